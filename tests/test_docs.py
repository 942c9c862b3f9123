"""Citations in the code point at pages and sections that exist, and the docs' own links resolve.

A comment or docstring that says why by pointing elsewhere (``docs/reliability.md "Silent
corruption"``, ``README "Set up"``, ``docs/spec.md#public-traces``, ``core/spec/model.py``) must name a
file of this repository and, where it names a section, a heading of that page. The field notes
that lie beside the project (``FIELD-NOTES``) are not part of it: code cites docs/verified.md,
which says the same in the project's words.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
CODE_DIRS = ("cli", "core", "simulator", "testbed", "workloads", "faults", "analysis", "benchmarks", "tests")
OTHER_FILES = ("cluster.yaml", "install.sh", "pyproject.toml")
ROOTS = ("cli", "core", "simulator", "testbed", "workloads", "faults", "analysis", "experiments",
         "benchmarks", "tests", "docs")
FILE_EXT = ("py", "md", "yaml", "yml", "json", "toml", "sh", "txt")

_SECTION = re.compile(r"""(?P<file>\bREADME(?:\.md)?|(?<![\w./-])docs/[\w./-]*?\.md)(?:'s)?(?:\s+section)?"""
                      r"""(?:\s*"(?P<sec>[^"]+)"|#(?P<anchor>[\w-]+))?""")
_NOTES = re.compile(r"FIELD[-_ ]NOTES|field notes", re.I)
_PATH = re.compile(rf"(?<![\w./~-])(?P<path>(?:{'|'.join(ROOTS)})/[\w./*-]*[\w*])")


def _fences_off(text: str) -> str:
    """The prose of a page: without its code blocks, and without HTML comments (the guides' steps for
    tests/test_guides.py, which name the files a reader creates)."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def headings(page: Path) -> set[str]:
    """The headings of a markdown page (outside code blocks), as written, without backticks."""
    return {m.group(1).replace("`", "").strip()
            for m in re.finditer(r"^#{1,6} (.+)$", _fences_off(page.read_text()), flags=re.M)}


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def check_citations(text: str, where: str, repo: Path = REPO) -> list[str]:
    """Every problem with the citations in one comment or docstring (whitespace-normalised)."""
    text = " ".join(text.split())
    problems = []
    if _NOTES.search(text):
        problems.append(f"{where}: cites FIELD-NOTES, which is not part of the repository: cite docs/verified.md")
    for m in _SECTION.finditer(text):
        name = m.group("file")
        page = repo / ("README.md" if name.startswith("README") else name)
        if not page.is_file():
            problems.append(f"{where}: cites {name}, which does not exist")
            continue
        sec, anc = m.group("sec"), m.group("anchor")
        if sec is not None and sec.replace("`", "").strip() not in headings(page):
            problems.append(f'{where}: cites {name} "{sec}", which is no heading of that page')
        if anc is not None and anc not in {anchor(h) for h in headings(page)}:
            problems.append(f"{where}: cites {name}#{anc}, which is no heading of that page")
    for m in _PATH.finditer(text):
        path = m.group("path").rstrip(".")
        if path.startswith("docs/") and path.endswith(".md"):
            continue  # a page: checked above with its section
        if "*" in path:
            if not any(repo.glob(path)):
                problems.append(f"{where}: names {path}, which matches nothing")
            continue
        name = path.rsplit("/", 1)[-1]
        ext = name.rsplit(".", 1)[-1] if "." in name else ""
        if ext and ext not in FILE_EXT:  # an output (a .png, a .parquet) or another project's file
            continue
        if not ((repo / path).is_file() if ext else (repo / path).exists()):
            problems.append(f"{where}: names {path}, which does not exist")
    return problems


def _comment_runs(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Consecutive comment lines joined, so a citation may wrap from one line to the next."""
    runs: list[tuple[int, str]] = []
    for line, text in lines:
        if runs and line == runs[-1][0] + runs[-1][1].count("\n") + 1:
            runs[-1] = (runs[-1][0], runs[-1][1] + "\n" + text)
        else:
            runs.append((line, text))
    return runs


def python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment run and docstring of a Python file."""
    source = path.read_text()
    comments = [(tok.start[0], tok.string.lstrip("#").strip())
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    texts = _comment_runs(comments)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append((node.body[0].lineno, doc))
    return texts


def hash_comment_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment run of a YAML, shell or TOML file (``#`` to the end of line)."""
    comments = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"(?:^|\s)#(?!!)(.*)$", line)
        if m:
            comments.append((i, m.group(1).strip()))
    return _comment_runs(comments)


