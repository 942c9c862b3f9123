"""Sizes checked before work: what a spec's runs will need, estimated from the spec alone.

A spec whose topology or workload cannot fit this machine's memory, or would run longer
than the time allowed, is refused with the reason before anything is built (a spec with
10^9 pods otherwise spends minutes allocating before it fails, or fills the swap).

The simulator's costs are fits of ``benchmarks/bench_sizes.py`` (the embedded default
scenario at 1,024 to 16,384 workers and 10,000 to 40,000 requests, fresh processes, this
2-core machine): peak resident memory ``170 MiB + 2.8 KiB per worker + 471 B per
request``, CPU time ``46 us per request + 5.7 ns per request and worker`` (each decision
scores every pod) ``+ 6 us per worker``. The estimate only has to be right within a
factor of a few: what it refuses is orders of magnitude beyond the machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from vocab import SIM, TESTBED

if TYPE_CHECKING:
    from core.spec.model import ExperimentSpec

GiB = 2**30

# benchmarks/bench_sizes.py (module docstring)
SIM_BASE_BYTES = 170 * 2**20
SIM_WORKER_BYTES = 2.8 * 1024
SIM_REQUEST_BYTES = 471.0
SIM_CPU_PER_REQUEST_S = 46e-6
SIM_CPU_PER_REQUEST_WORKER_S = 5.7e-9
SIM_CPU_PER_WORKER_S = 6e-6
# The risk price keeps three float64 rings of (window / bucket) x pods (core/risk.py).
RISK_RING_BYTES_PER_CELL = 3 * 8
# The testbed's engines start in parallel in 88-117 s when the machine is idle, 330 s when not
# (docs/performance.md "Measured figures"): the slower figure bounds the start.
ENGINE_START_S = 330.0
# A run that would not end within a day is, far more often than not, a spec with a digit too
# many; `--max-hours` raises the limit for one that means it.
DEFAULT_MAX_HOURS = 24.0


class SizeError(ValueError):
    """A spec too large for this machine; the message is one line with the estimate and the reason."""


@dataclass(frozen=True)
class Footprint:
    """What one run of a spec needs, estimated; ``None`` where the spec alone does not say."""

    workers: int
    requests: float | None  # expected requests in one run
    memory_bytes: float  # peak, of the largest process
    seconds: float | None  # one run: CPU seconds (simulator) or wall seconds (testbed)


def expected_requests(spec: "ExperimentSpec") -> float | None:
    """Requests one run is expected to hold: a synthetic stream's rate x duration, capped by
    max_requests; a trace's max_requests (else unknown before the file is read, and then
    bounded by the file itself)."""
    return workload_requests(spec.workload)


def field_of(obj: Any, name: str) -> Any:
    """A field of a spec part: a pydantic model's attribute, or its dict's key as run.json holds it."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def workload_requests(workload: Any) -> float | None:
    """:func:`expected_requests` of a workload: a workloads.spec.WorkloadSpec, or its dict as a run's
    run.json holds it (so records of a run can be sized without parsing their spec again)."""
    most = field_of(workload, "max_requests")
    cap = float(most) if most is not None else math.inf
    rate, duration = field_of(field_of(workload, "arrival") or {}, "rate_rps"), field_of(workload, "duration_s")
    if rate is None:  # a trace
        return cap if math.isfinite(cap) else None
    return min(cap, rate * duration if duration is not None else math.inf)


def _run_wall_s(spec: "ExperimentSpec", requests: float | None) -> float | None:
    """The testbed's wall time for one run: the arrivals' span and the last request's deadline."""
    w = spec.workload
    rate = getattr(w.arrival, "rate_rps", None)
    if w.duration_s is not None:
        span = w.duration_s
    elif rate is not None and requests is not None:
        span = requests / rate
    else:
        return None
    return span + spec.deadline_s


