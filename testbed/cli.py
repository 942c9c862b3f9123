"""The ``testbed`` command line.

    testbed sim [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1]
    testbed report PATH... [--out DIR]
    testbed policies

Errors are one line on stderr and exit status 2; rows recorded before an
error or Ctrl-C stay in their run directories (marked ``interrupted``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .policies import POLICY_NAMES, check_policy_name

console = Console(stderr=True)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _cmd_sim(args: argparse.Namespace) -> int:
    from simulator.run import run_sim

    from .spec import load_spec

    spec = load_spec(args.spec)
    policies = [check_policy_name(p) for p in _csv(args.policies)] if args.policies else [p.name for p in spec.policies]
    try:
        seeds = [int(s) for s in _csv(args.seeds)] if args.seeds else spec.seeds
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    base_dir = Path(args.spec).resolve().parent if args.spec else None
    out = Path(args.out)
    runs = [(p, s) for p in policies for s in seeds]
    console.print(f"[bold]{spec.name}[/]: {spec.topology.pods} pods x {spec.topology.workers_per_pod} workers, "
                  f"{len(policies)} policies x {len(seeds)} seeds -> {out / spec.name}")
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        overall = prog.add_task("all runs", total=len(runs))
        for policy, seed in runs:
            task = prog.add_task(f"{policy} seed {seed}", total=1.0)
            run_dir = run_sim(spec, policy, seed, out, base_dir=base_dir,
                              progress=lambda f, task=task: prog.update(task, completed=f))
            prog.update(task, completed=1.0, visible=False)
            prog.advance(overall)
            prog.console.print(f"  {policy:<16} seed {seed}: {run_dir}")
    console.print(f"report: testbed report {out / spec.name}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import report

    # a wide table stays readable when written to a file or a CI log
    out_console = Console() if sys.stdout.isatty() else Console(width=200)
    report([Path(p) for p in args.paths], Path(args.out) if args.out else None, out_console)
    return 0


def _cmd_policies(args: argparse.Namespace) -> int:
    print("\n".join(POLICY_NAMES))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed", description="Reliability-aware routing for PD-disaggregated LLM serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sim", help="run an experiment spec in the simulator")
    s.add_argument("spec", nargs="?", help="experiment YAML (default: the embedded default scenario)")
    s.add_argument("--out", default="runs", help="parent folder of the run directories (default: runs)")
    s.add_argument("--policies", help="comma-separated subset of the spec's policies")
    s.add_argument("--seeds", help="comma-separated seeds (default: the spec's)")
    s.set_defaults(fn=_cmd_sim)
    r = sub.add_parser("report", help="metrics table and plots of run directories")
    r.add_argument("paths", nargs="+", help="run directories, or folders holding them")
    r.add_argument("--out", help="where to write CSVs and plots (default: a report folder next to the first path)")
    r.set_defaults(fn=_cmd_report)
    p = sub.add_parser("policies", help="list the known policies")
    p.set_defaults(fn=_cmd_policies)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        console.print("interrupted: rows recorded so far are kept; run directories are marked interrupted")
        return 130
    except (ValueError, FileNotFoundError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"testbed: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
