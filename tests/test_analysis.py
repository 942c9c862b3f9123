"""analysis: metrics on hand-built run directories, checked against values worked out by hand."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from analysis.run.metrics import (
    decision_latency,
    degraded_availability,
    degraded_pod_shares,
    failure_composition,
    failure_rate,
    fault_window,
    gap_to_oracle,
    goodput_rps,
    latency_percentiles,
    peak_in_flight,
    resilience_index,
    success_series,
    timeout_share,
    traffic_deflection_ratio,
)
from analysis.run.data import load_run
from analysis.run.scalars import kv_leases, run_metrics
from analysis.run.report import report
from core.spec.metrics import MetricsSpec
from analysis.run.summary import RunDiscoveryError, collect_runs, compare_worlds, discover_runs, mean_ci, summarize
from core.records import DecisionRecord, FaultEvent, PriceRecord, RequestRecord, RunWriter

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

T975 = {2: 4.3027, 3: 3.1824}  # Student t quantile 0.975 for 2 and 3 degrees of freedom (printed tables)


# --------------------------------------------------------------------------- builders


class Reqs:
    """Hand-made request records with consecutive ids."""

    def __init__(self) -> None:
        self.rows: list[RequestRecord] = []

    def add(self, t: float, outcome: str = "ok", stage: str | None = None, pp: int = 0, dp: int = 1,
            ttft: float = 0.5, decode: float = 1.0, out: int = 11) -> None:
        ok = outcome == "ok"
        self.rows.append(RequestRecord(
            request_id=len(self.rows), arrival_s=t, prompt_tokens=100, output_tokens=out,
            prefill_worker=pp * 10, decode_worker=dp * 10, prefill_pod=pp, decode_pod=dp,
            first_token_s=t + ttft if ok else math.nan, end_s=t + ttft + decode if ok else math.nan,
            outcome=outcome, failed_stage=None if ok else stage,
        ))

    def bin(self, start: float, n: int, n_ok: int, **kw) -> None:
        """n requests spread over [start, start + 1) of which the first n_ok succeed."""
        for i in range(n):
            self.add(start + i / max(n, 1), "ok" if i < n_ok else "timeout", None if i < n_ok else "decode", **kw)


def link_fault(apply_s: float, clear_s: float | None, pod: int = 3, fid: int = 0) -> list[FaultEvent]:
    ev = [FaultEvent(apply_s, fid, "apply", "link", pod, f"pod{pod}.uplink", 0.05)]
    if clear_s is not None:
        ev.append(FaultEvent(clear_s, fid, "clear", "link", pod, f"pod{pod}.uplink", 0.05))
    return ev


def write_run(directory: Path, *, reqs: Reqs | list = (), faults: list = (), decisions: list = (),
              prices: list = (), policy: str = "LC", scenario: str = "link", seed: int = 0, world: str = "sim",
              metrics: dict | None = None, close: bool = True) -> Path:
    spec = {"deadline_s": 30.0, "metrics": metrics if metrics is not None else {"bin_s": 5.0}}
    w = RunWriter(directory, {"world": world, "scenario": scenario, "policy": policy, "seed": seed, "spec": spec},
                  flush_s=1e9)
    for rec in [*(reqs.rows if isinstance(reqs, Reqs) else reqs), *faults, *decisions, *prices]:
        w.write(rec)
    if close:
        w.close()
    else:
        w.flush()
    return directory


def loaded(tmp_path: Path, **kw):
    """Write a run and read it back, so metrics see the exact dtypes of real Parquet tables."""
    return load_run(write_run(tmp_path / "run", **kw))


# --------------------------------------------------------------------------- failures


def test_failure_rate_timeout_share_and_composition(tmp_path):
    r = Reqs()
    for i in range(7):
        r.add(float(i))
    r.add(7.0, "timeout", "kv_transfer")
    r.add(8.0, "timeout", "kv_transfer")
    r.add(9.0, "error", "prefill")
    run = loaded(tmp_path, reqs=r)
    assert failure_rate(run.requests) == pytest.approx(0.3)
    assert timeout_share(run.requests) == pytest.approx(2 / 3)
    comp = failure_composition(run.requests)
    assert comp == pytest.approx({"admission": 0.0, "prefill_queue": 0.0, "prefill": 1 / 3, "decode_queue": 0.0, "kv_transfer": 2 / 3,
                                  "decode": 0.0, "unknown": 0.0})
    m = run_metrics(run)
    assert (m["n_requests"], m["n_failed"]) == (10, 3)
    assert m["fail_share_kv_transfer"] == pytest.approx(2 / 3)



def test_peak_in_flight_is_rebuilt_from_routed_to_ended_with_a_failure_at_its_limit():
    nan = math.nan
    rows = [  # routed_s, end_s, arrival_s, first_token_s, outcome
        (0.0, 2.0, 0.0, 0.5, "ok"),
        (1.0, 3.0, 1.0, 1.5, "ok"),
        (1.5, nan, 1.5, nan, "timeout"),  # no first token: ends at 1.5 + the first-token limit
        (2.0, nan, 2.0, 2.2, "timeout"),  # a first token: ends at 2.0 + the deadline (12.0)
        (3.0, 4.0, 3.0, 3.2, "ok"),  # starts as the second ends: the end counts first
        (3.5, 3.8, 3.5, 3.6, "ok"),
        (nan, nan, 1.6, nan, "rejected"),  # never routed
    ]
    req = pd.DataFrame(rows, columns=["routed_s", "end_s", "arrival_s", "first_token_s", "outcome"])
    # first-token limit 1 s: the third ends at 2.5; at most 3 at once (0-2 at 1.5; 2-4 at 2.0 with the tie)
    assert peak_in_flight(req, 1.0, 10.0) == 3
    # 5 s: it ends at 6.5, so at 3.5 the third, fourth, fifth and sixth are in flight
    assert peak_in_flight(req, 5.0, 10.0) == 4
    assert peak_in_flight(req[req.outcome == "rejected"], 1.0, 10.0) == 0

def test_no_failures_gives_nan_timeout_share_and_unknown_stage_counts(tmp_path):
    r = Reqs()
    r.add(0.0)
    r.add(1.0)
    assert math.isnan(timeout_share(loaded(tmp_path, reqs=r).requests))
    r.add(2.0, "rejected", None)  # a failure that names no stage
    run = load_run(write_run(tmp_path / "b", reqs=r))
    assert failure_rate(run.requests) == pytest.approx(1 / 3)
    assert timeout_share(run.requests) == 0.0
    assert failure_composition(run.requests)["unknown"] == 1.0


# --------------------------------------------------------------------------- time series, window


def test_success_series_bins_and_empty_bins(tmp_path):
    r = Reqs()
    r.add(0.5)
    r.add(1.0, "timeout", "decode")
    r.add(4.9)
    r.add(12.0, "error", "prefill_queue")  # bin [10, 15); bin [5, 10) stays empty
    s = success_series(loaded(tmp_path, reqs=r).requests, 5.0)
    assert s["bin_start_s"].tolist() == [0.0, 5.0, 10.0]
    assert s["n"].tolist() == [3, 0, 1]
    assert s["success_ratio"].iloc[0] == pytest.approx(2 / 3)
    assert math.isnan(s["success_ratio"].iloc[1])
    assert s["success_ratio"].iloc[2] == 0.0


def test_fault_window_cleared_and_uncleared(tmp_path):
    r = Reqs()
    for t in (1.0, 25.0, 47.0):
        r.add(t)
    two = [*link_fault(10.0, 20.0, pod=3, fid=0), *link_fault(15.0, 30.0, pod=5, fid=1)]
    run = loaded(tmp_path, reqs=r, faults=two)
    w = fault_window(run.faults, run.requests)
    assert (w.onset_s, w.end_s, w.cleared, w.pods) == (10.0, 30.0, True, (3, 5))
    # fault 1 never cleared: the window runs to the last arrival, though fault 0 cleared at 20
    one_open = [*link_fault(10.0, 20.0, fid=0), *link_fault(15.0, None, fid=1)]
    run2 = load_run(write_run(tmp_path / "b", reqs=r, faults=one_open))
    w2 = fault_window(run2.faults, run2.requests)
    assert (w2.onset_s, w2.end_s, w2.cleared) == (10.0, 47.0, False)
    assert fault_window(run.faults.iloc[0:0], run.requests) is None


def _dip_run(tmp_path: Path):
    """bins of 5 s: four pre-fault bins at 8/10 ok (S_0 = 0.8); fault [20, 30); horizon 10 s.
    bins starting 20, 25, 30, 35 -> 0.4, 0.6, 0.8, 1.0 success; bin 40 (outside) -> 0."""
    r = Reqs()
    for b in range(4):
        r.bin(5.0 * b, 10, 8)
    for start, n_ok in ((20.0, 4), (25.0, 6), (30.0, 8), (35.0, 10), (40.0, 0)):
        r.bin(start, 10, n_ok)
    return loaded(tmp_path, reqs=r, faults=link_fault(20.0, 30.0),
                  metrics={"bin_s": 5.0, "recovery_horizon_s": 10.0, "availability_target": 0.5})


def test_resilience_index_of_a_known_dip(tmp_path):
    run = _dip_run(tmp_path)
    w = fault_window(run.faults, run.requests)
    # min(S_b/S_0, 1): 0.4/0.8, 0.6/0.8, 0.8/0.8, min(1.0/0.8, 1)
    expected = (0.5 + 0.75 + 1.0 + 1.0) / 4
    assert resilience_index(run.requests, w, 5.0, 10.0) == pytest.approx(expected)
    assert run_metrics(run)["resilience_index"] == pytest.approx(expected)
    # a longer horizon takes in bin 40 (success 0)
    assert resilience_index(run.requests, w, 5.0, 15.0) == pytest.approx((0.5 + 0.75 + 1 + 1 + 0) / 5)


def test_resilience_index_is_one_without_a_dip_and_nan_without_baseline(tmp_path):
    r = Reqs()
    for b in range(6):
        r.bin(5.0 * b, 4, 4)
    run = loaded(tmp_path, reqs=r, faults=link_fault(10.0, 20.0))
    w = fault_window(run.faults, run.requests)
    assert resilience_index(run.requests, w, 5.0, 60.0) == 1.0
    early = fault_window(load_run(write_run(tmp_path / "b", reqs=r, faults=link_fault(0.0, 20.0))).faults, run.requests)
    assert math.isnan(resilience_index(run.requests, early, 5.0, 60.0))
    assert math.isnan(resilience_index(run.requests, None, 5.0, 60.0))


def test_degraded_availability_counts_nonempty_bins_at_least_half_inside_the_window(tmp_path):
    run = _dip_run(tmp_path)
    w = fault_window(run.faults, run.requests)
    # window [20, 30): bins 20 (0.4) and 25 (0.6)
    assert degraded_availability(run.requests, w, 5.0, 0.5) == 0.5
    assert degraded_availability(run.requests, w, 5.0, 0.4) == 1.0
    assert degraded_availability(run.requests, w, 5.0, 0.99) == 0.0
    assert run_metrics(run)["degraded_availability"] == 0.5  # target 0.5 from the run's spec
    r = Reqs()
    r.bin(0.0, 5, 5)
    r.bin(20.0, 5, 5)  # bins 25 and 30 hold nothing
    r.bin(35.0, 4, 2)
    run2 = load_run(write_run(tmp_path / "b", reqs=r, faults=link_fault(20.0, 40.0)))
    w2 = fault_window(run2.faults, run2.requests)
    assert degraded_availability(run2.requests, w2, 5.0, 0.99) == 0.5  # bins 20 (1.0) and 35 (0.5)
    # window [17, 21): bin 15 is 3 s inside but empty, bin 20 only 1 s inside: no bin counts
    late = load_run(write_run(tmp_path / "c", reqs=r, faults=link_fault(17.0, 21.0)))
    w3 = fault_window(late.faults, run2.requests)
    assert math.isnan(degraded_availability(run2.requests, w3, 5.0, 0.99))
    # a fault applied milliseconds late, as the testbed does (10.08 s for 20 s): its first bin still counts
    # (bins 20 at 1.0 and 35 at 0.5; bin 40 is 0.08 s inside and empty anyway)
    ms_late = load_run(write_run(tmp_path / "d", reqs=r, faults=link_fault(20.08, 40.1)))
    assert degraded_availability(run2.requests, fault_window(ms_late.faults, run2.requests), 5.0, 0.99) == 0.5


def test_traffic_deflection_ratio(tmp_path):
    r = Reqs()
    for i in range(10):  # before onset: 4 of 10 touch pod 3 (2 as prefill, 2 as decode)
        r.add(float(i), pp=3 if i < 2 else 0, dp=3 if i in (2, 3) else 1)
    for i in range(10):  # during: 1 of 10
        r.add(20.0 + i, pp=3 if i == 0 else 0, dp=1)
    for i in range(2):  # rejected before routing: not counted
        r.add(25.0 + i, "rejected", "prefill_queue", pp=-1, dp=-1)
    for i in range(5):  # after the window: not counted
        r.add(40.0 + i, pp=3, dp=3)
    run = loaded(tmp_path, reqs=r, faults=link_fault(20.0, 35.0))
    w = fault_window(run.faults, run.requests)
    assert degraded_pod_shares(run.requests, w) == pytest.approx((0.4, 0.1))
    assert traffic_deflection_ratio(run.requests, w) == pytest.approx((0.4 - 0.1) / 0.4)
    m = run_metrics(run)
    assert m["traffic_deflection_ratio"] == pytest.approx(0.75)
    assert m["n_degraded_pods"] == 1
    # nothing touched pod 7 before the fault: NaN
    pod7 = load_run(write_run(tmp_path / "b", reqs=r, faults=link_fault(20.0, 35.0, pod=7)))
    w7 = fault_window(pod7.faults, run.requests)
    assert math.isnan(traffic_deflection_ratio(run.requests, w7))


# --------------------------------------------------------------------------- serving, overhead


def test_latency_percentiles_and_goodput(tmp_path):
    r = Reqs()
    # TTFT 0.1 .. 0.5; TPOT = decode / (out - 1)
    r.add(0.0, ttft=0.1, decode=0.5, out=11)   # TPOT 0.05: good
    r.add(2.0, ttft=0.2, decode=0.5, out=11)   # good
    r.add(4.0, ttft=0.3, decode=4.0, out=21)   # TPOT 0.2: misses the TPOT SLO
    r.add(6.0, ttft=0.4, decode=0.0, out=1)    # no TPOT, TTFT ok: good
    r.add(8.0, ttft=0.5, decode=0.5, out=11)   # TTFT misses 0.45
    r.add(10.0, "timeout", "decode")           # failed: never good, not in latencies
    run = loaded(tmp_path, reqs=r, metrics={"ttft_slo_s": 0.45, "tpot_slo_s": 0.1, "percentiles": [90]})
    p = latency_percentiles(run.requests, [50, 90])
    assert p["ttft_p50_s"] == pytest.approx(0.3)
    assert p["ttft_p90_s"] == pytest.approx(0.1 + 0.9 * 4 * 0.1)  # linear interpolation
    assert p["tpot_p50_s"] == pytest.approx(0.05)  # TPOTs 0.05, 0.05, 0.2, 0.05
    assert p["e2e_p50_s"] == pytest.approx(0.7)  # e2e 0.6, 0.7, 4.3, 0.4, 1.0
    assert goodput_rps(run.requests, 0.45, 0.1) == pytest.approx(3 / 10.0)  # 3 good over arrivals 0..10 s
    m = run_metrics(run)
    assert m["goodput_rps"] == pytest.approx(0.3)
    assert {"ttft_p50_s", "ttft_p90_s", "ttft_p99_s"} <= m.keys()  # 50 and 99 always, 90 from the spec


def test_decision_latency_overall_and_by_candidates(tmp_path):
    lat_us = {8: [1.0, 2.0, 3.0, 4.0], 16: [10.0, 20.0]}
    dec = [DecisionRecord(float(i), i, "LC", c, 0, us * 1e-6, 0, 1, 0, 1, 0.0)
           for i, (c, us) in enumerate((c, us) for c, xs in lat_us.items() for us in xs)]
    run = loaded(tmp_path, reqs=[], decisions=dec)
    t = decision_latency(run.decisions, (50, 99))
    overall = t[t["n_candidates"].isna()].iloc[0]
    assert overall["n_decisions"] == 6
    assert overall["latency_p50_us"] == pytest.approx(3.5)  # median of 1, 2, 3, 4, 10, 20
    by = t.dropna(subset=["n_candidates"]).set_index("n_candidates")
    assert by.loc[8, "latency_p50_us"] == pytest.approx(2.5)
    assert by.loc[16, "latency_p99_us"] == pytest.approx(10 + 0.99 * 10)
    m = run_metrics(run)
    assert m["decision_latency_p50_us"] == pytest.approx(3.5)
    assert math.isnan(m["failure_rate"])  # no requests


# --------------------------------------------------------------------------- many runs


def _runs_with_failures(root: Path, policy: str, fails: list[int], world: str = "sim", scenario: str = "link") -> None:
    """One run per seed with 10 requests of which fails[seed] time out."""
    for seed, k in enumerate(fails):
        r = Reqs()
        for i in range(10):
            r.add(float(i), "ok" if i >= k else "timeout", None if i >= k else "kv_transfer")
        write_run(root / world / scenario / f"{policy}-s{seed}", reqs=r, policy=policy, seed=seed, world=world,
                  scenario=scenario)


def test_summary_ci_over_three_seeds_and_gap_to_oracle(tmp_path):
    _runs_with_failures(tmp_path, "LC", [1, 2, 4])
    _runs_with_failures(tmp_path, "OracleAvoidance", [0, 1, 1])
    _runs_with_failures(tmp_path, "OTF-R", [2])  # one seed only
    runs = collect_runs([tmp_path])
    assert len(runs) == 7
    s = summarize(runs).set_index("policy")
    x = [0.1, 0.2, 0.4]
    half = T975[2] * statistics.stdev(x) / math.sqrt(3)
    assert s.loc["LC", "failure_rate_mean"] == pytest.approx(statistics.mean(x))
    assert s.loc["LC", "failure_rate_ci"] == pytest.approx(half, rel=1e-4)
    assert s.loc["LC", "n_runs"] == 3 and s.loc["LC", "seeds"] == "0,1,2"
    assert math.isnan(s.loc["OTF-R", "failure_rate_ci"])
    # paired gaps: 0.1 - 0, 0.2 - 0.1, 0.4 - 0.1
    gaps = [0.1, 0.1, 0.3]
    assert s.loc["LC", "gap_failure_rate_mean"] == pytest.approx(statistics.mean(gaps))
    gap_half = T975[2] * statistics.stdev(gaps) / math.sqrt(3)
    assert s.loc["LC", "gap_failure_rate_ci"] == pytest.approx(gap_half, rel=1e-4)
    assert s.loc["OracleAvoidance", "gap_failure_rate_mean"] == 0.0
    assert s.loc["OTF-R", "gap_failure_rate_mean"] == pytest.approx(0.2 - 0.0)  # seed 0 only


def test_gap_to_oracle_pairs_by_world_scenario_seed():
    runs = pd.DataFrame({
        "world": ["sim", "sim", "sim", "testbed"],
        "scenario": ["a", "a", "a", "a"],
        "policy": ["OracleAvoidance", "LC", "LC", "LC"],
        "seed": [0, 0, 1, 0],
        "failure_rate": [0.05, 0.25, 0.3, 0.5],
    })
    g = gap_to_oracle(runs, ["failure_rate"])["gap_failure_rate"].tolist()
    assert g[0] == 0.0 and g[1] == pytest.approx(0.2)
    assert math.isnan(g[2]) and math.isnan(g[3])  # no oracle for seed 1, none in the testbed world
    with pytest.raises(ValueError, match="two OracleAvoidance runs"):
        gap_to_oracle(pd.concat([runs, runs.iloc[[0]]]), ["failure_rate"])


def test_mean_ci_by_hand():
    m, h, n = mean_ci([1.0, 2.0, 3.0, 6.0, math.nan])
    assert (m, n) == (3.0, 4)
    assert h == pytest.approx(T975[3] * statistics.stdev([1, 2, 3, 6]) / 2, rel=1e-4)
    assert math.isnan(mean_ci([2.0])[1])


def test_duplicate_seed_is_an_error(tmp_path):
    _runs_with_failures(tmp_path / "a", "LC", [1])
    _runs_with_failures(tmp_path / "b", "LC", [2])
    with pytest.raises(ValueError, match="duplicate run .*seed=0") as e:
        collect_runs([tmp_path])
    assert "\n" not in str(e.value)


def test_discovery(tmp_path):
    _runs_with_failures(tmp_path / "exp", "LC", [1, 2])
    found = discover_runs([tmp_path / "exp", tmp_path / "exp/sim/link/LC-s0"])  # second is a duplicate
    assert [p.name for p in found] == ["LC-s0", "LC-s1"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    for bad in ("missing", "empty", "file.txt"):
        with pytest.raises(RunDiscoveryError) as e:
            discover_runs([tmp_path / bad])
        msg = str(e.value)
        assert str(tmp_path / bad) in msg and "\n" not in msg


def test_bad_metrics_spec_is_a_one_line_error(tmp_path):
    d = write_run(tmp_path / "run", reqs=[], metrics={"bin_sz": 5.0})
    with pytest.raises(ValueError, match=r"run\.json.*metrics\.bin_sz") as e:
        load_run(d)
    assert "\n" not in str(e.value)
    d2 = write_run(tmp_path / "run2", reqs=[], metrics={"bin_s": -1})
    with pytest.raises(ValueError, match=r"metrics\.bin_s"):
        load_run(d2)
    assert MetricsSpec(percentiles=[99, 50, 99]).percentiles == (50.0, 99.0)


def test_a_run_made_again_into_its_directory_replaces_the_earlier_rows(tmp_path):
    """An interrupted run flushed three parts; the run made again into the same directory flushes
    one: a reader sees that run's rows alone, not the earlier run's parts beyond its own."""
    d = tmp_path / "run"
    meta = {"world": "sim", "scenario": "link", "policy": "LC", "seed": 0, "spec": {}}
    r = Reqs()
    for i in range(9):
        r.add(float(i), "ok")
    w = RunWriter(d, meta, flush_s=1e9)
    for k in range(3):
        for rec in r.rows[3 * k:3 * k + 3]:
            w.write(rec)
        w.flush()
    del w  # interrupted
    assert len(pd.read_parquet(d / "requests.parquet")) == 9
    again = RunWriter(d, meta, flush_s=1e9)
    for rec in r.rows[:2]:
        again.write(rec)
    again.close()
    assert sorted(pd.read_parquet(d / "requests.parquet")["request_id"]) == [r.rows[0].request_id, r.rows[1].request_id]


def test_interrupted_run_still_reads(tmp_path):
    d = tmp_path / "run"
    meta = {"world": "testbed", "scenario": "link", "policy": "LC", "seed": 0, "spec": {}}
    w = RunWriter(d, meta, flush_s=1e9)
    r = Reqs()
    for i in range(8):
        r.add(float(i), "ok" if i != 2 else "timeout", None if i != 2 else "kv_transfer")
    for rec in r.rows[:5]:
        w.write(rec)
    w.flush()
    for rec in r.rows[5:]:
        w.write(rec)  # never flushed: lost with the process
    del w  # no close(): run.json keeps status "running"
    m = run_metrics(d)
    assert m["status"] == "running"
    assert m["n_requests"] == 5
    assert m["failure_rate"] == pytest.approx(1 / 5)
    assert math.isnan(m["resilience_index"])  # no faults table rows


def test_compare_worlds():
    def runs(world, rates):
        return pd.DataFrame({"world": world, "scenario": "s", "policy": "LC", "seed": range(len(rates)),
                             "failure_rate": rates, "goodput_rps": [1.0] * len(rates)})

    c = compare_worlds(runs("sim", [0.1, 0.2, 0.3]), runs("testbed", [0.2, 0.3, 0.4]), tolerance=0.0,
                       metrics=["failure_rate", "goodput_rps"]).set_index("metric")
    assert c.loc["failure_rate", "diff"] == pytest.approx(0.1)
    assert bool(c.loc["failure_rate", "agree"])  # CIs (half-width ~0.25 each) overlap
    assert bool(c.loc["goodput_rps", "agree"])
    # one seed per side: no CI, only the tolerance decides
    near = compare_worlds(runs("sim", [0.10]), runs("testbed", [0.15]), tolerance=0.1, metrics=["failure_rate"])
    far = compare_worlds(runs("sim", [0.10]), runs("testbed", [0.15]), tolerance={"failure_rate": 0.01},
                         metrics=["failure_rate"])
    assert bool(near["agree"].iloc[0]) and not bool(far["agree"].iloc[0])
    # tight CIs far apart: disagree
    apart = compare_worlds(runs("sim", [0.10, 0.11, 0.10]), runs("testbed", [0.50, 0.51, 0.50]), 0.05,
                           metrics=["failure_rate"])
    assert not bool(apart["agree"].iloc[0])
    assert compare_worlds(runs("sim", [0.1]), runs("testbed", [0.1]).assign(policy="RR"), 0.1).empty


def test_report_writes_csvs_and_plots(tmp_path):
    root = tmp_path / "runs"
    for policy, fails in (("LC", [2, 3]), ("OracleAvoidance", [0, 1])):
        for seed, k in enumerate(fails):
            r = Reqs()
            for b in range(8):
                r.bin(5.0 * b, 5, 5 - k if 4 <= b < 6 else 5, pp=3 if b % 2 else 0)
            # pod 3's price rises by 0.5 during the fault [20, 30)
            prices = [PriceRecord(float(t), pod, 0.1 + 0.5 * (pod == 3 and 20 <= t < 30), 0.1, 0.0, 0.0, 0.0)
                      for t in range(0, 40, 2) for pod in range(4)] if policy == "LC" else []
            dec = [DecisionRecord(float(i), i, policy, 8, 0, 2e-6, 0, 1, 0, 1, 0.0) for i in range(5)]
            write_run(root / f"{policy}-{seed}", reqs=r, faults=link_fault(20.0, 30.0), decisions=dec,
                      prices=prices, policy=policy, seed=seed)
    buf = io.StringIO()
    summary = report([root], None, Console(file=buf, width=250))
    out = tmp_path / "report"  # default: next to the first path
    assert {p.name for p in out.iterdir()} >= {
        "runs.csv", "summary.csv", "decision_latency.csv", "success_ratio_link_sim.png",
        "failure_composition_link_sim.png", "risk_price_link_sim.png",
    }
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(summary["policy"]) == ["LC", "OracleAvoidance"]
    assert pd.read_csv(out / "summary.csv").shape == summary.shape
    assert len(pd.read_csv(out / "runs.csv")) == 4
    # LC fails 2 and 3 of 5 requests in 2 of 8 bins (40 requests): 4/40 and 6/40
    lc = summary.set_index("policy").loc["LC"]
    assert lc["failure_rate_mean"] == pytest.approx(5 / 40)
    assert lc["gap_failure_rate_mean"] == pytest.approx(((4 - 0) / 40 + (6 - 2) / 40) / 2)
    text = buf.getvalue()
    assert "OracleAvoidance" in text and "failure rate" in text and "0.125 ±" in text
    custom = report([root / "LC-0"], tmp_path / "elsewhere", Console(file=io.StringIO()))
    assert len(custom) == 1 and (tmp_path / "elsewhere" / "summary.csv").exists()


def _set_source(run_dir: Path, source: dict | None) -> None:
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["source"] = source
    meta_path.write_text(json.dumps(meta))


def test_runs_name_their_commit_and_a_report_of_mixed_commits_says_so(tmp_path):
    """run.json's source becomes each run's commit label; a set of runs not all from one clean
    commit is said in one line, with the runs each commit wrote per world; one clean commit is not."""
    root = tmp_path / "runs"
    _runs_with_failures(root, "LC", [1, 2, 3])
    _runs_with_failures(root, "LC", [1, 2], world="testbed")
    clean = {"commit": "a" * 40, "dirty": False}
    for d in sorted(root.glob("*/*/*")):
        _set_source(d, clean)
    assert run_metrics(root / "sim/link/LC-s0")["commit"] == "a" * 10
    buf = io.StringIO()
    summary = report([root], tmp_path / "out", Console(file=buf, width=400))
    assert set(summary["commits"]) == {"a" * 10}
    assert "clean commit" not in buf.getvalue()

    _set_source(root / "sim/link/LC-s1", {"commit": "b" * 40, "dirty": True})
    _set_source(root / "testbed/link/LC-s0", None)  # written outside a checkout of the project
    assert run_metrics(root / "sim/link/LC-s1")["commit"] == "b" * 10 + "+dirty"
    assert run_metrics(root / "testbed/link/LC-s0")["commit"] == "unknown"
    buf = io.StringIO()
    summary = report([root], tmp_path / "out", Console(file=buf, width=400)).set_index("world")
    assert summary.loc["sim", "commits"] == f"{'a' * 10},{'b' * 10}+dirty"
    assert summary.loc["testbed", "commits"] == f"{'a' * 10},unknown"
    note = [line for line in buf.getvalue().splitlines() if "clean commit" in line]
    assert len(note) == 1
    assert f"{'a' * 10}: 2 sim, 1 testbed; {'b' * 10}+dirty: 1 sim; unknown: 1 testbed" in note[0]


def test_expired_kv_leases_are_summed_over_the_runs_engines():
    meta = {"engines": {
        "pod0-prefill": {"vllm:nixl_num_kv_expired_reqs_total": 6.0, "vllm:nixl_num_notifications_after_expiry_total": 1.0},
        "pod2-decode": {"vllm:nixl_num_kv_expired_reqs_total": 0.0},
        "pod3-decode": {},  # an engine whose counters are missing counts nothing
    }}
    assert kv_leases(meta) == {"kv_leases_expired": 6.0, "kv_reads_after_expiry": 1.0}
    for sim in ({}, {"engines": {}}, {"engines": None}):  # a simulated run has no engines
        assert all(math.isnan(v) for v in kv_leases(sim).values())
