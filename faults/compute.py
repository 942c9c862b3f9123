"""Compute slow-down of the fault injector: a worker made slower by a factor.

Two backends behind one small :class:`ComputeThrottle` protocol:

* :class:`CpuQuotaThrottle` (no GPU): CFS bandwidth control on the worker's
  processes. They are moved into ``<cpu controller root>/testbed-faults/<key>``
  whose quota is ``baseline_cores / factor`` cores; cgroup v2 (``cpu.max``) when
  ``/sys/fs/cgroup``-style cgroup2 has the cpu controller, else cgroup v1
  (``cpu.cfs_quota_us``). On v1 the ``cpuacct`` controller may live in its own
  hierarchy (it does on this project's machines), then a twin cgroup there holds
  the same processes so the CPU they obtain can be read.
* :class:`GpuClockThrottle`: locked SM clocks through pynvml.

The factor a caller gets back is *measured*, never the one asked for: the CPU
backend saturates the cgroup with busy-loop probe processes for a few CFS
periods and divides the CPU it could have used by the CPU it obtained; the GPU
backend divides the maximum SM clock by the current one.

A fault must never outlive the process that set it: active throttles are kept
in a registry that an ``atexit`` hook clears, and :func:`clear_project_cgroups`
removes whatever a crashed process left (it finds the original cgroups of the
processes in a small state file per throttle).
"""

from __future__ import annotations

import atexit
import errno
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

PARENT = "testbed-faults"  # every cgroup of the project lives under <controller root>/PARENT
_KEY_RE = re.compile(r"[^A-Za-z0-9_.-]")
_MIN_QUOTA_US = 1000  # the kernel refuses a CFS quota below 1 ms
_RMDIR_TRIES = 50  # rmdir can report EBUSY for a moment after the last task left


class ComputeFaultError(RuntimeError):
    """A compute fault that cannot be carried out; the message is one line."""


@runtime_checkable
class ComputeThrottle(Protocol):
    """One slowed-down worker. ``apply`` is an idempotent "make it so"."""

    key: str

    def apply(self, pids: Sequence[int], factor: float) -> float:
        """Slow ``pids`` down by ``factor`` (>= 1); returns the measured factor."""
        ...

    def clear(self) -> float:
        """Undo everything (idempotent); returns the factor measured afterwards (about 1)."""
        ...

    @property
    def active(self) -> bool: ...


# --------------------------------------------------------------------------- processes


def _proc_stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parens)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.rpartition(")")[2].split()


