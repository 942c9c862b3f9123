"""The simulator against answers worked out by hand."""


import numpy as np
import pandas as pd
import pytest

from analysis.run.metrics import peak_in_flight
from simulator.run import run_sim
from core.records import read_table
from core.spec.model import parse_spec
from builders import HAND_ENGINE, faulted_spec_dict, fixed, link_fault, parse, poisson, small_spec_dict
from core.topology import GBPS

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

KV = 131072  # bytes per token


# One request of 1000 prompt tokens on 2 x 2 workers, engine times in round numbers.
BASE = small_spec_dict(engine=HAND_ENGINE, workload={"prompt": fixed(1000)})


def _spec(**over):
    return parse(BASE, **over)


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


CORE = faulted_spec_dict(
    name="core", seeds=[3], workload={"arrival": poisson(4.0), "duration_s": 90},
    faults=[link_fault([1], 0.005, 20.0, 30.0)],
    health={"model": "alert"},  # the tests below read the alert monitor's delay
    policies=["LC", "OTF-R", "OracleAvoidance"])


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


def test_a_link_down_stalls_every_pull_across_it_until_it_is_back(tmp_path):
    # residual_bw 0 on pod 1 from 20 s to 50 s (CORE's fault, down): no byte crosses its core
    # links, so a pull across them never completes and its request times out in kv_transfer;
    # the production health checks' probe fails on a dead link (round trip infinite).
    data = {**CORE, "health": {}, "faults": [{**CORE["faults"][0], "residual_bw": 0.0}]}
    d, r = _run(tmp_path, parse_spec(data), "LC", 3)
    crosses = (r.prefill_pod != r.decode_pod) & ((r.prefill_pod == 1) | (r.decode_pod == 1))
    during = crosses & (r.kv_start_s >= 20.0) & (r.kv_start_s < 50.0)
    # not one pull that started while the link was down ended before it was back up
    assert during.sum() >= 3 and not (r.kv_end_s[during] < 50.0).any()
    doomed = during & (r.arrival_s + data["deadline_s"] < 50.0)  # their deadline passes while it is down
    assert doomed.sum() >= 3
    assert (r.outcome[doomed] == "timeout").all() and (r.failed_stage[doomed] == "kv_transfer").all()
    # before the fault and once it is over, the same paths carry KV again
    after = crosses & (r.kv_start_s >= 50.0)
    assert after.sum() >= 3 and (r.outcome[after] == "ok").all()
    # the faults table shows the link at 0, and the price's bandwidth term at its maximum
    faults = read_table(d, "faults")
    assert faults[(faults.pod == 1) & (faults.event == "apply")].severity.tolist() == [0.0]
    prices = read_table(d, "prices")
    mid = prices[(prices.pod == 1) & (prices.time_s > 25.0) & (prices.time_s < 50.0)]
    assert not mid.empty and (mid.bw_term == 1.0).all()
    # the probe cannot cross a dead link: the production checks flag the pod while it is down
    health = read_table(d, "health")
    assert health[(health.pod == 1) & (health.time_s > 20.0) & (health.time_s < 50.0)].unhealthy.any()


def test_the_admission_limit_bounds_what_is_in_flight_and_records_the_rest_as_rejected(tmp_path):
    # CORE at 10x its rate: far past what 4 x 4 workers serve within the deadline
    over = {**CORE, "workload": {**CORE["workload"], "arrival": {"kind": "poisson", "rate_rps": 40.0}}}
    _, free = _run(tmp_path / "free", parse_spec(over), "LC", 3)
    limited = parse_spec({**over, "router": {"max_in_flight": 24}})
    d, r = _run(tmp_path / "limited", limited, "LC", 3)
    assert "rejected" not in set(free.outcome)
    rejected = r[r.outcome == "rejected"]
    assert len(rejected) > 0.2 * len(r)
    assert (rejected.failed_stage == "admission").all() and (rejected.prefill_pod == -1).all()
    assert rejected.routed_s.isna().all() and rejected.end_s.isna().all()
    # in flight (routed, not yet ended) never above the limit: rebuilt from the records
    routed = r[r.outcome != "rejected"]
    assert peak_in_flight(r, limited.first_token_limit_s, limited.deadline_s) <= 24
    # every request is in the records, and only routed ones were decided
    assert len(r) == len(free) and len(read_table(d, "decisions")) == len(routed)
    # a rejection is cheap: the limited run's admitted requests fail less than the free run's requests
    assert (routed.outcome != "ok").mean() < (free.outcome != "ok").mean()


