"""The simulator's cheap events keep SimPy's event order exactly, ties included."""

from __future__ import annotations

import pytest
import simpy

from simulator.events import Chain, call_after, run_until

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

# (delay, label) steps of three sleepers: equal times across them, zero delays, and a
# sleeper whose wake-ups fall on another's: ties that only the event ids order.
SCRIPTS = {
    "a": [(1.0, "a1"), (0.0, "a2"), (0.5, "a3"), (1.5, "a4"), (0.0, "a5")],
    "b": [(1.0, "b1"), (0.5, "b2"), (0.0, "b3"), (1.5, "b4")],
    "c": [(0.0, "c1"), (1.5, "c2"), (1.0, "c3"), (0.5, "c4")],
}


def _background(env: simpy.Environment, log: list, use_calls: bool) -> None:
    """Timers made from inside other timers, some due at the sleepers' times."""

    def fire(label: str, then: list[tuple[float, str]]) -> None:
        log.append((env.now, label))
        if then:
            delay, nxt = then[0]
            _after(env, delay, lambda: fire(nxt, then[1:]), use_calls)

    _after(env, 1.0, lambda: fire("t1", [(0.5, "t2"), (0.0, "t3"), (1.5, "t4")]), use_calls)
    _after(env, 2.0, lambda: fire("u1", [(0.0, "u2"), (0.5, "u3")]), use_calls)


def _after(env: simpy.Environment, delay: float, fn, use_calls: bool) -> None:
    if use_calls:
        call_after(env, delay, lambda _ev: fn())
    else:
        env.timeout(delay).callbacks.append(lambda _ev: fn())


def _with_processes(until: float) -> list:
    env, log = simpy.Environment(), []

    def sleeper(steps):
        for delay, label in steps:
            yield env.timeout(delay)
            log.append((env.now, label))

    for steps in SCRIPTS.values():
        env.process(sleeper(steps))
    _background(env, log, use_calls=False)
    env.run(until=until)
    return log + [(env.now, "end")]


def _with_chains(until: float) -> list:
    env, log = simpy.Environment(), []

    def wake(chain: Chain) -> None:
        steps, i = chain.data
        if i > 0:
            log.append((env.now, steps[i - 1][1]))
        if i == len(steps):
            chain.end()
            return
        chain.data = (steps, i + 1)
        chain.sleep(steps[i][0])

    chains = [Chain(env, wake, (steps, 0)) for steps in SCRIPTS.values()]
    _background(env, log, use_calls=True)
    run_until(env, until, chains)
    return log + [(env.now, "end")]


@pytest.mark.parametrize("until", [2.5, 3.0, 10.0])
def test_chains_and_calls_run_in_the_order_of_processes_and_timeouts(until):
    expected = _with_processes(until)
    assert _with_chains(until) == expected
    assert len({t for t, _ in expected}) < len(expected)  # the scripts do tie


def test_call_after_is_ordered_like_a_timeout_made_at_the_same_point():
    env, log = simpy.Environment(), []
    for i in range(6):
        if i % 2:
            call_after(env, 1.0, lambda ev: log.append(ev.data), i)
        else:
            env.timeout(1.0).callbacks.append(lambda _ev, i=i: log.append(i))
    env.run()
    assert log == list(range(6))


def test_run_until_stops_where_env_run_would():
    env, log = simpy.Environment(), []
    call_after(env, 2.0, lambda _ev: log.append("at until"))
    call_after(env, 1.0, lambda _ev: log.append("before"))
    run_until(env, 2.0, [])
    assert log == ["before"] and env.now == 2.0
    with pytest.raises(ValueError, match="greater than the current"):
        run_until(env, 2.0, [])


def test_the_simpy_internals_the_simulator_uses_are_where_it_expects_them():
    """simulator/events.py reads and writes Environment._queue, ._eid and ._now (SimPy 4.1's, for
    speed; pyproject.toml accepts 4.1.x only): this fails, naming what moved, when a SimPy release
    changes them, before a run's event order silently does."""
    import itertools
    from importlib.metadata import version

    from simpy.events import NORMAL, URGENT

    assert version("simpy").startswith("4.1."), f"simpy {version('simpy')}: pyproject.toml pins 4.1.x"
    env = simpy.Environment(initial_time=2.5)
    assert env._now == env.now == 2.5, "Environment._now is no longer the clock"
    assert isinstance(env._queue, list) and env._queue == [], "Environment._queue is no longer a plain heap list"
    assert isinstance(env._eid, itertools.count), "Environment._eid is no longer an itertools.count"
    t = env.timeout(1.0)
    assert env._queue == [(3.5, NORMAL, 0, t)], f"Environment.schedule keys events otherwise: {env._queue}"
    assert next(env._eid) == 1 and NORMAL == 1 and URGENT == 0
    env._now = 3.0  # what run_until does: step() must take the clock from the key, not keep its own
    env.step()
    assert env.now == 3.5 and t.processed


# SimPy's Environment internals the simulator may touch, and the one module that may touch them.
SIMPY_INTERNALS = {"_queue", "_eid", "_now"}
INTERNALS_MODULE = "events.py"


def simpy_internals_outside(root) -> list[str]:
    """``file:line attribute`` of every read or write of SimPy's internals (an attribute named like
    one, on anything: the code is parsed, not grepped) in a simulator module other than events.py."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(root).glob("*.py")):
        if path.name == INTERNALS_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SIMPY_INTERNALS:
                found.append(f"{path.name}:{node.lineno} {node.attr}")
    return found


def test_only_the_events_module_touches_simpy_internals():
    from pathlib import Path

    assert simpy_internals_outside(Path(__file__).resolve().parents[1] / "simulator") == []


def test_a_read_of_the_clock_behind_the_property_is_caught(tmp_path):
    (tmp_path / "events.py").write_text("def f(env):\n    return env._now\n")
    (tmp_path / "cluster.py").write_text("def g(self):\n    now = self.env._now\n    return self.env.now, now\n")
    (tmp_path / "network.py").write_text("def h(env):\n    env._eid = None\n")
    assert simpy_internals_outside(tmp_path) == ["cluster.py:2 _now", "network.py:2 _eid"]
