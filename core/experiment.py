"""What both worlds build the same way from a spec: topology, capacities, seeds, the router.

Both worlds build one cluster from the spec's ``topology``: the simulator models a worker per
topology worker, the testbed starts a vLLM engine per topology worker, with the same roles.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from faults.health import HealthLabelModel
from faults.telemetry import BandwidthTelemetry

from .breaker import PodBreakers
from .in_flight import InFlightEvidence
from .policies import make_policy
from .risk import RiskPriceEstimator
from .routing import Router
from core.spec.model import ExperimentSpec
from .topology import Topology
from .view import Capacity

if TYPE_CHECKING:
    from workloads.generate import Workload


def build_topology(spec: ExperimentSpec) -> Topology:
    t = spec.topology
    uplink = t.uplink_gbps if t.uplink_gbps is not None else t.nic_gbps * t.workers_per_pod / t.oversubscription
    return Topology.build(t.pods, t.workers_per_pod, t.prefill_fraction, t.placement, t.nic_gbps, uplink,
                          t.link_baseline_gbps)


def capacity_of(spec: ExperimentSpec) -> Capacity:
    e = spec.engine
    return Capacity(e.prefill_slots, e.prefill_batch_tokens, e.decode_max_batch, e.decode_kv_tokens)


def testbed_capacity(spec: ExperimentSpec, kv_bytes_per_token: int) -> Capacity:
    """The engine block's scales, with the KV capacity the real engines are given
    (``testbed.kv_cache_bytes``; calibration hands the simulator the same number)."""
    return replace(capacity_of(spec), decode_kv_tokens=spec.testbed.kv_cache_bytes / kv_bytes_per_token)


def seed_streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent generators per concern, so a policy's coin flips never shift the
    workload or the health labels: every policy sees the same scenario for a seed."""
    names = ("workload", "policy", "health", "retry")  # (a child's stream does not depend on how many)
    return dict(zip(names, (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(names)))))


def seeded_workload(spec: ExperimentSpec, seed: int, base_dir: Path | None = None) -> Workload:
    """The request stream ``spec``'s workload gives ``seed``: the one both worlds replay (the
    simulator's run, the testbed's jobs), drawn from the seed's own workload stream."""
    from workloads.generate import generate

    return generate(spec.workload, seed_streams(seed)["workload"], base_dir=base_dir)


def run_dir_for(out: Path, spec: ExperimentSpec, policy: str, seed: int) -> Path:
    return Path(out) / spec.name / policy / f"seed-{seed}"


def make_router(spec: ExperimentSpec, topo: Topology, policy: str, rngs: dict[str, np.random.Generator],
                sink: Callable[[Any], None], capacity: Capacity | None = None) -> Router:
    """The router of one run; ``capacity`` defaults to the simulated engine's."""
    weights = spec.weights_for(policy)
    bw0 = np.full(topo.n_pods, topo.uplink_Bps)
    cb = spec.router.circuit_breaker
    breakers = None if cb is None else PodBreakers(topo.n_pods, cb.failure_threshold, cb.success_threshold, cb.open_s,
                                                   sink)
    return Router(
        topo,
        capacity or capacity_of(spec),
        make_policy(policy, weights, rngs["policy"]),
        RiskPriceEstimator(topo.n_pods, weights, spec.router.history_window_s, spec.router.history_bucket_s),
        HealthLabelModel(spec.health, topo.n_pods, rngs["health"]),
        BandwidthTelemetry(spec.telemetry, bw0),
        bw0,
        sink,
        spec.router.max_in_flight,
        breakers,
        InFlightEvidence(topo.n_pods, spec.router.history_window_s) if spec.telemetry.in_flight else None,
    )