def _ppid(pid: int) -> int | None:
    fields = _proc_stat_fields(pid)
    return int(fields[1]) if fields else None


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, recursively (from the ppid in /proc/*/stat), not ``pid`` itself."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        ppid = _ppid(int(entry.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return sorted(out)


# --------------------------------------------------------------------------- cgroup layout


@dataclass(frozen=True)
class _Hierarchy:
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
class _Layout:
    version: int  # 1 or 2
    cpu: _Hierarchy  # where the quota is set
    acct: _Hierarchy  # where the usage counter is read (== cpu on v2 and for a combined cpu,cpuacct mount)

    @property
    def hierarchies(self) -> tuple[_Hierarchy, ...]:
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


_layout_cache: _Layout | None = None


def _layout() -> _Layout:
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
            v2.append(_Hierarchy(mnt, root, ""))
        else:
            reasons.append(f"cgroup2 at {mnt} has no cpu controller ({' '.join(ctrls) or 'none'})")
    if v2:
        # prefer the conventional unified mount point when there are several
        v2.sort(key=lambda h: h.mount != Path("/sys/fs/cgroup"))
        _layout_cache = _Layout(2, v2[0], v2[0])
        return _layout_cache
    cpu = acct = None
    for mnt, root, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        if "cpu" in opts and cpu is None:
            cpu = _Hierarchy(mnt, root, "cpu")
        if "cpuacct" in opts and acct is None:
            acct = _Hierarchy(mnt, root, "cpuacct")
    if cpu is None:
        reasons.append("no cgroup v1 mount with the cpu controller")
    elif acct is None:
        reasons.append("cgroup v1 has cpu but no cpuacct controller to measure with")
    if cpu is None or acct is None:
        raise ComputeFaultError("no usable cgroup cpu controller: " + "; ".join(reasons))
    if acct.mount == cpu.mount:
        acct = cpu  # combined cpu,cpuacct hierarchy: one cgroup does both
    _layout_cache = _Layout(1, cpu, acct)
    return _layout_cache


def _write(path: Path, value: str) -> None:
    # one write() per value: cgroupfs parses each write on its own, and errors (ESRCH,
    # EINVAL) come back from that write, not from a later flush we might miss
    with open(path, "w", buffering=1) as f:
        f.write(value)


def _procs(cg: Path) -> list[int]:
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _state_dir() -> Path:
    # /run is wiped on reboot, exactly like cgroups; not /run/testbed, whose *.json are cluster runs
    if os.geteuid() == 0 and Path("/run").is_dir():
        return Path("/run/testbed-faults")
    return Path(tempfile.gettempdir()) / f"testbed-faults-{os.geteuid()}"


def _state_path(key: str) -> Path:
    return _state_dir() / f"{key}.json"


def _load_state(key: str) -> dict[str, Any]:
    try:
        return json.loads(_state_path(key).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _evacuate(cg: Path, mount: Path, origin_of: Callable[[int], Path]) -> None:
    """Move every process in ``cg`` to where it came from (its origin, else the hierarchy root).

    Repeats until the cgroup is empty: a process may fork while we move its siblings.
    """
    for _ in range(100):
        pids = _procs(cg)
        if not pids:
            return
        for pid in pids:
            for target in (origin_of(pid), mount):
                try:
                    _write(target / "cgroup.procs", str(pid))
                    break
                except ProcessLookupError:
                    break  # exited meanwhile
                except OSError as exc:
                    if exc.errno == errno.ESRCH:
                        break
                    continue  # origin gone or refused: fall back to the hierarchy root
    raise ComputeFaultError(f"cannot empty cgroup {cg}: processes keep appearing in it")


def _rmdir(path: Path) -> bool:
    """rmdir with a short retry for EBUSY; False when it does not exist."""
    for _ in range(_RMDIR_TRIES):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or _procs(path):
                raise ComputeFaultError(f"cannot remove cgroup {path}: {exc.strerror}") from None
            time.sleep(0.02)
    raise ComputeFaultError(f"cannot remove cgroup {path}: still busy")


def _rmdir_parent(h: _Hierarchy) -> None:
    # only when empty: another throttle (maybe of another process) may still use it
    try:
        (h.mount / PARENT).rmdir()
    except OSError:
        pass


def _origin_lookup(origins: dict[int, dict[str, str]], h: _Hierarchy) -> Callable[[int], Path]:
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
            p = _ppid(p)
        return default

    return origin_of


# --------------------------------------------------------------------------- registry

_registry: dict[str, CpuQuotaThrottle | GpuClockThrottle] = {}
_registry_lock = threading.Lock()


def _register(t: CpuQuotaThrottle | GpuClockThrottle) -> None:
    with _registry_lock:
        _registry[f"{type(t).__name__}:{t.key}"] = t


def _unregister(t: CpuQuotaThrottle | GpuClockThrottle) -> None:
    with _registry_lock:
        _registry.pop(f"{type(t).__name__}:{t.key}", None)


# A forked child inherits the registry but not the faults: its exit must not undo its parent's.
os.register_at_fork(after_in_child=_registry.clear)


@atexit.register
def _clear_all_at_exit() -> None:
    # teardown without the measuring probe: at interpreter exit, spawning processes is
    # the last thing to rely on, and nobody is left to read the figure
    with _registry_lock:
        live = list(_registry.values())
    for t in live:
        try:
            t._teardown()
        except Exception as exc:  # keep clearing the others
            print(f"faults.compute: clearing {t.key} at exit failed: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------- CPU backend

# The probe: burn CPU until killed, the parent dies, or a hard deadline (never orphaned for long).
_BUSY = (
    "import os,sys,time\n"
    "p=os.getppid();e=time.monotonic()+float(sys.argv[1])\n"
    "while os.getppid()==p and time.monotonic()<e:\n"
    " for _ in range(10000): pass\n"
)


class CpuQuotaThrottle:
    """CFS bandwidth control on a worker's processes (the CPU stand-in for a slower GPU).

    ``apply(pids, factor)`` moves the processes (all their threads; children they
    fork later follow them) into ``<cpu root>/testbed-faults/<key>`` with a quota
    of ``baseline_cores / factor`` cores. ``baseline_cores`` defaults to the
    number of CPUs the first pid may run on. Calling ``apply`` again changes the
    factor and adds pids; processes leave the cgroup only on ``clear``.

    The returned factor is measured: ``ceil(baseline_cores)`` busy-loop probes
    join the cgroup for ``probe_s`` (rounded to whole CFS periods, so the
    quota's on/off pattern averages out exactly) and the factor is
    ``baseline_cores * wall / cpu obtained by the cgroup``; the probes run on
    the CPUs the first pid may use. Contention from the rest of the machine
    shows up in it, as it should. With no limit and a baseline below what the
    processes and probes can use on those CPUs (a non-integer or explicit
    smaller baseline) it reads below 1: the cgroup got more than the baseline.
    """

    def __init__(
        self, key: str, baseline_cores: float | None = None, period_us: int = 100_000, probe_s: float = 0.3
    ) -> None:
        clean = _KEY_RE.sub("_", key)
        if not clean or clean in (".", ".."):
            raise ComputeFaultError(f"invalid throttle key {key!r}")
        if baseline_cores is not None and not (baseline_cores > 0 and math.isfinite(baseline_cores)):
            raise ComputeFaultError(f"baseline_cores must be > 0, got {baseline_cores}")
        if not 1000 <= period_us <= 1_000_000:
            raise ComputeFaultError(f"period_us must be in [1000, 1000000], got {period_us}")
        self.key = clean
        self.baseline_cores = baseline_cores  # fixed by the first apply when None
        self._baseline_arg = baseline_cores
        self.period_us = int(period_us)
        self.probe_s = float(probe_s)
        self.factor: float | None = None  # the factor asked for while active
        self._active = False
        self._origins: dict[int, dict[str, str]] = {}  # pid -> {hierarchy mount: original cgroup dir}
        self._cpus: set[int] = set()  # the CPUs the first pid may use: the probes run on these
        self._cleared_factor: float | None = None  # measured by the last clear that undid something
        self._lock = threading.RLock()

    # -- public

    @property
    def active(self) -> bool:
        return self._active

    def cgroup_dirs(self) -> list[Path]:
        """The cgroup directories this throttle uses (whether or not they exist now)."""
        return [h.mount / PARENT / self.key for h in _layout().hierarchies]

    def apply(self, pids: Sequence[int], factor: float) -> float:
        factor = float(factor)
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ComputeFaultError(f"factor must be >= 1 (1 = no limit), got {factor}")
        pids = [int(p) for p in pids]
        layout = _layout()
        with self._lock:
            if self._active and not (layout.cpu.mount / PARENT / self.key).is_dir():
                self._teardown()  # removed under us (clear_project_cgroups elsewhere): start afresh
            if not pids and not self._active:
                raise ComputeFaultError("no pids to throttle")
            # read every pid's current cgroups first: a missing pid fails here, before anything changes
            new: dict[int, dict[str, str]] = {}
            ours = {str(d) for d in self.cgroup_dirs()}
            for pid in pids:
                if pid in self._origins:
                    continue
                origin = {}
                for h in layout.hierarchies:
                    d = h.dir_of(pid)
                    if str(d) in ours:
                        break  # already in this throttle (e.g. a child that followed its parent)
                    if PARENT in d.relative_to(h.mount).parts:
                        raise ComputeFaultError(f"pid {pid} is already throttled by cgroup {d}")
                    origin[str(h.mount)] = str(d)
                else:
                    new[pid] = origin
            first = pids[0] if pids else next(iter(self._origins), os.getpid())
            try:
                cpus = self._cpus or os.sched_getaffinity(first)
            except OSError:
                raise ComputeFaultError(f"pid {first} does not exist") from None
            baseline = self.baseline_cores if self.baseline_cores is not None else float(len(cpus))
            quota_us = None if factor == 1.0 else round(self.period_us * baseline / factor)
            if quota_us is not None and quota_us < _MIN_QUOTA_US:
                raise ComputeFaultError(
                    f"factor {factor} leaves a quota of {quota_us} us per {self.period_us} us period (< 1 ms)"
                )

            created = not self._active
            if created:
                self._create(layout)  # raises when the key's cgroup exists: then nothing of ours to undo
            previous = self.factor
            moved: list[int] = []
            try:
                self.baseline_cores, self._cpus = baseline, cpus
                self._set_quota(layout, quota_us)
                for pid, origin in new.items():
                    self._origins[pid] = origin
                    self._save_state()  # before the move: a crash right after it still leaves the origin
                    moved.append(pid)
                    for h in layout.hierarchies:
                        try:
                            _write(h.mount / PARENT / self.key / "cgroup.procs", str(pid))
                        except OSError as exc:
                            if exc.errno == errno.ESRCH:
                                raise ComputeFaultError(f"pid {pid} does not exist") from None
                            raise ComputeFaultError(f"cannot move pid {pid} into a cgroup: {exc.strerror}") from None
                measured = self._probe(layout)
            except BaseException:
                if created:
                    # nothing may be left behind: move whoever got in back, remove the cgroups
                    try:
                        self._teardown()
                    except ComputeFaultError:
                        pass
                else:
                    # an active throttle keeps its previous factor and processes
                    self._restore(layout, moved)
                    try:
                        self._set_quota(layout, self._quota_for(previous))
                    except (OSError, ComputeFaultError):
                        pass
                raise
            self.factor = factor
            self._active = True
            self._cleared_factor = None
            _register(self)
            return measured

    def _quota_for(self, factor: float | None) -> int | None:
        if factor is None or factor == 1.0 or self.baseline_cores is None:
            return None
        return round(self.period_us * self.baseline_cores / factor)

    def _restore(self, layout: _Layout, pids: list[int]) -> None:
        """Move ``pids`` back to their recorded cgroups and forget them (rollback of a failed apply)."""
        for pid in pids:
            origin = self._origins.pop(pid, {})
            for h in layout.hierarchies:
                try:
                    _write(Path(origin.get(str(h.mount), h.mount)) / "cgroup.procs", str(pid))
                except OSError:
                    pass  # exited, or its origin is gone: clear() will still evacuate the cgroup
        if self._active:
            self._save_state()

    def clear(self) -> float:
        layout = _layout()
        with self._lock:
            if self._active:
                try:
                    self._set_quota(layout, None)
                except FileNotFoundError:
                    # removed under us (clear_project_cgroups from elsewhere): nothing left to undo
                    self._forget()
                except ComputeFaultError:
                    self._teardown()  # leaving the cgroup lifts the quota all the same
                else:
                    try:
                        # Measured after lifting the quota but before the processes leave: it
                        # checks that this cgroup no longer caps what they get, which is the
                        # undo being verified; before lifting it would just re-measure the fault.
                        self._cleared_factor = self._probe(layout)
                        return self._cleared_factor
                    finally:
                        self._teardown()
            if self._cleared_factor is not None:
                # already cleared and nothing applied since: the figure measured then still holds
                # (a new probe without the workload in the cgroup would measure something else)
                return self._cleared_factor
            # never applied: still report a measured figure, from an unlimited scratch cgroup
            self._create(layout)
            try:
                self._set_quota(layout, None)
                return self._probe(layout)
            finally:
                self._teardown()

    # -- internals

    def _create(self, layout: _Layout) -> None:
        """mkdir the key's cgroup on every hierarchy; on failure remove only what this call made."""
        made: list[Path] = []
        try:
            for h in layout.hierarchies:
                parent = h.mount / PARENT
                for attempt in range(3):
                    try:
                        parent.mkdir(exist_ok=True)
                        if layout.version == 2:
                            # v2: the cpu controller must be enabled on the way down to our cgroup.
                            # Left enabled on the root afterwards: others may rely on it by then.
                            for d in (h.mount, parent):
                                if "cpu" not in (d / "cgroup.subtree_control").read_text().split():
                                    _write(d / "cgroup.subtree_control", "+cpu")
                        (parent / self.key).mkdir()
                        made.append(parent / self.key)
                        break
                    except FileNotFoundError:
                        # the shared parent was removed between our mkdirs by another throttle's clear
                        if attempt == 2:
                            raise ComputeFaultError(f"cannot create cgroup under {parent}: it keeps vanishing") from None
        except FileExistsError as exc:
            self._undo_create(layout, made)
            raise ComputeFaultError(
                f"cgroup {exc.filename} already exists (key in use, or left by a crash: run clear_project_cgroups)"
            ) from None
        except OSError as exc:
            self._undo_create(layout, made)
            hint = ""
            if layout.version == 2 and exc.errno == errno.EBUSY:
                # cgroup v2 "no internal processes": e.g. a container whose cgroup root holds its processes
                hint = " (cgroup v2 cannot enable cpu below a cgroup that holds processes)"
            raise ComputeFaultError(
                f"cannot create cgroup for {self.key}: {exc.filename}: {exc.strerror}{hint}"
            ) from None
        except BaseException:
            self._undo_create(layout, made)
            raise
        self._origins = {}

    @staticmethod
    def _undo_create(layout: _Layout, made: list[Path]) -> None:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass
        for h in layout.hierarchies:
            _rmdir_parent(h)

    def _set_quota(self, layout: _Layout, quota_us: int | None) -> None:
        d = layout.cpu.mount / PARENT / self.key
        try:
            if layout.version == 2:
                _write(d / "cpu.max", f"{'max' if quota_us is None else quota_us} {self.period_us}")
            else:
                # lift the quota first: a new period can be refused while an old quota is inconsistent
                _write(d / "cpu.cfs_quota_us", "-1")
                _write(d / "cpu.cfs_period_us", str(self.period_us))
                if quota_us is not None:
                    _write(d / "cpu.cfs_quota_us", str(quota_us))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ComputeFaultError(f"cannot set the CPU quota of {d}: {exc.strerror}") from None

    def _usage_ns(self, layout: _Layout) -> int:
        d = layout.acct.mount / PARENT / self.key
        if layout.version == 2:
            for line in (d / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) * 1000
            raise ComputeFaultError(f"{d}/cpu.stat has no usage_usec")
        return int((d / "cpuacct.usage").read_text())

    def _probe(self, layout: _Layout) -> float:
        """Saturate the cgroup with busy loops and measure the slow-down it imposes."""
        cpus = self._cpus or os.sched_getaffinity(0)
        baseline = self.baseline_cores or float(len(cpus))
        period_s = self.period_us / 1e6
        window = max(1, round(self.probe_s / period_s)) * period_s  # whole periods
        warmup = period_s  # let the probes get past interpreter start-up
        n = math.ceil(baseline)
        probes: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(n):
                p = subprocess.Popen(
                    [sys.executable, "-S", "-I", "-c", _BUSY, str(warmup + window + 10)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                probes.append(p)
                # on the workload's CPUs: what the cgroup can get is measured where the workload runs,
                # so an unlimited cgroup reads ~1 rather than "more cores than the workload may use"
                os.sched_setaffinity(p.pid, cpus)
                for h in layout.hierarchies:
                    _write(h.mount / PARENT / self.key / "cgroup.procs", str(p.pid))
            time.sleep(warmup)
            u0, t0 = self._usage_ns(layout), time.monotonic()
            time.sleep(window)
            u1, t1 = self._usage_ns(layout), time.monotonic()
        except OSError as exc:
            raise ComputeFaultError(f"CPU probe failed: {exc.strerror or exc}") from None
        finally:
            for p in probes:
                p.kill()
            for p in probes:
                p.wait()
        cpu_s = (u1 - u0) / 1e9
        if cpu_s <= 0:
            raise ComputeFaultError(f"CPU probe obtained no CPU time in {t1 - t0:.3f} s")
        return baseline * (t1 - t0) / cpu_s

    def _save_state(self) -> None:
        d = _state_dir()
        text = json.dumps({"key": self.key, "owner": os.getpid(), "origins": self._origins})
        for attempt in range(3):
            try:
                d.mkdir(parents=True, exist_ok=True)
                tmp = d / f".{self.key}.{os.getpid()}.tmp"
                tmp.write_text(text)
                tmp.replace(_state_path(self.key))  # atomic: a reader never sees half a file
                return
            except FileNotFoundError:
                if attempt == 2:  # another process keeps removing the (empty) state dir
                    raise ComputeFaultError(f"cannot write the state file in {d}") from None

    def _forget(self) -> None:
        self._active = False
        self.factor = None
        self.baseline_cores = self._baseline_arg  # a default baseline is re-read at the next apply
        self._cpus = set()
        self._origins = {}
        _state_path(self.key).unlink(missing_ok=True)
        _rmdir_state_dir()
        _unregister(self)

    def _teardown(self) -> list[str]:
        """Move every process back, remove the cgroups; no measuring. Returns the removed dirs."""
        with self._lock:
            layout = _layout()
            removed = _remove_key_cgroups(layout, self.key, self._origins)
            self._forget()
            for h in layout.hierarchies:
                _rmdir_parent(h)
            return removed


def _remove_key_cgroups(layout: _Layout, key: str, origins: dict[int, dict[str, str]]) -> list[str]:
    removed = []
    for h in layout.hierarchies:
        cg = h.mount / PARENT / key
        if not cg.exists():
            continue
        _evacuate(cg, h.mount, _origin_lookup(origins, h))
        if _rmdir(cg):
            removed.append(str(cg))
    return removed


def clear_project_cgroups(only_empty: bool = False) -> list[str]:
    """Remove every cgroup this module created on this machine (after moving its processes back).

    Processes return to the cgroups recorded when they were throttled (state files
    survive a crashed owner), children forked later to their parent's. Idempotent;
    returns the cgroup directories removed. ``only_empty``: just those no process is
    in any more (what a run that ended left; another run's live throttles stay).
    """
    try:
        layout = _layout()
    except ComputeFaultError:
        return []  # no cpu controller: nothing can have been created
    removed: list[str] = []
    with _registry_lock:
        local = [] if only_empty else [t for t in _registry.values() if isinstance(t, CpuQuotaThrottle)]
    errors: list[ComputeFaultError] = []
    for t in local:
        try:
            removed += t._teardown()
        except ComputeFaultError as exc:
            errors.append(exc)  # keep going: one stuck cgroup must not shield the others
    keys = set()
    for h in layout.hierarchies:
        parent = h.mount / PARENT
        if parent.is_dir():
            keys |= {d.name for d in parent.iterdir() if d.is_dir()}
    for key in sorted(keys):
        if only_empty and any(_procs(h.mount / PARENT / key) for h in layout.hierarchies
                              if (h.mount / PARENT / key).is_dir()):
            continue
        state = _load_state(key)
        origins = {int(pid): o for pid, o in state.get("origins", {}).items()}
        try:
            removed += _remove_key_cgroups(layout, key, origins)
        except ComputeFaultError as exc:
            errors.append(exc)
    for h in layout.hierarchies:
        _rmdir_parent(h)
    # state files whose cgroups are gone (their owners are gone too, or they'd be in a cgroup)
    sd = _state_dir()
    if sd.is_dir():
        for f in sd.glob("*.json"):
            if not any((h.mount / PARENT / f.stem).exists() for h in layout.hierarchies):
                f.unlink(missing_ok=True)
        _rmdir_state_dir()
    if errors:
        raise ComputeFaultError(f"{len(errors)} cgroup(s) could not be removed, first: {errors[0]}")
    return removed


def _rmdir_state_dir() -> None:
    try:
        _state_dir().rmdir()  # only when empty
    except OSError:
        pass


# --------------------------------------------------------------------------- GPU backend


def gpu_available() -> str | None:
    """None when NVML can drive a GPU here, else the reason it cannot."""
    try:
        import pynvml
    except ImportError as exc:
        return f"pynvml not importable ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses, or a missing libnvidia-ml
        return f"NVML init failed: {exc}"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML sees no GPU"
    except Exception as exc:
        return f"NVML device count failed: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return None


class GpuClockThrottle:
    """Locked SM clocks on one GPU: ``max SM clock / factor``.

    The whole device is slowed, whoever runs on it: ``pids`` is accepted for the
    common interface and ignored. The measured factor is the maximum SM clock over
    the current one after a short settle. An idle GPU may park its clock below the
    lock, so on an idle device the figure can read above the asked factor (and
    ``clear`` above 1); under load it is the locked clock that counts.
    Locking clocks needs root (or the admin having allowed it) and a Volta or
    newer GPU; otherwise :class:`ComputeFaultError` says what NVML answered.
    """

    SETTLE_S = 0.5

    def __init__(self, key: str, device_index: int) -> None:
        self.key = _KEY_RE.sub("_", key)
        self.device_index = int(device_index)
        self.factor: float | None = None
        self._active = False
        self._lock = threading.RLock()

    @property
    def active(self) -> bool:
        return self._active

    def _nvml(self) -> Any:
        reason = gpu_available()
        if reason is not None:
            raise ComputeFaultError(f"GPU throttle unavailable: {reason}")
        import pynvml

        pynvml.nvmlInit()  # reference-counted by NVML; each call here is paired with a shutdown
        return pynvml

    def _measure(self, nvml: Any, handle: Any, max_mhz: int) -> float:
        time.sleep(self.SETTLE_S)
        cur = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        if cur <= 0:
            raise ComputeFaultError(f"GPU {self.device_index} reports an SM clock of {cur} MHz")
        return max_mhz / cur

    def apply(self, pids: Sequence[int], factor: float) -> float:
        """Lock the device's SM clock to max/factor; ``pids`` is ignored (the whole GPU slows)."""
        factor = float(factor)
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ComputeFaultError(f"factor must be >= 1 (1 = no limit), got {factor}")
        with self._lock:
            nvml = self._nvml()
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
                max_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
                target = max(1, int(max_mhz / factor))
                if factor == 1.0:
                    nvml.nvmlDeviceResetGpuLockedClocks(handle)
                else:
                    nvml.nvmlDeviceSetGpuLockedClocks(handle, target, target)
                self._active, self.factor = True, factor
                _register(self)
                return self._measure(nvml, handle, max_mhz)
            except nvml.NVMLError as exc:
                raise ComputeFaultError(f"GPU {self.device_index}: locking SM clocks at {factor}x failed: {exc}") from None
            finally:
                nvml.nvmlShutdown()

    def clear(self) -> float:
        """Reset the locked clocks (idempotent); returns max / current SM clock afterwards."""
        with self._lock:
            nvml = self._nvml()
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
                if self._active:
                    nvml.nvmlDeviceResetGpuLockedClocks(handle)
                    self._active, self.factor = False, None
                    _unregister(self)
                max_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
                return self._measure(nvml, handle, max_mhz)
            except nvml.NVMLError as exc:
                raise ComputeFaultError(f"GPU {self.device_index}: resetting SM clocks failed: {exc}") from None
            finally:
                nvml.nvmlShutdown()

    def _teardown(self) -> list[str]:
        if self._active:
            nvml = self._nvml()
            try:
                nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(self.device_index))
            finally:
                nvml.nvmlShutdown()
            self._active, self.factor = False, None
            _unregister(self)
        return []


def make_throttle(key: str) -> ComputeThrottle:
    """The slow-down this machine supports: GPU clocks where a GPU is usable, else CPU quota.

    A GPU throttle acts on device 0 of the calling process (its CUDA_VISIBLE_DEVICES
    view): on a GPU node the engine actor and the agent see the pod's GPU."""
    if gpu_available() is None:
        return GpuClockThrottle(key, 0)
    return CpuQuotaThrottle(key)
