"""Fluid-flow network: KV-cache transfers share every link they cross, max-min fair.

Each transfer is a *flow* over a few links. Between two changes (a flow starts,
ends or is aborted, or a link's capacity changes) every flow moves at a
constant rate; at each change the rates become the max-min fair allocation
again, so a degraded link slows every flow through it from that instant on and
the capacity it no longer uses goes to the others.

How a change is kept cheap:

* The max-min allocation is one *level* per bottleneck link, found by a
  triangular solve that is verified, repaired or replaced by a progressive
  filling (:mod:`simulator.maxmin`, the base class that holds that half).
* Changes that provably leave every other flow's rate alone skip all of that:
  a flow that fits into the spare capacity of its path without anyone through
  its fullest link being faster, and a flow that was the only one limited by
  its bottleneck and crosses no other bottleneck. In a lightly loaded fat-tree
  that is many of them (two thirds at 10 concurrent flows over 64 links).
  Otherwise the allocation is found again (:mod:`simulator.maxmin`).
* Active flows live densely in slots ``0..n-1`` (a finished flow's slot takes
  the last one); flow links are a ``(width, slots)`` int array padded with a
  sentinel link of infinite capacity, so per-flow work is a few elementwise
  calls over contiguous rows. Its columns (and each flow's bottleneck link)
  are written only when a vectorised path needs them: a shortcut reads each
  flow's path and bottleneck from Python lists.
* What the shortcuts read and update one link at a time (flows and
  bottleneck flows per link, allocated load, capacity and tolerance, the
  solve order) is kept in Python lists, and each flow's path, id and callback
  in a small object: a numpy element costs several times a list item, and a
  shortcut touches some thirty of them. A link's place in the solve order is
  looked up when needed (rare) rather than kept current on every change. The
  vectorised paths build the arrays they need from these (a solve is rare: a
  few per hundred changes), and Python floats round exactly as numpy's
  float64 does, so both give the same numbers. A flow's remaining bytes,
  finishing threshold and rate are one column of a ``(3, slots)`` array, so
  moving a flow to another slot is one copy.
* ONE pending timer (a :func:`simulator.events.call_after` callback), for the
  earliest completion (found vectorised); a change that moves rates replaces
  it, a shortcut only if the new flow ends first, and a superseded timer is
  ignored when it fires. Flows started or aborted inside ``on_done`` callbacks
  share one recomputation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import simpy

from .events import Call, call_after
from .maxmin import _REL_RATE_TOL, MaxMinAllocation

__all__ = ["FlowNetwork"]

# A flow within this fraction of its size of the end counts as finished, so
# float error never leaves a flow with a few stray bytes and a timer to match.
_REL_BYTES_EPS = 1e-9
# Verification slack: link loads relative to the link plus a floor relative to
# the largest capacity (for links of capacity 0); rates: simulator.maxmin.
_REL_LOAD_TOL = 1e-9
_ABS_LOAD_TOL = 1e-12
# Remaining times above this mean "not moving" (a flow on a zero-capacity link).
_NEVER = 1e100
# Floor for rates when dividing; gives a remaining time far beyond _NEVER.
_TINY_RATE = 1e-200
_INITIAL_SLOTS = 64
_INF = float("inf")
# Shortcut starts after a solve from which the link loads are kept as a list (see _load_now):
# at least _LOADS_TO_LIST, more in a large network (_LINKS_PER_LOAD_USE).
_LOADS_TO_LIST = 3
# A list costs a conversion of every link (some 10 ns each, freeing included) and saves some
# 0.7 us per shortcut that reads and updates it: it pays once the shortcuts number about the
# links / 64 (33 with the flagship's 2,112 links, where a list after 3 cost the LC study cell 5%).
_LINKS_PER_LOAD_USE = 64


class _Flow(NamedTuple):
    """What the network keeps of an active flow beside its slot's numbers: fixed at its start, so
    a named tuple, which start() builds with ``tuple.__new__`` (every field, in order): a fraction
    of the cost of an object with an ``__init__``, or of the named tuple's own constructor."""

    fid: int
    on_done: Callable[[int], None]
    size: float
    path: list[int]


