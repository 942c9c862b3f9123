"""What a policy sees of the cluster at decision time.

Two parts with different lifetimes, so the hot path does no needless work:

* ``Loads``: per-worker counters the router updates in place on every
  dispatch and completion (the fast loop reads them each decision);
* ``PodState``: per-pod arrays (health labels, ground truth, risk price),
  replaced as a whole when the slow loop or the label model changes them.
  Policies cache whatever they derive from it, keyed on its identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .topology import Topology


@dataclass(frozen=True)
class Capacity:
    """Per-worker scales that turn counters into utilisations in [0, 1]."""

    prefill_slots: float  # outstanding requests at which a prefill worker counts as full
    prefill_token_budget: float  # tokens per prefill batch
    decode_slots: float  # max decode batch (sequences)
    decode_kv_tokens: float  # KV capacity in tokens


@dataclass(frozen=True)
class Loads:
    """In-flight counters per worker, mutated in place by the router."""

    prefill_outstanding: np.ndarray  # requests routed and not yet through prefill
    prefill_tokens: np.ndarray  # their prompt tokens
    decode_outstanding: np.ndarray  # requests routed and not yet finished
    decode_kv_tokens: np.ndarray  # KV tokens they will hold (prompt + output)
    # Both outstanding counters in one array, prefill workers then decode workers, when the two
    # above are its halves (as zeros() makes them): a policy can score both roles in one pass.
    outstanding: np.ndarray | None = None

    @classmethod
    def zeros(cls, topo: Topology) -> "Loads":
        n_p, n_d = topo.prefill_ids.size, topo.decode_ids.size
        both = np.zeros(n_p + n_d)
        return cls(both[:n_p], np.zeros(n_p), both[n_p:], np.zeros(n_d), both)


@dataclass(frozen=True)
class PodState:
    unhealthy: np.ndarray  # (P,) bool: health labels as emitted (True = masked)
    degraded: np.ndarray  # (P,) bool: ground truth, only OracleAvoidance may look
    price: np.ndarray  # (P,) risk price pi_j
    # (P,) bool: pods the router's circuit breaker holds open (kept out of every policy's choice)
    blocked: np.ndarray | None = None
    # (W,) bool by worker id: workers whose engine is down (dead actor or engine core: the router
    # saw it, not a label), kept out of every policy's choice
    down: np.ndarray | None = None

    @classmethod
    def initial(cls, n_pods: int) -> "PodState":
        return cls(np.zeros(n_pods, bool), np.zeros(n_pods, bool), np.zeros(n_pods), np.zeros(n_pods, bool))

    def replace(self, **kw: np.ndarray) -> "PodState":
        return PodState(**{**self.__dict__, **kw})


@dataclass
class ClusterView:
    topo: Topology
    capacity: Capacity
    loads: Loads
    pods: PodState
    path_cost: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.path_cost = self.topo.path_cost()
        t = self.topo
        # pod_util's sums: prefill workers then decode workers, each in index order.
        self._util_pods = np.concatenate([t.prefill_pod, t.decode_pod])
        self._util_n = np.maximum(np.bincount(t.worker_pod, minlength=t.n_pods).astype(float), 1.0)

    def pod_util(self) -> np.ndarray:
        """Utilisation per pod: mean over its workers of min(outstanding / slots, 1).

        One bincount adds each worker's term to its pod in the order prefill workers, then decode
        workers (bincount adds in input order, so the sums are the same to the last bit)."""
        c, ld = self.capacity, self.loads
        per_worker = np.concatenate([np.minimum(ld.prefill_outstanding / c.prefill_slots, 1.0),
                                     np.minimum(ld.decode_outstanding / c.decode_slots, 1.0)])
        return np.bincount(self._util_pods, per_worker, self.topo.n_pods) / self._util_n
