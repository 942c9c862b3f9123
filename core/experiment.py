"""What both worlds build the same way from a spec: topology, capacities, seeds, the router.

The simulator's cluster is the spec's ``topology`` and ``engine``; the testbed's is its
``testbed`` block (pods of one prefill and one decode engine each) until the two share one
topology.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from faults.health import HealthLabelModel
from faults.telemetry import BandwidthTelemetry

from .policies import make_policy
from .risk import RiskPriceEstimator
from .routing import Router
from .spec import ExperimentSpec
from .topology import Topology
from .view import Capacity


def build_topology(spec: ExperimentSpec) -> Topology:
    t = spec.topology
    return Topology.build(t.pods, t.workers_per_pod, t.prefill_fraction, t.placement, t.nic_gbps, t.uplink_gbps)


def capacity_of(spec: ExperimentSpec) -> Capacity:
    e = spec.engine
    return Capacity(e.prefill_slots, e.prefill_batch_tokens, e.decode_max_batch, e.decode_kv_tokens)


def testbed_topology(spec: ExperimentSpec) -> Topology:
    """Pods of one prefill and one decode engine each, links at the testbed's baseline rate."""
    t = spec.testbed
    return Topology.build(t.pods, 2, 0.5, "within_pod", nic_gbps=t.link_gbps, uplink_gbps=t.link_gbps)


def testbed_capacity(spec: ExperimentSpec, kv_bytes_per_token: int) -> Capacity:
    t = spec.testbed
    return Capacity(t.max_num_seqs, t.max_num_batched_tokens, t.max_num_seqs, t.kv_cache_bytes / kv_bytes_per_token)


def seed_streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent generators per concern, so a policy's coin flips never shift the
    workload or the health labels: every policy sees the same scenario for a seed."""
    names = ("workload", "policy", "health")
    return dict(zip(names, (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(names)))))


def run_dir_for(out: Path, spec: ExperimentSpec, policy: str, seed: int) -> Path:
    return Path(out) / spec.name / policy / f"seed-{seed}"


def make_router(spec: ExperimentSpec, topo: Topology, policy: str, rngs: dict[str, np.random.Generator],
                sink: Callable[[Any], None], capacity: Capacity | None = None) -> Router:
    """The router of one run; ``capacity`` defaults to the simulated engine's."""
    weights = spec.weights_for(policy)
    bw0 = np.full(topo.n_pods, topo.uplink_Bps)
    return Router(
        topo,
        capacity or capacity_of(spec),
        make_policy(policy, weights, rngs["policy"]),
        RiskPriceEstimator(topo.n_pods, weights, spec.router.history_window_s, spec.router.history_bucket_s),
        HealthLabelModel(spec.health, topo.n_pods, rngs["health"]),
        BandwidthTelemetry(spec.telemetry, bw0),
        bw0,
        sink,
    )
