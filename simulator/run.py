"""Run an experiment spec in the simulator: one run directory per (policy, seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import simpy

from faults.schedule import FaultSchedule
from testbed.experiment import build_topology, make_router, run_dir_for, seed_streams
from testbed.records import RunWriter
from testbed.spec import ExperimentSpec
from workloads.generate import Workload, generate

from .cluster import ClusterSim


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
    for i, f in enumerate(spec.faults):
        if f.kind == "link" and (f.delay_ms > 0 or f.loss > 0):
            raise ValueError(f"faults[{i}]: delay_ms and loss are testbed-only (netem); the simulator does not model them")
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
