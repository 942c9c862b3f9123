"""cgroup v1/v2 discovery, the low-level cgroupfs helpers, and the crash-state files.

The project's cgroups live under ``<controller root>/testbed-faults/<key>``. The
cpu controller is found from the mounts: cgroup v2 (``cpu.max``) when a cgroup2
mount has the cpu controller, else cgroup v1 (``cpu.cfs_quota_us``). On v1 the
``cpuacct`` controller may live in its own hierarchy (it does on this project's
machines), then a twin cgroup there holds the same processes so the CPU they
obtain can be read.

A crashed owner leaves its cgroups behind: a small state file per key records
the cgroups its processes came from, so that a later cleanup can move them back.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.util.files import write_json_atomic
from testbed.machine.procs import ppid
from testbed.faults.compute_common import ComputeFaultError

PARENT = "testbed-faults"  # every cgroup of the project lives under <controller root>/PARENT
_RMDIR_TRIES = 50  # rmdir can report EBUSY for a moment after the last task left

Origins = dict[int, dict[str, str]]  # pid -> {hierarchy mount: original cgroup dir}


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where it is and how /proc/<pid>/cgroup names it."""

    mount: Path  # mount point
    root: str  # the hierarchy path mounted there (not "/" inside some containers)
    controller: str  # v1: the controller matched in /proc/<pid>/cgroup; v2: ""

    def dir_of(self, pid: int) -> Path:
        """The cgroup directory ``pid`` is in on this hierarchy."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            raise ComputeFaultError(f"pid {pid} does not exist") from None
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            if (not self.controller and ctrls == "") or self.controller in ctrls.split(","):
                rel = os.path.relpath(path, self.root)
                if rel.startswith(".."):
                    raise ComputeFaultError(
                        f"pid {pid} is in cgroup {path}, outside the mounted {self.root} at {self.mount}"
                    )
                return Path(os.path.normpath(self.mount / rel))
        raise ComputeFaultError(f"pid {pid} has no {self.controller or 'cgroup2'} entry in /proc/{pid}/cgroup")


@dataclass(frozen=True)
class Layout:
    version: int  # 1 or 2
    cpu: Hierarchy  # where the quota is set
    acct: Hierarchy  # where the usage counter is read (== cpu on v2 and for a combined cpu,cpuacct mount)

    @property
    def hierarchies(self) -> tuple[Hierarchy, ...]:
        return (self.cpu,) if self.acct == self.cpu else (self.cpu, self.acct)


def _mountinfo() -> list[tuple[Path, str, str, list[str]]]:
    """(mount point, mounted root, fs type, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            # mountinfo escapes spaces etc. as octal
            mnt = fields[4].encode().decode("unicode_escape")
            out.append((Path(mnt), fields[3], tail[0], tail[2].split(",")))
    return out


_layout_cache: Layout | None = None


def cpu_layout() -> Layout:
    """Find the cpu controller from the mounts (v2 with cpu enabled first, else v1)."""
    global _layout_cache
    if _layout_cache is not None:
        return _layout_cache
    mounts = _mountinfo()
    reasons = []
    v2 = []
    for mnt, root, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        try:
            ctrls = (mnt / "cgroup.controllers").read_text().split()
        except OSError as exc:
            reasons.append(f"cgroup2 at {mnt} unreadable ({exc.strerror})")
            continue
        if "cpu" in ctrls:
            v2.append(Hierarchy(mnt, root, ""))
        else:
            reasons.append(f"cgroup2 at {mnt} has no cpu controller ({' '.join(ctrls) or 'none'})")
    if v2:
        # prefer the conventional unified mount point when there are several
        v2.sort(key=lambda h: h.mount != Path("/sys/fs/cgroup"))
        _layout_cache = Layout(2, v2[0], v2[0])
        return _layout_cache
    cpu = acct = None
    for mnt, root, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        if "cpu" in opts and cpu is None:
            cpu = Hierarchy(mnt, root, "cpu")
        if "cpuacct" in opts and acct is None:
            acct = Hierarchy(mnt, root, "cpuacct")
    if cpu is None:
        reasons.append("no cgroup v1 mount with the cpu controller")
    elif acct is None:
        reasons.append("cgroup v1 has cpu but no cpuacct controller to measure with")
    if cpu is None or acct is None:
        raise ComputeFaultError("no usable cgroup cpu controller: " + "; ".join(reasons))
    if acct.mount == cpu.mount:
        acct = cpu  # combined cpu,cpuacct hierarchy: one cgroup does both
    _layout_cache = Layout(1, cpu, acct)
    return _layout_cache


# --------------------------------------------------------------------------- cgroupfs


def write(path: Path, value: str) -> None:
    """Write one value to a cgroupfs file."""
    # one write() per value: cgroupfs parses each write on its own, and errors (ESRCH,
    # EINVAL) come back from that write, not from a later flush we might miss
    with open(path, "w", buffering=1) as f:
        f.write(value)


def members(cg: Path) -> list[int]:
    """The pids in cgroup ``cg`` (none when it does not exist)."""
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def evacuate(cg: Path, mount: Path, origin_of: Callable[[int], Path]) -> None:
    """Move every process in ``cg`` to where it came from (its origin, else the hierarchy root).

    Repeats until the cgroup is empty: a process may fork while we move its siblings.
    """
    for _ in range(100):
        pids = members(cg)
        if not pids:
            return
        for pid in pids:
            for target in (origin_of(pid), mount):
                try:
                    write(target / "cgroup.procs", str(pid))
                    break
                except ProcessLookupError:
                    break  # exited meanwhile
                except OSError as exc:
                    if exc.errno == errno.ESRCH:
                        break
                    continue  # origin gone or refused: fall back to the hierarchy root
    raise ComputeFaultError(f"cannot empty cgroup {cg}: processes keep appearing in it")


def rmdir(path: Path) -> bool:
    """rmdir with a short retry for EBUSY; False when it does not exist."""
    for _ in range(_RMDIR_TRIES):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or members(path):
                raise ComputeFaultError(f"cannot remove cgroup {path}: {exc.strerror}") from None
            time.sleep(0.02)
    raise ComputeFaultError(f"cannot remove cgroup {path}: still busy")


def rmdir_parent(h: Hierarchy) -> None:
    """Remove ``<mount>/PARENT`` if it is empty."""
    # only when empty: another throttle (maybe of another process) may still use it
    try:
        (h.mount / PARENT).rmdir()
    except OSError:
        pass


def origin_lookup(origins: Origins, h: Hierarchy) -> Callable[[int], Path]:
    """Where a process of a throttle goes back to on ``h``: its recorded cgroup, else its
    nearest recorded ancestor's (a child forked after apply), else the first recorded pid's."""
    mount = str(h.mount)
    default = next((Path(o[mount]) for o in origins.values() if mount in o), h.mount)

    def origin_of(pid: int) -> Path:
        seen = set()
        p: int | None = pid
        while p and p > 1 and p not in seen:
            seen.add(p)
            if p in origins and mount in origins[p]:
                return Path(origins[p][mount])
            p = ppid(p)
        return default

    return origin_of


def remove_key_cgroups(layout: Layout, key: str, origins: Origins) -> list[str]:
    """Move the processes of ``key``'s cgroups back to their origins and remove the cgroups;
    returns the directories removed."""
    removed = []
    for h in layout.hierarchies:
        cg = h.mount / PARENT / key
        if not cg.exists():
            continue
        evacuate(cg, h.mount, origin_lookup(origins, h))
        if rmdir(cg):
            removed.append(str(cg))
    return removed


# --------------------------------------------------------------------------- crash state


def state_dir() -> Path:
    """Where the per-key state files live."""
    # /run is wiped on reboot, exactly like cgroups; not /run/testbed, whose *.json are cluster runs
    if os.geteuid() == 0 and Path("/run").is_dir():
        return Path("/run/testbed-faults")
    return Path(tempfile.gettempdir()) / f"testbed-faults-{os.geteuid()}"


def state_path(key: str) -> Path:
    return state_dir() / f"{key}.json"


def load_state(key: str) -> dict[str, Any]:
    """What ``save_state`` recorded for ``key``; {} when nothing (readable) was."""
    try:
        return json.loads(state_path(key).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def save_state(key: str, origins: Origins) -> None:
    """Record ``key``'s owner (this process) and its processes' original cgroups."""
    d = state_dir()
    for attempt in range(3):
        try:
            d.mkdir(parents=True, exist_ok=True)
            # a reader never sees half a file
            write_json_atomic(state_path(key), {"key": key, "owner": os.getpid(), "origins": origins})
            return
        except FileNotFoundError:
            if attempt == 2:  # another process keeps removing the (empty) state dir
                raise ComputeFaultError(f"cannot write the state file in {d}") from None


def remove_state(key: str) -> None:
    state_path(key).unlink(missing_ok=True)
    rmdir_state_dir()


def rmdir_state_dir() -> None:
    try:
        state_dir().rmdir()  # only when empty
    except OSError:
        pass
