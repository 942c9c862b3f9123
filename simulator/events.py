"""The simulator's cheap events: plain callbacks on SimPy's queue, and chains beside it.

A SimPy ``Timeout`` plus a closure appended to its callbacks, or a generator
process resumed by one, costs several times what the model does at that
instant, and a simulated request needs about six of them. Two cheaper kinds,
both ordered exactly as the SimPy events they replace (by time, priority, then
creation: SimPy's event id), so a run's event order, ties included, is what it
would be with timeouts and processes:

* :func:`call_after` puts a minimal event on SimPy's queue. ``Environment.step``
  asks an event only for ``callbacks`` (called with the event) and ``_ok``;
  :class:`Call` has nothing else, and its ``data`` slot carries what the
  callback needs, so no closure is built per event.
* A :class:`Chain` is a callback with exactly one wake-up pending at a time:
  what a process that sleeps on one timeout after another is (the arrivals, and
  the sweeps of the per-request limits). Its pending wake-up is not an event but
  the key SimPy would have given the timeout, an event id included, drawn at the
  same moment; :func:`run_until` runs SimPy's queue and the chains together in
  key order. A wake-up then costs neither an event nor a trip through the queue.

:func:`run_until` also runs a :class:`Call` itself (as ``Environment.step``
would: it has one callback and cannot fail) and hands every other event to
``step``. This module reads and writes SimPy's queue, event-id counter and clock
(``_queue``, ``_eid``, ``_now``: SimPy 4's ``Environment``, pinned to 4.1.x in
pyproject.toml); nothing else in the simulator does (the model reads the clock as
``env.now``), and tests/test_sim_events.py checks that the order is SimPy's and that
no other module reads these internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any, Callable

import simpy
from simpy.events import NORMAL, URGENT

__all__ = ["Call", "Chain", "call_after", "run_until"]

# The key of a chain that will not wake again: after every (time, priority, id, chain) key.
_NEVER = (float("inf"),)


class Call:
    """An event that runs ``fn(self)`` when the clock reaches it (it cannot fail or be cancelled:
    a callback that no longer applies checks for itself, e.g. against the latest event it made)."""

    __slots__ = ("callbacks", "data")
    _ok = True  # what Environment.step checks after the callbacks

    def __init__(self, fn: Callable[[Call], None], data: Any) -> None:
        self.callbacks: tuple[Callable[[Call], None], ...] | None = (fn,)
        self.data = data


_new_call = object.__new__


def call_after(env: simpy.Environment, delay: float, fn: Callable[[Call], None], data: Any = None) -> Call:
    """Run ``fn(event)`` ``delay`` seconds from now, where a ``env.timeout(delay)`` made now would fire."""
    ev = _new_call(Call)  # Call(fn, data), without the call of __init__ (a few events per request)
    ev.callbacks = (fn,)
    ev.data = data
    # What env.schedule(ev, NORMAL, delay) does, without the call.
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), ev))
    return ev


class Chain:
    """A callback with one wake-up pending at a time, woken by :func:`run_until`.

    Made, it is due at once, before any ordinary event of this instant (where a SimPy process
    made at this point would start). ``fn(chain)`` runs when it is due; it calls :meth:`sleep`
    for its next wake-up, or :meth:`end`. Only its own callback may reschedule a chain.
    ``data`` is the callback's to use.
    """

    __slots__ = ("env", "fn", "key", "data")

    def __init__(self, env: simpy.Environment, fn: Callable[[Chain], None], data: Any = None) -> None:
        self.env, self.fn, self.data = env, fn, data
        # (time, priority, event id) as SimPy would key its Initialize event, then the chain
        # itself (never compared: event ids differ).
        self.key: tuple[Any, ...] = (env.now, URGENT, next(env._eid), self)

    def sleep(self, delay: float) -> None:
        """Wake up ``delay`` seconds from now, where ``env.timeout(delay)`` made now would fire."""
        env = self.env
        self.key = (env._now + delay, NORMAL, next(env._eid), self)  # as Environment.schedule keys it

    def end(self) -> None:
        """Wake up no more."""
        self.key = _NEVER


def run_until(env: simpy.Environment, until: float, chains: Sequence[Chain]) -> None:
    """``env.run(until)``, waking ``chains`` in their place among SimPy's events (the clock
    ends at ``until``, as with ``env.run``)."""
    at = float(until)
    if at <= env.now:
        raise ValueError(f"until ({at}) must be greater than the current simulation time")
    queue, step = env._queue, env.step
    # Where env.run(until) would schedule the event that stops it (urgent: first at its time),
    # kept among the chains' wake-ups (a heap), so one comparison finds what comes next.
    stop = (env._now + (at - env._now), URGENT, next(env._eid))
    pending = [c.key for c in chains] + [stop]
    heapify(pending)
    due = pending[0]
    while True:
        if queue:
            entry = queue[0]
            if entry < due:  # keys differ in their event ids, so never tie
                event = entry[3]
                if event.__class__ is Call:  # step()'s work for an event with one callback that cannot fail
                    heappop(queue)
                    env._now = entry[0]
                    fn = event.callbacks[0]
                    event.callbacks = None
                    fn(event)
                else:
                    step()
                continue
        if due is stop:
            break
        else:
            env._now = due[0]
            chain = due[3]
            chain.fn(chain)
            heapreplace(pending, chain.key)
            due = pending[0]
    env._now = stop[0]
