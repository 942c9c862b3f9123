"""Run an experiment spec in the simulator: one run directory per (policy, seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import simpy

from faults.health import HealthLabelModel
from faults.schedule import FaultSchedule
from faults.telemetry import BandwidthTelemetry
from testbed.policies import make_policy
from testbed.records import RunWriter
from testbed.risk import RiskPriceEstimator
from testbed.routing import Router
from testbed.spec import ExperimentSpec
from testbed.topology import Topology
from testbed.view import Capacity
from workloads.generate import Workload, generate

from .cluster import ClusterSim


def build_topology(spec: ExperimentSpec) -> Topology:
    t = spec.topology
    return Topology.build(t.pods, t.workers_per_pod, t.prefill_fraction, t.placement, t.nic_gbps, t.uplink_gbps)


def capacity_of(spec: ExperimentSpec) -> Capacity:
    e = spec.engine
    return Capacity(e.prefill_slots, e.prefill_batch_tokens, e.decode_max_batch, e.decode_kv_tokens)


def seed_streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent generators per concern, so a policy's coin flips never shift the
    workload or the health labels: every policy sees the same scenario for a seed."""
    names = ("workload", "policy", "health")
    return dict(zip(names, (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(names)))))


def run_dir_for(out: Path, spec: ExperimentSpec, policy: str, seed: int) -> Path:
    return Path(out) / spec.name / policy / f"seed-{seed}"


def make_router(spec: ExperimentSpec, topo: Topology, policy: str, rngs: dict[str, np.random.Generator], sink) -> Router:
    weights = spec.weights_for(policy)
    bw0 = np.full(topo.n_pods, topo.uplink_Bps)
    return Router(
        topo,
        capacity_of(spec),
        make_policy(policy, weights, rngs["policy"]),
        RiskPriceEstimator(topo.n_pods, weights, spec.router.history_window_s, spec.router.history_bucket_s),
        HealthLabelModel(spec.health, topo.n_pods, rngs["health"]),
        BandwidthTelemetry(spec.telemetry, bw0),
        bw0,
        sink,
    )


def run_sim(
    spec: ExperimentSpec,
    policy: str,
    seed: int,
    out: Path,
    workload: Workload | None = None,
    base_dir: Path | None = None,
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Simulate one policy and seed; returns the run directory."""
    rngs = seed_streams(seed)
    wl = workload if workload is not None else generate(spec.workload, rngs["workload"], base_dir=base_dir)
    topo = build_topology(spec)
    schedule = FaultSchedule(spec.faults, topo.n_pods)
    run_dir = run_dir_for(out, spec, policy, seed)
    meta = {
        "world": "sim",
        "scenario": spec.name,
        "policy": policy,
        "seed": seed,
        "spec": spec.model_dump(mode="json"),
        "workload": wl.summary(),
        "fault_pods": [int(p) for p in schedule.fault_pods()],
    }
    with RunWriter(run_dir, meta) as writer:
        env = simpy.Environment()
        router = make_router(spec, topo, policy, rngs, writer.write)
        sim = ClusterSim(env, topo, spec.engine, router, schedule, wl, spec.deadline_s,
                         spec.topology.kv_bytes_per_token, spec.health, spec.router.slow_loop_s,
                         writer.write, progress)
        sim.run()
        writer.meta["sim_end_s"] = env.now
    return run_dir
