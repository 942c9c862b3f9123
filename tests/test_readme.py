"""The README's and docs/ pages' commands and examples are checked here, so the docs cannot drift."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.main import build_parser
from core.policies import POLICY_NAMES
from core.spec.model import parse_spec

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
FRONT_DOOR_LINES = 300  # the README is a front door; the rest lives in docs/
FIRST_SCREEN = 60  # the two commands and what the first prints stand within these lines


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _section(text: str, title: str) -> str:
    """The text under the level-2 heading `title`, up to the next level-2 heading."""
    assert f"## {title}\n" in text, f"no section {title!r}"
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_setup_has_exactly_two_commands_and_ci_runs_the_second():
    (block,) = re.findall(r"```bash\n(.*?)```", _section(README, "Set up"), flags=re.S)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 2
    assert lines[0].startswith("./install.sh && testbed twin")
    assert lines[1] == "./install.sh && python -m pytest -q -n auto"
    ci = (REPO / ".ci" / "run").read_text()
    assert "grep -m1 '^./install.sh && python -m pytest' README.md" in ci
    assert (REPO / "install.sh").stat().st_mode & 0o111


def test_the_readme_is_a_front_door_with_the_commands_and_what_they_print_on_its_first_screen():
    lines = README.splitlines()
    assert len(lines) <= FRONT_DOOR_LINES, f"README.md has {len(lines)} lines; move text to docs/"
    first = "\n".join(lines[:FIRST_SCREEN]) + "\n"
    assert "./install.sh && testbed twin\n" in first
    assert "./install.sh && python -m pytest -q -n auto\n" in first
    # a real excerpt of what `testbed twin` prints: the metrics table and the verdict, from a run
    # whose machine and commit the sentence before it names
    (excerpt,) = _blocks(first, "text")
    assert "OracleAvoidance" in excerpt and len(excerpt.splitlines()) >= 5, excerpt
    # readable in a terminal of ordinary width: the compact verdict (analysis/compare/compact.py)
    assert max(map(len, excerpt.splitlines())) <= 100, max(excerpt.splitlines(), key=len)
    assert "verdict:" in excerpt
    intro = first.split("```text\n", 1)[0].rstrip().rsplit("\n\n", 1)[-1]
    assert re.search(r"commit `[0-9a-f]{7,}`", intro) and "cores" in intro, intro


def test_every_docs_page_is_linked_from_the_readme_and_the_docs_index():
    for name in DOCS:
        assert f"(docs/{name})" in README, f"README.md does not link docs/{name}"
        if name != "README.md":
            assert f"({name})" in DOCS["README.md"], f"docs/README.md does not link {name}"


def test_every_testbed_command_in_the_readme_and_the_docs_parses_and_its_files_exist():
    pages = {"README.md": README, **{f"docs/{n}": t for n, t in DOCS.items()}}
    cmds = [(page, ln.strip()) for page, text in pages.items() for b in _blocks(text, "bash")
            for part in b.splitlines() for ln in part.split("&&") if ln.strip().startswith("testbed ")]
    assert len([c for p, c in cmds if p == "README.md"]) >= 5
    parser = build_parser()
    # a spec the page's own runnable example writes first (tests/test_guides.py's steps) need not be in the repository
    written = {page: set(re.findall(r"<!-- guide-test: write (\S+) -->", text)) for page, text in pages.items()}
    for page, cmd in cmds:
        args = parser.parse_args(shlex.split(cmd, comments=True)[1:])
        if getattr(args, "spec", None) and args.spec not in written[page]:
            assert (REPO / args.spec).is_file(), (page, cmd)
        for p in args.policies.split(",") if getattr(args, "policies", None) else []:
            assert p in POLICY_NAMES, (page, cmd)


def test_the_spec_example_is_valid():
    (example,) = _blocks(DOCS["spec.md"], "yaml")
    spec = parse_spec(yaml.safe_load(example), "docs/spec.md example")
    assert [p.name for p in spec.policies] == ["LC", "OTF-R"]


def test_the_policy_table_lists_every_policy():
    rows = re.findall(r"^\| `([^`]+)` \|", _section(README, "Policies"), flags=re.M)
    assert rows == list(POLICY_NAMES)


def test_the_experiment_table_lists_the_shipped_specs():
    rows = re.findall(r"^\| `([^`]+\.yaml)` \|", _section(README, "Using it"), flags=re.M)
    assert sorted(rows) == sorted(p.name for p in (REPO / "experiments").glob("*.yaml"))


def test_the_smoke_example_runs_as_written(tmp_path):
    # the first two lines of "Using it", run in a scratch folder holding a copy of experiments/
    (block, *_) = re.findall(r"```bash\n(.*?)```", _section(README, "Using it"), flags=re.S)
    lines = block.splitlines()[:2]
    assert lines[0].startswith("testbed sim experiments/smoke.yaml")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "smoke.yaml").write_text((REPO / "experiments" / "smoke.yaml").read_text())
    for line in lines:
        args = shlex.split(line)[1:]
        if args[0] == "sim":
            args += ["--seeds", "0", "--policies", "LC,OTF-R"]  # keep the test short
        res = subprocess.run([sys.executable, "-m", "cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})  # this tree's code
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "report" / "summary.csv").is_file()