def _dead_pull_spec(tmp_path, on_abort: str, rows: str, r: float, deadline_s: float, max_batch: int = 256,
                    **engine):
    """by_pod, one worker a pod (pod 0 prefills, pod 1 decodes): every pull crosses pod 0's slowed uplink."""
    trace = tmp_path / f"trace-{on_abort}.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return _spec(topology={"pods": 2, "workers_per_pod": 1, "placement": "by_pod", "nic_gbps": 8.0, "uplink_gbps": 8.0},
                 engine={"kv_pull_on_abort": on_abort, "decode_max_batch": max_batch, **engine},
                 workload={"arrival": {"kind": "trace", "path": str(trace)}, "max_requests": None,
                           "prompt": None, "output": None},
                 faults=[{"kind": "link", "pods": [0], "residual_bw": r, "start_s": 0.0, "duration_s": 1000.0}],
                 deadline_s=deadline_s)


@pytest.mark.parametrize("on_abort", ["cancel", "finish"])
def test_a_pull_given_up_at_its_deadline_is_cancelled_or_finishes_as_dead_work(tmp_path, on_abort):
    # prefill 0-1 s; the pull of 1008 tokens' KV at r = 0.1 of 8 Gbit/s takes 10 x 0.132 s; the
    # deadline (1.5 s) comes 0.5 s into it
    d, r = _run(tmp_path, _dead_pull_spec(tmp_path, on_abort, "0.0,1000,10\n", 0.1, 1.5))
    (row,) = r.itertuples()
    assert row.outcome == "timeout" and row.failed_stage == "kv_transfer"
    (dead,) = read_table(d, "dead_pulls").itertuples()
    nbytes = 1008 * KV
    pull_s = nbytes / (0.1 * 8.0 * GBPS)
    assert (dead.request_id, dead.prefill_pod, dead.decode_pod, dead.kv_bytes) == (0, 0, 1, nbytes)
    assert dead.given_up_s == pytest.approx(1.5)
    if on_abort == "cancel":
        assert (dead.ending, dead.end_s, dead.bytes_after) == ("cancelled", pytest.approx(1.5), 0.0)
    else:  # the rest of the pull, at the link's rate, after the request was given up
        assert dead.ending == "done" and dead.end_s == pytest.approx(1.0 + pull_s)
        assert dead.bytes_after == pytest.approx(nbytes * (1.0 + pull_s - 1.5) / pull_s)
    from analysis.run.scalars import run_metrics

    m = run_metrics(d)  # what the report counts as dead work
    assert (m["n_dead_pulls"], m["dead_kv_bytes"]) == ((0, 0.0) if on_abort == "cancel" else (1, dead.bytes_after))


def test_a_pull_that_outlives_an_unrenewed_kv_lease_ends_corrupt(tmp_path):
    # r = 0.01: request 0's pull of 1008 tokens' KV takes 13.2 s from its prefill's end at 1 s, past a
    # 6 s lease; request 1's 112 tokens take 1.5 s from 20.1 s, within it. The deadline (30 s) is not
    # reached, so each decodes to its end and vLLM would return both as successes.
    rows = "0.0,1000,10\n20.0,100,10\n"
    _, held = _run(tmp_path / "derived", _dead_pull_spec(tmp_path, "cancel", rows, 0.01, 30.0))
    assert held.outcome.tolist() == ["ok", "ok"]  # no lease set: it outlives every live request
    # vLLM 0.32's decoder renews the lease while it pulls: a short one changes nothing
    _, renewed = _run(tmp_path / "renewed", _dead_pull_spec(tmp_path, "cancel", rows, 0.01, 30.0, kv_lease_s=6))
    assert renewed.outcome.tolist() == ["ok", "ok"]
    d, r = _run(tmp_path / "short", _dead_pull_spec(tmp_path, "cancel", rows, 0.01, 30.0, kv_lease_s=6,
                                                    kv_lease_renewed=False))
    assert r.outcome.tolist() == ["corrupt", "ok"]
    assert r.kv_end_s[0] - r.prefill_end_s[0] > 6 > r.kv_end_s[1] - r.prefill_end_s[1]
    # decoded to its end, blamed on the transfer that read the freed blocks
    assert r.failed_stage[0] == "kv_transfer" and r.end_s[0] == pytest.approx(held.end_s[0])
    from analysis.run.scalars import run_metrics

    m = run_metrics(d)
    assert (m["n_corrupt"], m["outputs_checked"], m["corrupt_rate_checked"]) == (1, 2, 0.5)
    assert m["failure_rate"] == 0.5 and m["fail_share_kv_transfer"] == 1.0
    with pytest.raises(ValueError, match="kv_lease_s"):
        _dead_pull_spec(tmp_path, "cancel", rows, 0.01, 30.0, kv_lease_s=5)


