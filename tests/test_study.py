"""The study's grid: expansion of a spec's study block, deterministic cells, resumable runs on Ray."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from core.records import read_table
from core.spec.model import SpecError, load_spec, parse_spec
from builders import faulted_spec_dict, link_fault, poisson
from study.table import load_study
from study.grid import expand_study
from study.cells import cell_is_done
from study.runner import run_cell, run_study

REPO = Path(__file__).resolve().parents[1]

# A grid that simulates in about a second per cell: 4 pods x 4 workers, pod 1 degraded.
BASE = faulted_spec_dict(
    name="tiny_study", workload={"arrival": poisson(4.0)}, faults=[link_fault([1], 0.05, 20.0, 20.0)],
    policies=["LC", "FaultAwareOTF-R"], metrics={"bin_s": 5.0, "recovery_horizon_s": 10.0})


def _spec(study: dict, **over) -> object:
    return parse_spec({**BASE, **over, "study": study}, "tiny.yaml")


def test_expansion_is_the_product_of_each_sweeps_axes_times_policies_and_seeds():
    spec = _spec({"seeds": [0, 1, 2], "sweeps": [
        {"name": "sev", "axes": {"severity": [0.2, 0.01], "telemetry": ["direct", "delayed", "none"]}},
        {"name": "lab", "set": {"health.model": "alert"}, "policies": ["FaultAwareLC"], "seeds": [7],
         "axes": {"label_delay_s": [0, 10], "label_noise": [0.0, 0.2]}},
    ]})
    cells = expand_study(spec)
    assert len(cells) == 2 * 3 * 2 * 3 + 2 * 2 * 1 * 1
    assert len({c.cell for c in cells}) == len(cells)
    sev = [c for c in cells if c.sweep == "sev" and c.axes == {"severity": 0.01, "telemetry": "delayed"}]
    assert {(c.policy, c.seed) for c in sev} == {(p, s) for p in ("LC", "FaultAwareOTF-R") for s in (0, 1, 2)}
    assert all(c.spec.faults[0].residual_bw == 0.01 and c.spec.telemetry.mode == "delayed" for c in sev)
    lab = [c for c in cells if c.sweep == "lab"]
    assert {c.policy for c in lab} == {"FaultAwareLC"} and {c.seed for c in lab} == {7}
    # A study policy the spec does not list is added to the point's spec, so the run can use it.
    assert all("FaultAwareLC" in [p.name for p in c.spec.policies] for c in lab)
    noisy = next(c for c in lab if c.axes == {"label_delay_s": 10, "label_noise": 0.2})
    h = noisy.spec.health
    assert h.model == "alert" and h.detection_delay_s == 10
    # label noise q: spurious episodes of length D at rate q / ((1 - q) D) are wrong q of the time.
    assert h.false_positive_rate_per_s == pytest.approx(0.2 / (0.8 * h.false_positive_duration_s))
    assert h.flap_rate_per_s == pytest.approx(0.2 / (0.8 * h.flap_duration_s))
    # LC does not read the risk price, the only thing telemetry feeds: its cells at one severity and
    # seed share one run, the first's (telemetry direct); FaultAwareOTF-R's do not.
    lc = [c for c in cells if c.sweep == "sev" and c.policy == "LC" and c.seed == 1 and c.axes["severity"] == 0.01]
    assert [c.axes["telemetry"] for c in lc] == ["direct", "delayed", "none"]
    assert len({c.run for c in lc}) == 1 and {c.run_dir for c in lc} == {lc[0].run_dir}
    assert [c.shared for c in lc] == [False, True, True] and lc[0].run_dir.startswith(f"cells/{lc[0].point}/")
    priced = [c for c in cells if c.sweep == "sev" and c.policy == "FaultAwareOTF-R"]
    assert len({c.run for c in priced}) == len(priced) and not any(c.shared for c in priced)
    assert len({c.run_dir for c in cells}) == len({c.run for c in cells}) == len(cells) - 2 * 2 * 3


def test_a_point_another_sweep_repeats_is_run_once():
    spec = _spec({"sweeps": [{"name": "a", "axes": {"severity": [0.2, 0.01]}},
                             {"name": "b", "axes": {"severity": [0.01], "deadline_s": [20, 30]}}]})
    cells = expand_study(spec)
    a = {(c.policy, c.seed): c for c in cells if c.sweep == "a" and c.axes["severity"] == 0.01}
    same = [c for c in cells if c.sweep == "b" and c.axes["deadline_s"] == 20]  # the base spec's deadline
    other = [c for c in cells if c.sweep == "b" and c.axes["deadline_s"] == 30]
    assert same and all(c.shared and (c.run, c.run_dir) == (a[c.policy, c.seed].run, a[c.policy, c.seed].run_dir)
                        and c.cell != a[c.policy, c.seed].cell for c in same)
    assert not any(c.shared for c in other) and not {c.run for c in other} & {c.run for c in a.values()}


def test_telemetry_changes_nothing_but_the_price_for_a_policy_that_ignores_it(tmp_path):
    """What sharing LC's run across telemetry modes rests on: its requests, decisions, health and faults are
    the same with the bandwidth seen directly and not at all; only the price it ignored differs."""
    cells = expand_study(_spec({"sweeps": [{"name": "s", "axes": {"severity": [0.005],
                                                                  "telemetry": ["direct", "none"]}}]}))
    tables = {}
    for c in cells:
        if c.seed == 0:
            res = run_cell(c.spec.model_dump_json(), c.policy, c.seed)
            d = tmp_path / c.point / c.policy
            for rel, data in res["files"].items():
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_bytes(data)
            tables[c.policy, c.axes["telemetry"]] = _tables(d)
    lc_direct, lc_none = tables["LC", "direct"], tables["LC", "none"]
    assert (lc_direct["requests"]["outcome"] != "ok").any()
    for t in ("requests", "decisions", "health", "faults"):
        pd.testing.assert_frame_equal(lc_direct[t], lc_none[t], check_exact=True)
    assert not lc_direct["prices"].equals(lc_none["prices"])
    assert not tables["FaultAwareOTF-R", "direct"]["decisions"].equals(tables["FaultAwareOTF-R", "none"]["decisions"])


def test_cell_ids_are_stable_and_follow_the_resolved_spec():
    study = {"sweeps": [{"name": "s", "axes": {"load": [1.0, 2.0], "router.slow_loop_s": [0.5]}}]}
    a, b = expand_study(_spec(study)), expand_study(_spec(study))
    assert [c.cell for c in a] == [c.cell for c in b]
    assert a[-1].spec.workload.arrival.rate_rps == 8.0 and a[0].spec.router.slow_loop_s == 0.5
    changed = expand_study(_spec(study, deadline_s=30))
    assert not {c.cell for c in a} & {c.cell for c in changed}


@pytest.mark.parametrize("study, needle", [
    ({"sweeps": [{"name": "s", "axes": {"severty": [0.1]}}]}, "unknown axis 'severty'"),
    ({"sweeps": [{"name": "s", "axes": {"severity": []}}]}, "axis severity has no values"),
    ({"sweeps": [{"name": "s", "axes": {"severity": [0.1, 0.1]}}]}, "lists a value twice"),
    ({"sweeps": [{"name": "s", "axes": {"label_delay_s": [7]}}]},
     "study.sweeps[0] (s) point s__label-delay-s-7: invalid spec at health: detection_delay_s does not apply to model: checks"),
    ({"sweeps": [{"name": "s", "axes": {"severity": [1.5]}}]}, "point s__severity-1.5: invalid spec at faults.0.link.residual_bw"),
    ({"sweeps": [{"name": "s", "axes": {"router.no_such": [1]}}]}, "router.no_such"),
    ({"sweeps": [{"name": "s", "axes": {"label_noise": [1.0]}}]}, "label_noise is a fraction of time in [0, 1)"),
    ({"sweeps": [{"name": "s", "policies": ["Nope"], "axes": {"load": [1]}}]}, "Nope"),
    ({"sweeps": [{"name": "s", "axes": {"load": [1]}}, {"name": "s", "axes": {"load": [2]}}]}, "sweep names must be unique"),
])
def test_a_bad_study_is_one_line_naming_the_problem(study, needle):
    with pytest.raises(SpecError) as e:
        expand_study(_spec(study), "tiny.yaml")
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_severity_needs_a_link_fault():
    with pytest.raises(SpecError, match="axis severity needs a link fault"):
        expand_study(_spec({"sweeps": [{"name": "s", "axes": {"severity": [0.1]}}]}, faults=[]))


def test_the_maps_axes_set_what_they_name_and_refuse_what_they_cannot():
    cells = expand_study(_spec({"sweeps": [{"name": "m", "axes": {"degraded_pods": [1, 3], "fault_s": [7.5]}}]}))
    pods = {c.axes["degraded_pods"]: c.spec.faults[0].pods for c in cells}
    assert pods == {1: [0], 3: [0, 1, 2]} and {c.spec.faults[0].duration_s for c in cells} == {7.5}
    assert all(c.spec.faults[0].start_s == 20.0 for c in cells)  # a fault's length moves its end, not its start
    for axes, needle in (({"degraded_pods": [5]}, r"from 1 to topology.pods \(4\)"),
                         ({"degraded_pods": [0]}, "from 1 to topology.pods"), ({"fault_s": [0]}, "fault_s is a length")):
        with pytest.raises(SpecError, match=needle):
            expand_study(_spec({"sweeps": [{"name": "m", "axes": axes}]}))
    with pytest.raises(SpecError, match="axis fault_s needs a link fault"):
        expand_study(_spec({"sweeps": [{"name": "m", "axes": {"fault_s": [10]}}]}, faults=[]))


def test_the_grids_newer_axes_set_what_they_name_and_refuse_what_they_cannot():
    cells = expand_study(_spec({"seeds": [0], "sweeps": [
        {"name": "f", "set": {"telemetry": "none"}, "axes": {"in_flight": [False, True]}},
        {"name": "m", "set": {"health.model": "alert"}, "axes": {"label_miss": [0.5]}},
        {"name": "p", "axes": {"prompt_scale": [0.5, 2]}}]}))
    by = {(c.sweep, *c.axes.values()): c.spec for c in cells if c.policy == "LC"}
    assert [by["f", v].telemetry.in_flight for v in (False, True)] == [False, True]
    assert by["m", 0.5].health.miss_prob == 0.5
    # a prompt x times as long, its distribution's shape and bounds scaled, at the same prompt tokens a second
    base = parse_spec(BASE).workload
    for x in (0.5, 2):
        w = by["p", x].workload
        assert (w.prompt.median, w.prompt.min, w.prompt.max, w.prompt.sigma) == (
            base.prompt.median * x, base.prompt.min * x, base.prompt.max * x, base.prompt.sigma)
        assert w.arrival.rate_rps == base.arrival.rate_rps / x and w.output == base.output
    for axes, needle in (({"in_flight": [1]}, "in_flight is true or false"),
                         ({"label_miss": [1.5]}, "label_miss is a probability"),
                         ({"prompt_scale": [0]}, "prompt_scale is a factor > 0")):
        with pytest.raises(SpecError, match=needle):
            expand_study(_spec({"sweeps": [{"name": "x", "axes": axes}]}))


def test_a_prompt_scale_of_one_is_the_base_spec_and_a_longer_prompt_moves_more_kv_per_request(tmp_path):
    """prompt_scale 1 shares the base point's run (the same records); at 2 a run draws prompts about twice
    as long, about half as many of them, so the prompt tokens offered a second stay about the same."""
    cells = expand_study(_spec({"seeds": [0], "policies": ["LC"], "sweeps": [
        {"name": "base", "axes": {"severity": [0.01]}},
        {"name": "p", "set": {"severity": 0.01}, "axes": {"prompt_scale": [1, 2]}}]}))
    one = next(c for c in cells if c.axes.get("prompt_scale") == 1)
    assert one.shared and one.run_dir == next(c for c in cells if c.sweep == "base").run_dir
    req = {}
    for c in (c for c in cells if not c.shared):
        res = run_cell(c.spec.model_dump_json(), c.policy, c.seed)
        d = tmp_path / c.point
        for rel, data in res["files"].items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        req[c.axes.get("prompt_scale", 1)] = read_table(d, "requests")
    assert 1.7 < req[2]["prompt_tokens"].median() / req[1]["prompt_tokens"].median() < 2.3
    assert 0.35 < len(req[2]) / len(req[1]) < 0.65
    assert 0.75 < req[2]["prompt_tokens"].sum() / req[1]["prompt_tokens"].sum() < 1.25


def test_the_shipped_headline_map_expands_with_the_flagship_run_once_per_r_policy_and_seed():
    spec = load_spec(REPO / "experiments" / "headline_map.yaml")
    cells = expand_study(spec)
    per_r = {"load": 5, "degraded_pods": 5, "kv_size": 4, "ttft_limit": 4, "fault_length": 4}
    by_sweep = pd.Series([c.sweep for c in cells]).value_counts().to_dict()
    assert by_sweep == {k: n * 2 * 3 * 3 for k, n in per_r.items()}  # x 2 r x 3 policies x 3 seeds
    # the flagship's point recurs in each of the five sweeps: one run for all five
    assert len({c.run for c in cells}) == len(cells) - 4 * 2 * 3 * 3


def test_the_shipped_study_expands_and_every_point_is_valid():
    spec = load_spec(REPO / "experiments" / "study.yaml")
    cells = expand_study(spec)
    by_sweep = pd.Series([c.sweep for c in cells]).value_counts().to_dict()
    assert by_sweep == {"severity": 4 * 3 * 5 * 5, "labels": 4 * 3 * 2 * 5, "sensitivity": 4 * 3 * 3 * 2 * 5,
                        "in_flight": 4 * 2 * 2 * 5, "label_misses": 4 * 2 * 5, "lengths": 3 * 3 * 2 * 3}
    # Shared runs: the three price-blind policies at two more telemetry modes, sensitivity's points at
    # the base load and time-to-first-token limit (severity's telemetry direct points, LC and OTF-R), and
    # each newer sweep's base point: in_flight off (severity's telemetry none), no label missed (labels'
    # 5 s delay without noise), 128 KiB a token at the profile's prompts (severity's r = 0.01, direct).
    shared = 3 * 2 * 4 * 5 + 2 * 4 * 5 + 4 * 2 * 5 + 2 * 5 + 2 * 3
    assert len({c.run for c in cells}) == len(cells) - shared
    assert {c.sweep for c in cells if c.shared} == set(by_sweep) - {"labels"}


def _tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    out = {t: read_table(run_dir, t) for t in ("requests", "decisions", "faults", "health", "prices")}
    out["decisions"] = out["decisions"].drop(columns=["latency_s"])  # wall clock, in both worlds
    return out


def test_a_cell_is_deterministic(tmp_path):
    cell = expand_study(_spec({"sweeps": [{"name": "s", "axes": {"severity": [0.005]}}]}))[0]
    runs = []
    for k in range(2):
        res = run_cell(cell.spec.model_dump_json(), cell.policy, cell.seed)
        d = tmp_path / f"run{k}"
        for rel, data in res["files"].items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        runs.append(_tables(d))
    assert len(runs[0]["requests"]) > 100 and (runs[0]["requests"]["outcome"] != "ok").any()
    for t in runs[0]:
        pd.testing.assert_frame_equal(runs[0][t], runs[1][t], check_exact=True)


def _finished_at(study_dir: Path) -> dict[str, str]:
    return {str(p.parent.relative_to(study_dir)): json.loads(p.read_text())["finished_at"]
            for p in study_dir.rglob("cell.json")}


def test_the_grid_runs_on_ray_and_resumes_without_redoing_finished_cells(tmp_path):
    study = {"sweeps": [{"name": "s", "axes": {"severity": [0.2, 0.01]}}]}
    spec = _spec(study)
    first = run_study(spec, tmp_path, workers=2)
    d = first.study_dir
    assert (first.cells, first.skipped, first.ran, first.failed) == (4, 0, 4, [])
    index = json.loads((d / "study.json").read_text())
    assert index["axes"] == ["severity"] and len(index["cells"]) == 4
    cells = expand_study(spec)
    assert all(cell_is_done(d, c) for c in cells)
    for c in cells:  # every cell is a run directory the analysis can read, with its metrics cached
        meta = json.loads((d / c.run_dir / "run.json").read_text())
        assert (meta["status"], meta["policy"], meta["seed"]) == ("finished", c.policy, c.seed)
        assert (d / c.run_dir / "metrics.json").is_file()
    stamps = _finished_at(d)

    # Nothing to do: no cell runs again (and no Ray is started).
    again = run_study(spec, tmp_path, workers=2)
    assert (again.skipped, again.ran) == (4, 0) and _finished_at(d) == stamps

    # A cell stopped half-way (no cell.json, a partial table) and a cell a stopped driver was writing.
    victim = cells[3]
    (d / victim.run_dir / "cell.json").unlink()
    (d / victim.run_dir / "requests.parquet" / "part-00000.parquet").write_bytes(b"truncated")
    (d / ".partial" / "deadbeef").mkdir(parents=True)
    resumed = run_study(spec, tmp_path, workers=2)
    assert (resumed.skipped, resumed.ran) == (3, 1)
    after = _finished_at(d)
    assert {k: v for k, v in after.items() if k != victim.run_dir} == \
        {k: v for k, v in stamps.items() if k != victim.run_dir}
    assert cell_is_done(d, victim) and len(read_table(d / victim.run_dir, "requests")) > 100
    assert not (d / ".partial").exists() or not any((d / ".partial").iterdir())

    # A grown grid runs only its new runs, and only the sweeps asked for; the index lists every cell.
    # Sweep u's LC cell has the records of s's LC cell at r = 0.01 (LC ignores telemetry): it is not run.
    grown = _spec({"sweeps": [{"name": "s", "axes": {"severity": [0.2, 0.01, 0.05]}},
                              {"name": "t", "axes": {"load": [0.5]}},
                              {"name": "u", "axes": {"severity": [0.01], "telemetry": ["none"]}}]})
    with pytest.raises(ValueError, match="no sweep named 'v'; the study has s, t, u"):
        run_study(grown, tmp_path, sweeps=["v"])
    more = run_study(grown, tmp_path, workers=2, sweeps=["s", "u"])
    assert (more.cells, more.runs, more.skipped, more.ran) == (8, 7, 4, 3)
    assert len(json.loads((d / "study.json").read_text())["cells"]) == 10
    assert not (d / "cells" / "t__load-0.5").exists()
    assert not (d / "cells" / "u__severity-0.01_telemetry-none" / "LC").exists()
    table = load_study(d).set_index(["point", "policy"])
    assert len(table) == 8 and table.attrs["skipped"] == ["cells/t__load-0.5/LC/seed-0",
                                                          "cells/t__load-0.5/FaultAwareOTF-R/seed-0"]
    shared, own = table.loc[("u__severity-0.01_telemetry-none", "LC")], table.loc[("s__severity-0.01", "LC")]
    assert shared["run_dir"] == own["run_dir"] and shared["failure_rate"] == own["failure_rate"]
    assert shared["cell"] != own["cell"]


def _cells_while_running(study_dir) -> int:
    """Finished cells of a study still running: its tasks remove their scratch folders while the
    walk goes on (a folder seen can be gone when entered), so a walk that hits one starts over."""
    while True:
        try:
            return len(list(study_dir.rglob("cell.json")))
        except FileNotFoundError:
            continue


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_grid_and_the_same_command_finishes_only_what_is_left(tmp_path, sig):
    """Ctrl-C, and SIGTERM (a scheduler's stop, a CI timeout) alike: ray.init sets its own SIGTERM
    handler over the command's, which core/util/ray_start.py puts back; without it SIGTERM ended
    the study by SystemExit, without its "interrupted" line or status 130."""
    spec = {**BASE, "study": {"seeds": [0, 1, 2, 3, 4, 5], "sweeps": [{"name": "s", "axes": {"severity": [0.2, 0.05, 0.01]}}]}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "cli", "study", str(path), "--out", str(tmp_path / "runs"), "--workers", "1"]
    study_dir = tmp_path / "runs" / "tiny_study"
    ray_before = _ray_pids()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and _cells_while_running(study_dir) < 2:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in out, out
    done = len(list(study_dir.rglob("cell.json")))
    assert 2 <= done < 36, out
    if sig == signal.SIGTERM:  # the rest is the same command again, as after Ctrl-C
        time.sleep(2)
        assert not _ray_pids() - ray_before, "a Ray process of the stopped study outlived it"
        return
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    said = " ".join((res.stdout + res.stderr).split())  # rich wraps lines at the terminal's width
    assert f"{36 - done} run(s) done" in said and f"{done} were already finished" in said, said
    assert not (study_dir / ".partial").exists()  # nor the tasks' scratch space under it
    assert len(list(study_dir.rglob("cell.json"))) == 36
    time.sleep(2)  # Ray's processes exit right after ray.shutdown() returns
    assert not _ray_pids() - ray_before, "a Ray process of the study outlived it"


def _ray_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "raylet|gcs_server|ray::"], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def _sigint_default() -> None:
    """In the child: Ctrl-C's default disposition. A shell's background job (`cmd &`, as CI
    runners and nohup start them) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: the test would send a signal nobody can receive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_cell_whose_worker_dies_leaves_no_scratch_behind(tmp_path):
    """A stopped study cancels nothing: its workers end, and each one's child removes the scratch
    directory of the cell it was running (study/runner.py). Here the worker is a plain process,
    SIGKILLed mid-cell."""
    spec = parse_spec({**BASE, "workload": {**BASE["workload"], "duration_s": 3600}}, "long.yaml")
    scratch = tmp_path / "scratch"
    code = ("import sys\n"
            "from study.runner import run_cell_in_clean_process\n"
            "run_cell_in_clean_process(sys.stdin.read(), 'LC', 0, None, sys.argv[1])\n")
    worker = subprocess.Popen([sys.executable, "-c", code, str(scratch)], cwd=REPO, stdin=subprocess.PIPE, text=True)
    try:
        worker.stdin.write(spec.model_dump_json())
        worker.stdin.close()
        deadline = time.monotonic() + 60
        # the worker's directory, and the child's run inside it: the cell is running
        while not list(scratch.glob("testbed-cell-*/testbed-cell-*")):
            assert worker.poll() is None and time.monotonic() < deadline, "the cell never started"
            time.sleep(0.1)
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 10
        while list(scratch.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(scratch.iterdir()), list(scratch.rglob("*"))[:5]
    finally:
        worker.kill()


def test_a_run_recorded_before_a_spec_field_was_added_at_its_default_still_counts_as_finished(tmp_path):
    """A new spec field with a default changes every cell's run id but no record: the run recorded
    before it, its run.json's spec parsed again today, is the cell's run; a recorded value that
    differs (or a field that no longer parses) is not."""
    from study.table import cell_finished
    from simulator.run import run_sim

    spec = _spec({"sweeps": [{"name": "s", "axes": {"severity": [0.01]}}]})
    cell = expand_study(spec)[0]
    run_dir = run_sim(cell.spec, cell.policy, cell.seed, tmp_path)
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text())
    router = meta["spec"]["router"]
    dropped = next(iter(router))  # a field the spec leaves at its default: as if recorded before it existed
    del router[dropped]
    meta_path.write_text(json.dumps(meta))
    (run_dir / "cell.json").write_text(json.dumps({"run": "recorded-under-an-older-id", "policy": cell.policy,
                                                   "seed": cell.seed}))
    assert cell_finished(run_dir, cell.run)
    meta["spec"]["deadline_s"] = meta["spec"]["deadline_s"] + 1.0  # another run's inputs
    meta_path.write_text(json.dumps(meta))
    assert not cell_finished(run_dir, cell.run)
    meta["spec"]["deadline_s"] -= 1.0
    meta["spec"]["router"]["a_field_renamed_since"] = 1  # no longer parses: runs again
    meta_path.write_text(json.dumps(meta))
    assert not cell_finished(run_dir, cell.run)
