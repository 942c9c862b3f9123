"""`testbed sim`: a spec's policies and seeds in the simulator."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import check_sizes, console, selection


def cmd_sim(args: argparse.Namespace) -> int:
    from core.calibration.fit import load_calibration
    from core.spec.model import load_spec

    spec = load_spec(args.spec)
    policies, seeds = selection(args, spec)
    check_sizes(spec, "sim", len(policies) * len(seeds), args)
    cal = load_calibration(args.calibration) if args.calibration else None
    simulate(spec, policies, seeds, Path(args.out), Path(args.spec).resolve().parent if args.spec else None, cal)
    console.print(f"report: testbed report {Path(args.out) / spec.name}")
    return 0


def simulate(spec: Any, policies: list[str], seeds: list[int], out: Path, base_dir: Path | None, cal: Any) -> None:
    """Every (policy, seed) in the simulator; with a calibration, as the calibrated testbed."""
    from core.calibration.fit import apply_calibration
    from simulator.run import run_sim

    if cal is not None:
        spec = apply_calibration(spec, cal)
    trace = None
    if spec.workload.arrival.kind == "trace":
        # read once, before anything is printed or written: a bad file is one line, and every
        # run replays the same requests (a trace takes no randomness)
        from core.experiment import seed_streams
        from workloads.generate import generate

        trace = generate(spec.workload, seed_streams(seeds[0])["workload"], base_dir=base_dir)
    runs = [(p, s) for p in policies for s in seeds]
    console.print(f"[bold]{spec.name}[/]: {spec.topology.pods} pods x {spec.topology.workers_per_pod} workers"
                  f"{' (calibrated)' if cal is not None else ''}, "
                  f"{len(policies)} policies x {len(seeds)} seeds -> {out / spec.name}")
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        overall = prog.add_task("all runs", total=len(runs))
        for policy, seed in runs:
            task = prog.add_task(f"{policy} seed {seed}", total=1.0)
            run_dir = run_sim(spec, policy, seed, out, workload=trace, base_dir=base_dir,
                              progress=lambda f, task=task: prog.update(task, completed=f))
            prog.update(task, completed=1.0, visible=False)
            prog.advance(overall)
            prog.console.print(f"  {policy:<16} seed {seed}: {run_dir}")
