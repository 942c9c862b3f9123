"""The simulator's hot path computes exactly what the plain formulation does."""

from __future__ import annotations

import numpy as np
import pytest

from core.policies import Weights, make_policy
from core.policies.pickers import ArgMin
from core.records import RequestRecord, RunWriter, read_table
from core.risk import RiskPriceEstimator
from core.stages import blamed_pods
from core.topology import Topology
from core.view import Capacity, ClusterView, Loads, PodState

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def _topology() -> Topology:
    return Topology.build(4, 6)


def _separate(loads: Loads) -> Loads:
    """The same counters in four separate arrays (no both-roles array)."""
    return Loads(loads.prefill_outstanding.copy(), loads.prefill_tokens.copy(), loads.decode_outstanding.copy(),
                 loads.decode_kv_tokens.copy())


@pytest.mark.parametrize("policy", ["LC", "FaultAwareLC", "OTF-R", "FaultAwareOTF-R", "OracleAvoidance",
                                    "PowerOfTwo", "BanaServe"])
def test_scoring_both_roles_in_one_pass_chooses_as_two_passes(policy):
    topo = _topology()
    cap = Capacity(7, 8192, 13, 400000)  # slots whose reciprocals round
    rng = np.random.default_rng(3)
    joint = ClusterView(topo, cap, Loads.zeros(topo), PodState.initial(topo.n_pods))
    weights = Weights(lambda_p=0.5)
    a = make_policy(policy, weights, np.random.default_rng(0))
    b = make_policy(policy, weights, np.random.default_rng(0))
    for step in range(300):
        if step % 25 == 0:
            joint.pods = PodState(rng.random(topo.n_pods) < 0.3, rng.random(topo.n_pods) < 0.3,
                                  rng.random(topo.n_pods) * rng.integers(0, 2))
        joint.loads.prefill_outstanding[:] = rng.integers(0, 9, topo.prefill_ids.size)
        joint.loads.decode_outstanding[:] = rng.integers(0, 30, topo.decode_ids.size)
        joint.loads.prefill_tokens[:] = rng.integers(0, 9000, topo.prefill_ids.size)
        joint.loads.decode_kv_tokens[:] = rng.integers(0, 500000, topo.decode_ids.size)
        apart = ClusterView(topo, cap, _separate(joint.loads), joint.pods)
        assert a.choose(joint) == b.choose(apart)


def test_argmin_takes_the_first_lowest_score_from_a_rotating_start():
    def reference(score, k):  # scan from k round to k - 1, keep the first strictly lower
        best = k
        for i in list(range(k, score.size)) + list(range(k)):
            if score[i] < score[best]:
                best = i
        return best

    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 12))
        score = rng.integers(0, 4, n).astype(float)
        score[rng.random(n) < 0.1] = np.inf
        picker = ArgMin()
        picker._turn = int(rng.integers(0, 50))
        k = picker._turn % n
        assert picker.pick(score, np.arange(n), rng) == reference(score, k)


def test_pod_utilisation_sums_like_one_add_per_worker():
    topo = _topology()
    cap = Capacity(7, 8192, 13, 400000)
    view = ClusterView(topo, cap, Loads.zeros(topo), PodState.initial(topo.n_pods))
    rng = np.random.default_rng(1)
    for _ in range(50):
        view.loads.prefill_outstanding[:] = rng.integers(0, 10, topo.prefill_ids.size)
        view.loads.decode_outstanding[:] = rng.integers(0, 15, topo.decode_ids.size)
        u = np.zeros(topo.n_pods)
        np.add.at(u, topo.prefill_pod, np.minimum(view.loads.prefill_outstanding / cap.prefill_slots, 1.0))
        np.add.at(u, topo.decode_pod, np.minimum(view.loads.decode_outstanding / cap.decode_slots, 1.0))
        assert np.array_equal(view.pod_util(), u / np.bincount(topo.worker_pod, minlength=topo.n_pods))


