"""Cost of the fluid network model: microseconds per flow (one start + one completion).

    python benchmarks/bench_network.py [--flows 10000] [--repeat 3] [--seed 0] [--cpu]

Two networks. First the brief's: a fat-tree's 32 pods give 64 links (each
pod's uplink and downlink, 100 Gb/s); flows run between random pod pairs over
2 links (sender uplink, receiver downlink). Second the simulator's own shape:
1024 workers' NICs plus the pods' core links (2112 links), flows between random
workers over 4 links (2 inside a pod). Flows are KV-sized (lognormal, median
40 MB); N run concurrently: whenever one finishes another starts. Columns:

* ``separate``: the new flow starts from its own SimPy event a moment later,
  as a request process would start it, so the start and the completion are two
  separate changes of the allocation;
* ``in-callback``: the new flow starts inside ``on_done``; the network folds it
  into the completion's recomputation;
* ``degraded``: as ``separate``, with 4 pods' links at 10 % (pod network) or
  their core links at 1 % (worker network) of capacity.

Each figure is the best of ``--repeat`` runs (wall time, or with ``--cpu``
this process's CPU time, steadier on a shared machine) and includes the
driver's own SimPy events (``simpy only`` below). ``path mix`` says how the
``separate`` run's changes were handled: shortcut (no other rate changed), and
per recomputation the triangular solves, repair rounds and full progressive
fillings. The ``np.add`` line calibrates the machine: numpy call overhead
dominates these costs.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from simulator.network import FlowNetwork  # noqa: E402

N_PODS = 32
WORKERS_PER_POD = 32
LINK_BPS = 100e9 / 8
NIC_BPS = 400e9 / 8
_clock = time.perf_counter  # --cpu: time.process_time (this process's CPU time)


def _pod_level(rng: np.random.Generator, total: int, degraded: bool) -> tuple[np.ndarray, list]:
    """64 links: pod uplinks then downlinks; a flow crosses sender uplink and receiver downlink."""
    src = rng.integers(0, N_PODS, total)
    dst = (src + rng.integers(1, N_PODS, total)) % N_PODS  # another pod
    cap = np.full(2 * N_PODS, LINK_BPS)
    if degraded:
        for p in range(4):
            cap[p] = cap[N_PODS + p] = 0.1 * LINK_BPS
    return cap, [[int(a), N_PODS + int(b)] for a, b in zip(src, dst)]


def _worker_level(rng: np.random.Generator, total: int, degraded: bool) -> tuple[np.ndarray, list]:
    """The simulator's fat-tree: every worker's NIC (tx, rx) and every pod's core links.

    2112 links; a transfer between two random workers crosses the sender's tx,
    its pod's uplink, the receiver pod's downlink and the receiver's rx (2
    links inside one pod). Core links are non-blocking unless degraded (1 %).
    """
    W, P = N_PODS * WORKERS_PER_POD, N_PODS
    cap = np.r_[np.full(2 * W, NIC_BPS), np.full(2 * P, NIC_BPS * WORKERS_PER_POD)]
    if degraded:
        for p in range(4):
            cap[2 * W + p] = cap[2 * W + P + p] = 0.01 * cap[2 * W + p]
    src = rng.integers(0, W, total)
    dst = (src + rng.integers(1, W, total)) % W
    paths = []
    for a, b in zip(src.tolist(), dst.tolist()):
        pa, pb = a // WORKERS_PER_POD, b // WORKERS_PER_POD
        paths.append([a, W + b] if pa == pb else [a, 2 * W + pa, 2 * W + P + pb, W + b])
    return cap, paths


def run(n_conc: int, n_flows: int, mode: str, seed: int, degraded: bool = False,
        level: str = "pod") -> tuple[float, dict]:
    """Microseconds per completed flow, and the network's path counters."""
    rng = np.random.default_rng(seed)
    total = n_conc + n_flows
    cap, paths = (_pod_level if level == "pod" else _worker_level)(rng, total, degraded)
    sizes = rng.lognormal(np.log(40e6), 0.5, total).tolist()
    gaps = rng.exponential(1e-6, total).tolist()
    env = simpy.Environment()
    net = FlowNetwork(env, cap)
    started = finished = 0

    def start_next(_ev: object = None) -> None:
        nonlocal started
        if started < total:
            net.start(paths[started], sizes[started], on_done)
            started += 1

    def on_done(_fid: int) -> None:
        nonlocal finished
        finished += 1
        if mode == "in-callback":
            start_next()
        else:
            env.timeout(gaps[finished % total]).callbacks.append(start_next)

    for _ in range(n_conc):
        start_next()
    stats0 = dict(net.stats)
    t0 = _clock()
    env.run()
    spent = _clock() - t0
    stats = {k: v - stats0[k] for k, v in net.stats.items()}
    return 1e6 * spent / finished, stats


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
    t0 = _clock()
    env.run()
    return 1e6 * (_clock() - t0) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=10000, help="completed flows per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (best is shown)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true",
                    help="measure this process's CPU time instead of wall time (on a shared machine)")
    args = ap.parse_args()
    global _clock
    if args.cpu:
        _clock = time.process_time

    def best(*a, **k) -> tuple[float, dict]:
        return min((run(*a, **k) for _ in range(args.repeat)), key=lambda r: r[0])

    for level, title in (
        ("pod", "64 links (32 pods x up/down, 100 Gb/s), 2 links per flow (the brief's figure)"),
        ("worker", "2112 links (1024 workers' NIC tx/rx at 400 Gb/s + 64 pod core links, "
                   "non-blocking), 4 links per cross-pod flow; degraded: 4 pods' core links at 1 %"),
    ):
        print(f"{title}; {args.flows} flows per run, best of {args.repeat}, "
              f"{'CPU' if args.cpu else 'wall'} time")
        print(f"{'concurrent':>10} {'separate':>10} {'in-callback':>12} {'degraded':>10}"
              "   us per flow (start + completion); path mix (separate)")
        for n_conc in (10, 50, 200, 1000):
            sep, st = best(n_conc, args.flows, "separate", args.seed, level=level)
            cb, _ = best(n_conc, args.flows, "in-callback", args.seed, level=level)
            deg, _ = best(n_conc, args.flows, "separate", args.seed, degraded=True, level=level)
            changes = 2 * args.flows
            recomputes = max(changes - st["shortcuts"], 1)
            mix = (f"shortcut {st['shortcuts'] / changes:4.0%}; per recompute "
                   f"{st['solves'] / recomputes:.2f} solves, {st['repairs'] / recomputes:.2f} repairs, "
                   f"{st['fills'] / recomputes:.3f} fills")
            print(f"{n_conc:>10} {sep:>10.1f} {cb:>12.1f} {deg:>10.1f}   {mix}")
        print()
    print(f"simpy only (one timeout + callback per flow): {simpy_only(args.flows):.1f} us")
    a, b = np.random.rand(200), np.random.rand(200)
    ref = min(timeit.repeat(lambda: np.add(a, b), number=20000, repeat=5)) / 20000 * 1e6
    print(f"machine: np.add on 200 floats takes {ref:.2f} us")


if __name__ == "__main__":
    main()
