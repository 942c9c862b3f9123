"""What the command groups share: the console, the selection of policies and seeds, the size
check, and the arguments of the commands that run a spec."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from core.policies import check_policy_name

console = Console(stderr=True)


def csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def selection(args: argparse.Namespace, spec) -> tuple[list[str], list[int]]:
    """The spec's policies and seeds, or the subsets asked for on the command line."""
    policies = [check_policy_name(p) for p in csv(args.policies)] if args.policies else [p.name for p in spec.policies]
    try:
        seeds = [int(s) for s in csv(args.seeds)] if args.seeds else spec.seeds
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    return policies, seeds


def check_sizes(spec: Any, world: str, runs: int, args: argparse.Namespace) -> None:
    """Refuse, before anything is built, what cannot fit this machine or the time allowed."""
    from core.spec.sizes import check_fits

    check_fits(spec, world, runs, max_hours=args.max_hours)


def out_console() -> Console:
    # a wide table stays readable when written to a file or a CI log
    return Console() if sys.stdout.isatty() else Console(width=200)


def experiment_parser(sub: Any, name: str, help: str, default: str, fn: Any, out: str = "runs") -> Any:
    """`run`, `sim` and `twin` take the same arguments: a spec and subsets of its policies and seeds."""
    p = sub.add_parser(name, help=help)
    p.add_argument("spec", nargs="?", help=f"experiment YAML (default: {default})")
    p.add_argument("--out", default=out, help=f"parent folder of the run directories (default: {out})")
    p.add_argument("--policies", help="comma-separated subset of the spec's policies")
    p.add_argument("--seeds", help="comma-separated seeds (default: the spec's)")
    p.add_argument("--max-hours", type=float, default=24.0,
                   help="refuse a spec whose runs are estimated to take longer (default 24; core/spec/sizes.py)")
    p.set_defaults(fn=fn)
    return p
