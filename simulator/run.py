"""Run an experiment spec in the simulator: one run directory per (policy, seed)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import simpy

from core.experiment import build_topology, seeded_workload
from core.run import RunContext
from core.spec.model import ExperimentSpec
from workloads.generate import Workload

from .host import HostedClusterSim, cluster_sim
from vocab import FAULT_LINK


# Young-generation threshold while a simulation runs (CPython's default: 700).
_GC_GEN0_THRESHOLD = 10_000


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect garbage less often while the simulation runs.

    A simulated request allocates a few dozen tuples and objects (events, records, heap
    entries) that die young and form no cycles. At CPython's default thresholds a young
    collection runs every 700 allocations and the older generations, which hold every live
    request, record and pending event, are traversed again every ten of those: about a
    tenth of a run. Objects from before the run are frozen (gc.freeze) so that even the
    oldest collection skips them, unless the caller froze some itself (unfreezing would
    thaw those too). Everything is restored on exit.
    """
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(_GC_GEN0_THRESHOLD, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


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
        if f.kind == FAULT_LINK and (f.delay_ms > 0 or f.loss > 0):
            raise ValueError(f"faults[{i}]: delay_ms and loss are testbed-only (netem); the simulator does not model them")
    wl = workload if workload is not None else seeded_workload(spec, seed, base_dir)
    with RunContext(spec, "sim", policy, seed, out, build_topology(spec), wl.summary()) as ctx:
        env = simpy.Environment()
        sim = cluster_sim(env, ctx, spec.engine, wl, spec.deadline_s, spec.topology.kv_bytes_per_token, progress,
                          spec.topology.kv_wire_overhead, spec.first_token_limit_s)
        with _fewer_collections():
            sim.run()
        ctx.writer.meta["sim_end_s"] = env.now
        if isinstance(sim, HostedClusterSim):  # the shared host's summary (docs/simulator.md "The host model")
            ctx.writer.meta["sim_host"] = sim.host_summary()
    return ctx.run_dir
