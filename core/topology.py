"""The cluster's shape: pods, workers and their roles, links and paths.

A two-level fat-tree: every worker has a NIC (one transmit and one receive
link); every pod has one uplink to the core and one downlink from it (its
"core links", the ones the study degrades). Intra-pod switching and the core
are non-blocking, as in a full-bisection fat-tree, so they are not links.

Link index layout (``n_workers = W``, ``n_pods = P``)::

    [0, W)        worker NIC transmit
    [W, 2W)       worker NIC receive
    [2W, 2W+P)    pod uplink (pod -> core)
    [2W+P, 2W+2P) pod downlink (core -> pod)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

PREFILL, DECODE = 0, 1
GBPS = 1e9 / 8  # bytes per second in one Gbit/s


def kv_transfer_bytes(prompt_tokens: int, block_tokens: int, bytes_per_token: int) -> int:
    """The KV a pull moves: every cache block of the prompt, the partial last one included
    (measured with NIXL on vLLM's CPU build), in both worlds."""
    return -(-prompt_tokens // block_tokens) * block_tokens * bytes_per_token


@dataclass(frozen=True)
class Topology:
    n_pods: int
    workers_per_pod: int
    worker_pod: np.ndarray  # (W,) pod of each worker
    worker_role: np.ndarray  # (W,) PREFILL or DECODE
    prefill_ids: np.ndarray  # global worker ids of prefill workers
    decode_ids: np.ndarray
    prefill_pod: np.ndarray  # pod of each prefill worker (cached: read every decision)
    decode_pod: np.ndarray
    nic_Bps: float
    uplink_Bps: float
    # What a link fault's residual factor r is relative to (see core_link_Bps).
    fault_baseline_Bps: float
    # Derived from worker_pod for path(), which runs once per KV transfer: Python numbers, not
    # numpy scalars (set by __post_init__; no argument, and left out of repr and comparisons).
    _pod_of: list[int] = field(init=False, repr=False, compare=False)
    _n_w: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pod_of", self.worker_pod.tolist())
        object.__setattr__(self, "_n_w", int(self.worker_pod.size))

    @classmethod
    def build(
        cls,
        n_pods: int,
        workers_per_pod: int,
        prefill_fraction: float = 0.5,
        placement: Literal["within_pod", "by_pod"] = "within_pod",
        nic_gbps: float = 400.0,
        uplink_gbps: float | None = None,
        link_baseline_gbps: float | None = None,
    ) -> "Topology":
        """``within_pod``: each pod holds prefill and decode workers in the given
        proportion; ``by_pod``: whole pods are prefill pods or decode pods.
        ``uplink_gbps`` defaults to non-blocking (sum of the pod's NICs);
        ``link_baseline_gbps`` (what a fault's r is relative to) to the uplink."""
        w = n_pods * workers_per_pod
        worker_pod = np.repeat(np.arange(n_pods), workers_per_pod)
        if placement == "within_pod":
            k = int(round(workers_per_pod * prefill_fraction))
            if not 0 < k < workers_per_pod:
                raise ValueError(f"topology: prefill_fraction {prefill_fraction} leaves a pod of {workers_per_pod} without prefill or decode workers")
            role = np.tile(np.r_[np.full(k, PREFILL), np.full(workers_per_pod - k, DECODE)], n_pods)
        elif placement == "by_pod":
            k = int(round(n_pods * prefill_fraction))
            if not 0 < k < n_pods:
                raise ValueError(f"topology: prefill_fraction {prefill_fraction} leaves {n_pods} pods without prefill or decode pods")
            role = np.where(worker_pod < k, PREFILL, DECODE)
        else:
            raise ValueError(f"topology: unknown placement {placement!r} (known: within_pod, by_pod)")
        uplink = uplink_gbps if uplink_gbps is not None else nic_gbps * workers_per_pod
        return cls(
            n_pods=n_pods,
            workers_per_pod=workers_per_pod,
            worker_pod=worker_pod,
            worker_role=role,
            prefill_ids=np.flatnonzero(role == PREFILL),
            decode_ids=np.flatnonzero(role == DECODE),
            prefill_pod=worker_pod[role == PREFILL],
            decode_pod=worker_pod[role == DECODE],
            nic_Bps=nic_gbps * GBPS,
            uplink_Bps=uplink * GBPS,
            fault_baseline_Bps=(link_baseline_gbps if link_baseline_gbps is not None else uplink) * GBPS,
        )

    @property
    def n_workers(self) -> int:
        return int(self.worker_pod.size)

    # --- links -----------------------------------------------------------
    @property
    def n_links(self) -> int:
        return 2 * self.n_workers + 2 * self.n_pods

    def link_capacity_Bps(self) -> np.ndarray:
        w, p = self.n_workers, self.n_pods
        return np.r_[np.full(2 * w, self.nic_Bps), np.full(2 * p, self.uplink_Bps)]

    def core_link_Bps(self, factor: float) -> float:
        """A pod core link's capacity at residual factor ``factor``: its own when healthy,
        else ``factor`` x the fault baseline (a shaper's rate), never above its own."""
        if factor >= 1.0:
            return self.uplink_Bps
        return min(self.uplink_Bps, factor * self.fault_baseline_Bps)

    def uplink(self, pod: int) -> int:
        return 2 * self.n_workers + pod

    def downlink(self, pod: int) -> int:
        return 2 * self.n_workers + self.n_pods + pod

    def path(self, src_worker: int, dst_worker: int) -> tuple[int, ...]:
        """Links a KV transfer from ``src_worker`` to ``dst_worker`` crosses."""
        pod_of, w = self._pod_of, self._n_w
        sp, dp = pod_of[src_worker], pod_of[dst_worker]
        if sp == dp:
            return (src_worker, w + dst_worker)
        # what uplink(sp) and downlink(dp) give, written out (this runs once per transfer)
        return (src_worker, 2 * w + sp, 2 * w + self.n_pods + dp, w + dst_worker)

    def path_cost(self) -> np.ndarray:
        """(P, P) normalised path cost between pods: 0 inside a pod, 1 across the core
        (a cross-pod transfer crosses two more links and shares the pods' core links)."""
        return 1.0 - np.eye(self.n_pods)
