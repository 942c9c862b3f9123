"""The comparison's verdict in 100 columns (analysis/compare/compact.py): what `testbed compare` and
`testbed twin` print at their end by default, its numbers the Fidelity's own, and --full for every
table. On the hand-built worlds of tests/test_fidelity.py."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
from rich.console import Console

import analysis.compare.fidelity as fidelity_module
import analysis.compare.compact as compact
import cli.run as cli_run
from analysis.compare.fidelity import Fidelity
from analysis.compare.compact import command_lines, print_compact, verdict_lines
from analysis.compare.console import print_fidelity
from cli.main import build_parser, main
from core.calibration.fit import save_calibration
from test_calibration import _calibration
from analysis.rule.verdict import RULE_VERSION
from test_fidelity import POLICIES, _hand_priors, build_worlds, compared_worlds

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


@pytest.fixture(scope="module")
def fid(tmp_path_factory) -> Fidelity:
    return compared_worlds(tmp_path_factory, full=True)  # every table: the files alike


def render(fid: Fidelity, width: int = 100, **kw) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    print_compact(fid, console, **kw)
    return console.export_text().splitlines()


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _rel(r) -> str:
    return f"{100 * r['deviation']:+.0f}% [{100 * r['dev_low']:+.0f}, {100 * r['dev_high']:+.0f}]"


def test_the_compact_view_fits_100_columns_and_shows_the_fidelitys_numbers(fid):
    lines = render(fid)
    assert max(map(len, lines)) <= 100
    said = lines[next(i for i, ln in enumerate(lines) if ln.startswith("rel. err =")) + 1:]  # below the table
    assert said and not any(ln.endswith(" ") for ln in said)  # wrapped by word, no padding to the width
    t = fid.table.set_index(["policy", "metric"])
    rows = {cells[0]: cells[1:] for ln in lines if ln.startswith("│")
            for cells in [[c.strip() for c in ln.strip("│").split("│")]]}
    assert list(rows) == list(POLICIES)  # one row per policy, the table's own order
    verdicts = fid.verdicts()
    for p in POLICIES:
        fr = t.loc[(p, "failure_rate")]
        mine = [v for q, _, v in verdicts if q == p]
        assert rows[p] == [f"{_pct(fr['sim'])} / {_pct(fr['testbed'])}", _pct(t.loc[(p, "outcome_agreement"), "sim"]),
                           _rel(t.loc[(p, "ttft_p50_s")]), _rel(t.loc[(p, "e2e_p50_s")]),
                           "/".join(str(mine.count(v)) for v in ("pass", "fail", "undecided"))]
    assert rows["OTF-R"][0] == "11.7% / 25.0%" and rows["OTF-R"][2].startswith("-17% [-17, ")  # by hand: 7/60, 15/60
    text = "\n".join(lines)
    n = fid.counts()
    assert f"verdict: {n['pass']} pass, {n['fail']} fail, {n['undecided']} undecided (rule {RULE_VERSION})" in text
    assert f"{n['pass'] + n['fail']} checks decided; at the rule's level" in text
    assert "Kendall tau = 1.000" in text and "order of LC, OTF-R, OracleAvoidance by failure rate" in text
    # 5 fails, named (the failure rate with the share host noise could explain); 6 undecided, by check
    assert "mismatch: OTF-R failure_rate (host noise could explain 50%), OTF-R ttft_p50_s," in text
    assert "undecided, by check: failure_rate ×2, outcome_agreement ×1," in text and "fidelity.csv" in text
    assert "every table: the same command with --full" in text and str(fid.out_dir) in text
    # a wider console (stdout to a file: cli/common.py's 200) keeps the verdict in 100 columns; a
    # narrower one squeezes it to its own width
    assert render(fid, 200) == lines
    assert max(map(len, render(fid, 80))) <= 80


def test_few_checks_are_named_with_the_seeds_they_would_need(fid, monkeypatch):
    monkeypatch.setattr(compact, "NAMED_MAX", 10)
    (head, _), (fail, failed), (undecided, open_) = verdict_lines(fid)[:3]
    needed = fid.table.set_index(["policy", "metric"])["seeds_needed"]
    lc = needed[("LC", "failure_rate")]
    assert f"LC failure_rate ({lc:.0f} seeds)" in open_ or (math.isnan(lc) and "LC failure_rate (over 100 seeds)" in open_)
    assert "all kendall_tau" in open_ and "all rank_order" in open_ and len(failed) == 5


def test_the_command_that_prints_every_table_is_one_shell_command_within_the_width():
    argv = ["testbed", "compare", "runs/twin/sim/twin", "runs/twin/testbed/twin", "--out", "runs/twin/fidelity",
            "--calibration", "runs/twin/calibration.json", "--repeat", "runs/twin/testbed-repeat/twin",
            "--calibration-sims", "runs/twin/sim-calibration-1/twin", "runs/a b/twin", "--full"]
    lines = command_lines(argv, 60)
    assert len(lines) > 2 and all(len(ln) <= 60 for ln in lines)
    assert all(ln.endswith(" \\") for ln in lines[:-1])
    # as a shell reads the lines pasted: one command, every word whole
    said = subprocess.run(["bash", "-c", "printf '%s\\0' " + "\n".join(lines)], capture_output=True, text=True)
    assert said.stdout.split("\0")[:-1] == argv


def test_compare_prints_the_compact_view_and_writes_the_files_the_full_one_does(fid, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fidelity_module, "check_priors", _hand_priors)
    sim, tb = build_worlds(tmp_path)
    assert main(["compare", str(sim), str(tb), "--out", str(tmp_path / "out")]) == 0
    short = capsys.readouterr().out
    assert "verdict:" in short and "pass/fail/" in short and "Failure composition" not in short
    assert max(map(len, short.splitlines())) <= 100  # stdout not a terminal: a 200-column console
    # the same files, byte for byte, as the fixture's comparison of the same worlds printed in full
    # (the PNGs aside: drawn anew); tests/test_fidelity.py's CLI tests print the full view (--full)
    written = sorted(f.name for f in (tmp_path / "out").glob("*.csv"))
    assert written == sorted(f.name for f in fid.out_dir.glob("*.csv")) and "fidelity.csv" in written
    for name in written:
        assert (tmp_path / "out" / name).read_bytes() == (fid.out_dir / name).read_bytes(), name


def test_the_full_view_is_what_compare_printed_before(fid):
    # the rank's lines moved to analysis/compare/compact.py; the full view prints them as it did
    console = Console(width=250, record=True, file=io.StringIO())
    print_fidelity(fid, console)
    text = console.export_text()
    assert ("Kendall tau = 1.000 of the means (3 policies); over the pairs ordered alike, between 0.333 and 1.000 "
            "(needs >= 0.6): undecided") in text
    n = fid.counts()
    assert f"verdict: {n['pass']} pass, {n['fail']} fail, {n['undecided']} undecided (rule {RULE_VERSION}): mismatch: " \
           "OTF-R failure_rate" in text


def test_twin_ends_in_the_compact_view_pointing_to_a_compare_of_the_same_runs(tmp_path, monkeypatch):
    """cmd_twin, its engines and simulator stubbed: by default the compact view, with the command that
    prints every table; that command compares exactly what the twin compared; --full prints them."""
    calls = []
    monkeypatch.setattr("testbed.runs.launch.run_testbed", lambda *a, **k: None)
    monkeypatch.setattr(cli_run, "simulate", lambda *a, **k: None)
    monkeypatch.setattr(sys.modules["analysis.run.report"], "report", lambda *a, **k: None)  # the package's name is the function
    monkeypatch.setattr("analysis.compare.console.compare", lambda *a, **k: calls.append((a, k)))
    cal = save_calibration(_calibration(), tmp_path / "cal.json")
    cal2 = save_calibration(_calibration(), tmp_path / "cal2.json")
    twin = ["twin", "--calibration", str(cal), "--calibrations", str(cal2), "--seeds", "0,1", "--policies", "LC",
            "--out", str(tmp_path / "t")]
    assert main(twin) == 0
    (args, kw), = calls
    assert kw["full"] is False
    again = build_parser().parse_args(kw.pop("full_command")[1:])
    assert again.cmd == "compare" and again.full
    again.fn(again)
    (args2, kw2) = calls[1]
    assert kw2.pop("full") is True and kw2.get("full_command") is None
    assert args2[:4] == args[:4] and kw2["repeat_paths"] == kw["repeat_paths"] is not None  # 2 seeds: a repeat
    assert kw2["calibration_sims"] == kw["calibration_sims"] and len(kw["calibration_sims"]) == 1
    assert main([*twin, "--full"]) == 0 and calls[2][1]["full"] is True
