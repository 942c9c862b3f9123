"""Calibration checked against the run (analysis/checks/calibration.py): each fit against a hand-built
run's quiet requests, with the predictions worked out by hand here from the fit's parameters."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from analysis.run.data import load_run
from analysis.run.summary import discover_runs
from analysis.checks.calibration import (
    CALIBRATION_MISS,
    CHECKED,
    CSV_NAME,
    calibration_check,
    predicted_tpot_s,
    print_calibration_check,
    quiet_residuals,
    write_calibration_check,
)
from core.calibration.fit import (Calibration, EngineCalibration, NetworkCalibration, apply_calibration, load_calibration,
                              save_calibration)
from core.records import FaultEvent, HostRecord, RequestRecord, RunWriter
from builders import fixed, link_fault, parse, poisson, small_spec_dict
from simulator.run import run_sim

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

# The fit under test, in round numbers: prefill 20 ms + 1 ms a token; decode step 10 ms + 2 ms a
# sequence + 1 us a KV token; a pull 5 ms + 1 ns a byte (8 Gbit/s = 1e9 bytes/s).
ENGINE = dict(prefill_tokens_per_s=1000.0, prefill_overhead_s=0.02, decode_step_base_s=0.01,
              decode_step_per_seq_s=0.002, decode_step_per_kv_token_s=1e-6, decode_kv_tokens=32768,
              kv_block_tokens=128, kv_transfer_latency_s=0.005)
NETWORK = dict(kv_bytes_per_token=8192, kv_wire_overhead=1.0, unshaped_gbps=8.0)
SPEC = {"deadline_s": 30.0, "engine": {"prefill_tokens_per_s": 1000.0, "prefill_overhead_s": 0.02}}
FAULT = (50.0, 60.0)  # pod 1's link, fault 0
PRESSED = (20.0, 25.0)  # the host under CPU pressure (PSI "some" = 1) only then

# Hand predictions.
BATCH_PREFILL = 0.02 + (300 + 200) / 1000  # R0 and R1 prefill together: 0.52 s
ALONE_PREFILL = 0.02 + 400 / 1000  # R2: 0.42 s
# R0 and R1 decode together on worker 2 (11 tokens each: KV = prompt + half the output)
BATCH_STEP = 0.01 + 0.002 * 2 + 1e-6 * ((300 + 5.5) + (200 + 5.5))  # 0.014511 s
ALONE_STEP = 0.01 + 0.002 * 1 + 1e-6 * (400 + 10.5)  # R2 alone (21 tokens): 0.0124105 s
PULL = 0.005 + 2_000_000 / 1e9  # 2 MB over the unshaped link: 0.007 s


# The control path's legs, for the simulator's run: 3 ms to the prefill engine, 2 ms to the decode
# engine, 4 ms for the decode scheduler to take a pulled request in.
LEGS = dict(prefill_call_s=0.003, decode_call_s=0.002, decode_join_s=0.004)


def calibration(**engine: float) -> Calibration:
    return Calibration(created="2026-11-25T00:00:00+00:00", source={}, engine=EngineCalibration(**ENGINE | engine),
                       network=NetworkCalibration(**NETWORK), fits={})


def request(rid: int, arrival: float, prompt: int, out: int, prefill: float, pull: float, tpot: float, *,
            start: float | None = None, dw: int = 2, outcome: str = "ok") -> RequestRecord:
    """A request on prefill worker 0 (pod 0) and decode worker ``dw``: its prefill from ``start``
    (default: its arrival) for ``prefill`` s, its pull right after for ``pull`` s, its first token
    then and ``out - 1`` more at ``tpot`` s each."""
    p0 = arrival if start is None else start
    k0 = p0 + prefill
    first = k0 + pull
    ok = outcome == "ok"
    return RequestRecord(rid, arrival, prompt, out, prefill_worker=0, decode_worker=dw, prefill_pod=0,
                         decode_pod=1, routed_s=arrival, prefill_start_s=p0, prefill_end_s=k0, kv_start_s=k0,
                         kv_end_s=first, first_token_s=first, end_s=first + (out - 1) * tpot if ok else math.nan,
                         outcome=outcome, failed_stage=None if ok else "decode", kv_bytes=2_000_000)


def host_samples() -> list[HostRecord]:
    """Workers 0 and 2, every 0.5 s over 70 s: CPU pressure only within PRESSED."""
    rows = []
    for w, role in ((0, "prefill"), (2, "decode")):
        for t in np.arange(0.0, 70.5, 0.5):
            pressure = float(np.clip(t, *PRESSED) - PRESSED[0])
            rows.append(HostRecord(float(t), w, w // 2, role, cpu_s=0.5 * t, wait_s=0.0, pressure_s=pressure,
                                   busy_s=t, steal_s=0.0))
    return rows


def write(d: Path, policy: str, seed: int, requests: list[RequestRecord]) -> Path:
    w = RunWriter(d, {"world": "testbed", "scenario": "link", "policy": policy, "seed": seed, "spec": SPEC},
                  flush_s=1e9)
    for rec in [*requests, FaultEvent(FAULT[0], 0, "apply", "link", 1, "pod1:eth0/egress", 0.01),
                FaultEvent(FAULT[1], 0, "clear", "link", 1, "pod1:eth0/egress", 0.01), *host_samples()]:
        w.write(rec)
    w.close()
    return d


def lc_run() -> list[RequestRecord]:
    """Quiet requests whose prefill the fit puts 20-25% too slow, whose steps it puts 10% too fast
    and whose lone pulls it puts 10% too slow; and five that are not quiet, each off by far more."""
    return [
        # R0 and R1: one prefill batch (same worker, same start and end), one decode batch; their
        # pulls share the prefill NIC (twice a lone pull's time): not the lone pull the fit is of
        request(0, 1.0, 300, 11, BATCH_PREFILL / 1.2, 2 * PULL / 1.1, BATCH_STEP / 0.9),
        request(1, 1.0, 200, 11, BATCH_PREFILL / 1.2, 2 * PULL / 1.1, BATCH_STEP / 0.9),
        # R2 alone: its prefill starts later (queued), its decode on worker 3 has no company
        request(2, 4.0, 400, 21, ALONE_PREFILL / 1.25, PULL / 1.1, ALONE_STEP / 0.9, start=4.5, dw=3),
        # R3 inside the fault window; R4 arrives before it and ends inside it
        request(3, 55.0, 400, 11, 5.0, 3.0, 0.5, dw=4),
        request(4, 48.0, 400, 11, 0.1, 3.0, 0.5, dw=5),
        # R5 host-stalled: prefill 4.76x its engine's time while the host was pressed all its life
        request(5, 20.0, 400, 11, 2.0, 0.1, 0.2, dw=6),
        # R6 timed out (not ok); R7 a 1-token output (no step to measure), its prefill slow
        request(6, 30.0, 400, 11, 5.0, 3.0, 0.5, dw=7, outcome="timeout"),
        request(7, 10.0, 100, 1, 3.0, PULL / 1.1, 0.5, dw=8),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cc")
    write(root / "LC" / "seed-0", "LC", 0, lc_run())
    # another run: one quiet request whose prefill the fit puts 50% too slow
    write(root / "OTF-R" / "seed-1", "OTF-R", 1, [request(0, 1.0, 400, 21, ALONE_PREFILL / 1.5, PULL / 1.1,
                                                          ALONE_STEP, dw=3)])
    return root


@pytest.fixture(scope="module")
def table(runs: Path, tmp_path_factory) -> pd.DataFrame:
    # the dict `testbed compare` holds: a calibration file read back and dumped
    path = save_calibration(calibration(), tmp_path_factory.mktemp("cal") / "calibration.json")
    return calibration_check([runs], load_calibration(path).model_dump())


def row(table: pd.DataFrame, policy: str, stage: str) -> pd.Series:
    sel = table[(table["policy"] == policy) & (table["stage"] == stage)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_quiet_requests_leave_out_the_fault_window_the_host_stalled_and_the_failed(table):
    # ok: 7 of 8 (R6 timed out); quiet: R0, R1, R2 (R3, R4 overlap the fault, R5 is host-stalled) and R7
    assert row(table, "LC", "prefill")[["n_ok", "n_quiet"]].tolist() == [7, 4]
    # R0's and R1's pulls shared a NIC: R2's and R7's are checked
    assert row(table, "LC", "kv_pull")[["n_ok", "n_quiet"]].tolist() == [7, 2]
    # R7's single token has no step: out of both counts
    assert row(table, "LC", "decode_step")[["n_ok", "n_quiet"]].tolist() == [6, 3]


def test_a_prefill_batch_is_predicted_from_its_summed_tokens_and_a_miss_of_20_percent_is_flagged(table):
    r = row(table, "LC", "prefill")
    # residuals: R0, R1 +20% (their batch of 500 tokens, 0.52 s), R2 +25% (alone, 0.42 s), R7 below
    r7 = ((0.02 + 100 / 1000) - 3.0) / 3.0
    rel = sorted([0.2, 0.2, 0.25, r7])
    assert r["rel_residual_p50"] == pytest.approx((0.2 + 0.2) / 2)
    assert r["abs_rel_residual_p90"] == pytest.approx(np.percentile(np.abs(rel), 90))
    assert r["predicted_p50_s"] == pytest.approx((0.42 + 0.52) / 2)  # of 0.12, 0.42, 0.52, 0.52
    assert r["measured_p50_s"] == pytest.approx(0.52 / 1.2)  # of 0.336, 0.433, 0.433, 3.0
    assert r["flag"] and 0.2 > CALIBRATION_MISS


def test_decode_steps_follow_the_batch_and_a_miss_of_10_percent_is_not_flagged(table):
    r = row(table, "LC", "decode_step")
    # R0 and R1 in a batch of 2, R2 alone: each measured TPOT is its step / 0.9
    assert r["predicted_p50_s"] == pytest.approx(BATCH_STEP)  # of ALONE_STEP, BATCH_STEP, BATCH_STEP
    assert r["measured_p50_s"] == pytest.approx(BATCH_STEP / 0.9)
    assert r["rel_residual_p50"] == pytest.approx(0.9 - 1)
    assert not r["flag"]


def test_lone_pulls_follow_the_unshaped_link(table):
    r = row(table, "LC", "kv_pull")
    # R2 and R7 at PULL / 1.1 (R0 and R1, at -45% each, would have flagged it)
    assert r["predicted_p50_s"] == pytest.approx(PULL)
    assert r["measured_p50_s"] == pytest.approx(PULL / 1.1)
    assert r["rel_residual_p50"] == pytest.approx(0.1) and r["abs_rel_residual_p90"] == pytest.approx(0.1)
    assert not r["flag"]


def test_pooled_rows_take_every_runs_quiet_requests(table):
    r = row(table, "all", "prefill")
    assert pd.isna(r["seed"]) and r["n_quiet"] == 5 and r["n_ok"] == 8
    # LC's residuals and OTF-R's +50%
    r7 = ((0.02 + 100 / 1000) - 3.0) / 3.0
    assert r["rel_residual_p50"] == pytest.approx(np.median([0.2, 0.2, 0.25, r7, 0.5]))
    other = row(table, "OTF-R", "decode_step")
    assert other["seed"] == 1 and other["rel_residual_p50"] == pytest.approx(0.0) and not other["flag"]


def test_the_step_model_is_averaged_per_token_over_a_changing_batch():
    """A: decoding 0-1 s; B: in the batch from its KV's arrival at 0.5 s (its first token at 0.6 s),
    a timeout given up at its deadline (arrival + 30 s). Over A's window: 0.5 s alone, 0.5 s beside
    B. A's tokens' mean step is the window over the steps made."""
    req = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.0], "prompt_tokens": [1000, 3000],
                        "output_tokens": [10, 10], "decode_worker": [2, 2], "kv_end_s": [0.0, 0.5],
                        "first_token_s": [0.0, 0.6], "end_s": [1.0, math.nan], "outcome": ["ok", "timeout"]})
    alone = 0.01 + 0.002 + 1e-6 * 1005
    beside = 0.01 + 0.002 * 2 + 1e-6 * (1005 + 3005)
    got = predicted_tpot_s(req, EngineCalibration(**ENGINE), SPEC, np.array([True, False]))
    assert got[0] == pytest.approx(1.0 / (0.5 / alone + 0.5 / beside))
    assert math.isnan(got[1])


def test_a_calibration_object_and_its_dump_give_the_same_table(runs, table):
    assert calibration_check([runs], calibration()).equals(table)
    with pytest.raises(ValueError, match="not a calibration"):
        calibration_check([runs], {"engine": ENGINE})


def test_the_table_is_printed_with_misses_marked_and_written(table, tmp_path):
    out = io.StringIO()
    print_calibration_check(table, Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    prefill = [x for x in lines if "LC" in x and "prefill" in x]
    steps = [x for x in lines if "LC" in x and "decode_step" in x]
    assert "MISS" in prefill[0] and "MISS" not in steps[0]
    path = write_calibration_check(table, tmp_path)
    assert path.name == CSV_NAME
    back = pd.read_csv(path)
    assert back["flag"].tolist() == table["flag"].tolist() and len(back) == 3 * len(CHECKED)


def test_the_simulators_own_run_of_the_calibration_checks_out(tmp_path):
    """The simulator runs the very models the check predicts from, so on its quiet requests (prefill
    batches, decode batches that change under way, lone pulls, the control path's legs) the prefill,
    pull and call residuals are nil. Its decode steps and first tokens nearly so: it counts a
    sequence's prompt alone as KV where the check adds half its output (1 us x 5 tokens a sequence
    against steps of 12 ms and more), and it stamps a first token one step, at the batch's step when
    the request joined, after the join, which is off where the batch changes within that step; the
    check counts a request in its batch from its pull's end, the simulator from its join 4 ms later."""
    cal = calibration(**LEGS)
    spec = apply_calibration(parse(small_spec_dict(
        workload={"arrival": poisson(6.0), "prompt": fixed(256), "output": fixed(10), "max_requests": 120},
        faults=[link_fault([1], 0.05, 5.0, 2.0)])), cal)
    run_sim(spec, "LC", 0, tmp_path)
    table = calibration_check([tmp_path], cal)
    pooled = table[table["policy"] == "all"].set_index("stage")
    assert (pooled["n_quiet"] < pooled["n_ok"]).all()  # the fault's left out
    # at 6 requests/s a prefill worker is often busy: a third of the requests find it idle
    assert (pooled.drop("prefill_call")["n_quiet"] > 50).all() and pooled.loc["prefill_call", "n_quiet"] > 20
    res = quiet_residuals(load_run(discover_runs([tmp_path])[0]), cal)
    assert res.loc[res["stage"] == "prefill", "predicted_s"].max() >= 0.02 + 3 * 256 / 1000  # batches of 3
    assert pooled.loc[["prefill", "kv_pull", "prefill_call", "decode_call"], "abs_rel_residual_p90"].max() < 1e-9
    assert abs(pooled.loc["decode_step", "rel_residual_p50"]) < 1e-3
    assert pooled.loc["decode_step", "abs_rel_residual_p90"] < 0.01
    assert abs(pooled.loc["first_token", "rel_residual_p50"]) < 1e-3
    # and the same run judged against a calibration without the legs misses them whole
    without = calibration_check([tmp_path], calibration()).query("policy == 'all'").set_index("stage")
    assert (without.loc[["prefill_call", "decode_call"], "rel_residual_p50"] == -1.0).all()


