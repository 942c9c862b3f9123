"""Cost of the fluid network model: wall-clock microseconds per flow (one start + one completion).

    python benchmarks/bench_network.py [--flows 20000] [--seed 0]

A fat-tree's 32 pods give 64 links (each pod's uplink and downlink, 100 Gb/s).
N flows run concurrently between random pod pairs, each over 2 links (sender
uplink, receiver downlink), KV-sized (lognormal, median 40 MB). Whenever one
finishes, another starts, so concurrency stays at N. Two ways to start it:

* ``separate``: from its own SimPy event a moment later, as a request process
  does; a start and a completion each pay a full recomputation;
* ``in-callback``: inside ``on_done``; the network folds the start into the
  completion's recomputation.

``degraded`` repeats ``separate`` with 4 pods' links at 10 % capacity (more
distinct bottleneck levels, more water-filling passes). The figures include
the driver's own SimPy events; ``simpy only`` is that overhead alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from simulator.network import FlowNetwork  # noqa: E402

N_PODS = 32
LINK_BPS = 100e9 / 8


def _paths(rng: np.random.Generator, n: int) -> list[list[int]]:
    src = rng.integers(0, N_PODS, n)
    dst = (src + rng.integers(1, N_PODS, n)) % N_PODS  # another pod
    return [[int(a), N_PODS + int(b)] for a, b in zip(src, dst)]


def run(n_conc: int, n_flows: int, mode: str, seed: int, degraded: bool = False) -> float:
    """Wall-clock microseconds per completed flow."""
    rng = np.random.default_rng(seed)
    total = n_conc + n_flows
    paths = _paths(rng, total)
    sizes = rng.lognormal(np.log(40e6), 0.5, total)
    gaps = rng.exponential(1e-6, total)
    env = simpy.Environment()
    cap = np.full(2 * N_PODS, LINK_BPS)
    if degraded:
        for p in range(4):
            cap[p] = cap[N_PODS + p] = 0.1 * LINK_BPS
    net = FlowNetwork(env, cap)
    i = 0
    finished = 0

    def start_next(_ev: object = None) -> None:
        nonlocal i
        if i < total:
            net.start(paths[i], sizes[i], on_done)
            i += 1

    def on_done(_fid: int) -> None:
        nonlocal finished
        finished += 1
        if mode == "in-callback":
            start_next()
        elif mode == "separate":
            env.timeout(gaps[finished % total]).callbacks.append(start_next)
        else:  # "simpy only": the driver's events, no network
            raise AssertionError(mode)

    for _ in range(n_conc):
        start_next()
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    return 1e6 * wall / finished


def simpy_only(n_flows: int) -> float:
    """The driver's own cost: one timeout plus one callback per flow."""
    env = simpy.Environment()
    count = 0

    def tick(_ev: object) -> None:
        nonlocal count
        count += 1
        if count < n_flows:
            env.timeout(1e-6).callbacks.append(tick)

    env.timeout(1e-6).callbacks.append(tick)
    t0 = time.perf_counter()
    env.run()
    return 1e6 * (time.perf_counter() - t0) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=20000, help="completed flows per measurement")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"64 links (32 pods x up/down, 100 Gb/s), 2 links per flow, {args.flows} flows per figure")
    print(f"{'concurrent':>10} {'separate':>12} {'in-callback':>12} {'degraded':>12}   (us per flow)")
    for n_conc in (50, 200, 1000):
        row = [run(n_conc, args.flows, m, args.seed) for m in ("separate", "in-callback")]
        row.append(run(n_conc, args.flows, "separate", args.seed, degraded=True))
        print(f"{n_conc:>10} " + " ".join(f"{v:>12.1f}" for v in row))
    print(f"simpy only (one timeout + callback per flow): {simpy_only(args.flows):.1f} us")


if __name__ == "__main__":
    main()
