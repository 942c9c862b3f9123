"""CPU backend of the compute slow-down: CFS bandwidth control on a worker's processes.

They are moved into ``<cpu controller root>/testbed-faults/<key>`` (see
``cgroups``) whose quota is ``baseline_cores / factor`` cores. The measured
factor comes from saturating the cgroup with busy-loop probe processes for a few
CFS periods: the CPU it could have used over the CPU it obtained.

:func:`clear_project_cgroups` removes whatever a crashed process left (it finds
the original cgroups of the processes in the state file of each throttle).
"""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.faults.cgroups import (
    PARENT,
    Layout,
    Origins,
    cpu_layout,
    load_state,
    members,
    remove_key_cgroups,
    remove_state,
    rmdir_parent,
    rmdir_state_dir,
    save_state,
    state_dir,
    write,
)
from testbed.faults.compute_common import ComputeFaultError, register, registered, sanitize_key, unregister

_MIN_QUOTA_US = 1000  # the kernel refuses a CFS quota below 1 ms

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
        clean = sanitize_key(key)
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
        self._origins: Origins = {}  # pid -> {hierarchy mount: original cgroup dir}
        self._cpus: set[int] = set()  # the CPUs the first pid may use: the probes run on these
        self._cleared_factor: float | None = None  # measured by the last clear that undid something
        self._lock = threading.RLock()

    # -- public

    @property
    def active(self) -> bool:
        return self._active

    def cgroup_dirs(self) -> list[Path]:
        """The cgroup directories this throttle uses (whether or not they exist now)."""
        return [h.mount / PARENT / self.key for h in cpu_layout().hierarchies]

    def apply(self, pids: Sequence[int], factor: float) -> float:
        factor = float(factor)
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ComputeFaultError(f"factor must be >= 1 (1 = no limit), got {factor}")
        pids = [int(p) for p in pids]
        layout = cpu_layout()
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
                    save_state(self.key, self._origins)  # before the move: a crash right after it still leaves the origin
                    moved.append(pid)
                    for h in layout.hierarchies:
                        try:
                            write(h.mount / PARENT / self.key / "cgroup.procs", str(pid))
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
            register(self)
            return measured

    def _quota_for(self, factor: float | None) -> int | None:
        if factor is None or factor == 1.0 or self.baseline_cores is None:
            return None
        return round(self.period_us * self.baseline_cores / factor)

    def _restore(self, layout: Layout, pids: list[int]) -> None:
        """Move ``pids`` back to their recorded cgroups and forget them (rollback of a failed apply)."""
        for pid in pids:
            origin = self._origins.pop(pid, {})
            for h in layout.hierarchies:
                try:
                    write(Path(origin.get(str(h.mount), h.mount)) / "cgroup.procs", str(pid))
                except OSError:
                    pass  # exited, or its origin is gone: clear() will still evacuate the cgroup
        if self._active:
            save_state(self.key, self._origins)

    def clear(self) -> float:
        layout = cpu_layout()
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

    def _create(self, layout: Layout) -> None:
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
                                    write(d / "cgroup.subtree_control", "+cpu")
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
    def _undo_create(layout: Layout, made: list[Path]) -> None:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass
        for h in layout.hierarchies:
            rmdir_parent(h)

    def _set_quota(self, layout: Layout, quota_us: int | None) -> None:
        d = layout.cpu.mount / PARENT / self.key
        try:
            if layout.version == 2:
                write(d / "cpu.max", f"{'max' if quota_us is None else quota_us} {self.period_us}")
            else:
                # lift the quota first: a new period can be refused while an old quota is inconsistent
                write(d / "cpu.cfs_quota_us", "-1")
                write(d / "cpu.cfs_period_us", str(self.period_us))
                if quota_us is not None:
                    write(d / "cpu.cfs_quota_us", str(quota_us))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ComputeFaultError(f"cannot set the CPU quota of {d}: {exc.strerror}") from None

    def _usage_ns(self, layout: Layout) -> int:
        d = layout.acct.mount / PARENT / self.key
        if layout.version == 2:
            for line in (d / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) * 1000
            raise ComputeFaultError(f"{d}/cpu.stat has no usage_usec")
        return int((d / "cpuacct.usage").read_text())

    def _probe(self, layout: Layout) -> float:
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
                    write(h.mount / PARENT / self.key / "cgroup.procs", str(p.pid))
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

    def _forget(self) -> None:
        self._active = False
        self.factor = None
        self.baseline_cores = self._baseline_arg  # a default baseline is re-read at the next apply
        self._cpus = set()
        self._origins = {}
        remove_state(self.key)
        unregister(self)

    def _teardown(self) -> list[str]:
        """Move every process back, remove the cgroups; no measuring. Returns the removed dirs."""
        with self._lock:
            layout = cpu_layout()
            removed = remove_key_cgroups(layout, self.key, self._origins)
            self._forget()
            for h in layout.hierarchies:
                rmdir_parent(h)
            return removed


def clear_project_cgroups(only_empty: bool = False) -> list[str]:
    """Remove every cgroup the CPU throttle created on this machine (after moving its processes back).

    Processes return to the cgroups recorded when they were throttled (state files
    survive a crashed owner), children forked later to their parent's. Idempotent;
    returns the cgroup directories removed. ``only_empty``: just those no process is
    in any more (what a run that ended left; another run's live throttles stay).
    """
    try:
        layout = cpu_layout()
    except ComputeFaultError:
        return []  # no cpu controller: nothing can have been created
    removed: list[str] = []
    local = [] if only_empty else [t for t in registered() if isinstance(t, CpuQuotaThrottle)]
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
        if only_empty and any(members(h.mount / PARENT / key) for h in layout.hierarchies
                              if (h.mount / PARENT / key).is_dir()):
            continue
        state = load_state(key)
        origins = {int(pid): o for pid, o in state.get("origins", {}).items()}
        try:
            removed += remove_key_cgroups(layout, key, origins)
        except ComputeFaultError as exc:
            errors.append(exc)
    for h in layout.hierarchies:
        rmdir_parent(h)
    # state files whose cgroups are gone (their owners are gone too, or they'd be in a cgroup)
    sd = state_dir()
    if sd.is_dir():
        for f in sd.glob("*.json"):
            if not any((h.mount / PARENT / f.stem).exists() for h in layout.hierarchies):
                f.unlink(missing_ok=True)
        rmdir_state_dir()
    if errors:
        raise ComputeFaultError(f"{len(errors)} cgroup(s) could not be removed, first: {errors[0]}")
    return removed

