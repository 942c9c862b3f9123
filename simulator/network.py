"""Fluid-flow network: KV-cache transfers share every link they cross, max-min fair.

Each transfer is a *flow* over a few links. Between two changes (a flow starts,
ends or is aborted, or a link's capacity changes) every flow moves at a
constant rate; at each change the rates become the max-min fair allocation
again, so a degraded link slows every flow through it from that instant on and
the capacity it no longer uses goes to the others.

How a change is kept cheap:

* The max-min allocation is described by one *level* per bottleneck link:
  every flow is assigned the link that limits it, its rate is that link's
  level, and each bottleneck link is exactly full:
  ``sum over flows f through l of level[bottleneck(f)] == capacity[l]``.
  Ordered by level this system is lower triangular, so given the assignment
  the levels are one LAPACK triangular solve (``dtrtrs``) with at most one
  unknown per link.
* Changes that provably leave every other flow's rate alone skip all of that:
  a flow that fits into the spare capacity of its path without anyone through
  its fullest link being faster, and a flow that was the only one limited by
  its bottleneck and crosses no other bottleneck. In a lightly loaded fat-tree
  that is many of them (two thirds at 10 concurrent flows over 64 links).
* Otherwise the network re-solves with the assignment it has (a new flow
  takes its tightest link) and *verifies* the answer: with ``rate(f) = min
  over f's links of level``, every flow's rate must be its assigned level and
  every link within capacity. That is exactly max-min fairness (each flow then
  crosses a full link on which no flow is faster), so a verified answer is
  exact. If it fails, flows are re-assigned to their tightest link under the
  trial levels (overloaded links enter at their equal share) and the solve is
  repeated; after a few rounds a full progressive filling runs. That one is
  vectorised and freezes in each pass every link whose equal share is a
  *local* minimum (no flow through it is held lower elsewhere), not only the
  global minimum.
* Active flows live densely in slots ``0..n-1`` (a finished flow's slot takes
  the last one); flow links are a ``(width, slots)`` int array padded with a
  sentinel link of infinite capacity, so per-flow work is a few elementwise
  calls over contiguous rows.
* ONE pending SimPy timer, for the earliest completion (found vectorised); a
  change that moves rates replaces it, a shortcut only if the new flow ends
  first, and a superseded timer is ignored when it fires. Flows started or
  aborted inside ``on_done`` callbacks share one recomputation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import simpy
from scipy.linalg.lapack import dtrtrs

__all__ = ["FlowNetwork"]

# A flow within this fraction of its size of the end counts as finished, so
# float error never leaves a flow with a few stray bytes and a timer to match.
_REL_BYTES_EPS = 1e-9
# Verification slack: link loads relative to the link plus a floor relative to
# the largest capacity (for links of capacity 0); rates relative to the level.
_REL_LOAD_TOL = 1e-9
_ABS_LOAD_TOL = 1e-12
_REL_RATE_TOL = 1e-9
# Remaining times above this mean "not moving" (a flow on a zero-capacity link).
_NEVER = 1e100
# Floor for rates when dividing; gives a remaining time far beyond _NEVER.
_TINY_RATE = 1e-200
# Re-assignment rounds tried before falling back to progressive filling.
_MAX_REPAIRS = 4
_INITIAL_SLOTS = 64


class FlowNetwork:
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
        S = self._sentinel = cap.size  # padding link: infinite capacity, never a bottleneck
        L1 = S + 1
        self._cap = np.append(cap, np.inf)
        self._tol = np.empty(L1)
        self._any_dead = False  # some link has capacity 0 (then rates can be 0)
        self._capacity_changed()

        self._n = 0  # active flows occupy slots 0..n-1
        self._width = 2  # link rows; grows if a longer path arrives
        slots = _INITIAL_SLOTS
        self._links = np.full((self._width, slots), S, dtype=np.intp)
        self._size = np.zeros(slots)
        self._rem = np.zeros(slots)
        self._done_at = np.zeros(slots)  # remaining bytes that count as finished
        self._rate = np.zeros(slots)
        self._bl = np.zeros(slots, dtype=np.intp)  # slot -> its bottleneck link
        self._fid: list[int] = []  # slot -> flow id
        self._cb: list[Callable[[int], None]] = []  # slot -> on_done
        self._slot: dict[int, int] = {}  # flow id -> slot
        self._zero: dict[int, Callable[[int], None]] = {}  # zero-byte flows awaiting their callback

        # Bottleneck structure (the level system's shape).
        self._nb = np.zeros(L1, dtype=np.int64)  # flows each link limits
        self._nfl = np.zeros(L1, dtype=np.int64)  # active flows per link
        # Bottleneck links in a valid solve order: _obuf[:_k] (a buffer, so that
        # adding or dropping one is a scalar update).
        self._obuf = np.zeros(L1, dtype=np.intp)
        self._k = 0
        self._pos = np.full(L1, -1, dtype=np.intp)  # link -> its place in that order, or -1
        # _AT[i, j]: flows limited by the i-th bottleneck that cross the j-th (so
        # _AT.T is the lower-triangular system, in the Fortran order LAPACK
        # wants). Kept in step with single flows; None: rebuild from the flows.
        self._AT: np.ndarray | None = None
        self._need_sort = False  # a new flow's bottleneck comes after another of its links
        self._lam = np.full(L1, np.inf)  # level per link; inf: not a bottleneck
        self._lam_next = np.full(L1, np.inf)  # buffer for trial levels
        self._load_now = np.zeros(L1)  # allocated bytes/s per link (valid unless _stale)
        self._trial: tuple[np.ndarray, np.ndarray] | None = None  # failed solve: levels, excess
        # Repair keys: level nudged by link number, so equal levels still give
        # one strict order (the nudge is far below the verification tolerance).
        idx = np.arange(L1, dtype=np.float64)
        self._pert = 1.0 + idx * 2.0**-50
        self._tiny = idx * 1e-300

        self._next_id = 0
        self._t_last = env.now  # time up to which _rem is current
        self._timer: simpy.Event | None = None  # the one pending completion timer
        self._timer_at = np.inf  # when it fires
        self._target = -1  # flow id it completes
        self._batching = False  # inside completion callbacks: defer recomputation
        self._stale = False  # rates do not reflect the current flows/capacities
        # How allocations were found (benchmarks, tests): shortcuts taken,
        # triangular solves, re-assignment rounds, full progressive fillings.
        self.stats = {"shortcuts": 0, "solves": 0, "repairs": 0, "fills": 0}

    # ------------------------------------------------------------------ public

    def start(self, links: Sequence[int], nbytes: float, on_done: Callable[[int], None]) -> int:
        """Start a flow of ``nbytes`` over ``links``; returns its flow id."""
        nbytes = float(nbytes)
        if not (nbytes >= 0.0 and nbytes != np.inf):
            raise ValueError(f"flow size must be finite and >= 0 bytes, got {nbytes!r}")
        path = [int(x) for x in links]
        k = len(path)
        if k == 0:
            raise ValueError("a flow needs at least one link, got an empty path")
        for x in path:
            if not 0 <= x < self._n_links:
                raise ValueError(f"link {x} out of range: the network has links 0..{self._n_links - 1}")
        if k > 1 and len(set(path)) != k:
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
        if n == self._size.size:
            self._grow_slots()
        if k > self._width:
            self._grow_width(k)
        col = self._links[:, n]
        col[:k] = path
        col[k:] = self._sentinel
        self._size[n] = nbytes
        self._done_at[n] = _REL_BYTES_EPS * nbytes
        rate, m = (0.0, -1) if self._stale else self._spare_rate(path)
        if rate > 0.0:  # nobody else's rate changes
            self._advance()
            self._rem[n] = nbytes
            self._add_alone(n, path, m, rate)
        else:
            self._rem[n] = nbytes
            self._rate[n] = 0.0
            self._add_to_structure(n, path)
            self._stale = True
        self._fid.append(fid)
        self._cb.append(on_done)
        self._slot[fid] = n
        self._n = n + 1
        if not self._batching:
            if self._stale:
                self._reallocate()
                self._schedule()
            else:
                t_done = self._env.now + nbytes / rate
                if t_done < self._timer_at:
                    self._set_timer(t_done - self._env.now, fid)
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
        self._advance()  # rates change now (even if the recomputation is deferred)
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
    def n_active(self) -> int:
        """Number of flows with bytes still to move."""
        return self._n

    def link_load(self) -> np.ndarray:
        """Bytes/second currently allocated on each link."""
        if self._stale:
            self._reallocate()
        return self._load(self._rate[: self._n])[: self._n_links]

    # ------------------------------------------------------- flow bookkeeping

    def _slot_of(self, flow_id: int) -> int:
        try:
            return self._slot[flow_id]
        except KeyError:
            raise KeyError(f"flow {flow_id} is not active (finished, aborted or never started)") from None

    def _moved(self, s: int, dt: float) -> float:
        size = float(self._size[s])
        rem = float(self._rem[s]) - float(self._rate[s]) * dt
        return min(size, max(0.0, size - rem))

    def _capacity_changed(self) -> None:
        cap = self._cap
        self._tol[:] = _REL_LOAD_TOL * cap + _ABS_LOAD_TOL * float(cap[:-1].max())
        self._any_dead = bool(cap[:-1].min() == 0.0)

    def _load(self, r: np.ndarray) -> np.ndarray:
        """Per-link sums of per-flow values ``r`` (sentinel included)."""
        n = r.size
        L1 = self._sentinel + 1
        links = self._links
        out = np.bincount(links[0, :n], r, L1)
        for j in range(1, self._width):
            out += np.bincount(links[j, :n], r, L1)
        return out

    def _advance(self) -> None:
        """Move every flow forward to now at its current rate."""
        now = self._env.now
        dt = now - self._t_last
        if dt > 0.0:
            n = self._n
            if n:
                self._rem[:n] -= self._rate[:n] * dt
            self._t_last = now

    def _spare_rate(self, path: list[int]) -> tuple[float, int]:
        """Rate a new flow gets without changing any other flow's rate (else 0), and its link.

        That is the spare capacity t of its fullest link, provided no flow
        already through a link that it would fill is faster than t (else
        max-min fairness would take from that flow).
        """
        cap, load, tol, nb = self._cap, self._load_now, self._tol, self._nb
        t = np.inf
        for x in path:
            if nb[x]:  # a bottleneck is full: the flow must take a share
                return 0.0, -1
            spare = cap[x] - load[x]
            if spare < t:
                t, xs = spare, x
        if not t > tol[xs]:
            return 0.0, -1
        for x in path:
            if cap[x] - load[x] <= t + tol[x] and self._nfl[x] > 0:
                if self._max_rate_on(x) > t * (1.0 + _REL_RATE_TOL):
                    return 0.0, -1
        return float(t), xs

    def _max_rate_on(self, x: int) -> float:
        n = self._n
        lk = self._links[:, :n]
        on = lk[0] == x
        for j in range(1, self._width):
            on |= lk[j] == x
        return float(self._rate[:n][on].max())

    def _add_alone(self, s: int, path: list[int], m: int, rate: float) -> None:
        """Commit a new flow at its spare rate: its fullest link m becomes its bottleneck."""
        self.stats["shortcuts"] += 1
        load = self._load_now
        # m had spare capacity, so it limited no one: a new bottleneck, last in the
        # order (every flow through it is limited earlier, at a lower level).
        self._append_order(m)
        self._nb[m] = 1
        for x in path:
            self._nfl[x] += 1
            load[x] += rate
        self._bl[s] = m
        self._lam[m] = rate
        self._rate[s] = rate

    def _add_to_structure(self, s: int, path: list[int]) -> None:
        """Give the new flow in slot s its tightest link as bottleneck."""
        lam, pos, nb = self._lam, self._pos, self._nb
        m = path[0] if len(path) == 1 else min(path, key=lambda x: (lam[x], pos[x]))
        if lam[m] == np.inf:
            # No link of it limits anyone yet: guess the smallest equal share.
            cap, nfl = self._cap, self._nfl
            m = min(path, key=lambda x: (cap[x] / (nfl[x] + 1), x))
        if not nb[m]:  # a new bottleneck: last in the order (its level is unknown)
            self._append_order(m)
        nb[m] += 1
        AT = self._AT
        pm = pos[m]
        for x in path:
            if nb[x]:  # x is a bottleneck link
                if pos[x] < pm:
                    self._need_sort = True  # m must come first in the solve order
                    self._AT = AT = None
                elif AT is not None:
                    AT[pm, pos[x]] += 1.0
            self._nfl[x] += 1
        self._bl[s] = m

    def _drop(self, s: int) -> None:
        """Remove the flow in slot s; mark the allocation stale unless provably unchanged.

        Unchanged when the flow was the only one its bottleneck limited and it
        crosses no other bottleneck: then the capacity it frees was limiting no one.
        """
        nb = self._nb
        m = int(self._bl[s])
        path = self._links[:, s].tolist()
        alone = not self._stale and nb[m] == 1
        if alone:
            for x in path:
                if x != m and x != self._sentinel and nb[x]:
                    alone = False
                    break
        if alone:
            self.stats["shortcuts"] += 1
            r = float(self._rate[s])
            load = self._load_now
            for x in path:
                if x != self._sentinel:
                    load[x] -= r
        else:
            self._stale = True
        self._remove(s)

    def _remove(self, s: int) -> None:
        """Take the flow in slot s out of the structure; the last active flow moves in."""
        col = self._links[:, s]
        m = int(self._bl[s])
        nb, AT, pos = self._nb, self._AT, self._pos
        S = self._sentinel
        for x in col.tolist():
            if x == S:
                break
            if AT is not None and nb[x]:
                AT[pos[m], pos[x]] -= 1.0
            self._nfl[x] -= 1
            if self._nfl[x] == 0:
                self._load_now[x] = 0.0  # no drift from shortcut bookkeeping on idle links
        nb[m] -= 1
        if not nb[m]:  # m limits no flow any more
            self._drop_from_order(m)
            self._lam[m] = np.inf
        last = self._n - 1
        del self._slot[self._fid[s]]
        if s != last:
            col[:] = self._links[:, last]
            self._size[s] = self._size[last]
            self._rem[s] = self._rem[last]
            self._done_at[s] = self._done_at[last]
            self._rate[s] = self._rate[last]
            self._bl[s] = self._bl[last]
            moved = self._fid[last]
            self._fid[s] = moved
            self._cb[s] = self._cb[last]
            self._slot[moved] = s
        self._fid.pop()
        self._cb.pop()
        self._links[:, last] = S
        self._n = last

    def _grow_slots(self) -> None:
        old = self._size.size
        new = 2 * old
        links = np.full((self._width, new), self._sentinel, dtype=np.intp)
        links[:, :old] = self._links
        self._links = links
        for name in ("_size", "_rem", "_done_at", "_rate", "_bl"):
            a = getattr(self, name)
            b = np.zeros(new, dtype=a.dtype)
            b[:old] = a
            setattr(self, name, b)

    def _grow_width(self, k: int) -> None:
        links = np.full((k, self._size.size), self._sentinel, dtype=np.intp)
        links[: self._width] = self._links
        self._links = links
        self._width = k

    # ------------------------------------------------------------- allocation

    def _reallocate(self) -> None:
        """Max-min fair rates for the active flows: re-solve, repair, else fill afresh."""
        self._stale = False
        self._advance()  # at the old rates, up to now
        if self._n == 0:
            self._load_now.fill(0.0)
            return
        if self._solve():
            return
        for _ in range(_MAX_REPAIRS):
            if not self._reassign():
                break
            if self._solve():
                return
        self._fill()

    def _solve(self) -> bool:
        """Levels from the current bottleneck assignment; True if they are max-min fair.

        On success commits levels, rates and loads. On failure keeps the trial
        levels and link excess for ``_reassign``.
        """
        self.stats["solves"] += 1
        self._trial = None
        if self._need_sort:
            # A new flow's bottleneck sits after one of its other links: order
            # by level (stable: equal levels keep their valid relative order).
            order = self._obuf[: self._k]
            self._set_order(order.take(np.argsort(self._lam.take(order), kind="stable")))
            self._need_sort = False
        order = self._obuf[: self._k]
        AT = self._AT
        if AT is None:
            AT = self._AT = self._system()
        cap = self._cap
        sol, info = dtrtrs(AT.T, cap.take(order), lower=1)
        if info != 0 or not sol[sol.argmin()] >= 0.0:
            return False
        lam = self._lam_next
        lam.fill(np.inf)
        lam[order] = sol
        n = self._n
        lf = lam[self._links[:, :n]]
        r = lf[0]
        for j in range(1, self._width):
            r = np.minimum(r, lf[j])
        load = self._load(r)
        excess = load - cap
        # Each flow at its assigned level and every link within capacity:
        # exactly max-min fair (then every bottleneck link is full too).
        if np.count_nonzero(lam.take(self._bl[:n]) > r * (1.0 + _REL_RATE_TOL)) or np.count_nonzero(
            excess > self._tol
        ):
            self._trial = (lam.copy(), excess)
            return False
        self._rate[:n] = r
        self._lam_next = self._lam
        self._lam = lam
        self._load_now = load
        return True

    def _system(self) -> np.ndarray:
        """_AT rebuilt from the flows: counts of (own bottleneck, bottleneck crossed)."""
        n, k, pos = self._n, self._k, self._pos
        pb = pos.take(self._bl[:n])
        px = pos[self._links[:, :n]]  # -1: not a bottleneck (or padding)
        on = px >= 0
        idx = (pb * k + px)[on]
        return np.bincount(idx, minlength=k * k).reshape(k, k).astype(np.float64)

    def _set_order(self, order: np.ndarray) -> None:
        k = self._k = order.size
        self._obuf[:k] = order
        self._pos.fill(-1)
        self._pos[order] = np.arange(k)
        self._AT = None

    def _append_order(self, m: int) -> None:
        """m becomes a bottleneck, last in the order."""
        self._obuf[self._k] = m
        self._pos[m] = self._k
        self._k += 1
        self._AT = None

    def _drop_from_order(self, m: int) -> None:
        """m limits no flow any more."""
        p, k = int(self._pos[m]), self._k - 1
        ob = self._obuf
        if p < k:
            ob[p:k] = ob[p + 1 : k + 1]
            self._pos[ob[p:k]] -= 1
        self._pos[m] = -1
        self._k = k
        self._AT = None

    def _set_structure(self, bl: np.ndarray) -> np.ndarray:
        """Adopt a bottleneck link per flow; returns the bottleneck links (ascending)."""
        self._bl[: self._n] = bl
        self._nb = np.bincount(bl, minlength=self._sentinel + 1)
        return np.flatnonzero(self._nb)

    def _reassign(self) -> bool:
        """After a failed solve: give every flow its tightest link under the trial levels.

        Links the trial overloads become candidates at their equal share (a
        lower bound of their level, so the flows that must move to them do).
        False if the failed solve left nothing to go on.
        """
        if self._trial is None:
            return False
        self.stats["repairs"] += 1
        lam, excess = self._trial
        over = excess > self._tol
        if np.count_nonzero(over):
            lam[over] = self._cap[over] / np.maximum(self._nfl[over], 1)
        key = lam * self._pert + self._tiny
        n = self._n
        lk = self._links[:, :n]
        kf = key[lk]
        best = lk[0]
        bk = kf[0]
        for j in range(1, self._width):
            better = kf[j] < bk
            best = np.where(better, lk[j], best)
            bk = np.where(better, kf[j], bk)
        bset = self._set_structure(best)
        self._set_order(bset.take(np.argsort(key.take(bset))))
        self._need_sort = False
        return True

    def _fill(self) -> None:
        """Progressive filling from scratch; rebuilds the bottleneck structure.

        Each pass computes every link's equal share of its remaining capacity
        among its unfrozen flows, and each flow's tightest share. A link no
        flow of which is held lower elsewhere is a bottleneck whose share is
        final (shares elsewhere only rise as flows freeze below them), so all
        flows through such links freeze at their tightest share in the same
        pass. A frozen flow's links are redirected to the sentinel, which takes
        it out of the counts without compacting the arrays.
        """
        self.stats["fills"] += 1
        n = self._n
        S = self._sentinel
        L1 = S + 1
        width = self._width
        lk = self._links[:, :n].copy()  # working copy: frozen flows -> sentinel
        flat = lk.ravel()
        cap = self._cap.copy()
        rate = self._rate[:n]
        bl = np.zeros(n, dtype=np.intp)
        fpass = np.zeros(n)  # pass in which each flow froze
        unfrozen = n
        it = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            while True:
                it += 1
                # Equal share per link (links without unfrozen flows: inf or nan, never read).
                share = cap / np.bincount(flat, minlength=L1)
                fs = share[lk]
                fmin = fs[0]
                for j in range(1, width):
                    fmin = np.minimum(fmin, fs[j])
                # Links through which some flow is held lower elsewhere are not (yet) bottlenecks.
                held = np.bincount(flat, weights=(fs > fmin).ravel(), minlength=L1)
                bott = held == 0.0
                bott[S] = False
                # A frozen flow's bottleneck: the lowest-numbered bottleneck link on its path.
                cand = np.where(bott[lk], lk, L1)
                first = cand[0]
                for j in range(1, width):
                    first = np.minimum(first, cand[j])
                freeze = first < L1
                k = int(np.count_nonzero(freeze))
                if k == 0:  # cannot happen with finite, non-negative capacities
                    raise RuntimeError("max-min allocation made no progress (corrupt capacities?)")
                np.copyto(rate, fmin, where=freeze)
                np.copyto(bl, first, where=freeze)
                np.copyto(fpass, it, where=freeze)
                if k == unfrozen:
                    break
                w = np.where(freeze, fmin, 0.0)
                for j in range(width):
                    cap -= np.bincount(lk[j], w, L1)
                np.copyto(lk, S, where=freeze)
                unfrozen -= k
        np.maximum(rate, 0.0, out=rate)  # rounding on an exactly full link
        # Rebuild the structure; solve order: level, then pass (equal levels
        # reached later depend on earlier ones), then link number.
        lam = np.full(L1, np.inf)
        lam[bl] = rate  # a bottleneck's level is the rate of the flows it limits
        passno = np.zeros(L1)
        passno[bl] = fpass
        bset = self._set_structure(bl)
        self._set_order(bset.take(np.lexsort((bset, passno.take(bset), lam.take(bset)))))
        self._need_sort = False
        self._lam = lam
        self._load_now = self._load(rate)

    # ----------------------------------------------------------------- timer

    def _schedule(self) -> None:
        """Replace the pending timer by one for the earliest completion."""
        n = self._n
        if n == 0:
            self._timer, self._timer_at = None, np.inf
            return
        rate = self._rate[:n]
        if self._any_dead:
            rate = np.maximum(rate, _TINY_RATE)
        t = self._rem[:n] / rate
        s = int(t.argmin())
        dt = float(t[s]) - (self._env.now - self._t_last)
        if dt > _NEVER:  # nothing moves (every flow crosses a dead link)
            self._timer, self._timer_at = None, np.inf
            return
        self._set_timer(dt if dt > 0.0 else 0.0, self._fid[s])

    def _set_timer(self, dt: float, fid: int) -> None:
        ev = self._env.timeout(dt)
        ev.callbacks.append(self._on_timer)
        self._timer = ev
        self._timer_at = self._env.now + dt
        self._target = fid

    def _on_timer(self, ev: simpy.Event) -> None:
        if ev is not self._timer:
            return  # superseded by a later change
        self._timer, self._timer_at = None, np.inf
        self._advance()
        n = self._n
        done = self._rem[:n] <= self._done_at[:n]
        done[self._slot[self._target]] = True  # the timer's own flow, whatever the rounding
        finished = []
        for s in np.flatnonzero(done)[::-1].tolist():  # descending: the moved-in last flow is never done
            finished.append((self._cb[s], self._fid[s]))
            self._drop(s)
        self._batching = True
        try:
            for cb, fid in reversed(finished):
                cb(fid)
        finally:
            self._batching = False
            if self._stale:
                self._reallocate()
            self._schedule()

    def _zero_done(self, fid: int) -> None:
        cb = self._zero.pop(fid, None)
        if cb is not None:  # not aborted meanwhile
            cb(fid)
