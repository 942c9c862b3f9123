"""Simulator speed and peak memory at 1024 workers (not a test: prints figures).

    python benchmarks/bench_sim.py [--requests 100000] [--policy FaultAwareOTF-R]

Runs experiments/core_link_degradation.yaml (32 pods x 32 workers, faults on)
for a fixed number of requests in a fresh process, and reports simulated
requests per CPU second (the run is single-threaded) and the process's peak
resident memory. Targets: >= 20,000 requests/s per core; < 2 GiB for 100,000
requests. A single run varies by a few percent on a shared machine. The hot modules run
compiled where the install built them (core/compiled.py); TESTBED_PURE_PYTHON=1 measures them
as Python.

The machine's own speed moves by 2x between days, so the figure to compare across runs is the
speed as a share of SimPy's event rate measured in the same process around the run: SimPy's
plain loop, 100 processes each yielding ``env.timeout(1)`` (:func:`simpy_rate`), once before and
once after the simulation, averaged.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def simpy_rate(timeouts: int = 500_000, processes: int = 100) -> float:
    """SimPy timeouts per CPU second: ``processes`` processes, each yielding ``env.timeout(1)`` in a loop,
    until ``timeouts`` have fired."""
    import simpy

    env = simpy.Environment()

    def tick(env: simpy.Environment):
        while True:
            yield env.timeout(1)

    for _ in range(processes):
        env.process(tick(env))
    steps = timeouts // processes
    cpu0 = time.process_time()
    env.run(until=steps + 0.5)  # each process has fired `steps` timeouts by then
    return processes * steps / (time.process_time() - cpu0)


def _child(requests: int, policy: str, out: str) -> None:
    from simulator.run import run_sim
    from core.spec.model import load_spec, parse_spec

    data = load_spec(REPO / "experiments" / "core_link_degradation.yaml").model_dump(mode="json")
    data["workload"]["max_requests"] = requests
    data["workload"]["duration_s"] = None
    spec = parse_spec(data)
    before = simpy_rate()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    run_sim(spec, policy, 0, Path(out))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    simpy_per_s = (before + simpy_rate()) / 2
    from core.compiled import COMPILED_MODULES, is_compiled
    compiled = sum(is_compiled(sys.modules[m]) for m in COMPILED_MODULES if m in sys.modules)
    print(json.dumps({"requests": requests, "wall_s": wall, "cpu_s": cpu, "peak_bytes": peak,
                      "compiled": compiled, "hot_modules": len(COMPILED_MODULES), "simpy_per_s": simpy_per_s}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--policy", default="FaultAwareOTF-R")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.requests, args.policy, args.out)
        return
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run([sys.executable, __file__, "--child", "--requests", str(args.requests),
                              "--policy", args.policy, "--out", out], capture_output=True, text=True, check=True)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"policy {args.policy}, 1024 workers, {r['requests']} requests, "
          f"{r['compiled']} of {r['hot_modules']} hot modules compiled")
    print(f"  wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s")
    speed = r["requests"] / r["cpu_s"]
    print(f"  speed {speed:,.0f} simulated requests per CPU second (target >= 20,000)")
    print(f"  SimPy's plain loop in the same process: {r['simpy_per_s']:,.0f} timeouts per CPU second; "
          f"speed / SimPy's = {speed / r['simpy_per_s']:.4f}")
    print(f"  peak memory {r['peak_bytes'] / 2**30:.2f} GiB (target < 2 GiB)")


if __name__ == "__main__":
    main()
