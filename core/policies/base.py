"""A policy = filters, then weighted scorers, then a picker (llm-d's scheduler shape).

It picks a prefill worker first, then a decode worker, adding the path cost
from the chosen prefill pod. Everything is numpy over candidates; what depends
only on pod state is recomputed when the view's PodState object changes. Both
roles' scores live in one array (prefill workers, then decode workers), so a
worker scorer that can (``BOTH_ROLES_SCORERS``) fills it in one pass, and the
pod-level terms are added in one more; each role picks from its half.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..view import ClusterView, PodState
from .filters import FILTERS
from .pickers import PICKERS
from .scorers import BOTH_ROLES_SCORERS, POD_SCORERS, WORKER_SCORERS


_make_tuple = tuple.__new__


class Choice(NamedTuple):
    """One decision (a named tuple: built once per request, where a frozen dataclass costs ~3x)."""

    prefill: int  # index into topo.prefill_ids
    decode: int  # index into topo.decode_ids
    score: float
    n_candidates: int
    n_filtered: int


@dataclass(frozen=True)
class PolicyConfig:
    """A named combination of filters, weighted scorers and a picker. Each piece is a registered
    name (FILTERS, POD_SCORERS, WORKER_SCORERS, PICKERS) or, in a policy of the user's own
    (core/policies/plugins.py), the callable itself."""

    name: str
    filters: tuple[str | Callable, ...] = ()
    worker_scorer: str | Callable | None = "load"  # weight 1: the load term of S_j
    pod_scorers: tuple[tuple[str | Callable, float], ...] = ()  # (scorer, weight)
    path_weight: float = 0.0
    picker: str | Callable = "argmin"  # a class (or factory) whose instances pick(scores, allowed, rng)


def _piece(table: dict, piece: str | Callable) -> Callable:
    return table[piece] if isinstance(piece, str) else piece


def resolve_pieces(config: PolicyConfig) -> tuple[list[Callable], list[tuple[Callable, float]], Callable | None,
                                                  Callable]:
    """The config's pieces as callables: (filters, weighted pod scorers, worker scorer, picker
    factory); KeyError names a registered piece that does not exist."""
    worker = _piece(WORKER_SCORERS, config.worker_scorer) if config.worker_scorer is not None else None
    return ([_piece(FILTERS, f) for f in config.filters], [(_piece(POD_SCORERS, s), w) for s, w in config.pod_scorers],
            worker, _piece(PICKERS, config.picker))


class _RoleCache:
    """Per-role arrays derived from one PodState (``static`` and ``buf``: views of the policy's
    arrays for both roles, prefill workers first)."""

    __slots__ = ("static", "allowed", "n_filtered", "buf")

    def __init__(self, static: np.ndarray, allowed: np.ndarray, n_filtered: int, buf: np.ndarray) -> None:
        self.static, self.allowed, self.n_filtered = static, allowed, n_filtered
        self.buf = buf  # scores of one decision, reused


class Policy:
    def __init__(self, config: PolicyConfig, rng: np.random.Generator) -> None:
        self.config = config
        self.name = config.name
        self._rng = rng
        filters, pod_scorers, self._worker, picker = resolve_pieces(config)
        self._filters: list[Callable[[PodState], np.ndarray]] = filters
        self._pod_scorers = [(fn, w) for fn, w in pod_scorers if w]
        # a registered worker scorer may score both roles in one pass; a callable of the user's does not
        both = config.worker_scorer if isinstance(config.worker_scorer, str) else None
        self._both = BOTH_ROLES_SCORERS.get(both) if both else None
        self._pick_p = picker()
        self._pick_d = picker()
        self._cached_for: PodState | None = None
        self._roles: tuple[_RoleCache, _RoleCache] | None = None
        self._path: np.ndarray | None = None
        # Both roles at once (prefill workers, then decode workers): one decision's scores, each
        # worker's 1 / slots (for a both-roles scorer), and the pod-level terms.
        self._shape_for: tuple[object, object] | None = None  # (topology, capacity) they are for
        self._buf = self._scale = self._static = np.empty(0)
        self._add_static = False  # some pod-level term is not 0 (adding zeros changes no score)
        self._n_filtered = 0

    def _refresh(self, view: ClusterView) -> tuple[_RoleCache, _RoleCache]:
        pods, topo = view.pods, view.topo
        keep = np.ones(topo.n_pods, bool)
        for f in self._filters:
            keep &= f(pods)
        if pods.blocked is not None:  # the router's circuit breaker, under every policy
            keep &= ~pods.blocked
        pod_static = np.zeros(topo.n_pods)
        for fn, w in self._pod_scorers:
            pod_static += w * fn(pods)
        scores = pod_static.copy()  # before the filters (computed on a change of pod state only)
        pod_static[~keep] = np.inf
        n_p = topo.prefill_pod.size
        if self._shape_for is None or self._shape_for[0] is not topo or self._shape_for[1] is not view.capacity:
            self._shape_for = (topo, view.capacity)
            self._buf = np.empty(n_p + topo.decode_pod.size)
            self._scale = np.concatenate([np.full(n_p, 1.0 / view.capacity.prefill_slots),
                                          np.full(topo.decode_pod.size, 1.0 / view.capacity.decode_slots)])
        self._static = pod_static[np.concatenate([topo.prefill_pod, topo.decode_pod])]
        alive = None if pods.down is None else ~pods.down[np.concatenate([topo.prefill_ids, topo.decode_ids])]
        roles = []
        for wp, part in ((topo.prefill_pod, slice(None, n_p)), (topo.decode_pod, slice(n_p, None))):
            ok = keep[wp]
            if not ok.any():
                # Filters that remove every worker of a role would stall the cluster: then none
                # applies to that role. Per role, since `by_pod` pods hold one role each (both
                # prefill pods masked, or both decode pods' breakers open, leave the other role's).
                ok = np.ones(wp.size, bool)
                self._static[part] = scores[wp]
            if alive is not None and alive[part].any():
                # A down engine is never chosen while another of its role is up, even where the
                # filters leave only down ones: a certain failure is worse than a filtered pod.
                up = alive[part]
                if not (ok & up).any():
                    ok = up
                    self._static[part] = scores[wp]
                else:
                    ok = ok & up
                self._static[part][~up] = np.inf
            allowed = np.flatnonzero(ok)
            roles.append(_RoleCache(self._static[part], allowed, int(wp.size - allowed.size), self._buf[part]))
        self._add_static = bool(self._static.any())
        self._n_filtered = roles[0].n_filtered + roles[1].n_filtered
        if self.config.path_weight and self._path is None:
            # (P, P), gathered per decision: a (P, n_decode) table would be read from memory
            # a row at a time and cost more than the gather
            self._path = self.config.path_weight * view.path_cost
        self._cached_for = pods
        self._roles = (roles[0], roles[1])
        return self._roles

    def prepare(self, view: ClusterView) -> None:
        """Rebuild what depends only on pod state (filters, pod-level scores) now, when the
        router's slow loop or labels change it, rather than in the next decision: measured
        on the testbed, that rebuild on caches gone cold between requests was most of the
        recorded decision latency (docs/performance.md "Recorded decision latency")."""
        if view.pods is not self._cached_for:
            self._refresh(view)

    def choose(self, view: ClusterView, avoid: frozenset[int] | None = None) -> Choice:
        """The pair for one request; ``avoid``: pods a retry keeps away from (core/retry.py), as far
        as each role keeps a candidate elsewhere."""
        roles = self._roles if view.pods is self._cached_for else self._refresh(view)
        rp, rd = roles
        worker = self._worker
        if worker is None:
            sp, sd = rp.static, rd.static
        else:
            loads = view.loads
            if self._both is not None and loads.outstanding is not None:  # both roles in one pass
                self._both(loads, self._scale, self._buf)
                if self._add_static:
                    self._buf += self._static
            else:
                worker(loads, view.capacity, False, rp.buf)
                worker(loads, view.capacity, True, rd.buf)
                if self._add_static:
                    rp.buf += rp.static
                    rd.buf += rd.static
            sp, sd = rp.buf, rd.buf
        ap, ad = rp.allowed, rd.allowed
        if avoid:
            sp, ap = _avoiding(sp, ap, view.topo.prefill_pod, avoid)
        p = self._pick_p.pick(sp, ap, self._rng)
        if self._path is not None:
            row = self._path[view.topo.prefill_pod[p]].take(view.topo.decode_pod)
            sd = np.add(sd, row, out=sd) if worker is not None else sd + row  # never into the cached static array
        if avoid:
            sd, ad = _avoiding(sd, ad, view.topo.decode_pod, avoid)
        d = self._pick_d.pick(sd, ad, self._rng)
        # Choice's fields in order, without the named tuple's constructor (a Python call)
        return _make_tuple(Choice, (p, d, float(sp[p] + sd[d]), self._buf.size, self._n_filtered))


def _avoiding(score: np.ndarray, allowed: np.ndarray, worker_pod: np.ndarray,
              avoid: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
    """One role's scores and allowed candidates without the workers of the pods in ``avoid``
    (a copy: the arrays given may be the policy's cached ones); unchanged if none would be left."""
    out = np.isin(worker_pod, list(avoid))
    keep = allowed[~out[allowed]]
    if keep.size == 0:
        return score, allowed
    score = score.copy()
    score[out] = np.inf
    return score, keep
