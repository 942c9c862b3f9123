import numpy as np
import pytest

from core.policies import POLICY_NAMES, UnknownPolicy, Weights, make_policy
from core.topology import Topology
from core.view import Capacity, ClusterView, Loads, PodState

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

CAP = Capacity(prefill_slots=8, prefill_token_budget=8192, decode_slots=64, decode_kv_tokens=100_000)


def _view(pods=8, wpp=4, seed=0) -> ClusterView:
    topo = Topology.build(pods, wpp)
    rng = np.random.default_rng(seed)
    loads = Loads.zeros(topo)
    loads.prefill_outstanding[:] = rng.integers(0, 8, loads.prefill_outstanding.size)
    loads.prefill_tokens[:] = loads.prefill_outstanding * 1000
    loads.decode_outstanding[:] = rng.integers(0, 64, loads.decode_outstanding.size)
    loads.decode_kv_tokens[:] = loads.decode_outstanding * 1200
    return ClusterView(topo, CAP, loads, PodState.initial(pods))


def test_unknown_policy_lists_known_names():
    with pytest.raises(UnknownPolicy) as e:
        make_policy("LeastConn", Weights(), np.random.default_rng(0))
    msg = str(e.value)
    assert "LeastConn" in msg and "\n" not in msg
    for name in POLICY_NAMES:
        assert name in msg


def test_lc_picks_least_loaded_prefill_and_decode():
    view = _view()
    pol = make_policy("LC", Weights(), np.random.default_rng(0))
    c = pol.choose(view)
    lp = view.loads.prefill_outstanding
    ld = view.loads.decode_outstanding
    assert lp[c.prefill] == lp.min()
    assert ld[c.decode] == ld.min()


def test_lc_spreads_ties_instead_of_always_worker_zero():
    view = _view()
    view.loads.prefill_outstanding[:] = 0
    view.loads.decode_outstanding[:] = 0
    pol = make_policy("LC", Weights(), np.random.default_rng(0))
    picks = {pol.choose(view).prefill for _ in range(20)}
    assert len(picks) > 10


@pytest.mark.parametrize("policy", ["FaultAwareLC", "FaultAwareOTF-R"])
def test_fault_aware_never_picks_a_masked_pod_while_an_unmasked_one_exists(policy):
    rng = np.random.default_rng(1)
    for trial in range(200):
        view = _view(seed=trial)
        unhealthy = rng.random(8) < 0.8
        unhealthy[rng.integers(8)] = False  # at least one healthy pod
        # masked pods are the least loaded ones: a load-only policy would pick them
        topo = view.topo
        view.loads.prefill_outstanding[unhealthy[topo.prefill_pod]] = 0
        view.loads.decode_outstanding[unhealthy[topo.decode_pod]] = 0
        view.pods = view.pods.replace(unhealthy=unhealthy, price=rng.random(8))
        c = make_policy(policy, Weights(), np.random.default_rng(trial)).choose(view)
        assert not unhealthy[topo.prefill_pod[c.prefill]]
        assert not unhealthy[topo.decode_pod[c.decode]]


def test_all_masked_falls_back_to_all_pods():
    view = _view()
    view.pods = view.pods.replace(unhealthy=np.ones(8, bool))
    c = make_policy("FaultAwareLC", Weights(), np.random.default_rng(0)).choose(view)
    assert view.loads.prefill_outstanding[c.prefill] == view.loads.prefill_outstanding.min()


def _by_pod_picks(policy: str, **pods) -> tuple[Topology, list]:
    """30 choices of ``policy`` on 4 pods by_pod (pods 0-1 prefill, 2-3 decode) in pod state ``pods``."""
    topo = Topology.build(4, 1, placement="by_pod")
    view = ClusterView(topo, CAP, Loads.zeros(topo), PodState.initial(4))
    view.pods = view.pods.replace(**{k: np.array(v) for k, v in pods.items()})
    pol = make_policy(policy, Weights(), np.random.default_rng(0))
    return topo, [pol.choose(view) for _ in range(30)]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_role_filtered_out_whole_falls_back_alone_on_pods_of_one_role(policy):
    # Every decode pod's breaker open and prefill pod 1's: the decode role falls back to both its
    # pods, the prefill role still keeps pod 1 out.
    topo, picks = _by_pod_picks(policy, blocked=[False, True, True, True])
    assert {int(topo.prefill_pod[c.prefill]) for c in picks} == {0}
    assert {int(topo.decode_pod[c.decode]) for c in picks} <= {2, 3}
    assert all(np.isfinite(c.score) for c in picks)


@pytest.mark.parametrize("policy", ["FaultAwareLC", "FaultAwareOTF-R"])
def test_every_prefill_pod_masked_leaves_the_decode_mask_in_force(policy):
    topo, picks = _by_pod_picks(policy, unhealthy=[True, True, True, False])
    assert {int(topo.prefill_pod[c.prefill]) for c in picks} == {0, 1}
    assert {int(topo.decode_pod[c.decode]) for c in picks} == {3}
    assert all(np.isfinite(c.score) for c in picks)


def test_oracle_never_picks_a_degraded_pod_and_ignores_labels():
    rng = np.random.default_rng(2)
    for trial in range(200):
        view = _view(seed=trial)
        degraded = rng.random(8) < 0.7
        degraded[rng.integers(8)] = False
        view.pods = view.pods.replace(degraded=degraded, unhealthy=~degraded)  # labels lie
        pol = make_policy("OracleAvoidance", Weights(), np.random.default_rng(trial))
        for _ in range(3):
            c = pol.choose(view)
            assert not degraded[view.topo.prefill_pod[c.prefill]]
            assert not degraded[view.topo.decode_pod[c.decode]]


