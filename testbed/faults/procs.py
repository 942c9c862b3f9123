"""/proc helpers: process stat fields, parent pids, the process tree.

Shared by the compute throttle (which processes make up a worker, where a
process forked after a fault goes back to) and the emulated cluster (which
processes belong to a run, which must never be signalled).
"""

from __future__ import annotations

import os
from pathlib import Path


def all_pids() -> list[int]:
    """Every pid with an entry in /proc now (a process may be gone by the time it is read)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


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
        fields = stat_fields(pid)
    except OSError:  # unreadable: for walking the tree, as good as gone
        return None
    return int(fields[1]) if fields else None


def cmdline(pid: int | None) -> str:
    """``pid``'s command line, arguments joined by spaces; "" when it is gone or unreadable."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, recursively (from the ppid in /proc/*/stat), not ``pid`` itself."""
    children: dict[int, list[int]] = {}
    for p in all_pids():
        parent = ppid(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return sorted(out)
