"""The testbed side of a study (study/testbed_side.py) without engines: which runs it hands the
driver, where they go, how a finished run is marked and skipped the next time, and that an
interrupted run is run again from an empty directory. The driver's part (each run on engines
verified quiet) is tests/test_testbed_jobs.py's and the slow tests'; here a stand-in writes what
the driver would, a run directory (the simulator's, which has the same contract)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

import study.testbed_side as st
from study.table import cell_finished, load_study
from builders import shipped_spec_dict
from core.calibration.fit import load_calibration
from core.records import read_meta
from core.spec.model import parse_spec
from study.grid import expand_study
from simulator.run import run_sim

QUIET = Console(file=open("/dev/null", "w"))


def _spec():
    data = shipped_spec_dict("testbed.yaml", exclude={"study"})
    data["workload"]["max_requests"] = 6
    data["study"] = {"seeds": [0, 1], "sweeps": [
        {"name": "severe", "axes": {"severity": [0.01]}, "policies": ["LC", "OTF-R"]},
        {"name": "telemetry", "set": {"severity": 0.01}, "policies": ["LC", "OTF-R"],
         "axes": {"telemetry": ["none"]}}],
        "claims": [{"name": "price-cuts-failures", "metric": "failure_rate", "policy": "OTF-R",
                    "at": {"sweep": "severe"}, "vs": {"policy": "LC"}, "direction": "decrease", "margin": 0.03}]}
    return parse_spec(data, "t")


class FakeLaunch:
    """Stands in for testbed.runs.launch.launch_jobs: runs each job's (policy, seed) in the simulator
    into the job's out_dir, as the driver does into run_dir_for(out_dir, spec, policy, seed); stops
    (KeyboardInterrupt) after ``stop_after`` runs, leaving the next one half written."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.calls: list[dict] = []
        self.stop_after = stop_after

    def __call__(self, jobs, out, **kw):
        self.calls.append({"jobs": jobs, "out": out, **kw})
        if kw.get("calibrate_to") is not None:  # the engines alone, as the driver measures them first
            from core.calibration.fit import save_calibration
            from test_calibration import _calibration

            save_calibration(_calibration(), kw["calibrate_to"])
        n = 0
        for job in jobs:
            for policy in job.policies:
                for seed in job.seeds:
                    if self.stop_after is not None and n == self.stop_after:
                        d = Path(job.out_dir) / job.spec.name / policy / f"seed-{seed}"
                        d.mkdir(parents=True)
                        (d / "run.json").write_text('{"status": "running"}')
                        raise KeyboardInterrupt
                    run_sim(job.spec, policy, seed, Path(job.out_dir))
                    n += 1
        return 0


def _side(tmp_path, monkeypatch, launch, **kw):
    spec = _spec()
    cells = expand_study(spec, "t")
    monkeypatch.setattr("testbed.runs.launch.launch_jobs", launch)
    args = {"address": None, "calibration": None, "repeat_seeds": [0], "rerun": False, "console": QUIET} | kw
    return cells, st.run_testbed_side(spec, cells, cells, tmp_path, **args)


def test_each_distinct_run_is_one_job_run_on_one_set_of_engines_then_the_repeated_seed(tmp_path, monkeypatch):
    launch = FakeLaunch()
    cells, (cal, plan) = _side(tmp_path, monkeypatch, launch)
    # 8 cells, LC's telemetry-none cells share its severe runs: 6 runs; seed 0's 3 again
    assert (len(cells), len(plan.runs), len(plan.todo), len(plan.repeat)) == (8, 6, 6, 3)
    [call] = launch.calls
    # the engines alone measured first, then the calibration load (the scenario without its faults)
    # whose runs the calibration under the run's conditions is fitted on: the simulator's side uses it
    assert call["calibrate_to"] == tmp_path / "calibration-isolated.json" and call["calibration"] is None
    load, *jobs = call["jobs"]
    assert load.out_dir == (tmp_path / "calibration-load").resolve() and load.seeds == [1000, 1001]
    assert not load.spec.faults
    assert cal == tmp_path / "calibration.json" and load_calibration(cal).source["conditions"]["kind"] == "run"
    assert [(j.spec.name, j.policies, j.seeds) for j in jobs] == [
        ("severe__severity-0.01", ["LC"], [0, 1]), ("severe__severity-0.01", ["OTF-R"], [0, 1]),
        ("telemetry__telemetry-none", ["OTF-R"], [0, 1]),
        ("severe__severity-0.01", ["LC"], [0]), ("severe__severity-0.01", ["OTF-R"], [0]),
        ("telemetry__telemetry-none", ["OTF-R"], [0])]
    assert {j.out_dir for j in jobs[:3]} == {(tmp_path / "testbed" / "cells").resolve()}
    assert {j.out_dir for j in jobs[3:]} == {(tmp_path / "repeat" / "cells").resolve()}
    assert jobs[3].workloads[0].arrival_s.tolist() == jobs[0].workloads[0].arrival_s.tolist()
    assert jobs[2].spec.telemetry.mode == "none" and jobs[0].spec.telemetry.mode == "direct"
    # every run marked finished where the study's reader looks, shared cells included
    for c in plan.runs:
        assert cell_finished(tmp_path / "testbed" / c.run_dir, c.run)
    frame = load_study(tmp_path / "testbed")
    assert len(frame) == 8 and not frame.attrs["skipped"]
    assert len(load_study(tmp_path / "repeat")) == 4  # seed 0's cells, LC's shared one twice


