"""Does a change leave the simulator's records as they were? (not a test: prints a verdict)

    python tools/same_records.py --base REV [--spec experiments/smoke.yaml ...] [--seeds 0,1]

Runs the simulator on each spec (every policy, the given seeds) twice: in a scratch git worktree of
``REV`` and in this working tree, each in a fresh interpreter with its own tree first on the path,
then compares every table of every run directory (requests, decisions, faults, health, prices and
the rest) with pandas. Decision latency (``latency_s``) is the router's measured wall-clock time and
is left out; everything else must be equal to the bit. Exit status 1 when any table differs.
Used for the restructuring that became commit 17dba36 (docs/performance.md says what it gave).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = ("experiments/smoke.yaml", "core/defaults/testbed.yaml", "experiments/core_link_degradation.yaml")
WALL_CLOCK = {"latency_s"}  # measured, not simulated


def simulate(tree: Path, spec: str, seeds: str, out: Path, policies: str | None) -> None:
    """``testbed sim`` of ``tree``'s code (``python -m cli``, or ``testbed.cli`` before the move)."""
    module = "cli" if (tree / "cli" / "__main__.py").exists() else "testbed.cli"
    cmd = [sys.executable, "-m", module, "sim", str(REPO / spec), "--out", str(out), "--seeds", seeds]
    if policies:
        cmd += ["--policies", policies]
    env = {**os.environ, "PYTHONPATH": str(tree), "TESTBED_PURE_PYTHON": "1"}  # same code path in both trees
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    same, differ = 0, []
    for table in sorted(p for p in a.rglob("*.parquet") if p.is_dir() or p.parent.suffix != ".parquet"):
        other = b / table.relative_to(a)
        if not other.exists():
            differ.append(f"{table.relative_to(a)}: missing in the working tree's run")
            continue
        x, y = pd.read_parquet(table), pd.read_parquet(other)
        x, y = (d.drop(columns=[c for c in WALL_CLOCK if c in d.columns]) for d in (x, y))
        try:
            pd.testing.assert_frame_equal(x, y)
            same += 1
        except AssertionError as e:
            differ.append(f"{table.relative_to(a)}: {str(e).splitlines()[0]}")
    return same, differ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("--spec", action="append", help=f"spec(s) to simulate (default: {', '.join(DEFAULT_SPECS)})")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--policies", help="a subset of the specs' policies (default: all)")
    args = ap.parse_args()
    total, bad = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)
        try:
            for spec in args.spec or DEFAULT_SPECS:
                simulate(base_tree, spec, args.seeds, Path(tmp) / "before", args.policies)
                simulate(REPO, spec, args.seeds, Path(tmp) / "after", args.policies)
            same, differ = compare(Path(tmp) / "before", Path(tmp) / "after")
            total, bad = same, differ
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    print(f"{total} tables identical, {len(bad)} differ (base {args.base}, seeds {args.seeds})")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
