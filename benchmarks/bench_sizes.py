"""What a simulated run costs per worker and per request (not a test: prints figures).

    python benchmarks/bench_sizes.py

Runs the embedded default scenario (core-link degradation, FaultAwareOTF-R) in fresh
processes at several topology sizes and request counts, and fits peak resident memory
and CPU time to ``base + per_worker x workers + per_request x requests`` (least squares).
These fits are where core/spec/sizes.py's constants come from: the size check refuses a
spec before anything is built when the estimate does not fit the machine.
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

import numpy as np

# (pods, workers per pod, requests): worker counts 4x apart, request counts 4x apart
GRID = [(32, 32, 10_000), (32, 32, 40_000), (128, 32, 10_000), (128, 32, 40_000), (512, 32, 10_000)]


def _child(pods: int, wpp: int, requests: int, out: str) -> None:
    from core.spec.model import load_spec, parse_spec
    from simulator.run import run_sim

    data = load_spec(None).model_dump(mode="json")
    data["topology"].update(pods=pods, workers_per_pod=wpp)
    # the same load per worker as the 1024-worker default, so that queues look alike
    data["workload"]["arrival"]["rate_rps"] *= pods * wpp / 1024
    data["workload"].update(max_requests=requests, duration_s=None)
    cpu0 = time.process_time()
    run_sim(parse_spec(data), "FaultAwareOTF-R", 0, Path(out))
    print(json.dumps({"cpu_s": time.process_time() - cpu0,
                      "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child, args.out)
        return
    rows = []
    for pods, wpp, requests in GRID:
        with tempfile.TemporaryDirectory() as out:
            res = subprocess.run([sys.executable, __file__, "--child", str(pods), str(wpp), str(requests),
                                  "--out", out], capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append((pods * wpp, requests, r["peak_bytes"], r["cpu_s"]))
        print(f"{pods * wpp:6d} workers {requests:7d} requests: peak {r['peak_bytes'] / 2**20:7.1f} MiB, "
              f"cpu {r['cpu_s']:6.2f} s")
    a = np.array([[1.0, w, q] for w, q, _, _ in rows])
    (m0, mw, mq), *_ = np.linalg.lstsq(a, np.array([r[2] for r in rows]), rcond=None)
    # CPU time: per request, a decision scores every pod, so its cost grows with the workers
    b = np.array([[1.0, w, q, q * w] for w, q, _, _ in rows])
    (c0, cw, cq, cqw), *_ = np.linalg.lstsq(b, np.array([r[3] for r in rows]), rcond=None)
    print(f"memory: {m0 / 2**20:.0f} MiB + {mw / 1024:.1f} KiB per worker + {mq:.0f} B per request")
    print(f"cpu: {c0:.2f} s + {cw * 1e3:.3f} ms per worker + {cq * 1e6:.1f} us per request "
          f"+ {cqw * 1e9:.2f} ns per request and worker")


if __name__ == "__main__":
    main()
