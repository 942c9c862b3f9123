"""The simulator against answers worked out by hand."""


import numpy as np
import pandas as pd
import pytest

from simulator.run import run_sim
from core.records import read_table
from core.spec import parse_spec
from core.topology import GBPS

KV = 131072  # bytes per token


def _spec(**over):
    base = {
        "name": "t",
        "topology": {"pods": 2, "workers_per_pod": 2, "nic_gbps": 8.0},
        "engine": {"prefill_tokens_per_s": 1000.0, "prefill_overhead_s": 0.0, "decode_step_base_s": 0.01,
                   "decode_step_per_seq_s": 0.0, "decode_step_per_kv_token_s": 0.0},
        "workload": {"arrival": {"kind": "poisson", "rate_rps": 1.0}, "prompt": {"kind": "fixed", "value": 1000},
                     "output": {"kind": "fixed", "value": 10}, "max_requests": 1},
        "deadline_s": 100.0,
        "policies": ["LC"],
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return parse_spec(base)


def _run(tmp_path, spec, policy="LC", seed=0):
    d = run_sim(spec, policy, seed, tmp_path)
    return d, read_table(d, "requests").sort_values("request_id").reset_index(drop=True)


def test_single_request_stage_times_match_the_performance_model(tmp_path):
    _, r = _run(tmp_path, _spec())
    (row,) = r.itertuples()
    assert row.outcome == "ok" and pd.isna(row.failed_stage)
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(1.0)  # 1000 tokens at 1000 tokens/s
    nbytes = 1008 * KV  # whole blocks of 16 tokens (vLLM's CUDA block size)
    assert row.kv_bytes == nbytes
    assert row.kv_end_s - row.kv_start_s == pytest.approx(nbytes / (8.0 * GBPS))  # NIC-bound, 8 Gbit/s
    assert row.end_s - row.kv_end_s == pytest.approx(10 * 0.01)  # 10 tokens at 10 ms a step
    assert row.first_token_s - row.kv_end_s == pytest.approx(0.01)
    assert row.routed_s == row.arrival_s == row.prefill_start_s


def test_a_pull_moves_whole_blocks_and_pays_its_fixed_latency(tmp_path):
    """Calibrated engines: 128-token blocks (vLLM's CPU build) and a fixed cost per pull."""
    _, r = _run(tmp_path, _spec(engine={"kv_block_tokens": 128, "kv_transfer_latency_s": 0.25}))
    (row,) = r.itertuples()
    nbytes = 1024 * KV  # 1000 tokens -> 8 blocks of 128
    assert row.kv_bytes == nbytes
    assert row.kv_end_s - row.kv_start_s == pytest.approx(nbytes / (8.0 * GBPS) + 0.25)


def test_a_deadline_during_the_pull_latency_is_a_kv_transfer_timeout(tmp_path):
    # the bytes arrive at ~1.13 s; the completion 5 s later is past the 3 s deadline
    _, r = _run(tmp_path, _spec(deadline_s=3.0, engine={"kv_transfer_latency_s": 5.0}))
    (row,) = r.itertuples()
    assert row.outcome == "timeout" and row.failed_stage == "kv_transfer"


def test_prefill_batches_up_to_the_token_budget(tmp_path):
    spec = _spec(engine={"prefill_batch_tokens": 2000},
                 workload={"arrival": {"kind": "poisson", "rate_rps": 1000.0}, "max_requests": 3},
                 topology={"pods": 1, "workers_per_pod": 2})
    _, r = _run(tmp_path, spec)
    # first request starts alone (the worker was idle), the next two share one batch of 2000 tokens
    assert r.prefill_start_s[1] == r.prefill_start_s[2] == r.prefill_end_s[0]
    assert r.prefill_end_s[1] - r.prefill_start_s[1] == pytest.approx(2.0)


def test_continuous_batching_step_time_grows_with_the_batch(tmp_path):
    spec = _spec(engine={"decode_step_per_seq_s": 0.01, "prefill_batch_tokens": 4000},
                 workload={"arrival": {"kind": "poisson", "rate_rps": 1e6}, "max_requests": 3,
                           "output": {"kind": "fixed", "value": 200}},
                 topology={"pods": 1, "workers_per_pod": 2, "nic_gbps": 1e6})
    _, r = _run(tmp_path, spec)
    # step = 0.01 + 0.01 * batch. Request 0 decodes alone from t=1 (0.02 s a step); requests 1 and 2
    # (one prefill batch, 1..3 s) join at t=3 when it has 100 tokens: 100 more at 0.04 s -> t=7;
    # then the two left have 100 tokens to go at 0.03 s -> t=10.
    assert r.end_s.tolist() == pytest.approx([7.0, 10.0, 10.0], abs=1e-4)


def test_a_degraded_core_link_slows_a_cross_pod_transfer_by_r(tmp_path):
    # by_pod: pod 0 prefill, pod 1 decode, so every transfer crosses the core.
    topo = {"pods": 2, "workers_per_pod": 2, "placement": "by_pod", "nic_gbps": 8.0, "uplink_gbps": 8.0}
    fault = {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 0.0, "duration_s": 1000.0}
    _, healthy = _run(tmp_path / "a", _spec(topology=topo))
    _, slow = _run(tmp_path / "b", _spec(topology=topo, faults=[fault]))
    t_h = (healthy.kv_end_s - healthy.kv_start_s)[0]
    t_s = (slow.kv_end_s - slow.kv_start_s)[0]
    assert t_h == pytest.approx(1008 * KV / (8.0 * GBPS))
    assert t_s == pytest.approx(t_h / 0.1)


@pytest.mark.parametrize("direction, slowed", [("uplink", True), ("downlink", False), ("both", True)])
def test_a_link_fault_acts_only_in_its_direction(tmp_path, direction, slowed):
    # by_pod: KV leaves pod 0 (its uplink) and enters pod 1 (its downlink).
    topo = {"pods": 2, "workers_per_pod": 2, "placement": "by_pod", "nic_gbps": 8.0, "uplink_gbps": 8.0}
    fault = {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 0.0, "duration_s": 1000.0,
             "direction": direction}
    _, r = _run(tmp_path, _spec(topology=topo, faults=[fault]))
    t = (r.kv_end_s - r.kv_start_s)[0]
    assert t == pytest.approx(1008 * KV / (8.0 * GBPS) / (0.1 if slowed else 1.0))


def test_delay_and_loss_are_refused_by_the_simulator_in_one_line(tmp_path):
    fault = {"kind": "link", "pods": [0], "residual_bw": 1.0, "start_s": 0.0, "duration_s": 10.0, "delay_ms": 5}
    with pytest.raises(ValueError, match=r"faults\[0\]: delay_ms and loss are testbed-only"):
        _run(tmp_path, _spec(faults=[fault]))


def test_compute_slowdown_stretches_prefill_and_decode(tmp_path):
    fault = {"kind": "compute", "pods": [0, 1], "slowdown": 3.0, "start_s": 0.0, "duration_s": 1000.0}
    _, r = _run(tmp_path, _spec(faults=[fault]))
    assert (r.prefill_end_s - r.prefill_start_s)[0] == pytest.approx(3.0)
    assert (r.end_s - r.kv_end_s)[0] == pytest.approx(10 * 0.03)


def test_decode_admission_is_bounded_by_kv_memory(tmp_path):
    spec = _spec(engine={"decode_kv_tokens": 2500, "prefill_tokens_per_s": 1e6},
                 topology={"pods": 1, "workers_per_pod": 2},
                 workload={"arrival": {"kind": "poisson", "rate_rps": 50.0}, "max_requests": 20,
                           "output": {"kind": "fixed", "value": 200}})
    _, r = _run(tmp_path, spec)
    assert (r.outcome == "ok").all()
    # each request holds 1000 + 200 tokens from KV transfer start to its end: at most 2 fit in 2500
    ev = sorted([(t, 1) for t in r.kv_start_s] + [(t, -1) for t in r.end_s], key=lambda x: (x[0], x[1]))
    peak = max(np.cumsum([e for _, e in ev]))
    assert peak == 2


def test_a_timed_out_request_frees_its_worker_for_the_next(tmp_path):
    # request 0 is stuck in decode until its deadline; request 1 waits for the single decode slot
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,1000,100000\n0.5,1000,10\n")
    spec = _spec(engine={"decode_max_batch": 1}, topology={"pods": 1, "workers_per_pod": 2},
                 workload={"arrival": {"kind": "trace", "path": str(trace)}, "max_requests": None,
                           "prompt": None, "output": None},
                 deadline_s=30.0)
    _, r = _run(tmp_path, spec)
    assert r.outcome.tolist() == ["timeout", "ok"]
    assert r.failed_stage[0] == "decode"
    assert r.kv_start_s[1] == pytest.approx(30.0)  # admitted the moment request 0 was aborted


CORE = {
    "name": "core",
    "seeds": [3],
    "topology": {"pods": 4, "workers_per_pod": 4, "uplink_gbps": 400.0},
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 4.0}, "profile": "long_context", "duration_s": 90},
    "faults": [{"kind": "link", "pods": [1], "residual_bw": 0.005, "start_s": 20.0, "duration_s": 30.0}],
    "deadline_s": 20.0,
    "health": {"model": "alert"},  # the tests below read the alert monitor's delay
    "policies": ["LC", "OTF-R", "OracleAvoidance"],
}


