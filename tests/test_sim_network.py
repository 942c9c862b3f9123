"""Fluid network model: exact finish times, max-min fairness, live capacity changes."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.network import FlowNetwork

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REL = 1e-9


def _net(caps: list[float]) -> tuple[simpy.Environment, FlowNetwork, dict[int, float]]:
    env = simpy.Environment()
    return env, FlowNetwork(env, np.array(caps, dtype=float)), {}


def _recorder(env: simpy.Environment, done: dict[int, float]):
    def on_done(fid: int) -> None:
        assert fid not in done, "completion reported twice"
        done[fid] = env.now

    return on_done


def _at(env: simpy.Environment, t: float, fn) -> None:
    """Run fn at simulated time t (from its own event, like a simulator process)."""
    env.timeout(t - env.now).callbacks.append(lambda _ev: fn())


def reference_rates(caps: np.ndarray, paths: list[list[int]]) -> np.ndarray:
    """Textbook progressive filling: raise every unfrozen flow together until a link fills."""
    rem = [float(c) for c in caps]
    rates = [0.0] * len(paths)
    unfrozen = set(range(len(paths)))
    while unfrozen:
        shares = {}
        for link in range(len(caps)):
            users = [f for f in unfrozen if link in paths[f]]
            if users:
                shares[link] = rem[link] / len(users)
        level = min(shares.values())
        full = [link for link, s in shares.items() if s <= level * (1 + 1e-12) + 1e-300]
        frozen = [f for f in unfrozen if any(link in paths[f] for link in full)]
        for f in frozen:
            rates[f] = level
            for link in paths[f]:
                rem[link] -= level
            unfrozen.discard(f)
    return np.array(rates)


def test_single_flow_finishes_at_size_over_capacity():
    env, net, done = _net([4e9])
    fid = net.start([0], 1e9, _recorder(env, done))
    assert net.rate(fid) == pytest.approx(4e9, rel=REL)
    env.run()
    assert done[fid] == pytest.approx(1e9 / 4e9, rel=REL)
    assert net.n_active == 0


def test_two_flows_share_a_link_and_the_first_to_finish_frees_it():
    C, big, small = 10.0, 30.0, 10.0
    env, net, done = _net([C])
    rec = _recorder(env, done)
    a = net.start([0], big, rec)
    b = net.start([0], small, rec)
    assert net.rate(a) == pytest.approx(C / 2, rel=REL)
    assert net.rate(b) == pytest.approx(C / 2, rel=REL)
    env.run()
    t_b = small / (C / 2)  # both at C/2 until b is done
    t_a = t_b + (big - small) / C  # then a alone at C
    assert done[b] == pytest.approx(t_b, rel=REL)
    assert done[a] == pytest.approx(t_a, rel=REL)


def test_degraded_link_slows_every_flow_through_it_from_that_instant():
    C, r, t0 = 100.0, 0.1, 0.5
    env, net, done = _net([C, C])
    rec = _recorder(env, done)
    a = net.start([0], 200.0, rec)  # shares link 0 with b
    b = net.start([0, 1], 100.0, rec)
    c = net.start([1], 100.0, rec)  # link 1: b is held to C/2 by link 0, so c gets C/2
    rates_before = {}

    def degrade() -> None:
        rates_before.update(a=net.rate(a), b=net.rate(b), c=net.rate(c))
        net.set_capacity(0, r * C)

    _at(env, t0, degrade)
    env.run(until=t0 + 1e-9)
    assert rates_before == pytest.approx({"a": C / 2, "b": C / 2, "c": C / 2}, rel=REL)
    assert net.rate(a) == pytest.approx(r * C / 2, rel=REL)
    assert net.rate(b) == pytest.approx(r * C / 2, rel=REL)
    assert net.rate(c) == pytest.approx(C - r * C / 2, rel=REL)  # c takes what b can no longer use
    env.run()
    moved = C / 2 * t0  # by a and by b before the fault
    t_b = t0 + (100.0 - moved) / (r * C / 2)
    t_a = t_b + (200.0 - moved - (t_b - t0) * r * C / 2) / (r * C)
    t_c = t0 + (100.0 - moved) / (C - r * C / 2)
    assert done[c] == pytest.approx(t_c, rel=1e-7)
    assert done[b] == pytest.approx(t_b, rel=1e-7)
    assert done[a] == pytest.approx(t_a, rel=1e-7)


def test_recovery_restores_the_rate_and_a_dead_link_stalls():
    C = 8.0
    env, net, done = _net([C])
    fid = net.start([0], 16.0, _recorder(env, done))
    _at(env, 1.0, lambda: net.set_capacity(0, 0.0))  # 8 bytes moved, then nothing
    _at(env, 3.0, lambda: net.set_capacity(0, C))
    env.run(until=2.0)
    assert net.rate(fid) == 0.0
    assert net.transferred(fid) == pytest.approx(8.0, rel=REL)
    env.run()
    assert done[fid] == pytest.approx(3.0 + 8.0 / C, rel=REL)


def test_max_min_redistribution():
    env, net, _ = _net([2.0, 10.0])
    A = net.start([0], 100.0, lambda f: None)
    B = net.start([0, 1], 100.0, lambda f: None)
    C = net.start([1], 100.0, lambda f: None)
    assert [net.rate(A), net.rate(B), net.rate(C)] == pytest.approx([1.0, 1.0, 9.0], rel=REL)
    assert net.link_load() == pytest.approx([2.0, 10.0], rel=REL)


def test_abort_returns_bytes_moved_and_frees_capacity():
    C = 10.0
    env, net, done = _net([C])
    rec = _recorder(env, done)
    a = net.start([0], 100.0, rec)
    b = net.start([0], 100.0, rec)
    got = {}
    _at(env, 2.0, lambda: got.update(moved=net.abort(b), rate=net.rate(a)))
    env.run()
    assert got["moved"] == pytest.approx(C / 2 * 2.0, rel=REL)
    assert got["rate"] == pytest.approx(C, rel=REL)
    assert b not in done  # an aborted flow never calls back
    assert done[a] == pytest.approx(2.0 + (100.0 - 10.0) / C, rel=REL)
    with pytest.raises(KeyError, match="not active"):
        net.abort(b)


def test_zero_byte_flow_completes_now_through_the_event_queue():
    env, net, done = _net([1.0])
    calls = []

    def later() -> None:
        calls.append(net.start([0], 0.0, lambda fid: calls.append((fid, env.now))))
        assert len(calls) == 1  # not called back inside start()

    _at(env, 3.0, later)
    env.run()
    assert calls == [0, (0, 3.0)]
    assert net.n_active == 0


def test_simultaneous_completions_all_reported_at_the_same_time():
    env, net, done = _net([5.0, 5.0, 5.0])
    rec = _recorder(env, done)
    ids = [net.start([i], 10.0, rec) for i in range(3)]
    ids += [net.start([0], 10.0, rec)]  # shares link 0: both there end at 4 s
    env.run()
    assert done[ids[1]] == pytest.approx(2.0, rel=REL)
    assert done[ids[2]] == pytest.approx(2.0, rel=REL)
    assert done[ids[0]] == pytest.approx(4.0, rel=REL)
    assert done[ids[3]] == pytest.approx(4.0, rel=REL)
    assert net.n_active == 0


def test_flows_started_inside_a_completion_callback():
    C = 2.0
    env, net, done = _net([C])
    ends = []

    def chain(fid: int) -> None:
        ends.append(env.now)
        if len(ends) < 5:
            net.start([0], 4.0, chain)

    net.start([0], 4.0, chain)
    env.run()
    assert ends == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0], rel=REL)


def test_transferred_and_rate_mid_flight():
    env, net, _ = _net([4.0, 1.0])
    f = net.start([0, 1], 10.0, lambda fid: None)
    g = net.start([0], 10.0, lambda fid: None)
    env.run(until=2.0)
    assert net.rate(f) == pytest.approx(1.0, rel=REL)
    assert net.rate(g) == pytest.approx(3.0, rel=REL)
    assert net.transferred(f) == pytest.approx(2.0, rel=REL)
    assert net.transferred(g) == pytest.approx(6.0, rel=REL)
    assert net.is_active(f) and not net.is_active(99)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda n: n.start([5], 1.0, print), "link 5 out of range"),
        (lambda n: n.start([0, -1], 1.0, print), "link -1 out of range"),
        (lambda n: n.start((1, np.int64(2)), 1.0, print), "link 2 out of range"),
        (lambda n: n.start([], 1.0, print), "at least one link"),
        (lambda n: n.start([0], -1.0, print), "flow size"),
        (lambda n: n.start([0, 1, 0], 1.0, print), "twice"),
        (lambda n: n.set_capacity(0, -2.0), "capacity of link 0"),
    ],
)
def test_bad_input_is_a_clear_error(call, match):
    _, net, _ = _net([1.0, 1.0])
    with pytest.raises(ValueError, match=match):
        call(net)


def test_bad_capacity_vector_is_a_clear_error():
    with pytest.raises(ValueError, match=r"capacity_Bps\[1\]"):
        FlowNetwork(simpy.Environment(), np.array([1.0, np.nan]))


def _check_against_reference(net: FlowNetwork, flows: dict[int, list[int]]) -> None:
    caps = np.array([net.capacity(i) for i in range(net.link_load().size)])
    ids = sorted(flows)
    want = reference_rates(caps, [flows[f] for f in ids])
    got = np.array([net.rate(f) for f in ids])
    scale = max(caps.max(), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9 * scale)
    load = net.link_load()
    assert np.all(load <= caps * (1 + 1e-9) + 1e-9 * scale), "a link is allocated beyond its capacity"


@pytest.mark.parametrize("seed", range(12))
def test_random_event_sequences_match_reference_water_filling(seed):
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(2, 9))
    # Few distinct capacities on purpose: ties between links are the hard case.
    levels = np.array([1.0, 2.0, 5.0, 10.0])
    caps = levels[rng.integers(0, 4, n_links)]
    env = simpy.Environment()
    net = FlowNetwork(env, caps)
    flows: dict[int, list[int]] = {}
    finished: list[int] = []

    def on_done(fid: int) -> None:
        finished.append(fid)
        del flows[fid]

    for _ in range(60):
        op = rng.random()
        if op < 0.55 or not flows:
            k = int(rng.integers(1, min(4, n_links) + 1))
            path = [int(x) for x in rng.choice(n_links, size=k, replace=False)]
            fid = net.start(path, float(rng.uniform(0.5, 20.0)), on_done)
            flows[fid] = path
        elif op < 0.7:
            victim = int(rng.choice(sorted(flows)))
            moved = net.abort(victim)
            assert moved >= 0.0
            del flows[victim]
        elif op < 0.85:
            link = int(rng.integers(n_links))
            factor = float(rng.choice([0.01, 0.05, 0.2, 1.0, 0.0]))
            net.set_capacity(link, caps[link] * factor if factor else 0.0)
        else:
            env.run(until=env.now + float(rng.exponential(1.0)))
        assert net.n_active == len(flows)
        _check_against_reference(net, flows)
    for link in range(n_links):
        net.set_capacity(link, caps[link])
    env.run()
    assert not flows and net.n_active == 0


def test_one_network_timer_not_one_per_flow():
    class CountingEnv(simpy.Environment):
        scheduled = 0

        def schedule(self, event, priority=1, delay=0):
            CountingEnv.scheduled += 1
            super().schedule(event, priority, delay)

    env = CountingEnv()
    net = FlowNetwork(env, np.full(4, 10.0))
    rng = np.random.default_rng(3)
    n = 200
    for _ in range(n):
        path = [int(x) for x in rng.choice(4, 2, replace=False)]
        net.start(path, float(rng.uniform(1, 10)), lambda f: None)
    env.run()
    assert net.n_active == 0
    # Each start and each completion may replace the single timer; rescheduling
    # every flow on every change would be ~n * n events.
    assert CountingEnv.scheduled <= 2 * (2 * n) + 2


def test_rebuilt_structure_solves_to_the_same_rates():
    rng = np.random.default_rng(11)
    env = simpy.Environment()
    net = FlowNetwork(env, rng.choice([1.0, 3.0, 10.0], 12))
    for _ in range(80):
        net.start([int(x) for x in rng.choice(12, int(rng.integers(1, 4)), replace=False)], 5.0, print)
    before = net.link_load()
    rates = net._rate[: net.n_active].copy()
    net._fill()  # progressive filling from scratch
    np.testing.assert_allclose(net._rate[: net.n_active], rates, rtol=1e-9)
    assert net._solve()  # its structure is a valid triangular system that verifies
    np.testing.assert_allclose(net.link_load(), before, rtol=1e-9)


def test_many_flows_on_a_small_fat_tree_agree_with_reference():
    rng = np.random.default_rng(7)
    n_pods = 8
    env = simpy.Environment()
    caps = np.full(2 * n_pods, 10.0)
    caps[[0, n_pods + 3]] = 1.0  # two degraded links
    net = FlowNetwork(env, caps)
    flows = {}
    for _ in range(150):
        src, dst = rng.choice(n_pods, 2, replace=False)
        path = [int(src), int(n_pods + dst)]
        flows[net.start(path, float(rng.uniform(1, 5)), lambda fid: flows.pop(fid))] = path
    _check_against_reference(net, flows)
    for t in (0.5, 1.0, 2.0, 4.0):
        env.run(until=t)
        _check_against_reference(net, flows)
    env.run()
    assert not flows
    # The fast paths and the repairs all took part (and agreed with the reference).
    assert all(net.stats[k] > 0 for k in ("shortcuts", "solves", "repairs")), net.stats
