"""Decision latency per policy (not a test: prints figures).

    python benchmarks/bench_policies.py [--decisions N]

Each pod holds one prefill and one decode worker, so the candidate count of
each role equals the pod count (32, 256, 1024); the default 32 x 32 topology
is measured too. Loads change between decisions as the router would change
them; pod state (prices, labels) changes every 1000 decisions, like a slow loop.
Target: FaultAwareOTF-R p50 <= 20 us per decision at 1024 pods, one core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from core.policies import POLICY_NAMES, Weights, make_policy
from core.topology import Topology
from core.view import Capacity, ClusterView, Loads, PodState

CAP = Capacity(prefill_slots=16, prefill_token_budget=8192, decode_slots=256, decode_kv_tokens=400_000)


def measure(policy: str, pods: int, wpp: int, n: int) -> np.ndarray:
    topo = Topology.build(pods, wpp)
    rng = np.random.default_rng(0)
    view = ClusterView(topo, CAP, Loads.zeros(topo), PodState.initial(pods))
    view.loads.prefill_outstanding[:] = rng.integers(0, 16, topo.prefill_ids.size)
    view.loads.decode_outstanding[:] = rng.integers(0, 256, topo.decode_ids.size)
    pol = make_policy(policy, Weights(lambda_p=0.1), np.random.default_rng(1))
    lat = np.empty(n)
    for i in range(n):
        if i % 1000 == 0:
            view.pods = PodState(rng.random(pods) < 0.05, rng.random(pods) < 0.05, rng.random(pods))
        t0 = time.perf_counter()
        c = pol.choose(view)
        lat[i] = time.perf_counter() - t0
        view.loads.prefill_outstanding[c.prefill] += 1  # what the router does next
        view.loads.decode_outstanding[c.decode] += 1
    return lat[n // 10:]  # drop warm-up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=20000)
    args = ap.parse_args()
    shapes = [(32, 2), (256, 2), (1024, 2), (32, 32)]
    table = Table(title="decision latency (microseconds): p50 / p99")
    table.add_column("policy")
    for pods, wpp in shapes:
        table.add_column(f"{pods} pods x {wpp}" + (" (default)" if wpp == 32 else ""), justify="right")
    for policy in POLICY_NAMES:
        cells = []
        for pods, wpp in shapes:
            lat = measure(policy, pods, wpp, args.decisions) * 1e6
            cells.append(f"{np.percentile(lat, 50):.1f} / {np.percentile(lat, 99):.1f}")
        table.add_row(policy, *cells)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