def test_same_seed_gives_identical_records(tmp_path):
    spec = parse_spec(CORE)
    a, ra = _run(tmp_path / "a", spec, "OTF-R", 3)
    b, rb = _run(tmp_path / "b", spec, "OTF-R", 3)
    pd.testing.assert_frame_equal(ra, rb)
    for table in ("prices", "health", "faults"):
        pd.testing.assert_frame_equal(read_table(a, table), read_table(b, table))
    da, db = read_table(a, "decisions"), read_table(b, "decisions")
    pd.testing.assert_frame_equal(da.drop(columns="latency_s"), db.drop(columns="latency_s"))  # latency is wall clock
    _, rc = _run(tmp_path / "c", spec, "OTF-R", 4)
    assert not ra.arrival_s.equals(rc.arrival_s)


def test_every_policy_sees_the_same_workload_for_a_seed(tmp_path):
    spec = parse_spec(CORE)
    _, ra = _run(tmp_path / "a", spec, "LC", 3)
    _, rb = _run(tmp_path / "b", spec, "Random", 3)
    assert ra.arrival_s.equals(rb.arrival_s) and ra.prompt_tokens.equals(rb.prompt_tokens)


def test_oracle_never_routes_to_a_degraded_pod_and_risk_price_tracks_the_fault(tmp_path):
    spec = parse_spec(CORE)
    d, _ = _run(tmp_path, spec, "OracleAvoidance", 3)
    dec = read_table(d, "decisions")
    during = dec[(dec.time_s >= 20.0) & (dec.time_s < 50.0)]
    assert len(during) > 0
    assert not ((during.prefill_pod == 1) | (during.decode_pod == 1)).any()
    before = dec[dec.time_s < 20.0]
    assert ((before.prefill_pod == 1) | (before.decode_pod == 1)).any()

    d, r = _run(tmp_path / "lc", spec, "LC", 3)
    prices = read_table(d, "prices").pivot(index="time_s", columns="pod", values="price")
    assert prices.loc[19.0, 1] < prices.loc[30.0, 1]  # the bandwidth term jumps at the fault
    assert prices.loc[30.0, 1] > prices.loc[30.0].drop(1).max()
    assert prices.loc[89.0, 1] < prices.loc[45.0, 1]  # and falls back after recovery
    # LC keeps sending traffic into the degraded pod, and those requests time out in kv_transfer
    bad = r[(r.outcome == "timeout")]
    assert (bad.failed_stage == "kv_transfer").any()
    health = read_table(d, "health")
    onset = health[(health.pod == 1) & health.unhealthy]
    assert onset.time_s.min() == pytest.approx(20.0 + spec.health.detection_delay_s)