_make_tuple = tuple.__new__


class FlowNetwork(MaxMinAllocation):
    """Max-min fair fluid flows over links of given capacity (bytes/second).

    ``start`` returns a flow id; ``on_done(flow_id)`` is called at the simulated
    time the flow's last byte arrives. Aborted flows never call back.
    """

    def __init__(self, env: simpy.Environment, capacity_Bps: np.ndarray) -> None:
        cap = np.asarray(capacity_Bps, dtype=np.float64)
        if cap.ndim != 1 or cap.size == 0:
            raise ValueError(f"capacity_Bps must be a non-empty 1-D array, got shape {cap.shape}")
        bad = np.flatnonzero(~np.isfinite(cap) | (cap < 0))
        if bad.size:
            raise ValueError(
                f"capacity_Bps[{int(bad[0])}] = {cap[bad[0]]!r}: capacities must be finite and >= 0"
            )
        self._env = env
        self._n_links = cap.size
        self._link_ids = frozenset(range(cap.size))  # the valid link numbers (start checks paths against it)
        S = self._sentinel = cap.size  # padding link: infinite capacity, never a bottleneck
        L1 = S + 1
        self._cap = np.append(cap, np.inf)
        self._tol = np.empty(L1)
        self._capl: list[float] = []  # _cap and _tol as lists, for the scalar paths
        self._toll: list[float] = []
        self._any_dead = False  # some link has capacity 0 (then rates can be 0)
        self._capacity_changed()

        self._n = 0  # active flows occupy slots 0..n-1
        self._width = 2  # link rows; grows if a longer path arrives
        slots = _INITIAL_SLOTS
        self._flows: list[_Flow] = []  # slot -> flow (its path: the column of _links without padding)
        self._bottleneck: list[int] = []  # slot -> the link that limits its flow
        # The same per slot as an array for the vectorised paths: its bottleneck link, then its
        # links, padded (_bl and _links are its rows). Written lazily: start and moves only note
        # the slots whose column is stale (_dirty), and _sync_columns writes those before a
        # vectorised path reads the array (a few times per hundred changes).
        self._ints = np.full((1 + self._width, slots), S, dtype=np.intp)
        self._bl, self._links = self._ints[0], self._ints[1:]
        self._dirty: set[int] = set()
        self._pad = [[S] * (self._width - k) for k in range(self._width + 1)]  # path length -> padding
        # Per slot: remaining bytes, remaining bytes that count as finished, rate. Likewise one
        # array; _rem, _done_at and _rate are its rows.
        self._flow = np.zeros((3, slots))
        self._rem, self._done_at, self._rate = self._flow
        self._slot: dict[int, int] = {}  # flow id -> slot
        self._zero: dict[int, Callable[[int], None]] = {}  # zero-byte flows awaiting their callback

        # Bottleneck structure (the level system's shape).
        self._nb = [0] * L1  # flows each link limits
        self._nfl = [0] * L1  # active flows per link
        # Bottleneck links in a valid solve order, a list: a shortcut appends or removes one. The
        # order as an array and each link's place in it (-1: none) are derived when a solve or a
        # non-shortcut change needs them (_order_array, _places), not kept current on every change.
        self._order: list[int] = []
        self._order_arr: np.ndarray | None = None  # None: derive again
        self._pos = np.full(L1, -1, dtype=np.intp)
        self._pos_for = np.zeros(0, dtype=np.intp)  # the order _pos holds places for
        # _AT[i, j]: flows limited by the i-th bottleneck that cross the j-th (so
        # _AT.T is the lower-triangular system, in the Fortran order LAPACK
        # wants). Kept in step with single flows; None: rebuild from the flows.
        self._AT: np.ndarray | None = None
        self._need_sort = False  # a new flow's bottleneck comes after another of its links
        self._lam = np.full(L1, np.inf)  # level per link; inf: not a bottleneck
        self._lam_next = np.full(L1, np.inf)  # buffer for trial levels
        # Allocated bytes/s per link (valid unless _stale). A solve leaves its array here; the
        # shortcuts read and update it item by item, which a list does several times faster, so
        # it becomes a list once enough shortcuts have used it (a list costs a conversion of
        # every link: not worth it when the next solve comes a few changes later). Either gives
        # the same numbers: Python floats round as numpy's float64 do.
        self._load_now: list[float] | np.ndarray = np.zeros(L1)
        self._load_uses = 0  # shortcuts since the last solve
        self._loads_to_list = max(_LOADS_TO_LIST, L1 // _LINKS_PER_LOAD_USE)
        self._trial: tuple[np.ndarray, np.ndarray] | None = None  # failed solve: levels, excess
        # Repair keys: level nudged by link number, so equal levels still give
        # one strict order (the nudge is far below the verification tolerance).
        idx = np.arange(L1, dtype=np.float64)
        self._pert = 1.0 + idx * 2.0**-50
        self._tiny = idx * 1e-300

        self._next_id = 0
        self._t_last = env.now  # time up to which _rem is current
        self._timer: Call | None = None  # the one pending completion timer
        self._timer_at = _INF  # when it fires
        self._target = -1  # flow id it completes
        self._batching = False  # inside completion callbacks: defer recomputation
        self._stale = False  # rates do not reflect the current flows/capacities
        # How allocations were found (see stats).
        self._shortcuts = self._solves = self._repairs = self._fills = 0

    # ------------------------------------------------------------------ public

    def start(self, links: Sequence[int], nbytes: float, on_done: Callable[[int], None]) -> int:
        """Start a flow of ``nbytes`` over ``links``; returns its flow id."""
        nbytes = float(nbytes)
        if not 0.0 <= nbytes < _INF:
            raise ValueError(f"flow size must be finite and >= 0 bytes, got {nbytes!r}")
        path = list(map(int, links))
        k = len(path)
        if k == 0:
            raise ValueError("a flow needs at least one link, got an empty path")
        distinct = set(path)  # one set checks both the range and repeats (cheaper than min, max and a set)
        if not distinct <= self._link_ids:
            x = next(x for x in path if not 0 <= x < self._n_links)
            raise ValueError(f"link {x} out of range: the network has links 0..{self._n_links - 1}")
        if len(distinct) != k:
            raise ValueError(f"path {path} crosses a link twice")
        fid = self._next_id
        self._next_id += 1
        if nbytes == 0.0:
            # Complete "now", but through the event queue, never inside start().
            self._zero[fid] = on_done
            ev = self._env.timeout(0)
            ev.callbacks.append(lambda _ev, fid=fid: self._zero_done(fid))
            return fid

        n = self._n
        if n == self._rem.size:
            self._grow_slots()
        if k > self._width:
            self._grow_width(k)
        f: _Flow = _make_tuple(_Flow, (fid, on_done, nbytes, path))
        self._flows.append(f)
        self._slot[fid] = n
        self._done_at[n] = _REL_BYTES_EPS * nbytes
        self._rem[n] = nbytes  # slot n is not advanced below (it joins the active slots after)
        rate, m = (0.0, -1) if self._stale else self._spare_rate(path)
        self._dirty.add(n)  # its column of _ints, written when next needed (not before: slot n is not active yet)
        if rate > 0.0:  # nobody else's rate changes
            now = self._env.now
            self._advance(now)
            self._add_alone(n, f, m, rate)
            self._n = n + 1
            if not self._batching:
                t_done = now + nbytes / rate
                if t_done < self._timer_at:
                    self._set_timer(t_done - now, fid, now)
        else:
            self._rate[n] = 0.0
            self._add_to_structure(n, f)
            self._stale = True
            self._n = n + 1
            if not self._batching:
                self._reallocate()
                self._schedule()
        return fid

    def abort(self, flow_id: int) -> float:
        """Remove an active flow (no callback); returns the bytes it moved."""
        if flow_id in self._zero:
            del self._zero[flow_id]
            return 0.0
        s = self._slot_of(flow_id)
        moved = self._moved(s, self._env.now - self._t_last)
        self._drop(s)
        if not self._batching:
            if self._stale:
                self._reallocate()
                self._schedule()
            elif flow_id == self._target:
                self._schedule()
        return moved

    def set_capacity(self, link: int, capacity_Bps: float) -> None:
        """Change a link's capacity now (degradation or recovery)."""
        link = int(link)
        c = float(capacity_Bps)
        if not 0 <= link < self._n_links:
            raise ValueError(f"link {link} out of range: the network has links 0..{self._n_links - 1}")
        if not (c >= 0.0 and c != np.inf):
            raise ValueError(f"capacity of link {link} must be finite and >= 0 B/s, got {capacity_Bps!r}")
        if self._cap[link] == c:
            return
        self._advance(self._env.now)  # rates change now (even if the recomputation is deferred)
        self._cap[link] = c
        self._capacity_changed()
        self._stale = True
        if not self._batching:
            self._reallocate()
            self._schedule()

    def capacity(self, link: int) -> float:
        """Current capacity of a link, bytes/second."""
        return float(self._cap[int(link)])

    def transferred(self, flow_id: int) -> float:
        """Bytes an active flow has moved so far."""
        if flow_id in self._zero:
            return 0.0
        s = self._slot_of(flow_id)
        return self._moved(s, self._env.now - self._t_last)

    def rate(self, flow_id: int) -> float:
        """Current rate of an active flow, bytes/second."""
        if flow_id in self._zero:
            return 0.0
        s = self._slot_of(flow_id)
        if self._stale:
            self._reallocate()
        return float(self._rate[s])

    def is_active(self, flow_id: int) -> bool:
        """Whether a flow was started and has neither finished nor been aborted."""
        return flow_id in self._slot or flow_id in self._zero

    @property
    def stats(self) -> dict[str, int]:
        """How allocations were found (benchmarks, tests): shortcuts taken, triangular solves,
        re-assignment rounds, full progressive fillings."""
        return {"shortcuts": self._shortcuts, "solves": self._solves, "repairs": self._repairs,
                "fills": self._fills}

    @property
    def n_active(self) -> int:
        """Number of flows with bytes still to move."""
        return self._n

    def link_load(self) -> np.ndarray:
        """Bytes/second currently allocated on each link."""
        if self._stale:
            self._reallocate()
        self._sync_columns()
        return self._load(self._rate[: self._n])[: self._n_links]

    # ------------------------------------------------------- flow bookkeeping

    def _slot_of(self, flow_id: int) -> int:
        try:
            return self._slot[flow_id]
        except KeyError:
            raise KeyError(f"flow {flow_id} is not active (finished, aborted or never started)") from None

    def _moved(self, s: int, dt: float) -> float:
        size = self._flows[s].size
        rem = float(self._rem[s]) - float(self._rate[s]) * dt
        return min(size, max(0.0, size - rem))

    def _capacity_changed(self) -> None:
        cap = self._cap
        self._tol[:] = _REL_LOAD_TOL * cap + _ABS_LOAD_TOL * float(cap[:-1].max())
        self._capl = cap.tolist()
        self._toll = self._tol.tolist()
        self._any_dead = bool(cap[:-1].min() == 0.0)

    def _advance(self, now: float) -> np.ndarray:
        """Move every flow forward to ``now`` (the clock's) at its current rate; returns the
        active flows' remaining bytes (a view)."""
        n = self._n
        rem = self._rem[:n]
        dt = now - self._t_last
        if dt > 0.0:
            if n:
                rem -= self._rate[:n] * dt  # in place on the view (``a[:n] -= x`` would copy it back onto itself)
            self._t_last = now
        return rem

    def _spare_rate(self, path: list[int]) -> tuple[float, int]:
        """Rate a new flow gets without changing any other flow's rate (else 0), and its link.

        That is the spare capacity t of its fullest link, provided no flow
        already through a link that it would fill is faster than t (else
        max-min fairness would take from that flow).
        """
        cap, load, tol, nb = self._capl, self._load_now, self._toll, self._nb
        t = _INF
        for x in path:
            if nb[x]:  # a bottleneck is full: the flow must take a share
                return 0.0, -1
            spare = cap[x] - load[x]
            if spare < t:
                t, xs = spare, x
        if not t > tol[xs]:
            return 0.0, -1
        nfl = self._nfl
        for x in path:
            if nfl[x] and cap[x] - load[x] <= t + tol[x]:
                if self._max_rate_on(x) > t * (1.0 + _REL_RATE_TOL):
                    return 0.0, -1
        # a Python float even when the loads are still an array: a numpy scalar would make the
        # flow's rate, its timer and so the clock numpy scalars (the same values, slower to use)
        return float(t), xs

    def _max_rate_on(self, x: int) -> float:
        self._sync_columns()
        n = self._n
        on = (self._links[:, :n] == x).any(axis=0)
        return float(self._rate[:n][on].max())

    def _add_alone(self, s: int, f: _Flow, m: int, rate: float) -> None:
        """Commit the new flow f (slot s) at its spare rate: its fullest link m becomes its bottleneck."""
        self._shortcuts += 1
        # m had spare capacity, so it limited no one: a new bottleneck, last in the
        # order (every flow through it is limited earlier, at a lower level).
        self._order.append(m)
        self._order_arr = self._AT = None
        self._nb[m] = 1
        nfl, load = self._nfl, self._load_now
        if load.__class__ is not list:  # a solve's array: a list once enough shortcuts use it
            self._load_uses += 1
            if self._load_uses >= self._loads_to_list:
                load = self._load_now = load.tolist()
        for x in f.path:
            nfl[x] += 1
            load[x] += rate
        self._bottleneck.append(m)  # slot s, the new last one
        self._lam[m] = rate
        self._rate[s] = rate

    def _add_to_structure(self, s: int, f: _Flow) -> None:
        """Give the new flow f (slot s) its tightest link as bottleneck."""
        lam, nb, path = self._lam, self._nb, f.path
        pos = self._places()
        m = path[0] if len(path) == 1 else min(path, key=lambda x: (lam[x], pos[x]))
        if lam[m] == np.inf:
            # No link of it limits anyone yet: guess the smallest equal share.
            cap, nfl = self._capl, self._nfl
            m = min(path, key=lambda x: (cap[x] / (nfl[x] + 1), x))
        pm = pos[m]
        if not nb[m]:  # a new bottleneck: last in the order (its level is unknown)
            pm = len(self._order)
            self._order.append(m)
            self._order_arr = self._AT = None
        nb[m] += 1
        AT = self._AT
        for x in path:
            if nb[x]:  # x is a bottleneck link
                px = pm if x == m else pos[x]
                if px < pm:
                    self._need_sort = True  # m must come first in the solve order
                    self._AT = AT = None
                elif AT is not None:
                    AT[pm, px] += 1.0
            self._nfl[x] += 1
        self._bottleneck.append(m)  # slot s, the new last one

    def _drop(self, s: int) -> None:
        """Remove the flow in slot s; mark the allocation stale unless provably unchanged.

        Unchanged when the flow was the only one its bottleneck limited and it
        crosses no other bottleneck: then the capacity it frees was limiting no one.
        """
        f = self._flows[s]
        nb, nfl, m, path = self._nb, self._nfl, self._bottleneck[s], f.path
        r, load = float(self._rate[s]), self._load_now
        alone = not self._stale and nb[m] == 1
        for x in path:  # one pass: whether it is alone, and the loads as a shortcut keeps them
            if x != m and nb[x]:
                alone = False
            nfl[x] -= 1
            # An idle link's load is exactly 0 (no drift from the shortcuts' bookkeeping). Not
            # alone, the allocation is stale: the loads are recomputed before anything reads them.
            load[x] = load[x] - r if nfl[x] else 0.0
        if alone:
            self._shortcuts += 1
        else:
            self._stale = True
        AT = self._AT
        if AT is not None:  # keep the system in step (its rows and columns: places in the order)
            pos = self._places()
            pm = pos[m]
            for x in path:
                if nb[x]:
                    AT[pm, pos[x]] -= 1.0
        nb[m] -= 1
        if not nb[m]:  # m limits no flow any more
            self._order.remove(m)
            self._order_arr = self._AT = None
            self._lam[m] = _INF
        self._vacate(s, f)

    def _vacate(self, s: int, f: _Flow) -> None:
        """Free flow f's slot s: the last active flow moves into it."""
        last = self._n - 1
        flows = self._flows
        del self._slot[f.fid]
        bottleneck = self._bottleneck
        if s != last:
            self._flow[:, s] = self._flow[:, last]
            moved = flows[s] = flows[last]
            bottleneck[s] = bottleneck[last]
            self._slot[moved.fid] = s
            self._dirty.add(s)  # (the last slot's column is rewritten whole by the next start)
        flows.pop()
        bottleneck.pop()
        self._n = last

    def _sync_columns(self) -> None:
        """Write the columns of _ints that start and moves left stale (see __init__)."""
        dirty = self._dirty
        if not dirty:
            return
        n, ints, flows, bottleneck, pad = self._n, self._ints, self._flows, self._bottleneck, self._pad
        for s in dirty:
            if s < n:  # a slot at or past n is free now: nothing to write
                path = flows[s].path
                ints[:, s] = [bottleneck[s], *path, *pad[len(path)]]  # (one by one: cheaper than gathering)
        dirty.clear()

    def _grow_slots(self) -> None:
        old = self._rem.size
        new = 2 * old
        ints = np.full((1 + self._width, new), self._sentinel, dtype=np.intp)
        ints[:, :old] = self._ints
        self._ints = ints
        self._bl, self._links = ints[0], ints[1:]
        flow = np.zeros((3, new))
        flow[:, :old] = self._flow
        self._flow = flow
        self._rem, self._done_at, self._rate = flow

    def _grow_width(self, k: int) -> None:
        ints = np.full((1 + k, self._rem.size), self._sentinel, dtype=np.intp)
        ints[: 1 + self._width] = self._ints
        self._ints = ints
        self._bl, self._links = ints[0], ints[1:]
        self._width = k
        self._pad = [[self._sentinel] * (k - j) for j in range(k + 1)]

    # ----------------------------------------------------------------- timer

    def _schedule(self) -> None:
        """Replace the pending timer by one for the earliest completion."""
        n = self._n
        if n == 0:
            self._timer, self._timer_at = None, _INF
            return
        rate = self._rate[:n]
        if self._any_dead:
            rate = np.maximum(rate, _TINY_RATE)
        t = self._rem[:n] / rate
        s = int(t.argmin())
        now = self._env.now
        dt = float(t[s]) - (now - self._t_last)
        if dt > _NEVER:  # nothing moves (every flow crosses a dead link)
            self._timer, self._timer_at = None, _INF
            return
        self._set_timer(dt if dt > 0.0 else 0.0, self._flows[s].fid, now)

    def _set_timer(self, dt: float, fid: int, now: float | None = None) -> None:
        self._timer = call_after(self._env, dt, self._on_timer)
        self._timer_at = (self._env.now if now is None else now) + dt
        self._target = fid

    def _on_timer(self, ev: Call) -> None:
        if ev is not self._timer:
            return  # superseded by a later change
        self._timer, self._timer_at = None, _INF
        rem = self._advance(self._env.now)
        done = rem <= self._done_at[: self._n]
        done[self._slot[self._target]] = True  # the timer's own flow, whatever the rounding
        finished = []
        for s in reversed(done.nonzero()[0].tolist()):  # descending: the moved-in last flow is never done
            finished.append(self._flows[s])
            self._drop(s)
        self._batching = True
        try:
            for f in reversed(finished):
                f.on_done(f.fid)
        finally:
            self._batching = False
            if self._stale:
                self._reallocate()
            self._schedule()

    def _zero_done(self, fid: int) -> None:
        cb = self._zero.pop(fid, None)
        if cb is not None:  # not aborted meanwhile
            cb(fid)
