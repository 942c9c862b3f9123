"""`testbed study`: a spec's study grid in the simulator, as Ray tasks, resumably."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import console, csv


def cmd_study(args: argparse.Namespace) -> int:
    from core.spec import load_spec
    from cli.study_runner import run_study

    spec = load_spec(args.spec)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    try:
        res = run_study(spec, Path(args.out), address=args.address, workers=args.workers, rerun=args.rerun,
                        sweeps=csv(args.sweeps) if args.sweeps else None, base_dir=Path(args.spec).resolve().parent,
                        source=args.spec, console=console, max_hours=args.max_hours)
    except KeyboardInterrupt:
        done = sum(1 for _ in (Path(args.out) / spec.name).rglob("cell.json"))
        console.print(f"interrupted: the {done} finished run(s) are kept; the same command runs the rest")
        return 130
    console.print(f"{res.ran} run(s) done in {res.wall_s:.0f} s ({res.cpu_s:.0f} CPU-s), {res.skipped} were "
                  f"already finished, {len(res.failed)} failed; {res.cells} cells in {res.runs} runs")
    if res.failed:
        console.print("[red]failed cells[/] (rerun the same command to retry them):\n  " + "\n  ".join(res.failed))
        return 1
    console.print(f"report: testbed report {res.study_dir}")
    return 0