def test_the_same_call_again_starts_nothing_and_a_given_calibration_is_used(tmp_path, monkeypatch):
    _side(tmp_path, monkeypatch, FakeLaunch())
    again = FakeLaunch()
    _, (_, plan) = _side(tmp_path, monkeypatch, again)
    assert again.calls == [] and plan.todo == [] and plan.repeat_todo == []
    rerun = FakeLaunch()
    cal = tmp_path / "mine.json"
    _side(tmp_path, monkeypatch, rerun, rerun=True, calibration=cal, repeat_seeds=[])
    [call] = rerun.calls
    assert call["calibration"] == cal and call["calibrate_to"] is None
    assert sum(len(j.seeds) for j in call["jobs"]) == 6


def test_an_interrupted_study_keeps_its_finished_runs_and_reruns_the_rest_from_an_empty_directory(tmp_path,
                                                                                                monkeypatch):
    with pytest.raises(KeyboardInterrupt):  # the calibration load's 2 runs, then 2 of the grid's
        _side(tmp_path, monkeypatch, FakeLaunch(stop_after=4))
    spec = _spec()
    cells = expand_study(spec, "t")
    p = st.plan(cells, cells, tmp_path, [0])
    assert len(p.todo) == 4 and len(p.repeat_todo) == 3
    half = tmp_path / "testbed" / p.todo[0].run_dir
    assert read_meta(half)["status"] == "running" and not cell_finished(half, p.todo[0].run)
    resumed = FakeLaunch()
    _side(tmp_path, monkeypatch, resumed)
    # interrupted before its calibration was fitted: measured again, its load first, then the rest
    load, *jobs = resumed.calls[0]["jobs"]
    assert load.seeds == [1000, 1001] and sum(len(j.seeds) for j in jobs) == 4 + 3
    assert read_meta(half)["status"] == "finished"
    assert len(load_study(tmp_path / "testbed")) == 8


def test_mark_finished_leaves_a_run_that_did_not_finish_unmarked(tmp_path):
    spec = _spec()
    cells = expand_study(spec, "t")
    c = cells[0]
    d = tmp_path / c.run_dir
    d.mkdir(parents=True)
    (d / "run.json").write_text('{"status": "interrupted"}')
    assert st.mark_finished(tmp_path, [c]) == 0 and not (d / "cell.json").exists()


