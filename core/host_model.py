"""The host model's rules and the measure of its demand, defined once (docs/simulator.md "The host model").

The simulator's shared host (``simulator/host.py``) and the calibration that measures it
(``core/calibration/fit.py``, ``testbed/calibration/calibrate.py``) both apply the rules; the
calibration and the check of a run against it (``analysis/checks/host_demand.py``) measure demand by
state the same way (:func:`rate_against`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["MP_WORKER_SPIN_S", "host_shared", "host_speed", "rate_against", "sample_intervals", "worker_spin_s"]

#: How long a vLLM worker process busy-waits on its shared-memory queue after each call with the
#: multiprocessing executor (vllm/distributed/device_communicators/shm_broadcast.py SpinCondition,
#: busy_loop_s = 1; docs/reliability.md "What spins").
MP_WORKER_SPIN_S = 1.0


def worker_spin_s(executor: str) -> float:
    """What an engine's worker spins after each call, by vLLM executor (core.spec.model.TestbedSpec.executor):
    the mp executor's queue reader busy-waits MP_WORKER_SPIN_S; the uni executor has no worker
    process and no queue, so nothing (docs/reliability.md "The worker process, removed")."""
    return MP_WORKER_SPIN_S if executor == "mp" else 0.0


def host_speed(cores: float, demand_cores: float) -> float:
    """The speed a host of ``cores`` leaves each engine when its engines demand ``demand_cores``:
    processor sharing, as Linux's fair scheduler gives runnable threads; 1 while the cores suffice."""
    return min(1.0, cores / demand_cores) if demand_cores > 0 else 1.0


def host_shared(cores: float, engines: int, gpus_per_engine: int, engine_cores: float = 1.0) -> bool:
    """Whether engines on one host compete for its cores: CPU engines (no GPU of their own) that
    together can demand more than it has. A GPU engine computes on its own device."""
    return gpus_per_engine == 0 and engines * engine_cores > cores


def sample_intervals(t: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A cumulative counter sampled at times ``t`` (sorted) as intervals: (start, end, its rate over each)."""
    t, counter = np.asarray(t, float), np.asarray(counter, float)
    return t[:-1], t[1:], np.diff(counter) / np.diff(t)


def rate_against(ref_mid: np.ndarray, ref_cpu: np.ndarray, ref_busy: np.ndarray,
                 others: list[tuple[np.ndarray, np.ndarray, np.ndarray]], half_s: float) -> list[tuple[str, float]]:
    """Demand by state, in units of a computing engine (docs/simulator.md "Demand by state"): for each
    interval in which the reference engine computed (its midpoint, cores, and the machine's busy cores
    over it), every other engine's interval nearest it (midpoints within ``half_s``) as (its state,
    its cores / the reference's), and ``("background", the machine's busy cores beyond every engine's
    / the reference's)`` where every engine had one. ``others``: per engine (midpoints, cores, state
    per interval; a state that is not a string is not rated but counts in the background). On a host short of
    cores Linux's fair scheduler gives each runnable thread the same share, so what an engine gets
    against a computing one beside it is what it demands against one computing thread."""
    out: list[tuple[str, float]] = []
    for mid, cpu, busy in zip(ref_mid, ref_cpu, ref_busy):
        if not cpu > 0:
            continue
        seen, total = 0, cpu
        for m, c, states in others:
            if len(m) == 0:
                continue
            i = int(np.argmin(np.abs(m - mid)))
            if abs(m[i] - mid) > half_s:
                continue
            seen += 1
            total += c[i]
            if isinstance(states[i], str):  # None (or pandas' NaN for it): not in a state rated
                out.append((states[i], float(c[i] / cpu)))
        if seen == len(others):
            out.append(("background", float(max(busy - total, 0.0) / cpu)))
    return out
