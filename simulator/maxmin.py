"""Max-min fair rates of fluid flows over links, as one *level* per bottleneck link.

The allocation half of :class:`simulator.network.FlowNetwork` (its base class): given the
active flows and the links' capacities, the rates that are max-min fair, found as cheaply as the
last change allows. The network keeps the flows and their bookkeeping, takes the shortcuts that
leave every other rate alone, and calls ``_reallocate`` when a change may move rates.

* The max-min allocation is described by one level per bottleneck link:
  every flow is assigned the link that limits it, its rate is that link's
  level, and each bottleneck link is exactly full:
  ``sum over flows f through l of level[bottleneck(f)] == capacity[l]``.
  Ordered by level this system is lower triangular, so given the assignment
  the levels are one LAPACK triangular solve (``dtrtrs``) with at most one
  unknown per link.
* The network re-solves with the assignment it has (a new flow takes its
  tightest link) and *verifies* the answer: with ``rate(f) = min over f's
  links of level``, every flow's rate must be its assigned level and every
  link within capacity. That is exactly max-min fairness (each flow then
  crosses a full link on which no flow is faster), so a verified answer is
  exact. If it fails, flows are re-assigned to their tightest link under the
  trial levels (overloaded links enter at their equal share) and the solve is
  repeated; after a few rounds a full progressive filling runs. That one is
  vectorised and freezes in each pass every link whose equal share is a
  *local* minimum (no flow through it is held lower elsewhere), not only the
  global minimum.

The state read and written here (flows' link columns, bottleneck structure, levels, loads) is
the network's, created and described in ``FlowNetwork.__init__``: one object, split in two files
by what the code does, not two objects (a shortcut and a solve update the same lists and arrays).
Compiled like the network (core/compiled.py): it runs inside the per-event work.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dtrtrs

__all__ = ["MaxMinAllocation"]

# Verification slack on rates, relative to the level (the network's shortcuts use it too).
_REL_RATE_TOL = 1e-9
# Re-assignment rounds tried before falling back to progressive filling.
_MAX_REPAIRS = 4


class MaxMinAllocation:
    """Base of :class:`simulator.network.FlowNetwork`: the solve, repair and fill of its rates
    (no state or constructor of its own; see the module docstring)."""

    def _load(self, r: np.ndarray) -> np.ndarray:
        """Per-link sums of per-flow values ``r`` (sentinel included)."""
        n = r.size
        L1 = self._sentinel + 1
        links = self._links
        out = np.bincount(links[0, :n], r, L1)
        for j in range(1, self._width):
            out += np.bincount(links[j, :n], r, L1)
        return out

    def _set_loads(self, load: np.ndarray) -> None:
        self._load_now, self._load_uses = load, 0

    def _reallocate(self) -> None:
        """Max-min fair rates for the active flows: re-solve, repair, else fill afresh."""
        self._stale = False
        self._advance(self._env.now)  # at the old rates, up to now
        self._sync_columns()
        if self._n == 0:
            self._set_loads(np.zeros(self._sentinel + 1))
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
        self._solves += 1
        self._trial = None
        order = self._order_array()
        if self._need_sort:
            # A new flow's bottleneck sits after one of its other links: order
            # by level (stable: equal levels keep their valid relative order).
            order = order.take(np.argsort(self._lam.take(order), kind="stable"))
            self._set_order(order)
            self._need_sort = False
        AT = self._AT
        if AT is None:
            AT = self._AT = self._system(order)
        cap = self._cap
        sol, info = dtrtrs(AT.T, cap.take(order), lower=1)
        if info != 0 or not sol[sol.argmin()] >= 0.0:
            return False
        lam = self._lam_next
        lam.fill(np.inf)
        lam[order] = sol
        n = self._n
        # take() gathers several times faster than fancy indexing; min is exact in any order
        r = lam.take(self._links[:, :n]).min(axis=0)
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
        self._set_loads(load)
        return True

    def _system(self, order: np.ndarray) -> np.ndarray:
        """_AT rebuilt from the flows: counts of (own bottleneck, bottleneck crossed), for the
        solve order ``order`` (self._order as an array)."""
        n, k = self._n, order.size
        pos = self._places()
        pb = pos.take(self._bl[:n])
        px = pos.take(self._links[:, :n])  # -1: not a bottleneck (or padding)
        # Counted in a (k, k + 1) table whose column 0 takes the links that are no bottleneck
        # (cheaper than selecting the others first), then dropped.
        counts = np.bincount((pb * (k + 1) + 1 + px).ravel(), minlength=k * (k + 1))
        return counts.reshape(k, k + 1)[:, 1:].astype(np.float64)

    def _order_array(self) -> np.ndarray:
        if self._order_arr is None:
            self._order_arr = np.array(self._order, dtype=np.intp)
        return self._order_arr

    def _places(self) -> np.ndarray:
        """Each link's place in the solve order (-1: not a bottleneck)."""
        order = self._order_array()
        if self._pos_for is not order:
            self._pos[self._pos_for] = -1
            self._pos[order] = np.arange(order.size)
            self._pos_for = order
        return self._pos

    def _set_order(self, order: np.ndarray) -> None:
        self._order = order.tolist()
        self._order_arr = order
        self._AT = None

    def _set_structure(self, bl: np.ndarray) -> np.ndarray:
        """Adopt a bottleneck link per flow; returns the bottleneck links (ascending)."""
        self._bl[: self._n] = bl
        self._bottleneck = bl.tolist()
        nb = np.bincount(bl, minlength=self._sentinel + 1)
        self._nb = nb.tolist()
        return np.flatnonzero(nb)

    def _reassign(self) -> bool:
        """After a failed solve: give every flow its tightest link under the trial levels.

        Links the trial overloads become candidates at their equal share (a
        lower bound of their level, so the flows that must move to them do).
        False if the failed solve left nothing to go on.
        """
        if self._trial is None:
            return False
        self._repairs += 1
        lam, excess = self._trial
        over = excess > self._tol
        if np.count_nonzero(over):
            links = np.flatnonzero(over)
            nfl = self._nfl
            lam[over] = self._cap[over] / np.maximum(np.array([nfl[x] for x in links.tolist()], dtype=np.int64), 1)
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
        self._fills += 1
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
        self._set_loads(self._load(rate))