def test_testbed_report_on_a_study_of_both_worlds_gives_the_claims_again(tmp_path, monkeypatch, capsys):
    """`testbed report STUDY` of a carry-over study's directory redoes its claims from the run
    directories (the simulator's side here is a copy of the testbed's: equal worlds)."""
    import shutil

    import pandas as pd

    from cli.main import main

    _side(tmp_path, monkeypatch, FakeLaunch())
    shutil.copytree(tmp_path / "testbed", tmp_path / "sim")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "again")]) == 0
    row = pd.read_csv(tmp_path / "again" / "claims.csv").set_index("claim").loc["price-cuts-failures"]
    assert row["sim_mean"] == row["tb_mean"] and row["sim_n"] == row["tb_n"] == 2
    # seed 0's three distinct runs run twice (LC at telemetry none shares its severe run): the repeat
    # judged over its three pairs, and the spread they describe
    assert row["repeat_n"] == 3 and row["repeat"] in ("pass", "fail", "undecided")
    spreads = pd.read_csv(tmp_path / "again" / "claim_spreads.csv").set_index("metric")
    assert spreads.loc["failure_rate", "pairs"] == 3
    assert (tmp_path / "again" / "claim_price-cuts-failures.png").is_file()
    (tmp_path / "testbed" / "study.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "not a carry-over study's index" in capsys.readouterr().err


def test_the_command_runs_both_worlds_and_the_claims_with_the_default_repeat_seed(tmp_path, monkeypatch):
    """`testbed study SPEC --world both` end to end, with the driver's part stood in (FakeLaunch): the
    testbed side, its repeat of the first seed, the calibrated simulator, and the claims."""
    import json
    import shutil

    import pandas as pd
    import yaml

    from cli.main import main
    from test_calibration import _calibration
    from core.calibration.fit import save_calibration

    spec = _spec()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(json.loads(spec.model_dump_json())))
    cal = save_calibration(_calibration(), tmp_path / "cal.json")
    launch = FakeLaunch()
    monkeypatch.setattr("testbed.runs.launch.launch_jobs", launch)
    args = ["study", str(path), "--world", "both", "--out", str(tmp_path / "runs"), "--calibration", str(cal)]
    assert main(args) == 0
    [call] = launch.calls
    assert sorted({s for j in call["jobs"] if "repeat" in str(j.out_dir) for s in j.seeds}) == [0]
    root = tmp_path / "runs" / spec.name
    row = pd.read_csv(root / "claims" / "claims.csv").set_index("claim").loc["price-cuts-failures"]
    assert (row["sim_n"], row["tb_n"], row["repeat_n"]) == (2, 2, 3) and bool(row["claims_as_fixed"])
    assert len(load_study(root / "sim")) == 8
    fixed = json.loads((root / "testbed" / "study.json").read_text())["claims_fixed"]
    shutil.rmtree(root / "claims")
    assert main(args) == 0 and len(launch.calls) == 1  # all finished: nothing launched again
    assert (root / "claims" / "claims.csv").is_file()
    assert json.loads((root / "testbed" / "study.json").read_text())["claims_fixed"] == fixed
    # a margin changed after the runs: the record of what they began with stays, the verdicts say so
    data = yaml.safe_load(path.read_text())
    data["study"]["claims"][0]["margin"] = 0.3
    path.write_text(yaml.safe_dump(data))
    assert main(args) == 0 and len(launch.calls) == 1
    row = pd.read_csv(root / "claims" / "claims.csv").set_index("claim").loc["price-cuts-failures"]
    assert row["margin"] == 0.3 and not bool(row["claims_as_fixed"])
    later = json.loads((root / "testbed" / "study.json").read_text())["claims_fixed"]
    assert later["digest"] == fixed["digest"] and later["changed_to"] != fixed["digest"]


def test_the_simulators_side_again_under_another_calibration_judges_the_same_testbed_runs(tmp_path, monkeypatch):
    """`testbed study SPEC --world sim --calibration FILE` on a carry-over study's directory: the
    simulator's cells again under that calibration, the claims judged again on the recorded testbed
    runs, no engine started."""
    import json

    import pandas as pd
    import yaml

    from cli.main import main
    from core.calibration.fit import save_calibration
    from core.records import read_meta
    from test_calibration import _calibration

    spec = _spec()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(json.loads(spec.model_dump_json())))
    first = _calibration()
    launch = FakeLaunch()
    monkeypatch.setattr("testbed.runs.launch.launch_jobs", launch)
    out = tmp_path / "runs"
    assert main(["study", str(path), "--world", "both", "--out", str(out),
                 "--calibration", str(save_calibration(first, tmp_path / "cal.json"))]) == 0
    root = out / spec.name
    (root / "claims" / "claims.csv").unlink()
    slower = first.model_copy(update={"engine": first.engine.model_copy(
        update={"decode_step_base_s": 3 * first.engine.decode_step_base_s, "decode_call_s": 0.004})})
    again = save_calibration(slower, tmp_path / "again.json")
    assert main(["study", str(path), "--world", "sim", "--out", str(out), "--calibration", str(again)]) == 0
    assert len(launch.calls) == 1  # no engine started the second time
    sim = [read_meta(d) for d in (root / "sim").rglob("seed-*") if (d / "run.json").is_file()]
    assert len(sim) == 6 and all(m["spec"]["engine"]["decode_call_s"] == 0.004 for m in sim)  # 8 cells, 6 runs
    row = pd.read_csv(root / "claims" / "claims.csv").set_index("claim").loc["price-cuts-failures"]
    assert (row["sim_n"], row["tb_n"]) == (2, 2)
    # without the testbed's runs, the simulator's side alone
    bare = tmp_path / "bare"
    assert main(["study", str(path), "--world", "sim", "--out", str(bare), "--calibration", str(again)]) == 0
    assert not (bare / spec.name / "claims").exists() and len(load_study(bare / spec.name / "sim")) == 8