@pytest.mark.parametrize("on_abort, second", [("cancel", "kv_transfer"), ("finish", "decode_queue")])
def test_a_dead_pull_holds_its_decode_slot_until_it_ends(tmp_path, on_abort, second):
    # one decode slot; request 0's pull (13.2 s at r = 0.01) is given up at 5 s; request 1, prefilled
    # by 1.1 s, waits for the slot: freed at 5 s when cancelled, at 14.2 s when the pull goes on
    # (past request 1's own deadline, 5.5 s: it never leaves the decode queue)
    d, r = _run(tmp_path, _dead_pull_spec(tmp_path, on_abort, "0.0,1000,10\n0.5,100,10\n", 0.01, 5.0, max_batch=1))
    assert r.outcome.tolist() == ["timeout", "timeout"]
    assert r.failed_stage.tolist() == ["kv_transfer", second]
    if on_abort == "cancel":
        assert r.kv_start_s[1] == pytest.approx(5.0)  # admitted the moment request 0's pull stopped
    dead = read_table(d, "dead_pulls").sort_values("request_id")
    assert dead.request_id.tolist() == ([0, 1] if on_abort == "cancel" else [0])
    if on_abort == "finish":
        assert dead.ending.tolist() == ["done"] and dead.end_s.item() == pytest.approx(1.0 + 1008 * KV / (0.01 * 8.0 * GBPS))


def test_the_control_path_adds_its_legs_where_the_testbed_has_them(tmp_path):
    """engine.prefill_call_s, decode_call_s and decode_join_s: the call to the prefill engine, the
    call to the decode engine, and the wait for the decode scheduler after the pull, each where the
    testbed's router records it (docs/twin.md "A calibration under the run's conditions")."""
    legs = {"prefill_call_s": 0.3, "decode_call_s": 0.2, "decode_join_s": 0.05}
    _, plain = _run(tmp_path / "plain", _spec())
    _, r = _run(tmp_path / "legs", _spec(engine=legs))
    (p,), (row,) = plain.itertuples(), r.itertuples()
    assert row.outcome == "ok" and row.routed_s == row.arrival_s
    assert row.prefill_start_s - row.arrival_s == pytest.approx(0.3)
    assert row.prefill_end_s - row.prefill_start_s == pytest.approx(1.0)
    assert row.kv_start_s - row.prefill_end_s == pytest.approx(0.2)
    assert row.kv_end_s - row.kv_start_s == pytest.approx(p.kv_end_s - p.kv_start_s)
    assert row.first_token_s - row.kv_end_s == pytest.approx(0.05 + 0.01)  # the join, then one step
    assert row.end_s - row.arrival_s == pytest.approx(p.end_s - p.arrival_s + 0.55)


def test_a_request_given_up_before_its_decode_join_frees_its_place(tmp_path):
    """A deadline between the pull's end and the join: the request times out in decode without
    ever being in the batch, and its reserved slot goes to the next (one slot per decoder)."""
    spec = _spec(deadline_s=3.0, engine={"decode_join_s": 5.0, "decode_max_batch": 1},
                 workload={"arrival": {"kind": "poisson", "rate_rps": 1000.0}, "max_requests": 2},
                 topology={"pods": 1, "workers_per_pod": 2})
    _, r = _run(tmp_path, spec)
    assert r.outcome.tolist() == ["timeout", "timeout"] and r.failed_stage.tolist() == ["decode", "kv_transfer"]
    # the second was admitted (its pull started) only once the first gave its slot back, at 3 s
    assert r.kv_start_s[1] == pytest.approx(r.arrival_s[0] + 3.0)
