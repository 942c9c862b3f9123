"""Processes as /proc shows them: stat fields, parent pids, the process tree, each process's
start time (a PID recorded in a state file is checked against it, never trusted alone), liveness,
memory, the run marker of an emulated cluster's processes and the processes a sweep must never
signal.

Shared by the compute throttle (which processes make up a worker, where a process forked after a
fault goes back to), the engines (their own process tree), the emulated cluster (testbed/cluster/
emulated.py: which processes belong to a run) and ``testbed leftovers`` (testbed/cluster/leftovers.py:
every run's).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import psutil

RUN_MARKER_ENV = "TESTBED_CLUSTER_RUN"  # set in every node's environment: finds the run's processes


def all_pids() -> list[int]:
    """Every pid with an entry in /proc now (a process may be gone by the time it is read)."""
    return psutil.pids()


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parens).

    ``[0]`` is the state, ``[1]`` the ppid, ``[3]`` the session id, ``[19]`` the start
    time in clock ticks since boot. None when the process is gone; other errors (e.g.
    a stat file hidden by ``hidepid``) propagate, the caller decides what they mean.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw.rpartition(")")[2].split()


def ppid(pid: int) -> int | None:
    """``pid``'s parent pid; None when it is gone or its /proc entry cannot be read."""
    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, OSError):  # gone, or unreadable: for walking the tree, as good as gone
        return None


def cmdline(pid: int | None) -> str:
    """``pid``'s command line, arguments joined by spaces; "" when it is gone or unreadable."""
    if pid is None:
        return ""
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except (psutil.Error, OSError):
        return ""


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, recursively, not ``pid`` itself; [] when it is gone."""
    try:
        return sorted(p.pid for p in psutil.Process(pid).children(recursive=True))
    except (psutil.Error, OSError):
        return []


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