SAME_LATENCY = {"name": "same-latency", "metric": "ttft_p50_s", "policy": "OTF-R", "at": {"sweep": "severe"},
                "vs": {"policy": "LC"}, "direction": "none", "margin": 10.0}
NO_TELEMETRY_NO_CHANGE = {"name": "no-telemetry-no-change", "metric": "failure_rate", "policy": "OTF-R",
                          "at": {"sweep": "telemetry"}, "vs": {"policy": "LC"}, "direction": "none", "margin": 0.001}


def _looks_study(tmp_path, monkeypatch, claims: list[dict]) -> tuple[dict, "FakeLaunch", Path, list[str]]:
    """The test spec with looks at 2 and 4 of seeds 0-3 and ``claims``, the launcher stood in, a
    calibration given: (the spec's data, the stand-in, the out folder, the command's arguments)."""
    import json

    import yaml

    from core.calibration.fit import save_calibration
    from test_calibration import _calibration

    data = json.loads(_spec().model_dump_json())
    data["study"]["seeds"], data["study"]["looks"] = [0, 1, 2, 3], [2, 4]
    data["study"]["claims"] = claims
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    launch = FakeLaunch()
    monkeypatch.setattr("testbed.runs.launch.launch_jobs", launch)
    cal = save_calibration(_calibration(), tmp_path / "cal.json")
    out = tmp_path / "runs"
    return data, launch, out, ["study", str(path), "--world", "both", "--out", str(out), "--calibration", str(cal)]


def test_a_study_with_looks_runs_later_seeds_only_for_the_claims_still_undecided(tmp_path, monkeypatch):
    """A group-sequential design (study/looks.py) through `testbed study --world both`: look 1 runs
    seeds 0, 1 for every cell; a claim with a wide margin is decided there; look 2 runs seeds 2, 3 only
    for the cells of the claim still undecided (its margin below what four seeds can show), in both
    worlds; claims.csv says which look judged each."""
    import pandas as pd

    from cli.main import main

    # decided at look 1: OTF-R's and LC's latency are one in these short runs, in either world, well
    # inside 10 s (the repeat is judged against that margin: another metric than the other claim's);
    # undecided at every look: no failure either way, and four seeds cannot show 0.001
    data, launch, out, args = _looks_study(tmp_path, monkeypatch, [SAME_LATENCY, NO_TELEMETRY_NO_CHANGE])
    assert main(args) == 0
    first, second = launch.calls
    assert {s for j in first["jobs"] for s in j.seeds} == {0, 1}
    ran = {(j.spec.name, p, s) for j in second["jobs"] for p in j.policies for s in j.seeds}
    # LC's telemetry cell shares its severe run (same records): that run is the one look 2 adds
    assert ran == {(pt, p, s) for pt, p in (("telemetry__telemetry-none", "OTF-R"), ("severe__severity-0.01", "LC"))
                   for s in (2, 3)}
    root = out / data["name"]
    rows = pd.read_csv(root / "claims" / "claims.csv").set_index("claim")
    assert (rows.loc["same-latency", "look"], rows.loc["same-latency", "n_seeds"]) == (1, 2)
    assert rows.loc["same-latency", "verdict"] == "carries over"
    assert (rows.loc["no-telemetry-no-change", "look"], rows.loc["no-telemetry-no-change", "n_seeds"]) == (2, 4)
    assert set(rows["alpha"]) == {0.025}
    sim_seeds = {(r.point, r.policy, r.seed) for r in load_study(root / "sim").dropna(subset=["run_dir"]).itertuples()}
    assert ("severe__severity-0.01", "OTF-R", 2) not in sim_seeds  # decided at look 1: never run further
    assert ("telemetry__telemetry-none", "OTF-R", 3) in sim_seeds
    assert main(args) == 0 and len(launch.calls) == 2  # everything finished: nothing launched again


def test_a_study_whose_claims_all_decide_at_look_1_stops_there_and_shows_its_report_once(tmp_path, monkeypatch,
                                                                                         capsys):
    import io

    from rich.console import Console

    from cli.main import main
    from study.claims import carryover_report

    data, launch, out, args = _looks_study(tmp_path, monkeypatch, [SAME_LATENCY])  # decided at look 1
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert len(launch.calls) == 1  # no seed of look 2 ran
    once = Console(file=io.StringIO(), record=True, width=200)
    carryover_report(out / data["name"], tmp_path / "again", once)
    table = once.export_text().strip().splitlines()[0]  # the report's first line, as a report shows it
    assert printed.count(table) == 1, printed