def cited_files() -> list[Path]:
    # this file is left out: its docstring names FIELD-NOTES to say why nothing may cite it
    files = [p for d in CODE_DIRS for p in sorted((REPO / d).rglob("*.py"))
             if "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    specs = sorted((REPO / "experiments").glob("*.yaml")) + sorted((REPO / "core" / "defaults").glob("*.yaml"))
    return files + [REPO / f for f in OTHER_FILES] + specs


# ----------------------------------------------------------------------------------------------------------
# the checker itself, on made-up citations


def test_the_checker_passes_real_citations_and_fails_made_up_ones():
    assert check_citations('see README "Set up" and docs/reliability.md "Silent corruption"', "x") == []
    assert check_citations("docs/spec.md#public-traces, core/spec/model.py, testbed/engines/", "x") == []
    assert check_citations("the README's install command (BurstGPT's README says so)", "x") == []
    bad = {
        'README "No such section"': "no heading",
        'docs/reliability.md "Silent\n  corruptions"': "no heading",
        "docs/nowhere.md": "does not exist",
        "docs/spec.md#no-such-anchor": "no heading",
        "(FIELD-NOTES: 1-2 s)": "FIELD-NOTES",
        "see testbed/runtime/engine.py": "does not exist",
        "core/nope/": "does not exist",
    }
    for text, why in bad.items():
        problems = check_citations(text, "x")
        assert len(problems) == 1 and why in problems[0], (text, problems)


def test_the_checker_reads_comments_across_lines_and_docstrings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Module (README "Made up")."""\n\n# first line of a citation, README\n# "Set up" wraps\nx = 1\n'
                   'def f():\n    """docs/made_up.md"""\n')
    problems = [p for line, text in python_texts(src) for p in check_citations(text, f"m.py:{line}")]
    assert len(problems) == 2 and "Made up" in problems[0] and "made_up.md" in problems[1], problems


def test_anchors_follow_github():
    assert anchor("The prefill stall, explained") == "the-prefill-stall-explained"
    assert anchor("The study's phenomenon, and the physics behind it") == \
        "the-studys-phenomenon-and-the-physics-behind-it"


# ----------------------------------------------------------------------------------------------------------
# the code's citations


@pytest.mark.parametrize("path", cited_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_comment_or_docstring_cites_a_file_or_section_that_does_not_exist(path):
    texts = python_texts(path) if path.suffix == ".py" else hash_comment_texts(path)
    rel = path.relative_to(REPO)
    problems = [p for line, text in texts for p in check_citations(text, f"{rel}:{line}")]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------------------
# the docs' own links and paths


def _pages() -> list[Path]:
    """Every page a reader can reach: the README, the reference pages, the guides and the history."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_docs_resolves(page):
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _fences_off(page.read_text())):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anc = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anc and anc not in {anchor(h) for h in headings(dest)}:
            problems.append(f"{target}: no such heading")
    assert not problems, f"{page.relative_to(REPO)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_the_docs_name_exists(page):
    problems = [p for p in check_citations(_fences_off(page.read_text()), str(page.relative_to(REPO)))
                if "does not exist" in p or "matches nothing" in p]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------------------
# the spec's reference page


def _section(page: Path, heading: str) -> str:
    """The text under a ``## heading`` of a page, to the next heading of that level."""
    text = _fences_off(page.read_text())
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def documented_fields(section: str) -> set[str]:
    """The names in the first column of a section's table rows (`a`, `b` in one cell name both)."""
    return {name for cell in re.findall(r"^\| ([^|]+) \|", section, flags=re.M)
            for name in re.findall(r"`(\w+)`", cell)}


def test_every_testbed_field_is_on_the_spec_page():
    from core.spec.model import TestbedSpec

    rows = documented_fields(_section(REPO / "docs" / "spec.md", "The `testbed` block"))
    missing = [f for f in TestbedSpec.model_fields if f not in rows]
    assert not missing, f'docs/spec.md "The testbed block" leaves out testbed.{", testbed.".join(missing)}'
    stale = sorted(rows - set(TestbedSpec.model_fields))
    assert not stale, f'docs/spec.md "The testbed block" documents fields the spec lacks: {stale}'


def test_the_field_reader_takes_every_name_of_the_first_column_only():
    section = "\n## B\n\n| field | default |\n| --- | --- |\n| `a`, `b` | 1 |\n| `c` | `x` |\n"
    assert documented_fields(section) == {"a", "b", "c"}
