"""A policy = filters, then weighted scorers, then a picker (llm-d's scheduler shape).

It picks a prefill worker first, then a decode worker, adding the path cost
from the chosen prefill pod. Everything is numpy over candidates; what depends
only on pod state is recomputed when the view's PodState object changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..view import ClusterView, PodState
from .filters import FILTERS
from .pickers import PICKERS
from .scorers import POD_SCORERS, WORKER_SCORERS


@dataclass(frozen=True, slots=True)
class Choice:
    prefill: int  # index into topo.prefill_ids
    decode: int  # index into topo.decode_ids
    score: float
    n_candidates: int
    n_filtered: int


@dataclass(frozen=True)
class PolicyConfig:
    """A named combination of filters, weighted scorers and a picker."""

    name: str
    filters: tuple[str, ...] = ()
    worker_scorer: str | None = "load"  # weight 1: the load term of S_j
    pod_scorers: tuple[tuple[str, float], ...] = ()  # (scorer, weight)
    path_weight: float = 0.0
    picker: str = "argmin"


class _RoleCache:
    """Per-role arrays derived from one PodState."""

    __slots__ = ("static", "allowed", "n_filtered", "buf")

    def __init__(self, static: np.ndarray, allowed: np.ndarray, n_filtered: int) -> None:
        self.static, self.allowed, self.n_filtered = static, allowed, n_filtered
        self.buf = np.empty_like(static)  # scores of one decision, reused


class Policy:
    def __init__(self, config: PolicyConfig, rng: np.random.Generator) -> None:
        self.config = config
        self.name = config.name
        self._rng = rng
        self._filters: list[Callable[[PodState], np.ndarray]] = [FILTERS[f] for f in config.filters]
        self._pod_scorers = [(POD_SCORERS[s], w) for s, w in config.pod_scorers if w]
        self._worker = WORKER_SCORERS[config.worker_scorer] if config.worker_scorer else None
        self._pick_p = PICKERS[config.picker]()
        self._pick_d = PICKERS[config.picker]()
        self._cached_for: PodState | None = None
        self._roles: tuple[_RoleCache, _RoleCache] | None = None
        self._path: np.ndarray | None = None

    def _refresh(self, view: ClusterView) -> tuple[_RoleCache, _RoleCache]:
        pods = view.pods
        keep = np.ones(view.topo.n_pods, bool)
        for f in self._filters:
            keep &= f(pods)
        if not keep.any():  # a filter that removes everything would stall the cluster
            keep[:] = True
        pod_static = np.zeros(view.topo.n_pods)
        for fn, w in self._pod_scorers:
            pod_static += w * fn(pods)
        pod_static[~keep] = np.inf
        roles = []
        for wp in (view.topo.prefill_pod, view.topo.decode_pod):
            static = pod_static[wp]
            allowed = np.flatnonzero(keep[wp])
            roles.append(_RoleCache(static, allowed, int(wp.size - allowed.size)))
        if self.config.path_weight and self._path is None:
            # (P, P), gathered per decision: a (P, n_decode) table would be read from memory
            # a row at a time and cost more than the gather
            self._path = self.config.path_weight * view.path_cost
        self._cached_for = pods
        self._roles = (roles[0], roles[1])
        return self._roles

    def choose(self, view: ClusterView) -> Choice:
        roles = self._roles if view.pods is self._cached_for else self._refresh(view)
        rp, rd = roles
        worker = self._worker
        if worker is not None:
            sp = worker(view.loads, view.capacity, False, rp.buf)
            sp += rp.static
            sd = worker(view.loads, view.capacity, True, rd.buf)
            sd += rd.static
        else:
            sp, sd = rp.static, rd.static
        p = self._pick_p.pick(sp, rp.allowed, self._rng)
        if self._path is not None:
            row = self._path[view.topo.prefill_pod[p]].take(view.topo.decode_pod)
            sd = np.add(sd, row, out=sd) if worker is not None else sd + row  # never into the cached static array
        d = self._pick_d.pick(sd, rd.allowed, self._rng)
        return Choice(p, d, float(sp[p] + sd[d]), sp.size + sd.size, rp.n_filtered + rd.n_filtered)
