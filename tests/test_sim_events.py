"""The simulator's cheap events keep SimPy's event order exactly, ties included."""

from __future__ import annotations

import pytest
import simpy

from simulator.events import Chain, call_after, run_until

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
