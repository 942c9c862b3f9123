"""A calibration under the run's conditions (analysis/checks/refit.py), fitted on runs whose
parameters are known: the simulator's own runs of a calibration, which run its very models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.checks.refit import LEVELS, MIN_SAMPLES, fit_level, fit_run_conditions
from builders import fixed, parse, poisson, small_spec_dict
from core.calibration.fit import (LOAD_SEEDS, Calibration, EngineCalibration, NetworkCalibration, apply_calibration,
                              calibration_load, load_calibration, save_calibration)
from simulator.run import run_sim

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
NETWORK = dict(kv_bytes_per_token=8192, kv_wire_overhead=1.0, unshaped_gbps=8.0)
# What the engines alone measured: the slopes both share, and levels the run does not have.
ISOLATED = dict(prefill_tokens_per_s=5000.0, prefill_overhead_s=0.002, decode_step_base_s=0.004,
                decode_step_per_seq_s=0.0005, decode_step_per_kv_token_s=2e-6, decode_kv_tokens=32768,
                kv_block_tokens=128, kv_transfer_latency_s=0.0)
# What the run's conditions add: every level higher, and a control path.
TRUTH = ISOLATED | dict(prefill_overhead_s=0.006, decode_step_base_s=0.0065, kv_transfer_latency_s=0.001,
                        prefill_call_s=0.004, decode_call_s=0.0025, decode_join_s=0.0045)


def calibration(engine: dict) -> Calibration:
    return Calibration(created="2026-11-27T00:00:00+00:00", source={"host": "test"},
                       engine=EngineCalibration(**engine), network=NetworkCalibration(**NETWORK), fits={})


def spec(**over):
    """A load like the twin's: a request every second or so, prompts of one to a few KV blocks."""
    return parse(small_spec_dict(workload={"arrival": poisson(2.0), "prompt": {"kind": "uniform", "low": 200,
                                                                                  "high": 700},
                                           "output": fixed(12), "max_requests": 80}, **over))


@pytest.fixture(scope="module")
def load(tmp_path_factory) -> Path:
    """The calibration load run in the simulator calibrated to TRUTH: the runs a fit sees."""
    root = tmp_path_factory.mktemp("load")
    job, policies, seeds = calibration_load(spec(faults=[{"kind": "link", "pods": [1], "residual_bw": 0.1,
                                                           "start_s": 5.0, "duration_s": 5.0}]))
    assert job.faults == [] and seeds == list(LOAD_SEEDS) and policies == ["LC"]
    for seed in seeds:
        run_sim(apply_calibration(job, calibration(TRUTH)), policies[0], seed, root)
    return root


def test_the_levels_and_legs_are_found_where_the_run_put_them(load):
    cal = fit_run_conditions([load], calibration(ISOLATED))
    e = cal.engine
    # Prefill, pull and the two calls are the simulator's own models, exactly: found to 1e-6.
    for name in ("prefill_overhead_s", "kv_transfer_latency_s", "prefill_call_s", "decode_call_s"):
        assert getattr(e, name) == pytest.approx(TRUTH[name], rel=1e-6), name
    # The decode step and the first token's leg nearly so: the check's reconstruction counts half
    # of each sequence's output as KV (the simulator the prompt alone: 2 us x 6 tokens against
    # steps of 7 ms and more) and a request in its batch from its pull's end, not from its join.
    assert e.decode_step_base_s == pytest.approx(TRUTH["decode_step_base_s"], rel=0.03)
    assert e.decode_join_s == pytest.approx(TRUTH["decode_join_s"], rel=0.1)
    # the slopes and everything else stay the isolated calibration's
    for name in ("prefill_tokens_per_s", "decode_step_per_seq_s", "decode_step_per_kv_token_s", "kv_block_tokens"):
        assert getattr(e, name) == ISOLATED[name]
    assert cal.network == calibration(ISOLATED).network
    # each fit says what it did, and where
    for stage, name in LEVELS.items():
        f = cal.fits[f"run_{stage}"]
        assert f.n >= MIN_SAMPLES and abs(f.params["rel_residual_p50"]) < 1e-6, stage
        assert f.params[f"isolated_{name}"] == calibration(ISOLATED).engine.model_dump()[name]
        assert f.params["rel_residual_p50_before"] < 0, stage  # the isolated calibration was fast on each
    assert cal.conditions == "run" and calibration(ISOLATED).conditions == "isolated"
    cond = cal.source["conditions"]
    assert cond["kind"] == "run" and len(cond["runs"]) == len(LOAD_SEEDS) and cal.source["host"] == "test"
    # and the file round-trips
    back = load_calibration(save_calibration(cal, load / "fitted.json"))
    assert back.model_dump_json() == cal.model_dump_json()  # (a level's fit has no R2: NaN is not == NaN)


