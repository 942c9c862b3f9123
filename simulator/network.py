"""Fluid-flow network: KV-cache transfers share every link they cross, max-min fair.

Each transfer is a *flow* over a few links. Between two changes (a flow starts,
ends or is aborted, or a link's capacity changes) every flow moves at a
constant rate; at each change the rates become the max-min fair allocation
again, so a degraded link slows every flow through it from that instant on and
the capacity it no longer uses goes to the others.

How a change stays at tens of microseconds:

* The max-min allocation is described by one *level* per bottleneck link:
  every flow is assigned the link that limits it, its rate is that link's
  level, and each bottleneck link is exactly full:
  ``sum over flows f through l of level[bottleneck(f)] == capacity[l]``.
  Ordered by level this system is lower triangular, so given the assignment
  the levels are one LAPACK triangular solve (``dtrtrs``) with at most one
  unknown per link.
* A start or an end seldom changes *which* link limits which flow, so after a
  change the network re-solves with the assignment it has (a new flow takes
  its tightest link) and *verifies* the answer: with ``rate(f) = min over f's
  links of level``, every flow's rate must be its assigned level and every
  link within capacity. That is exactly max-min fairness (each flow crosses a
  full link on which no flow is faster), so a verified answer is exact.
* If verification fails, flows are re-assigned to their tightest link under
  the trial levels (overloaded links enter at their equal share) and the solve
  is repeated; after a few such rounds, or if they make no sense, a full
  progressive filling runs. It is vectorised and freezes in each pass every
  link whose equal share is a *local* minimum (no flow through it is held
  lower elsewhere), not only the global minimum.
* Active flows live densely in slots ``0..n-1`` (a finished flow's slot takes
  the last one); a flow's links are a row of a ``(slots, width)`` int array
  padded with a sentinel link of infinite capacity.
* ONE pending SimPy timer, for the earliest completion; a change replaces it
  and a superseded timer is ignored when it fires. Flows started or aborted
  inside ``on_done`` callbacks share one recomputation.
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
        self._width = 2  # link columns; grows if a longer path arrives
        slots = _INITIAL_SLOTS
        self._links = np.full((slots, self._width), S, dtype=np.intp)
        self._wbuf = np.zeros((slots, self._width))  # per-link weights for bincount
        self._size = np.zeros(slots)
        self._rem = np.zeros(slots)
        self._done_at = np.zeros(slots)  # remaining bytes that count as finished
        self._rate = np.zeros(slots)
        self._bl = np.zeros(slots, dtype=np.intp)  # slot -> its bottleneck link
        self._fid: list[int] = []  # slot -> flow id
        self._cb: list[Callable[[int], None]] = []  # slot -> on_done
        self._slot: dict[int, int] = {}  # flow id -> slot
        self._zero: dict[int, Callable[[int], None]] = {}  # zero-byte flows awaiting their callback

        # Bottleneck structure. _BT[m, x]: active flows crossing link x whose
        # bottleneck is m (row = bottleneck, so a sub-block transposed is the
        # lower-triangular system in the Fortran order LAPACK wants).
        self._BT = np.zeros((L1, L1))
        self._nfl = np.zeros(L1, dtype=np.int64)  # active flows per link
        self._order = np.zeros(0, dtype=np.intp)  # bottleneck links, a valid solve order
        self._pos = np.zeros(L1, dtype=np.intp)  # link -> place in _order
        self._AT: np.ndarray | None = None  # _BT over _order x _order, kept in step; None: rebuild
        self._need_sort = False  # a new flow's bottleneck comes after another of its links
        self._lam = np.full(L1, np.inf)  # level per link; inf: not a bottleneck
        self._lam_next = np.full(L1, np.inf)  # buffer for trial levels
        self._trial: tuple[np.ndarray, np.ndarray] | None = None  # failed solve: levels, excess
        # Repair keys: level nudged by link number, so equal levels still give
        # one strict order (the nudge is far below the verification tolerance).
        idx = np.arange(L1, dtype=np.float64)
        self._pert = 1.0 + idx * 2.0**-40
        self._tiny = idx * 1e-300

        self._next_id = 0
        self._t_last = env.now  # time up to which _rem is current
        self._timer: simpy.Event | None = None  # the one pending completion timer
        self._target = -1  # flow id the pending timer completes
        self._batching = False  # inside completion callbacks: defer recomputation
        self._stale = False  # rates do not reflect the current flows/capacities
        # Counters of how allocations were found (benchmarks, tests).
        self.stats = {"solves": 0, "repairs": 0, "fills": 0}

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

        self._advance()
        n = self._n
        if n == self._size.size:
            self._grow_slots()
        if k > self._width:
            self._grow_width(k)
        row = self._links[n]
        row[:k] = path
        row[k:] = self._sentinel
        self._size[n] = nbytes
        self._rem[n] = nbytes
        self._done_at[n] = _REL_BYTES_EPS * nbytes
        self._rate[n] = 0.0
        self._add_to_structure(n, path)
        self._fid.append(fid)
        self._cb.append(on_done)
        self._slot[fid] = n
        self._n = n + 1
        self._changed()
        return fid

    def abort(self, flow_id: int) -> float:
        """Remove an active flow (no callback); returns the bytes it moved."""
        if flow_id in self._zero:
            del self._zero[flow_id]
            return 0.0
        s = self._slot_of(flow_id)
        self._advance()
        moved = self._moved(s, 0.0)
        self._remove(s)
        self._changed()
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
        self._advance()
        self._cap[link] = c
        self._capacity_changed()
        self._changed()

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
        w = self._wbuf[:n]
        w[:] = r[:, None]
        return np.bincount(self._links[:n].ravel(), weights=w.ravel(), minlength=self._sentinel + 1)

    def _advance(self) -> None:
        """Move every flow forward to now at its current rate."""
        now = self._env.now
        dt = now - self._t_last
        if dt > 0.0:
            n = self._n
            if n:
                self._rem[:n] -= self._rate[:n] * dt
            self._t_last = now

    def _changed(self) -> None:
        """Flows or capacities changed: recompute rates and the timer (or defer)."""
        self._stale = True
        if not self._batching:
            self._reallocate()
            self._schedule()

    def _add_to_structure(self, s: int, path: list[int]) -> None:
        """Give the new flow in slot s its tightest link as bottleneck."""
        lam, pos, BT = self._lam, self._pos, self._BT
        m = path[0] if len(path) == 1 else min(path, key=lambda x: (lam[x], pos[x]))
        if lam[m] == np.inf:
            # No link of it limits anyone yet: guess the smallest equal share.
            cap, nfl = self._cap, self._nfl
            m = min(path, key=lambda x: (cap[x] / (nfl[x] + 1), x))
        if BT[m, m] == 0.0:  # a new bottleneck: last in the order (its level is unknown)
            pos[m] = self._order.size
            self._order = np.append(self._order, m)
            self._AT = None
        AT = self._AT
        pm = pos[m]
        for x in path:
            if BT[x, x] > 0.0 or x == m:  # x is a bottleneck link
                if pos[x] < pm:
                    self._need_sort = True  # m must come first in the solve order
                    self._AT = AT = None
                elif AT is not None:
                    AT[pm, pos[x]] += 1.0
            BT[m, x] += 1.0
            self._nfl[x] += 1
        self._bl[s] = m

    def _remove(self, s: int) -> None:
        """Drop the flow in slot s: out of the structure, last active flow moves in."""
        row = self._links[s]
        m = int(self._bl[s])
        BT, AT, pos = self._BT, self._AT, self._pos
        S = self._sentinel
        for x in row.tolist():
            if x == S:
                break
            if AT is not None and BT[x, x] > 0.0:
                AT[pos[m], pos[x]] -= 1.0
            BT[m, x] -= 1.0
            self._nfl[x] -= 1
        if BT[m, m] == 0.0:  # m limits no flow any more
            self._set_order(self._order[self._order != m])
            self._lam[m] = np.inf
        last = self._n - 1
        del self._slot[self._fid[s]]
        if s != last:
            row[:] = self._links[last]
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
        self._links[last] = S
        self._n = last

    def _grow_slots(self) -> None:
        old = self._size.size
        new = 2 * old
        links = np.full((new, self._width), self._sentinel, dtype=np.intp)
        links[:old] = self._links
        self._links = links
        self._wbuf = np.zeros((new, self._width))
        for name in ("_size", "_rem", "_done_at", "_rate", "_bl"):
            a = getattr(self, name)
            b = np.zeros(new, dtype=a.dtype)
            b[:old] = a
            setattr(self, name, b)

    def _grow_width(self, k: int) -> None:
        slots = self._size.size
        links = np.full((slots, k), self._sentinel, dtype=np.intp)
        links[:, : self._width] = self._links
        self._links = links
        self._wbuf = np.zeros((slots, k))
        self._width = k

    # ------------------------------------------------------------- allocation

    def _reallocate(self) -> None:
        """Max-min fair rates for the active flows: re-solve, repair, else fill afresh."""
        self._stale = False
        if self._n == 0:
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

        On success commits levels and rates. On failure keeps the trial levels
        and link excess for ``_reassign``.
        """
        self.stats["solves"] += 1
        self._trial = None
        if self._need_sort:
            # A new flow's bottleneck sits after one of its other links: order
            # by level (stable: equal levels keep their valid relative order).
            order = self._order
            self._set_order(order.take(np.argsort(self._lam.take(order), kind="stable")))
            self._need_sort = False
        order = self._order
        AT = self._AT
        if AT is None:
            AT = self._AT = self._BT.take(order, 0).take(order, 1)
        cap = self._cap
        sol, info = dtrtrs(AT.T, cap.take(order), lower=1)
        if info != 0 or not sol[sol.argmin()] >= 0.0:
            return False
        lam = self._lam_next
        lam.fill(np.inf)
        lam[order] = sol
        n = self._n
        lk = self._links[:n]
        lf = lam[lk]
        r = lf[:, 0]
        for j in range(1, self._width):
            r = np.minimum(r, lf[:, j])
        excess = self._load(r) - cap
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
        return True

    def _set_order(self, order: np.ndarray) -> None:
        self._order = order
        self._pos[order] = np.arange(order.size)
        self._AT = None

    def _set_structure(self, bl: np.ndarray) -> np.ndarray:
        """Adopt a bottleneck link per flow; returns the bottleneck links (ascending)."""
        n = self._n
        S = self._sentinel
        L1 = S + 1
        self._bl[:n] = bl
        idx = (bl[:, None] * L1 + self._links[:n]).ravel()
        self._BT = np.bincount(idx, minlength=L1 * L1).reshape(L1, L1).astype(np.float64)
        self._BT[:, S] = 0.0  # padding is not a link
        return np.flatnonzero(self._BT.diagonal() > 0)

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
        lk = self._links[:n]
        kf = key[lk]
        best = lk[:, 0]
        bk = kf[:, 0]
        for j in range(1, self._width):
            better = kf[:, j] < bk
            best = np.where(better, lk[:, j], best)
            bk = np.where(better, kf[:, j], bk)
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
        lk = self._links[:n].copy()  # working copy: frozen flows -> sentinel
        flat = lk.ravel()
        cap = self._cap.copy()
        rate = self._rate[:n]
        bl = np.zeros(n, dtype=np.intp)
        lam = np.full(L1, np.inf)
        passno = np.zeros(L1)
        wbuf = self._wbuf[:n]
        unfrozen = n
        it = 0
        while True:
            it += 1
            cnt = np.bincount(flat, minlength=L1)
            used = cnt > 0
            np.maximum(cnt, 1, out=cnt)  # unused links: avoid 0/0 (their share is never read)
            share = cap / cnt
            fs = share[lk]
            fmin = fs[:, 0]
            for j in range(1, width):
                fmin = np.minimum(fmin, fs[:, j])
            # Links through which some flow is held lower elsewhere are not (yet) bottlenecks.
            held = np.bincount(flat, weights=(fs > fmin[:, None]).ravel(), minlength=L1)
            bott = (held == 0.0) & used
            bott[S] = False
            lam[bott] = share[bott]
            passno[bott] = it
            # A frozen flow's bottleneck: the lowest-numbered bottleneck link on its path.
            cand = np.where(bott[lk], lk, L1)
            first = cand[:, 0]
            for j in range(1, width):
                first = np.minimum(first, cand[:, j])
            freeze = first < L1
            k = int(np.count_nonzero(freeze))
            if k == 0:  # cannot happen with finite, non-negative capacities
                raise RuntimeError("max-min allocation made no progress (corrupt capacities?)")
            np.copyto(rate, fmin, where=freeze)
            np.copyto(bl, first, where=freeze)
            if k == unfrozen:
                break
            wbuf[:] = np.where(freeze, fmin, 0.0)[:, None]
            cap -= np.bincount(flat, weights=wbuf.ravel(), minlength=L1)
            np.maximum(cap, 0.0, out=cap)
            np.copyto(lk, S, where=freeze[:, None])
            unfrozen -= k
        # Rebuild the structure; solve order: level, then pass (equal levels
        # reached later depend on earlier ones), then link number.
        bset = self._set_structure(bl)
        self._set_order(bset.take(np.lexsort((bset, passno.take(bset), lam.take(bset)))))
        self._need_sort = False
        self._lam.fill(np.inf)
        self._lam[bset] = lam.take(bset)

    # ----------------------------------------------------------------- timer

    def _schedule(self) -> None:
        """Replace the pending timer by one for the earliest completion."""
        self._timer = None
        n = self._n
        if n == 0:
            return
        rate = self._rate[:n]
        if self._any_dead:
            rate = np.maximum(rate, _TINY_RATE)
        t = self._rem[:n] / rate
        s = int(t.argmin())
        dt = float(t[s])
        if dt > _NEVER:  # nothing moves (every flow crosses a dead link)
            return
        ev = self._env.timeout(dt if dt > 0.0 else 0.0)
        ev.callbacks.append(self._on_timer)
        self._timer = ev
        self._target = self._fid[s]

    def _on_timer(self, ev: simpy.Event) -> None:
        if ev is not self._timer:
            return  # superseded by a later change
        self._timer = None
        self._advance()
        n = self._n
        done = self._rem[:n] <= self._done_at[:n]
        done[self._slot[self._target]] = True  # the timer's own flow, whatever the rounding
        finished = []
        for s in np.flatnonzero(done)[::-1].tolist():  # descending: the moved-in last flow is never done
            finished.append((self._cb[s], self._fid[s]))
            self._remove(s)
        self._stale = True
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
