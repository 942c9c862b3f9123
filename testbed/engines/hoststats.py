"""How much CPU an engine got, and how long it waited for one: the host's share in a request's time.

On the 2-core testbed a KV pull hanging on a throttled link keeps the engine on each end spinning
(measured: its ``VLLM::Worker`` main thread busy-waits on vLLM's shared-memory queue, near a full
core for as long as the pull lasts; docs/reliability.md "The prefill stall, explained"), and the other engines
on the same host then wait for a CPU: a healthy pod's prefill stalls for seconds. That is the host,
not the network; on a cluster with cores of its own per engine it would not happen. To let the
report tell the two apart, every engine samples, on its own node:

* its processes' CPU time and run-queue wait, summed over every thread (``/proc/<pid>/task/*/
  schedstat``: the scheduler's own account, "time spent on the cpu" and "time spent waiting on a
  runqueue", Documentation/scheduler/sched-stats.rst);
* the node's CPU pressure (``/proc/pressure/cpu`` "some" total: time in which at least one runnable
  task waited for a CPU, Documentation/accounting/psi.rst), busy and stolen CPU time (``/proc/stat``).

All counters are cumulative seconds; analysis/run/host_stall.py turns them into per-request shares.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

_TICK = os.sysconf("SC_CLK_TCK")


class HostSample(NamedTuple):
    wall_s: float  # time.time() when read
    cpu_s: float  # the engine's processes: on a CPU
    wait_s: float  # the engine's processes: runnable, waiting for a CPU
    pressure_s: float  # the node: some task runnable and waiting (PSI cpu some); NaN without PSI
    busy_s: float  # the node: CPU time in user, nice, system, irq and softirq, all CPUs
    steal_s: float  # the node: CPU time taken by the hypervisor
    lost_wakeup_s: float = 0.0  # the engine: idle in a missed wake-up of its queue (shm_wakeups.py)


def thread_times(pids: Iterable[int]) -> dict[tuple[int, int], tuple[int, int]]:
    """(on-CPU, run-queue wait) nanoseconds of each live thread of ``pids``, by (pid, tid)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                r, w, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            out[pid, int(tid)] = (int(r), int(w))
    return out


def task_times(pids: Iterable[int]) -> tuple[float, float]:
    """(on-CPU, run-queue wait) seconds of every thread of ``pids``; a process gone counts zero."""
    times = thread_times(pids).values()
    return sum(r for r, _ in times) / 1e9, sum(w for _, w in times) / 1e9


def node_times() -> tuple[float, float, float]:
    """(CPU pressure, busy, steal) seconds of this node since boot."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        pressure = int(some.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):  # a kernel without PSI
        pressure = float("nan")
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = f[0] + f[1] + f[2] + f[5] + f[6]
    return pressure, busy / _TICK, (f[7] if len(f) > 7 else 0) / _TICK


class HostSampler:
    """Samples ``pids()`` (refreshed every ``refresh`` samples: an engine's processes are fixed once
    it runs) every ``period_s`` on a daemon thread, keeping the last ``keep`` samples. Its CPU and
    wait only grow: a thread or process that exits (an engine core killed, a worker's helper
    thread) keeps what it had used, as a cgroup's cpu.stat does; summing the live ones alone
    dropped by seconds when pod 2's engine core was killed in the engine-death e2e."""

    def __init__(self, pids: Callable[[], list[int]], period_s: float = 0.5, keep: int = 40_000,
                 refresh: int = 20, lost_wakeup_s: Callable[[], float] | None = None) -> None:
        """``lost_wakeup_s``: the engine's cumulative seconds lost to missed wake-ups (shm_wakeups.py)."""
        if period_s <= 0:
            raise ValueError(f"period_s={period_s} must be > 0")
        self._pids_fn = pids
        self._lost_fn = lost_wakeup_s
        self.period_s = period_s
        self._refresh = refresh
        self._samples: collections.deque[HostSample] = collections.deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="testbed-hoststats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pids: list[int] = []
        last: dict[tuple[int, int], tuple[int, int]] = {}
        gone_run = gone_wait = 0  # ns of threads no longer seen
        n = 0
        while not self._stop.is_set():
            t = time.monotonic()
            if n % self._refresh == 0:
                pids = self._pids_fn()
            n += 1
            now = thread_times(pids)
            for key, (r, w) in last.items():
                if key not in now:
                    gone_run += r
                    gone_wait += w
            last = now
            run = gone_run + sum(r for r, _ in now.values())
            wait = gone_wait + sum(w for _, w in now.values())
            lost = self._lost_fn() if self._lost_fn is not None else 0.0
            self._samples.append(HostSample(time.time(), run / 1e9, wait / 1e9, *node_times(), lost))
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - t)))

    def samples(self, since_wall: float = 0.0) -> list[HostSample]:
        return [s for s in list(self._samples) if s.wall_s >= since_wall]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
