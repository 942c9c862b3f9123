"""Decision latency of the real router in the contexts it runs in (not a test: prints figures).

    python benchmarks/bench_decision_context.py [--spec PATH] [--policies LC,FaultAwareOTF-R]
                                                [--decisions 40] [--gap-ms 50] [--busy 4]

On the testbed the router recorded a p50 of 200-330 us per decision, where
benchmarks/bench_policies.py measures 2-13 us for the same ``policy.choose``. This measures
the recorded latency (``DecisionRecord.latency_s``, the ``perf_counter`` pair around
``policy.choose`` in ``Router.route``) of the very router the testbed builds:
``core.run.RunContext`` for the spec the testbed runs (default: the 2-pod, 2-workers-per-pod
``experiments/testbed_link_fault.yaml``), with its run writer behind the sink, driven by an
asyncio loop like ``RouterActor.run``. Settings (rows):

* plain process or a Ray async actor (``num_cpus=0``, as ``RouterActor``; Ray runs its loop in a
  thread of its own);
* back to back, or one decision every ``--gap-ms`` (the testbed: one every 0.1-10 s);
* with nothing else running, or with ``--busy`` processes on the 2 cores: ``spin``
  (``while True: pass``) or ``matmul`` (a single-threaded 1024 x 1024 float32 matmul loop,
  like a CPU engine's forward passes, which use the caches as the engines do).

Columns, from one run each, interleaved decision by decision (whatever else the machine does
then hits both alike): ``same PodState``: only loads changed since the decision before, so the
policy's per-PodState cache holds; ``new PodState``: the router's health and slow ticks
(``RunContext.periodic``) ran halfway through the gap, as the actor's 1 s loops do between the
testbed's 0.5 requests/s (a slow tick always replaces ``view.pods``); back to back, they run right
before. That cache's rebuild (``Policy._refresh``) used to run inside the next timed ``choose``,
on caches gone cold: the main part of the gap. The ticks now rebuild it (``Policy.prepare``), so
the two columns differ little; what remains is the cold-cache cost of ``choose`` itself after an
idle gap (docs/performance.md "Recorded decision latency": the figures before and after).

Each (setting, policy) is a fresh RunContext; its first 3 decisions are dropped. With 40 spaced
decisions a column's p99 is about its maximum; spaced cells vary up to ~2x from run to run (the
host's load), the ratio of the two columns much less. Run time: about 90 s on 2 cores. Busy
processes are killed and Ray is shut down on the way out, error or not (and a busy process dies
with this one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO / "experiments" / "testbed_link_fault.yaml"
WARMUP = 3  # decisions dropped per cell: the first ones of a fresh context pay one-time costs
PROMPT_TOKENS, OUTPUT_TOKENS = 500, 16

BUSY_CODE = {
    "spin": "while True: pass",
    # One thread, like a CPU engine's torch thread; its 12 MB of operands evict L1/L2 as engines do.
    "matmul": "import numpy as np\na = np.ones((1024, 1024), np.float32)\nwhile True: a @ a",
}


@dataclass(frozen=True)
class Setting:
    name: str
    in_ray: bool
    gap_s: float  # 0: back to back
    busy: str | None = None  # a BUSY_CODE key


# --- the decision loop (runs in this process or inside the Ray actor) -------------------------

def _compiled_modules() -> dict[str, str]:
    """Where the router's hot modules come from here, and whether compiled (core/compiled.py's finder decides)."""
    import core.policies.base
    import core.policies.pickers
    import core.routing
    from core.compiled import is_compiled

    return {m.__name__: f"{m.__file__} ({'compiled' if is_compiled(m) else 'PURE PYTHON'})"
            for m in (core.routing, core.policies.base, core.policies.pickers)}


async def measure_decisions(spec_path: str, policy: str, n: int, gap_s: float,
                            out: str) -> dict[str, list[float]]:
    """Recorded latency (seconds) of ``2 n`` decisions of a fresh RunContext, as the testbed's router
    makes them: ``n`` with the PodState of the decision before (``same``), and, interleaved with them
    (so that whatever else the machine does hits both alike), ``n`` after the router's ticks (``new``)."""
    from core.experiment import build_topology, testbed_capacity
    from core.run import RunContext
    from core.spec.model import load_spec

    spec = load_spec(spec_path)
    topo = build_topology(spec)
    capacity = testbed_capacity(spec, spec.topology.kv_bytes_per_token)
    ctx = RunContext(spec, "testbed", policy, 0, out, topo, {}, capacity, flush_s=1.0)  # flush_s: RouterActor's
    latencies: list[float] = []
    write = ctx.router.sink

    def sink(rec: Any) -> None:  # keep the writer behind it: its flushes are part of the real context
        if rec.table == "decisions":
            latencies.append(rec.latency_s)
        write(rec)

    ctx.router.sink = sink
    t_start = time.monotonic()
    ticket = None
    try:
        for i in range(2 * n + WARMUP):
            if gap_s:
                await asyncio.sleep(gap_s / 2)
            now = time.monotonic() - t_start
            if ticket is not None:  # the previous request ends in the gap (keeps the loads bounded)
                ticket.finish(now)
            if i % 2:  # what the actor's _every loops do between two arrivals: a new view.pods
                for _, tick in ctx.periodic:
                    tick(now)
            if gap_s:
                await asyncio.sleep(gap_s / 2)
            now = time.monotonic() - t_start
            ticket = ctx.route(now, i, now, PROMPT_TOKENS, OUTPUT_TOKENS)
        ticket.finish(time.monotonic() - t_start)
    finally:
        ctx.close()
    kept = range(WARMUP, len(latencies))
    return {"same": [latencies[i] for i in kept if i % 2 == 0], "new": [latencies[i] for i in kept if i % 2]}