def test_risk_counts_match_counting_straight_into_the_ring():
    n_pods, window, bucket = 5, 4.0, 1.0
    est = RiskPriceEstimator(n_pods, Weights(), window, bucket)
    rng = np.random.default_rng(2)
    ids = np.full(4, -1)
    total, timeouts, failures = (np.zeros((4, n_pods)) for _ in range(3))
    now = 0.0
    for _ in range(2000):
        now += float(rng.exponential(0.05))
        pp, dp = int(rng.integers(-1, n_pods)), int(rng.integers(0, n_pods))
        outcome = str(rng.choice(["ok", "ok", "ok", "timeout", "error"]))
        stage = str(rng.choice(["prefill", "decode_queue", "kv_transfer", "decode"])) if outcome != "ok" else None
        est.observe(now, pp, dp, outcome, stage)
        b = int(now // bucket)
        s = b % 4
        if ids[s] != b:
            ids[s] = b
            total[s] = timeouts[s] = failures[s] = 0.0
        for p in {pp, dp} - {-1}:
            total[s, p] += 1.0
        if outcome != "ok":
            for p in blamed_pods(stage, pp, dp):
                (timeouts if outcome == "timeout" else failures)[s, p] += 1.0
        if rng.random() < 0.02:
            comp = est.update(now, np.zeros(n_pods), None, np.ones(n_pods))
            live = (ids > b - 4) & (ids <= b)
            denom = np.maximum(total[live].sum(axis=0), 1.0)
            assert np.array_equal(comp.timeout_rate, timeouts[live].sum(axis=0) / denom)
            assert np.array_equal(comp.failure_rate, failures[live].sum(axis=0) / denom)


def test_records_keep_nan_and_none_through_a_flush(tmp_path):
    rec = RequestRecord(1, 0.5, 10, 2, first_token_s=float("nan"), outcome="timeout", failed_stage=None)
    with RunWriter(tmp_path, {}) as w:
        w.write(rec)
        w.write(rec._replace(request_id=2, failed_stage="decode", end_s=3.0))
    df = read_table(tmp_path, "requests")
    assert df.request_id.tolist() == [1, 2]
    assert np.isnan(df.first_token_s).all() and df.end_s.isna().tolist() == [True, False]
    assert df.failed_stage.isna().tolist() == [True, False] and df.failed_stage[1] == "decode"
    assert df.outcome.tolist() == ["timeout", "timeout"]


def test_topology_path_is_uplink_and_downlink_across_pods():
    for topo in (_topology(), Topology.build(3, 4, placement="by_pod", prefill_fraction=0.34)):
        w = topo.n_workers
        for src in range(w):
            for dst in range(w):
                sp, dp = int(topo.worker_pod[src]), int(topo.worker_pod[dst])
                want = (src, w + dst) if sp == dp else (src, topo.uplink(sp), topo.downlink(dp), w + dst)
                assert topo.path(src, dst) == want


def test_hot_path_records_are_the_schema_rows(tmp_path):
    """Decisions and prices are built without the named tuples' constructors (core.records.make_row):
    like a request's record, each has every field of its table and writes and reads back."""
    from core.records import DecisionRecord, PriceRecord
    from core.routing import Router
    from core.experiment import make_router, seed_streams
    from core.spec.model import load_spec

    topo = _topology()
    spec = load_spec()
    rows = []
    router = make_router(spec, topo, "FaultAwareOTF-R", seed_streams(0), rows.append)
    assert isinstance(router, Router)
    t = router.route(0.5, 7, 0.25, 100, 20)
    t.enter("prefill", 0.75)
    rec = t.finish(2.0, "timeout")
    router.slow_tick(1.0)
    kinds = {type(r) for r in rows}
    assert {RequestRecord, DecisionRecord, PriceRecord} <= kinds
    for r in rows:
        assert len(r) == len(type(r)._fields)
        assert r == type(r)(*r)
    assert rec.failed_stage == "prefill" and rec.end_s != rec.end_s and rec.prefill_start_s == 0.75
    with RunWriter(tmp_path, {}) as w:
        for r in rows:
            w.write(r)
        assert w.writers["requests"].count == 1 and w.writers["prices"].count == topo.n_pods
    assert read_table(tmp_path, "decisions").request_id.tolist() == [7]