def test_a_run_the_calibration_was_fitted_on_is_marked_and_never_judged(runs):
    """A calibration under the run's conditions names its fitting runs (source.conditions.runs): its
    residual there is 0 by construction, so that run is marked and left out of the pooled row."""
    cal = calibration().model_dump()
    cal["source"] = {**(cal.get("source") or {}), "conditions": {"kind": "run", "runs": [str(runs / "LC" / "seed-0")]}}
    t = calibration_check([runs], cal)
    lc = t[t["policy"] == "LC"]
    assert lc["fitted_on"].all() and not lc["flag"].any() and (lc["verdict"] == "fitted on").all()
    pooled = row(t, "all", "prefill")
    # only OTF-R's quiet request judged: its +50%, one run (the unit), which decides nothing
    assert pooled["n_quiet"] == 1 and pooled["rel_residual_p50"] == pytest.approx(0.5)
    assert pooled["n_runs"] == 1 and pooled["verdict"] == "undecided" and not pooled["flag"]


def test_the_pooled_flag_is_the_rules_verdict_over_the_runs_medians(table):
    # two runs' median prefill residuals, +20% and +50%: two values cannot place their mean (t(0.95, 1))
    pooled = row(table, "all", "prefill")
    assert pooled["n_runs"] == 2 and pooled["verdict"] == "undecided" and not pooled["flag"]
    assert not table.loc[table["policy"] != "all", "fitted_on"].any()