class DecisionBench:
    """The loop above as a Ray async actor's method (RouterActor's kind of process)."""

    async def compiled(self) -> dict[str, str]:
        return _compiled_modules()

    async def measure(self, spec_path: str, policy: str, n: int, gap_s: float, out: str) -> dict[str, list[float]]:
        return await measure_decisions(spec_path, policy, n, gap_s, out)


# --- busy processes ---------------------------------------------------------------------------

def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when this benchmark dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def busy_processes(kind: str | None, count: int) -> Iterator[None]:
    """``count`` processes running ``BUSY_CODE[kind]`` for the duration; all killed on exit."""
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        if kind is not None:
            for _ in range(count):
                procs.append(subprocess.Popen([sys.executable, "-c", BUSY_CODE[kind]], env=env,
                                              preexec_fn=_die_with_parent))
            time.sleep(1.0)  # past their imports: busy when the first decision is made
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


# --- the table ---------------------------------------------------------------------------------

def _cell(lat_s: list[float]) -> str:
    us = np.asarray(lat_s) * 1e6
    return f"{np.percentile(us, 50):.1f} / {np.percentile(us, 99):.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(DEFAULT_SPEC))
    ap.add_argument("--policies", default="LC,FaultAwareOTF-R")
    ap.add_argument("--decisions", type=int, default=40, help="per column of a spaced cell (back to back: 50x as many)")
    ap.add_argument("--gap-ms", type=float, default=50.0)
    ap.add_argument("--busy", type=int, default=4, help="busy processes (the 2x2 testbed runs 4 engines)")
    args = ap.parse_args()
    args.spec = str(Path(args.spec).resolve())  # the actor's working directory need not be ours
    policies = args.policies.split(",")
    gap = args.gap_ms / 1000
    settings = [
        Setting("plain, back to back", False, 0.0),
        Setting(f"plain, {args.gap_ms:g} ms apart", False, gap),
        Setting(f"plain, apart + {args.busy} spin", False, gap, "spin"),
        Setting(f"plain, apart + {args.busy} matmul", False, gap, "matmul"),
        Setting("Ray actor, back to back", True, 0.0),
        Setting(f"Ray actor, {args.gap_ms:g} ms apart", True, gap),
        Setting(f"Ray actor, apart + {args.busy} spin", True, gap, "spin"),
        Setting(f"Ray actor, apart + {args.busy} matmul", True, gap, "matmul"),
    ]
    import ray

    console = Console(width=150)
    table = Table(title=f"recorded decision latency (us), p50 / p99: {Path(args.spec).name}")
    for col in ("setting", "policy"):
        table.add_column(col)
    table.add_column("same PodState", justify="right")
    table.add_column("new PodState (ticks in the gap)", justify="right")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_decision_context-") as out:
        try:
            ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
            # SIGTERM as an exception, like Ctrl-C (after ray.init, which installs a handler of its
            # own): the finally blocks kill the busy processes and shut Ray down
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
            actor = ray.remote(num_cpus=0)(DecisionBench).remote()
            compiled = {"plain": _compiled_modules(), "Ray actor": ray.get(actor.compiled.remote())}
            for s in settings:
                n = args.decisions * (50 if s.gap_s == 0 else 1)
                with busy_processes(s.busy, args.busy):
                    for policy in policies:
                        call = (args.spec, policy, n, s.gap_s, out)
                        lat = (ray.get(actor.measure.remote(*call)) if s.in_ray
                               else asyncio.run(measure_decisions(*call)))
                        table.add_row(s.name, policy, _cell(lat["same"]), _cell(lat["new"]))
                table.add_section()
        finally:
            ray.shutdown()
    console.print(table)
    for where, mods in compiled.items():
        for name, origin in mods.items():
            console.print(f"{where}: {name} from {origin}", highlight=False)
    console.print(f"run time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
