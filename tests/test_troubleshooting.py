"""docs/troubleshooting.md holds: its examples run as written, with the guides' steps and checks
(tests/test_guides.py: ``<!-- guide-test: ... -->`` before a block), every ``testbed`` command it
shows parses, and its two tables say what the code has: every check `testbed doctor` can print with
each fix it prints on FAIL (read from the calls that make the checks), and every kind of thing
`testbed leftovers` lists with what removes it.

The examples start no Ray, engine or namespace: a spec the doctor refuses, a simulator run stopped
by SIGINT once its first rows are written (a condition, not a time) and `testbed report` on it, and
the log levels of a short simulator run.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from cli.main import build_parser
from test_guides import run_guide

pytestmark = pytest.mark.background  # starts no Ray, engine or namespace and judges no time (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
DOCTOR_CODE = ("cli/doctor.py", "testbed/cluster/preflight.py", "testbed/cluster/preflight_links.py",
               "testbed/cluster/preflight_gpu.py", "testbed/cluster/preflight_rdma.py")


def _section(heading: str) -> str:
    """The page's text under ``## heading``, to the next heading of that level."""
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _table(section: str) -> list[list[str]]:
    """The cells of a section's table rows (the header and its rule left out)."""
    rows = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in section.splitlines()
            if ln.startswith("| ")]
    return [r for r in rows[1:] if not set(r[0]) <= set("- ")]


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _text_blocks(section: str) -> list[str]:
    """The ```text blocks of a section that no guide-test step checks (what a command prints, shown)."""
    return [b for b in re.findall(r"(?<!-->\n)```text\n(.*?)```", section, re.S)]


# ----------------------------------------------------------------------------------------------------------
# the examples, run


def test_the_examples_run_as_written(tmp_path):
    done = run_guide(PAGE.name, tmp_path, folder=PAGE.parent)
    runs = {s.action: [] for s in done}
    for s in done:
        runs[s.action].append(s.out)
    refused, = runs["run, exit 2"]  # the doctor: one line, before any check (its output step compared it)
    assert len(refused.strip().splitlines()) == 1 and "invalid spec at testbed.mode" in refused

    run = tmp_path / "runs" / "long_run" / "LC" / "seed-0"  # stopped by SIGINT after its first flush
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert len(list((run / "requests.parquet").glob("part-*.parquet"))) >= 2
    assert len(pd.read_parquet(run / "requests.parquet")) > 0
    report, verbose, quiet = runs["run"]
    stopped = _section("A run stopped halfway")
    note = next(ln for b in _text_blocks(stopped) for ln in b.splitlines() if ln.startswith("note:"))
    assert note in " ".join(report.split()), report  # the line the page shows, as report printed it
    assert (tmp_path / "runs" / "report" / "summary.csv").is_file()

    logs = _section("Where the logs are")
    info = next(ln for b in _text_blocks(logs) for ln in b.splitlines() if ln.startswith("INFO "))
    assert info in verbose.splitlines(), verbose  # -v: the run's line, as the page shows it
    assert quiet == "", quiet  # -q: nothing at all
    assert json.loads((tmp_path / "quiet" / "short_run" / "LC" / "seed-0" / "run.json").read_text())["status"] \
        == "finished"


def test_every_testbed_command_of_the_page_parses():
    """Every line of its bash blocks, and every `testbed ...` in its prose that has arguments (a bare
    `testbed compare` names the command); a message it quotes (`testbed run: the testbed needs ...`)
    is no command."""
    parser = build_parser()
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = PAGE.read_text()
    shown = [ln.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in b.splitlines()]
    shown += [c for c in re.findall(r"`(testbed [^`]*)`", text) if len(c.split()) > 2]
    checked = 0
    for cmd in shown:
        words = cmd.split()
        if words[:1] != ["testbed"] or len(words) < 2 or not (words[1] in commands or words[1].startswith("-")):
            continue
        try:
            parser.parse_args(shlex.split(cmd.replace("SPEC", "x.yaml"), comments=True)[1:])
        except SystemExit:
            pytest.fail(f"{PAGE.name}: `{cmd}` does not parse")
        checked += 1
    assert checked >= 15, checked