def footprint(spec: "ExperimentSpec", world: Literal["sim", "testbed"]) -> Footprint:
    t = spec.topology
    workers = t.pods * t.workers_per_pod
    requests = expected_requests(spec)
    ring = math.ceil(spec.router.history_window_s / spec.router.history_bucket_s) * t.pods * RISK_RING_BYTES_PER_CELL
    # the simulator, or the testbed's router: the same core structures per worker and request (the
    # testbed's engines are testbed.runs.launch.check_machine's to count)
    memory = SIM_BASE_BYTES + SIM_WORKER_BYTES * workers + SIM_REQUEST_BYTES * (requests or 0) + ring
    if world == SIM:
        seconds = None if requests is None else (
            SIM_CPU_PER_WORKER_S * workers + requests * (SIM_CPU_PER_REQUEST_S + SIM_CPU_PER_REQUEST_WORKER_S * workers))
    else:
        seconds = _run_wall_s(spec, requests)
    return Footprint(workers, requests, memory, seconds)


def available_memory_bytes() -> float:
    """What this machine can still give (Linux's MemAvailable: free plus reclaimable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _size(b: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20)):
        if b >= scale:
            return f"{b / scale:,.1f} {unit}"
    return f"{b:,.0f} B"


def duration_text(s: float) -> str:
    return f"{s / 3600:,.1f} h" if s >= 3600 else f"{s / 60:,.1f} min"


def check_fits(spec: "ExperimentSpec", world: Literal["sim", "testbed"], runs: int = 1,
               max_hours: float = DEFAULT_MAX_HOURS, memory_bytes: float | None = None) -> Footprint:
    """Refuse (:class:`SizeError`) a spec whose ``runs`` runs in ``world`` cannot fit this
    machine's memory (``memory_bytes``, default what it has available) or ``max_hours``."""
    fp = footprint(spec, world)
    have = available_memory_bytes() if memory_bytes is None else memory_bytes
    t = spec.topology
    what = f"{t.pods:,} pods x {t.workers_per_pod:,} workers"
    if fp.requests is not None:
        what += f", about {fp.requests:,.0f} requests a run"
    where = "in the simulator" if world == SIM else "on the testbed"
    if fp.memory_bytes > have:
        raise SizeError(f"{spec.name}: too large to run {where} ({what}): it needs about {_size(fp.memory_bytes)} "
                        f"of memory, this machine has {_size(have)} available (estimate: core/spec/sizes.py)")
    if fp.seconds is not None:
        total = runs * fp.seconds + (ENGINE_START_S if world == TESTBED else 0.0)
        if total > max_hours * 3600:
            kind = "CPU time" if world == SIM else "wall time"
            raise SizeError(f"{spec.name}: too long to run {where} ({what}): {runs} run(s) need about "
                            f"{duration_text(total)} of {kind}, over the {max_hours:g} h allowed (--max-hours; "
                            f"estimate: core/spec/sizes.py)")
    return fp


def check_study_fits(specs: list["ExperimentSpec"], parallel: int, max_hours: float = DEFAULT_MAX_HOURS,
                     memory_bytes: float | None = None) -> None:
    """A study's runs in the simulator (one spec per run, ``parallel`` at a time on this machine):
    every run must fit alone, ``parallel`` of the largest together, and all of them in
    ``max_hours`` spread over ``parallel`` processes."""
    if not specs:
        return
    have = available_memory_bytes() if memory_bytes is None else memory_bytes
    prints = [check_fits(s, "sim", 1, max_hours=math.inf, memory_bytes=have) for s in specs]
    largest = max(range(len(specs)), key=lambda i: prints[i].memory_bytes)
    n = min(parallel, len(specs))
    if n * prints[largest].memory_bytes > have:
        raise SizeError(f"{specs[largest].name}: too large to run {n} cells at once: each needs up to about "
                        f"{_size(prints[largest].memory_bytes)} of memory, this machine has {_size(have)} available "
                        f"(--workers fewer; estimate: core/spec/sizes.py)")
    known = [p.seconds for p in prints if p.seconds is not None]
    total = sum(known) / n
    if total > max_hours * 3600:
        raise SizeError(f"{specs[0].name}: too long: its {len(specs)} runs need about {duration_text(sum(known))} of CPU "
                        f"time, {duration_text(total)} on {n} workers, over the {max_hours:g} h allowed (--max-hours; "
                        "estimate: core/spec/sizes.py)")