@pytest.mark.parametrize("baseline_gbps, r, window_s", [(0.25, 0.01, 2.0), (None, 0.2, 0.4)])
def test_the_price_learns_of_a_link_fault_when_its_probe_would_have_ended(tmp_path, baseline_gbps, r, window_s):
    """The testbed's agents measure a new limit with a probe (faults.telemetry): 2 s at a few Mbit/s,
    0.4 s at line rates. The simulated router sees the bandwidth that late too, not at once."""
    topo = {"pods": 2, "workers_per_pod": 2, "placement": "by_pod", "nic_gbps": 8.0, "uplink_gbps": 8.0,
            "link_baseline_gbps": baseline_gbps}
    fault = {"kind": "link", "pods": [0], "residual_bw": r, "start_s": 5.75, "duration_s": 20.0}
    spec = _spec(topology=topo, faults=[fault], workload={"max_requests": 30}, policies=["OTF-R"])
    d, _ = _run(tmp_path, spec, policy="OTF-R")
    prices = read_table(d, "prices")
    seen = prices[(prices.pod == 0) & (prices.bw_term > 0.5)].time_s.min()
    # slow ticks every second: the first one at or after the measurement's end
    assert seen == pytest.approx(np.ceil(5.75 + window_s), abs=1e-6)
    assert prices[(prices.pod == 0) & (prices.time_s < 5.75 + window_s)].bw_term.max() == 0.0
    faults = read_table(d, "faults")
    assert faults[faults.event == "apply"].time_s.tolist() == [5.75]  # recorded when acted on


