"""analysis of a study: the needless-deflection metric on hand-built tables, per-cell metrics cached next to
each run, the cells table of a study directory built from real tiny simulations, its figures and report."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from analysis.run.metrics import fault_window, needless_deflection, needless_deflection_ratio, pod_exposure
from analysis.run.data import load_run
from builders import faulted_spec_dict, link_fault, poisson
from study.table import (
    StudyError,
    cell_metrics,
    failure_reduction,
    load_study,
    select_cells,
    separation,
    series_frame,
    study_summary,
)
from study.plots import FigureSkipped, fig_conditions, fig_map, write_study_plots
from study.report import study_report
from analysis.run.scalars import code_note
from core.spec.model import parse_spec
from study.grid import expand_study
from simulator.run import run_sim
from cli.main import main

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

T975_1 = 12.7062  # Student t quantile 0.975, 1 degree of freedom (printed tables)

# --------------------------------------------------------------------------- hand-built tables


def requests(rows: list[tuple[float, int, int, str]]) -> pd.DataFrame:
    """(arrival_s, prefill_pod, decode_pod, outcome) -> the request columns the metrics read."""
    a, pp, dp, out = zip(*rows) if rows else ((), (), (), ())
    return pd.DataFrame({"arrival_s": np.asarray(a, float), "prefill_pod": np.asarray(pp, np.int64),
                         "decode_pod": np.asarray(dp, np.int64), "outcome": list(out)})


def faults(pods: tuple[int, ...] = (0,), start: float = 10.0, end: float = 20.0) -> pd.DataFrame:
    rows = [(start, i, "apply", p) for i, p in enumerate(pods)] + [(end, i, "clear", p) for i, p in enumerate(pods)]
    t, fid, ev, pod = zip(*rows)
    return pd.DataFrame({"time_s": t, "fault_id": fid, "event": ev, "pod": np.asarray(pod, np.int64)})


def spread(t0: float, n_touch: dict[int, int], n_other: int, failed: dict[int, int] | None = None) -> list:
    """Requests in [t0, t0 + 10): n_touch[d] with prefill on pod d (the first failed[d] of them fail),
    then n_other on pods 2 -> 3, which no test degrades."""
    failed = failed or {}
    rows, i = [], 0
    for d, n in n_touch.items():
        for k in range(n):
            rows.append((t0 + 0.1 * i, d, 3, "timeout" if k < failed.get(d, 0) else "ok"))
            i += 1
    rows += [(t0 + 0.1 * (i + k), 2, 3, "ok") for k in range(n_other)]
    return rows


def policy_run() -> pd.DataFrame:
    """Before [10, 20): 4 of 10 routed requests on pod 0 (s0 = 0.4); during it: 1 of 10 (sP = 0.1)."""
    return requests(spread(0.0, {0: 4}, 6) + spread(10.0, {0: 1}, 9))


def lc_run(n_fail_on_0: int) -> pd.DataFrame:
    """LC keeps sending 5 of 10 requests to pod 0 during the fault; n_fail_on_0 of them fail."""
    return requests(spread(0.0, {0: 4}, 6) + spread(10.0, {0: 5}, 5, {0: n_fail_on_0}))


def test_pod_exposure_counts_touching_and_failed_requests_per_degraded_pod():
    req = requests(spread(0.0, {0: 4, 1: 2}, 4) + spread(10.0, {0: 3, 1: 1}, 6, {0: 2, 1: 1})
                   + [(12.0, -1, -1, "rejected")] + [(25.0, 0, 3, "timeout")])
    exp = pod_exposure(req, fault_window(faults((0, 1)), req)).set_index("pod")
    # the rejected request was never routed; the one at 25 s is after the window
    assert exp.loc[0].to_dict() == {"n_routed_pre": 10, "n_touch_pre": 4, "n_fail_pre": 0,
                                    "n_routed_during": 10, "n_touch_during": 3, "n_fail_during": 2}
    assert exp.loc[1, ["n_touch_pre", "n_touch_during", "n_fail_during"]].tolist() == [2, 1, 1]
    assert pod_exposure(req, None).empty


@pytest.mark.parametrize("lc_fails,expected", [
    (0, 0.3 / 0.4),  # LC never failed on pod 0: every request moved away would have been fine there
    (5, 0.0),  # LC failed everything on pod 0: nothing moved away was needless
    (2, 0.3 * (1 - 2 / 5) / 0.4),
])
def test_needless_deflection_weighs_moved_share_by_lc_success_on_the_pod(lc_fails, expected):
    value = needless_deflection_ratio(policy_run(), faults(), lc_run(lc_fails), faults())
    assert value == pytest.approx(expected)


def test_needless_deflection_sums_over_degraded_pods():
    # pod 0: s0 = 0.4 -> sP = 0.1; pod 1: s0 = 0.2 -> sP = 0.2 (not moved; LC's f there does not matter)
    own = requests(spread(0.0, {0: 4, 1: 2}, 4) + spread(10.0, {0: 1, 1: 2}, 7))
    lc = requests(spread(0.0, {0: 4, 1: 2}, 4) + spread(10.0, {0: 4, 1: 2}, 4, {0: 1, 1: 2}))
    value = needless_deflection_ratio(own, faults((0, 1)), lc, faults((0, 1)))
    assert value == pytest.approx((0.3 * (1 - 1 / 4) + 0.0) / (0.4 + 0.2))


def test_needless_deflection_is_not_forced_to_zero_and_is_nan_without_a_counterfactual():
    # LC measured against itself: nothing moved, so 0
    lc = lc_run(0)
    assert needless_deflection_ratio(lc, faults(), lc, faults()) == 0.0
    # a policy that moved traffic, against an LC run that sent pod 0 nothing during the fault: unknown
    empty_lc = requests(spread(0.0, {0: 4}, 6) + spread(10.0, {}, 10))
    assert math.isnan(needless_deflection_ratio(policy_run(), faults(), empty_lc, faults()))
    # ... unless the policy moved nothing from the pod
    assert needless_deflection_ratio(lc, faults(), empty_lc, faults()) == 0.0
    # no fault, or no traffic on the pod before the fault: nothing to measure
    no_fault = faults().iloc[0:0]
    assert math.isnan(needless_deflection_ratio(policy_run(), no_fault, lc, faults()))
    cold = requests(spread(0.0, {}, 10) + spread(10.0, {0: 1}, 9))
    assert math.isnan(needless_deflection_ratio(cold, faults(), lc, faults()))
    assert math.isnan(needless_deflection(pod_exposure(lc, None), pod_exposure(lc, None)))


def test_failure_reduction_pairs_seeds_and_drops_those_where_the_baseline_never_failed():
    rows = []
    for seed, (falc, faotf) in enumerate([(0.1, 0.05), (0.2, 0.0), (0.0, 0.1)]):
        rows += [{"point": "p", "seed": seed, "severity": 0.01, "policy": "FaultAwareLC", "failure_rate": falc},
                 {"point": "p", "seed": seed, "severity": 0.01, "policy": "FaultAwareOTF-R", "failure_rate": faotf}]
    red = failure_reduction(pd.DataFrame(rows), ["severity"]).iloc[0]
    # seed 0: 1 - 0.05/0.1 = 0.5; seed 1: 1 - 0/0.2 = 1; seed 2 has no baseline failure
    assert (red["mean"], red["n"]) == (pytest.approx(0.75), 2)
    assert red["ci"] == pytest.approx(T975_1 * np.std([0.5, 1.0], ddof=1) / math.sqrt(2), rel=1e-4)


def test_separation_needs_a_factor_three_and_disjoint_intervals():
    assert separation((0.03, 0.005, 5), (0.0, 0.0, 5)) == "holds"
    assert separation((0.03, 0.02, 5), (0.005, 0.01, 5)) == "vanishes"  # 6x, but the intervals overlap
    assert separation((0.02, 0.001, 5), (0.01, 0.001, 5)) == "vanishes"  # only 2x
    assert separation((0.0, 0.0, 5), (0.0, 0.0, 5)) == "vanishes"  # neither fails
    assert separation((0.03, math.nan, 1), (0.0, math.nan, 1)) == "unknown"  # one seed: no interval


# --------------------------------------------------------------------------- a tiny study of real runs

# Simulates in about 0.1 s a cell: 4 pods x 4 workers, pod 0's core links degraded from 20 s to 45 s.
BASE = faulted_spec_dict(
    name="tiny", workload={"arrival": poisson(4.0)}, faults=[link_fault([0], 0.05, 20.0, 25.0)],
    policies=["LC", "FaultAwareLC", "OTF-R", "FaultAwareOTF-R", "OracleAvoidance"],
    metrics={"bin_s": 5.0, "recovery_horizon_s": 10.0})
SEVERITY = {"name": "severity", "axes": {"severity": [0.2, 0.005], "telemetry": ["direct", "none"]}}
LABELS = {"name": "labels", "set": {"health.model": "alert", "severity": 0.005},
          "policies": ["FaultAwareLC", "FaultAwareOTF-R"], "axes": {"label_delay_s": [0, 10], "label_noise": [0, 0.2]}}
SENSITIVITY = {"name": "sensitivity", "policies": ["LC", "OTF-R"], "seeds": [0],
               "axes": {"severity": [0.2, 0.005], "load": [0.5, 1.0], "ttft_timeout_s": [5, 30]}}
# the headline map's kind of sweep (experiments/headline_map.yaml): r x one condition
FAULT_LENGTH = {"name": "fault_length", "policies": ["LC", "OTF-R"], "axes": {"severity": [0.005], "fault_s": [8, 25]}}
# the newer sweeps of experiments/study.yaml: in-flight evidence without telemetry (the map), label misses and
# the prompt's length crossed with the KV a token at one r (figure i)
IN_FLIGHT = {"name": "in_flight", "set": {"telemetry": "none"}, "policies": ["OTF-R"], "seeds": [0],
             "axes": {"severity": [0.005], "in_flight": [False, True]}}
LABEL_MISSES = {"name": "label_misses", "set": {"health.model": "alert", "severity": 0.005},
                "policies": ["FaultAwareLC"], "seeds": [0], "axes": {"label_miss": [0, 1.0]}}
LENGTHS = {"name": "lengths", "set": {"severity": 0.005}, "policies": ["LC"], "seeds": [0],
           "axes": {"kv_bytes_per_token": [65536], "prompt_scale": [0.5, 1]}}
AXES = ["severity", "telemetry", "label_delay_s", "label_noise", "load", "ttft_timeout_s", "fault_s", "in_flight",
        "label_miss", "kv_bytes_per_token", "prompt_scale"]


def write_study(root: Path, cells, unrun=(), unfinished=(), cache=True) -> Path:
    """A study directory as the grid runner leaves it: study.json listing every cell; each run cell in
    cells/<point>/<policy>/seed-<seed> (run_sim's layout with out = cells, spec name = point) with
    cell.json, except ``unfinished`` (ran, no cell.json) and ``unrun`` (nothing on disk). A cell that shares
    another's run (study/grid.py) is not run again: it reads the other's directory."""
    root.mkdir(parents=True)
    for c in cells:
        if c.cell in unrun or c.shared:
            continue
        run_dir = run_sim(c.spec, c.policy, c.seed, root / "cells")
        assert run_dir == root / c.run_dir
        if cache:
            cell_metrics(run_dir)  # as the runner's task does
        if c.cell not in unfinished:
            (run_dir / "cell.json").write_text(json.dumps({**c.index_row(), "wall_s": 0.1}))
    index = {"name": "tiny", "axes": AXES, "cells": [c.index_row() for c in cells]}
    (root / "study.json").write_text(json.dumps(index))
    return root


@pytest.fixture(scope="module")
def grid():
    spec = parse_spec({**BASE, "study": {"seeds": [0, 1], "sweeps": [SEVERITY, LABELS, SENSITIVITY, FAULT_LENGTH, IN_FLIGHT,
                                                                LABEL_MISSES, LENGTHS]}})
    return expand_study(spec)


@pytest.fixture(scope="module")
def study(grid, tmp_path_factory) -> Path:
    """The whole grid; one cell never ran, one ran but has no cell.json; half the cells have no
    metrics.json yet (the report must compute it)."""
    root = tmp_path_factory.mktemp("study") / "tiny"
    unrun = next(c.cell for c in grid if c.sweep == "labels")
    unfinished = next(c.cell for c in grid if c.sweep == "sensitivity")
    write_study(root, grid, unrun={unrun}, unfinished={unfinished}, cache=False)
    for i, c in enumerate(grid):
        if i % 2 and c.cell not in (unrun, unfinished):
            cell_metrics(root / c.run_dir)
    return root


@pytest.fixture(scope="module")
def cells(study) -> pd.DataFrame:
    return load_study(study)


def subset(src: Path, dst: Path, grid, keep) -> Path:
    """A study holding only the cells ``keep`` accepts (copied from ``src``)."""
    chosen = [c for c in grid if keep(c)]
    dst.mkdir(parents=True)
    for c in chosen:
        if (src / c.run_dir).is_dir() and not (dst / c.run_dir).exists():  # cells may share a run
            shutil.copytree(src / c.run_dir, dst / c.run_dir)
    (dst / "study.json").write_text(json.dumps({"name": "sub", "axes": AXES, "cells": [c.index_row() for c in chosen]}))
    return dst


def test_load_study_has_a_row_per_finished_cell_with_axes_metrics_and_derived_columns(grid, study, cells):
    assert len(cells) == len(grid) - 2 and cells.attrs["n_cells"] == len(grid)
    assert len(cells.attrs["skipped"]) == 2
    assert set(cells.attrs["skipped"]).isdisjoint(cells["run_dir"].map(lambda d: str(Path(d).relative_to(study))))
    for col in ["cell", "point", "sweep", "policy", "seed", *AXES, "failure_rate", "degraded_availability",
                "resilience_index", "traffic_deflection_ratio", "needless_deflection_ratio", "gap_failure_rate"]:
        assert col in cells.columns, col
    assert cells["cell"].is_unique
    # axes a cell's sweep does not vary are NaN (labels set severity, but as a fixed field, not an axis)
    labels = cells.loc[cells["sweep"] == "labels"]
    assert labels["severity"].isna().all() and labels["label_noise"].notna().all()
    assert set(cells.loc[cells["sweep"] == "severity", "telemetry"]) == {"direct", "none"}
    # every cell now has its metrics.json, including those the fixture left without one
    assert all((Path(d) / "metrics.json").is_file() for d in cells["run_dir"])


def test_needless_deflection_and_gap_are_paired_on_point_and_seed(cells):
    sev = cells.loc[cells["sweep"] == "severity"].set_index(["point", "policy", "seed"])
    # gap to oracle: this cell's failure rate minus the oracle's on the same point and seed
    key = sev.index[0]
    oracle = sev.loc[(key[0], "OracleAvoidance", key[2]), "failure_rate"]
    assert sev.loc[key, "gap_failure_rate"] == pytest.approx(sev.loc[key, "failure_rate"] - oracle)
    assert (sev.xs("OracleAvoidance", level="policy")["gap_failure_rate"] == 0).all()
    # the oracle moves traffic off pod 0 that LC did not fail on, so part of its deflection is needless
    assert sev.xs("OracleAvoidance", level="policy")["needless_deflection_ratio"].notna().all()
    # the cached route gives what the record tables give
    row = cells.loc[(cells["sweep"] == "severity") & (cells["policy"] == "OTF-R")].iloc[0]
    lc_dir = cells.loc[(cells["point"] == row["point"]) & (cells["seed"] == row["seed"])
                       & (cells["policy"] == "LC"), "run_dir"].iloc[0]
    own, lc = load_run(row["run_dir"]), load_run(lc_dir)
    direct = needless_deflection_ratio(own.requests, own.faults, lc.requests, lc.faults)
    assert row["needless_deflection_ratio"] == pytest.approx(direct, nan_ok=True)
    # no LC cell in the labels sweep, no oracle in the sensitivity sweep: NaN, not 0
    assert cells.loc[cells["sweep"] == "labels", "needless_deflection_ratio"].isna().all()
    assert cells.loc[cells["sweep"] == "sensitivity", "gap_failure_rate"].isna().all()


def test_cell_metrics_is_strict_json_cached_and_recomputed_for_a_new_run(cells):
    run_dir = Path(cells.loc[cells["policy"] == "OTF-R", "run_dir"].iloc[0])
    cache = run_dir / "metrics.json"

    def no_nan(token):
        raise AssertionError(f"non-JSON constant {token} in metrics.json")

    raw = json.loads(cache.read_text(), parse_constant=no_nan)
    assert raw["metrics"]["policy"] == "OTF-R" and raw["exposure"][0]["pod"] == 0
    # the series covers the fault: bins before onset, inside it, and after
    s = series_frame(raw)
    assert s["t_rel_s"].min() < 0 < s["t_rel_s"].max() and s["degraded_price"].notna().any()
    # cached: a marked cache comes back as it is
    raw["metrics"]["failure_rate"] = 0.123
    cache.write_text(json.dumps(raw))
    assert cell_metrics(run_dir)["metrics"]["failure_rate"] == 0.123
    # a different run in the same place (another start time): recomputed
    meta = json.loads((run_dir / "run.json").read_text())
    meta["started_at"] = "2000-01-01T00:00:00+00:00"
    (run_dir / "run.json").write_text(json.dumps(meta))
    fresh = cell_metrics(run_dir)
    run = load_run(run_dir)
    assert fresh["metrics"]["failure_rate"] != 0.123
    assert fresh["exposure"] == pod_exposure(run.requests, fault_window(run.faults, run.requests)).to_dict("records")
    # NaN read back as NaN (no request fails, so the timeout share is undefined somewhere in the grid)
    assert any(math.isnan(cell_metrics(d)["metrics"]["timeout_share"]) for d in cells["run_dir"])


def test_select_cells_keeps_figures_from_mixing_sweeps(cells):
    sel = select_cells(cells, AXES, ["severity"], ["telemetry"])
    assert set(sel["sweep"]) == {"severity"}  # the sensitivity cells also vary severity, but load too
    sens = select_cells(cells, AXES, ["severity", "load"], ["ttft_timeout_s", "deadline_s"])
    assert set(sens["sweep"]) == {"sensitivity"}
    assert set(select_cells(cells, AXES, ["label_delay_s", "label_noise"])["sweep"]) == {"labels"}
    assert set(select_cells(cells, AXES, ["severity", "fault_s"])["sweep"]) == {"fault_length"}
    assert set(select_cells(cells, AXES, ["severity", "in_flight"])["sweep"]) == {"in_flight"}
    assert set(select_cells(cells, AXES, ["prompt_scale"], ["kv_bytes_per_token"])["sweep"]) == {"lengths"}


def test_the_figures_of_the_newer_sweeps_draw_their_conditions(study, grid, tmp_path):
    """Figure i draws a column per condition swept at one r (label misses, the prompt's length), figure h
    the in-flight evidence beside the map's conditions; neither draws the other's cells."""
    import matplotlib.image

    newer = load_study(subset(study, tmp_path / "newer", grid, lambda c: c.sweep in ("label_misses", "lengths")))
    assert set(newer["sweep"]) == {"label_misses", "lengths"}
    (tmp_path / "out").mkdir()
    (i,) = fig_conditions(newer, AXES, tmp_path / "out")
    h, w, _ = matplotlib.image.imread(i).shape
    assert w > h  # two columns side by side (one is taller than wide)
    with pytest.raises(FigureSkipped, match="severity"):
        fig_map(newer, AXES, tmp_path / "out")
    flight = load_study(subset(study, tmp_path / "flight", grid, lambda c: c.sweep == "in_flight"))
    assert fig_map(flight, AXES, tmp_path / "out")[0].name == "study_h_map.png"
    with pytest.raises(FigureSkipped, match="label_miss or prompt_scale"):
        fig_conditions(flight, AXES, tmp_path / "out")


def test_a_shorter_fault_fails_no_more_requests_than_a_longer_one(cells):
    """The map's fault-length column (figure h) reads what the fault's length does: LC's requests on the
    degraded pod fail while the pulls' queue stays past the limit, so a fault of 8 s fails no more of
    them than one of 25 s, and the longer one fails some."""
    lc = cells.loc[(cells["sweep"] == "fault_length") & (cells["policy"] == "LC")]
    by = lc.groupby("fault_s")["failure_rate"].mean()
    assert by[25] > 0 and by[8] <= by[25], by


def test_study_report_writes_tables_every_figure_and_counts_unfinished_cells(study, cells, tmp_path):
    buf = io.StringIO()
    summary = study_report(study, tmp_path / "rep", Console(file=buf, width=250))
    names = {p.name for p in (tmp_path / "rep").iterdir()}
    assert {"study_cells.csv", "study_summary.csv", "study_a_failure_vs_r.png", "study_b_reduction.png",
            "study_c_availability_vs_r.png", "study_d_deflection_vs_r.png", "study_f_label_heatmap.png",
            "study_g_sensitivity.png", "study_h_map.png", "study_e_fault_series_telemetry-direct.png",
            "study_e_fault_series_telemetry-none.png", "study_i_conditions.png"} <= names
    for png in (tmp_path / "rep").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(pd.read_csv(tmp_path / "rep" / "study_cells.csv")) == len(cells)
    # one summary row per point x policy; the mean over seeds matches the cells
    assert len(summary) == cells.groupby(["point", "policy"]).ngroups
    row = summary.loc[summary["n_seeds"] == 2].iloc[0]
    seeds = cells.loc[(cells["point"] == row["point"]) & (cells["policy"] == row["policy"]), "failure_rate"]
    assert row["failure_rate_mean"] == pytest.approx(seeds.mean())
    text = buf.getvalue()
    assert "2 of" in text and "not finished" in text and "sweep severity" in text and "needless" in text
    assert "skipped" not in text  # every figure had its cells
    # the runs' commits said where they are not one clean commit (a checkout with changes), else not
    assert (code_note(cells) is not None) == ("clean commit" in text)


def test_each_figure_is_skipped_with_a_note_when_its_cells_are_missing(study, grid, tmp_path):
    labels_only = load_study(subset(study, tmp_path / "labels", grid, lambda c: c.sweep == "labels"))
    paths, notes = write_study_plots(labels_only, AXES, tmp_path / "out1")
    assert [p.name for p in paths] == ["study_f_label_heatmap.png"]
    assert len(notes) == 8 and all("skipped" in n and "\n" not in n for n in notes)
    assert any(n.startswith("b:") and "FaultAwareLC" in n for n in notes)

    lc_oracle = load_study(subset(study, tmp_path / "lc", grid,
                                  lambda c: c.sweep == "severity" and c.policy in ("LC", "OracleAvoidance")))
    paths, notes = write_study_plots(lc_oracle, AXES, tmp_path / "out2")
    assert {p.name for p in paths} == {"study_a_failure_vs_r.png", "study_c_availability_vs_r.png",
                                       "study_d_deflection_vs_r.png"}
    assert {n[0] for n in notes} == {"b", "e", "f", "g", "h", "i"}

    nothing = load_study(subset(study, tmp_path / "none", grid, lambda c: False))
    assert nothing.empty and study_summary(nothing, AXES).empty
    assert write_study_plots(nothing, AXES, tmp_path / "out3")[0] == []


@pytest.mark.parametrize("content,needle", [
    (None, "not a study directory (no study.json)"),
    ("{not json", "not valid JSON"),
    ('{"name": "x", "axes": [], "cells": {}}', "cells must be a list"),
    ('{"name": "x", "axes": [], "cells": [{"cell": "a", "point": "p"}]}', "cells[0]: missing key 'sweep'"),
    ('{"name": "x", "axes": [], "cells": [{"cell": "a", "point": "p", "sweep": "s", "axes": {}, "policy": "LC",'
     ' "seed": "0", "run_dir": "cells/p/LC/seed-0"}]}', "seed must be int"),
])
def test_a_malformed_study_is_a_one_line_error(tmp_path, capsys, content, needle):
    d = tmp_path / "st"
    d.mkdir()
    if content is not None:
        (d / "study.json").write_text(content)
    with pytest.raises(StudyError) as e:
        load_study(d)
    assert needle in str(e.value) and "\n" not in str(e.value)
    if content is not None:  # a folder with study.json is a study for `testbed report`
        assert main(["report", str(d)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]


def test_testbed_report_of_a_study_dir_writes_the_study_report(study, grid, tmp_path, capsys):
    small = subset(study, tmp_path / "labels", grid, lambda c: c.sweep == "labels")
    assert main(["report", str(small)]) == 0
    assert (small / "report" / "study_cells.csv").is_file()  # default: STUDY_DIR/report
    assert (small / "report" / "study_f_label_heatmap.png").is_file()
    assert "sweep labels" in capsys.readouterr().out
    assert main(["report", str(small), str(study / "cells")]) == 2
    assert "report it on its own" in capsys.readouterr().err