def test_otfr_price_moves_traffic_off_a_risky_pod():
    view = _view()
    view.loads.prefill_outstanding[:] = 1
    view.loads.decode_outstanding[:] = 1
    risky = 3
    price = np.zeros(8)
    price[risky] = 2.0
    view.pods = view.pods.replace(price=price)
    otfr = make_policy("OTF-R", Weights(), np.random.default_rng(0))
    lc = make_policy("LC", Weights(), np.random.default_rng(0))
    topo = view.topo
    otfr_hits = sum(topo.prefill_pod[otfr.choose(view).prefill] == risky for _ in range(64))
    lc_hits = sum(topo.prefill_pod[lc.choose(view).prefill] == risky for _ in range(64))
    assert otfr_hits == 0 and lc_hits > 0
    # the price trades off against load: once every other worker is loaded enough, the risky pod wins
    view.loads.prefill_outstanding[topo.prefill_pod != risky] = 8 * 3  # load 3 > price 2
    assert topo.prefill_pod[otfr.choose(view).prefill] == risky


def test_path_weight_prefers_decode_in_the_prefill_pod():
    view = _view()
    view.loads.decode_outstanding[:] = 0
    pol = make_policy("OTF-R", Weights(lambda_p=1.0), np.random.default_rng(0))
    for _ in range(16):
        c = pol.choose(view)
        assert view.topo.prefill_pod[c.prefill] == view.topo.decode_pod[c.decode]


def test_banaserve_orders_by_utilisation_bucket_then_queue():
    view = _view(pods=1, wpp=4)  # 2 prefill, 2 decode workers
    ld = view.loads
    ld.decode_outstanding[:] = [1, 5]
    ld.decode_kv_tokens[:] = [90_000, 1_000]  # worker 0: few requests but KV memory nearly full
    c = make_policy("BanaServe", Weights(), np.random.default_rng(0)).choose(view)
    assert c.decode == 1
    ld.decode_kv_tokens[:] = [1_000, 1_500]  # same 0-10% bucket: the shorter queue wins
    c = make_policy("BanaServe", Weights(), np.random.default_rng(0)).choose(view)
    assert c.decode == 0


def test_random_round_robin_p2c_cover_candidates_and_respect_nothing_else():
    view = _view()
    n_p = view.topo.prefill_ids.size
    rr = make_policy("RoundRobin", Weights(), np.random.default_rng(0))
    assert [rr.choose(view).prefill for _ in range(n_p)] == list(range(n_p))
    rnd = make_policy("Random", Weights(), np.random.default_rng(0))
    seen = {rnd.choose(view).prefill for _ in range(400)}
    assert len(seen) == n_p
    p2c = make_policy("PowerOfTwo", Weights(), np.random.default_rng(0))
    lp = view.loads.prefill_outstanding
    picks = [p2c.choose(view).prefill for _ in range(400)]
    # the more loaded half of the workers is picked less often than the lighter half
    heavy = lp[picks] > np.median(lp)
    assert heavy.mean() < 0.5


def test_choice_reports_candidates_and_filtered():
    view = _view()
    unhealthy = np.zeros(8, bool)
    unhealthy[:2] = True
    view.pods = view.pods.replace(unhealthy=unhealthy)
    c = make_policy("FaultAwareLC", Weights(), np.random.default_rng(0)).choose(view)
    assert c.n_candidates == view.topo.n_workers
    assert c.n_filtered == 2 * 4  # two pods of four workers


def test_policy_recomputes_when_pod_state_changes():
    view = _view()
    pol = make_policy("FaultAwareLC", Weights(), np.random.default_rng(0))
    pol.choose(view)
    unhealthy = np.ones(8, bool)
    unhealthy[5] = False
    view.pods = view.pods.replace(unhealthy=unhealthy)
    c = pol.choose(view)
    assert view.topo.prefill_pod[c.prefill] == 5


def test_a_policy_reads_the_price_when_a_weighted_scorer_moves_with_it_whatever_its_name(monkeypatch):
    """reads_price probes each pod scorer (core/policies/registry.py): `testbed study` shares a price-blind
    policy's runs across telemetry settings, so a scorer that reads the price under another name must
    count, and one that does not must not."""
    from core.policies import registry, reads_price, scorers
    from core.policies.base import PolicyConfig

    assert reads_price("OTF-R", Weights()) and reads_price("FaultAwareOTF-R", Weights())
    assert not reads_price("LC", Weights()) and not reads_price("FaultAwareLC", Weights())
    assert not reads_price("OTF-R", Weights(lambda_r=0.0))  # weighted out
    monkeypatch.setitem(scorers.POD_SCORERS, "step", lambda pods: (pods.price > 0.5).astype(float))
    variants = registry._variants
    monkeypatch.setattr(registry, "_variants", lambda w: {
        **variants(w), "LC": PolicyConfig("LC", pod_scorers=(("step", 1.0), ("health", 1.0)))})
    assert reads_price("LC", Weights())
    monkeypatch.setattr(registry, "_variants", lambda w: {
        **variants(w), "LC": PolicyConfig("LC", pod_scorers=(("health", 1.0),))})
    assert not reads_price("LC", Weights())