def test_the_first_token_limit_times_out_a_stalled_pull_before_the_deadline(tmp_path):
    # 1000 tokens of 1 MB each over a 8 Gbit/s NIC take 1 s; at r = 0.001 of it on both pods'
    # core links, 1000 s. The first-token limit (5 s) ends it in kv_transfer, long before the
    # deadline (100 s); without a first-token limit the deadline does.
    over = dict(topology={"pods": 2, "workers_per_pod": 2, "nic_gbps": 8.0, "placement": "by_pod",
                          "kv_bytes_per_token": 1_000_000},
                faults=[{"kind": "link", "pods": [0], "residual_bw": 0.001, "start_s": 0.0, "duration_s": 500.0}])
    _, r = _run(tmp_path / "a", _spec(ttft_timeout_s=5.0, **over))
    assert r.outcome[0] == "timeout" and r.failed_stage[0] == "kv_transfer"
    assert r.kv_start_s[0] < 5.0 + r.arrival_s[0]
    _, r = _run(tmp_path / "b", _spec(ttft_timeout_s=None, **over))
    assert r.outcome[0] == "timeout" and r.failed_stage[0] == "kv_transfer"
    # ... and a request that gets its first token in time is not cut by the first-token limit
    _, r = _run(tmp_path / "c", _spec(ttft_timeout_s=5.0))
    assert r.outcome[0] == "ok" and r.first_token_s[0] - r.arrival_s[0] < 5.0


@pytest.mark.parametrize("r_bw, flagged", [(0.2, False), (0.002, True)])
def test_production_health_checks_flag_only_a_degradation_that_fails_requests(tmp_path, r_bw, flagged):
    # The checks model (default): the probe's answer crosses a link at r x 400 Gbit/s in
    # milliseconds, so only the passive outlier detection can flag the pod, and only once 5
    # requests in a row charged to it failed: at r = 0.2 the KV still moves in time, at
    # r = 0.002 it does not.
    data = {**CORE, "health": {}, "deadline_s": 20.0, "ttft_timeout_s": 10.0,
            "faults": [{**CORE["faults"][0], "residual_bw": r_bw}]}
    d, r = _run(tmp_path, parse_spec(data), "LC", 3)
    health = read_table(d, "health")
    labelled = health[(health.pod == 1) & health.unhealthy]
    failed = r[(r.outcome == "timeout") & ((r.prefill_pod == 1) | (r.decode_pod == 1))]
    if not flagged:
        assert labelled.empty and failed.empty
        return
    assert not labelled.empty
    first = labelled.time_s.min()
    # never before the fault, and not before five failures charged to pod 1 were recorded
    ends = (failed.arrival_s + np.where(failed.first_token_s.isna(), 10.0, 20.0)).sort_values()
    assert first >= 20.0 and len(ends) >= 5 and first >= ends.iloc[4] - 1e-6
    # the ejection ends: Envoy's 30 s base ejection x times ejected, re-checked at 1 s labels
    cleared = health[(health.pod == 1) & ~health.unhealthy & (health.time_s > first)]
    assert not cleared.empty and cleared.time_s.min() - first == pytest.approx(30.0, abs=1.0)
