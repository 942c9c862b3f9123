"""One study cell's simulation CPU time: in a plain process, in a Ray task, and in the clean child
a Ray task hands it to (study/clean_process.py). Not a test: prints figures.

    python benchmarks/bench_study_cell.py [--policy OTF-R] [--repeat 3]

The cell is experiments/study.yaml's severity sweep at r = 0.01, telemetry direct, seed 0 (about
59,000 requests). Each line gives the simulation's CPU seconds per repeat (``run_cell``'s
``cpu_s``: the simulation and its records, without the cell's metrics).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cell(policy: str) -> tuple[str, str, int]:
    from core.spec.model import load_spec
    from study.grid import expand_study

    cells = expand_study(load_spec(REPO / "experiments" / "study.yaml"), "study.yaml")
    c = next(c for c in cells if c.sweep == "severity" and c.policy == policy and c.seed == 0
             and c.axes == {"severity": 0.01, "telemetry": "direct"})
    return c.spec.model_dump_json(), c.policy, c.seed


def _here(policy: str, repeat: int) -> list[float]:
    from study.runner import run_cell

    args = _cell(policy)
    return [round(run_cell(*args)["cpu_s"], 2) for _ in range(repeat)]


def _clean(policy: str, repeat: int) -> list[float]:
    from study.runner import run_cell_in_clean_process

    args = _cell(policy)
    return [round(run_cell_in_clean_process(*args)["cpu_s"], 2) for _ in range(repeat)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="OTF-R")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"study cell severity r=0.01 telemetry direct, {args.policy}, seed 0: simulation CPU s per repeat")
    print(f"  plain process          {_here(args.policy, args.repeat)}")
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        print(f"  Ray task               {ray.get(ray.remote(_here).remote(args.policy, args.repeat))}")
        print(f"  Ray task, clean child  {ray.get(ray.remote(_clean).remote(args.policy, args.repeat))}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    main()
