"""An emulated cluster's processes as /proc shows them: the run's marker, each process's
start time (a PID recorded in a state file is checked against it, never trusted alone),
liveness, memory, and the processes a sweep must never signal.

The emulated cluster (testbed/hosts/emulated.py) finds its run's processes with these;
``testbed leftovers`` (testbed/hosts/leftovers.py) finds every run's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from testbed.faults.procs import ppid, stat_fields

RUN_MARKER_ENV = "TESTBED_CLUSTER_RUN"  # set in every node's environment: finds the run's processes


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks since boot), or None if gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return fields[0], int(fields[3]), int(fields[19])


def alive(pid: int, start_ticks: int) -> bool:
    """The process ``pid`` exists, is not a zombie, and is the one started at ``start_ticks``."""
    st = proc_stat(pid)
    return st is not None and st[0] != "Z" and st[2] == start_ticks


def pss_bytes(pids: Sequence[int]) -> int:
    """The processes' proportional set size, summed (one that is gone counts nothing)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def protected_pids() -> set[int]:
    """This process and its ancestors: never signalled by a sweep."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        pid = ppid(pid) or 0  # unreadable or gone: the chain ends here
    return pids


def self_start_ticks() -> int:
    """This process's start time in clock ticks since boot (0 if unreadable)."""
    st = proc_stat(os.getpid())
    return st[2] if st else 0
