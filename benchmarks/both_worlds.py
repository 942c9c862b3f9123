"""What the router-option benchmarks share (bench_breaker.py, bench_retry.py): run every spec
variant x policy x seed in the simulator and, unless asked not to, on the emulated testbed (one set
of engines for all, as `testbed twin` does), then list the run directories of both worlds."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def run_variants(specs: list[Any], policies: list[str], seeds: list[int], prefix: str, testbed: bool) -> Path:
    """Run every variant in both worlds under a new temporary folder (``sim/``, ``testbed/``); its path."""
    from simulator.run import run_sim

    work = Path(tempfile.mkdtemp(prefix=prefix))
    for spec in specs:
        for p in policies:
            for s in seeds:
                run_sim(spec, p, s, work / "sim")
    if testbed:
        from testbed.runs.launch import run_testbed

        first, *more = specs
        run_testbed(first, work / "testbed", policies, seeds, more=[(m, policies, seeds) for m in more])
    return work


def run_dirs(work: Path) -> list[tuple[str, Path]]:
    """(world, run directory) for every run under ``work``, simulator first."""
    return [(world, d) for world in ("sim", "testbed") for d in sorted((work / world).glob("*/*/seed-*"))]