def test_a_run_faster_than_the_slopes_keeps_no_negative_cost(load):
    """Where the isolated slopes alone predict more than the run took, the level is 0 and the
    residual left is reported, not hidden."""
    slower = ISOLATED | dict(prefill_tokens_per_s=2000.0)  # predicts 2.5x the run's prefill
    cal = fit_run_conditions([load], calibration(slower))
    f = cal.fits["run_prefill"]
    assert cal.engine.prefill_overhead_s == 0.0 and f.params["rel_residual_p50"] > 0.5


def test_a_stage_with_too_few_samples_keeps_its_isolated_level(tmp_path):
    short = spec()
    short = short.model_copy(update={"workload": short.workload.model_copy(update={"max_requests": MIN_SAMPLES - 2})})
    run_sim(apply_calibration(short, calibration(TRUTH)), "LC", 0, tmp_path)
    cal = fit_run_conditions([tmp_path], calibration(ISOLATED))
    assert cal.engine == calibration(ISOLATED).engine and not any(k.startswith("run_") for k in cal.fits)
    assert cal.conditions == "isolated"  # nothing fitted on the run: the host model stays on
    assert all(v["kept"] for v in cal.source["conditions"]["levels"].values())
    with pytest.raises(ValueError, match="nothing: no such file or directory"):
        fit_run_conditions([tmp_path / "nothing"], calibration(ISOLATED))


def test_the_level_search_finds_the_crossing_and_its_bounds():
    assert fit_level(lambda c: c - 0.3, 0.0, 0.1) == pytest.approx(0.3)  # the upper bound grows
    assert fit_level(lambda c: c + 1.0, 0.0, 1.0) == 0.0  # already over at the lower bound
    with pytest.raises(ValueError, match="no level"):
        fit_level(lambda c: -1.0, 0.0, 1.0)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_calibrate_fits_named_runs_without_engines(load, tmp_path):
    iso = save_calibration(calibration(ISOLATED), tmp_path / "isolated.json")
    out = tmp_path / "fitted.json"
    res = _cli("calibrate", "--fit-runs", load, "--calibration", iso, "--out", out)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["engine"]["prefill_call_s"] == pytest.approx(TRUTH["prefill_call_s"])
    assert "decode_join_s" in res.stdout and "under the run" in res.stdout
    bad = _cli("calibrate", "--fit-runs", load, "--out", tmp_path / "x.json")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--calibration" in bad.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_spread_of_calibrations_is_per_parameter():
    from analysis.checks.refit import SPREAD_PARAMS, calibration_spread

    cals = [calibration(ISOLATED | {"decode_step_base_s": b, "prefill_call_s": c}) for b, c in
            ((0.004, 0.0), (0.005, 0.002), (0.006, 0.004))]
    t = calibration_spread(cals).set_index("parameter")
    assert list(t.index) == list(SPREAD_PARAMS)
    base = t.loc["engine.decode_step_base_s"]
    assert [base["cal_1"], base["cal_2"], base["cal_3"]] == [0.004, 0.005, 0.006]
    assert base["mean"] == pytest.approx(0.005) and base["sd"] == pytest.approx(0.001)
    assert base["cv"] == pytest.approx(0.2) and base["max_over_min"] == pytest.approx(1.5)
    assert pd.isna(t.loc["engine.prefill_call_s", "max_over_min"])  # one calibration measured 0
    assert t.loc["engine.prefill_tokens_per_s", "sd"] == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        calibration_spread(cals[:1])


def test_a_calibration_under_the_run_does_not_share_the_host_twice():
    """Its levels were measured on engines that shared the host already: the simulator's host model
    stays off for it, and on for the engines-alone calibration of the same host."""
    from core.calibration.fit import HostCalibration

    host = HostCalibration(cores=2.0, engines=4, hosts=1, gpus_per_engine=0, shared=True,
                           demand={"hold": 0.5, "pull": 0.5, "decode": 2.0, "background": 0.3})
    isolated = calibration(ISOLATED).model_copy(update={"host": host})
    under_run = isolated.model_copy(update={"conditions": "run"})
    assert apply_calibration(spec(), isolated).engine.host_cores == 2.0
    assert apply_calibration(spec(), isolated).engine.host_decode_cores == 2.0
    assert apply_calibration(spec(), under_run).engine.host_cores is None