# ----------------------------------------------------------------------------------------------------------
# the doctor's table, against the calls that make the checks


def _constants(module: str, expr: ast.AST) -> list[str]:
    """The literal text of an expression: its string constants (an f-string's literal parts) and the
    module constants it names, each stripped of the spaces and punctuation it joins with."""
    mod = importlib.import_module(module)
    out = []
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.Name) and isinstance(getattr(mod, node.id, None), str):
            out.append(getattr(mod, node.id))
    return [p for p in (s.strip(" ;:,()") for s in out) if p]


def _checks() -> tuple[set[str], list[tuple[str | None, list[str]]]]:
    """Every check name the doctor's code makes, and per ``fail(...)`` call its name (None where the
    code builds it: a port's) and the literal pieces of its fix."""
    names: set[str] = set()
    fails: list[tuple[str | None, list[str]]] = []
    for rel in DOCTOR_CODE:
        module = rel.removesuffix(".py").replace("/", ".")
        for node in ast.walk(ast.parse((REPO / rel).read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            first = node.args[0] if node.args else None
            literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            if node.func.id == "check_port" and literal:  # its checks are named "<what> port"
                names.add(f"{literal} port")
            if node.func.id in ("ok", "fail", "na") and literal:
                names.add(literal)
            if node.func.id == "fail":
                fails.append((literal, _constants(module, node.args[2])))
    return names, fails


def test_the_doctor_table_lists_every_check_and_every_fix_the_code_prints():
    names, fails = _checks()
    assert {"ray", "vllm", "ucx tcp", "metrics port", "ray.init", "node"} <= names and len(fails) >= 20
    rows = [(set(_ticked(name)), fix) for name, _, fix in _table(_section("`testbed doctor` prints FAIL"))]
    listed = set().union(*(r for r, _ in rows))
    assert listed == names, f"the table lists {sorted(listed - names)} the code lacks, leaves out {sorted(names - listed)}"
    matched = set()
    for name, pieces in fails:
        hits = [i for i, (row, fix) in enumerate(rows) if (name is None or name in row)
                and all(p in fix for p in pieces)]
        assert hits, f"no row of the doctor table prints the fix of {name or 'a port'}'s FAIL: {pieces}"
        matched.update(hits)
    invented = [sorted(row) for i, (row, fix) in enumerate(rows) if i not in matched and fix != "(none)"]
    assert not invented, f"rows whose fix no FAIL of the code prints: {invented}"


def test_the_fix_reader_finds_a_changed_fix():
    expr = ast.parse("fail('x', 'found', f'choose another {field} in the spec, or stop what holds it')").body[0].value
    pieces = _constants("testbed.cluster.preflight", expr.args[2])
    assert pieces == ["choose another", "in the spec, or stop what holds it"]
    assert not all(p in "`choose another testbed.<what>_port in the spec`" for p in pieces)


# ----------------------------------------------------------------------------------------------------------
# the leftovers' table and lines, against testbed leftovers' own


def test_the_leftovers_table_and_lines_are_the_commands_own():
    from testbed.cluster.leftovers import REMEDY, Leftover

    section = _section("Something of the project is left on the machine")
    rows = {_ticked(kind)[0]: remedy for kind, _, remedy in _table(section)}
    assert set(rows) == set(REMEDY), sorted(set(rows) ^ set(REMEDY))
    for kind, remedy in REMEDY.items():
        assert rows[kind].replace("`", "") == remedy, (kind, rows[kind])
    lines = [ln for b in _text_blocks(section) for ln in b.splitlines() if ln.strip()]
    assert len(lines) >= 3
    for ln in lines:  # each shown line is one `testbed leftovers` prints: its kind, what, and remedy
        kind, what = ln.split(None, 1)[0], ln.split(None, 1)[1].rsplit("  (", 1)[0]
        assert kind in REMEDY and Leftover(kind, what).line() == ln, ln
