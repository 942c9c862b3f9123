"""GPU backend of the compute slow-down: locked SM clocks through pynvml.

GPUs are addressed by UUID, never by index: NVML numbers devices physically and
ignores CUDA_VISIBLE_DEVICES, so "device 0" in a fault agent is whichever GPU the
host lists first, not the engine's. The engine resolves the UUID of its own GPU
in its own process, where Ray set CUDA_VISIBLE_DEVICES (testbed/machine/gpu.py),
and the driver hands it to the agent with the fault.

Locked clocks outlive the process that set them, so every lock is undone by the
throttle's ``clear`` (the fault's clear, its time to live), by the exit registry
(normal exit; the agent's SIGTERM handler clears first), and, after a SIGKILL, by
``testbed faults clear``, which finds the GPUs through marker files written
before each set call (:func:`reset_project_gpu_locks`). Changing clocks needs
root: checked before any set call, and NVML's own refusal says so too.

pynvml is imported only when used: a CPU-only install need not have it. The
measured factor is the maximum SM clock over the current one.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.faults.cgroups import rmdir_state_dir, state_dir
from testbed.faults.compute_common import ComputeFaultError, register, sanitize_key, unregister
from testbed.machine.gpu import GpuLookupError, nvml_uuid


def require_root(what: str) -> None:
    """Refuse (one line) unless this process may change GPU clocks: NVML's set calls need root."""
    if os.geteuid() != 0:
        raise ComputeFaultError(f"{what}: changing GPU clocks needs root, this process runs as uid {os.geteuid()}; "
                                "run the fault agent as root")


def _squashed(text: str) -> str:
    return " ".join(text.split())


# What an NVML error means here, added to its own words.
_NVML_HINTS = {"NVML_ERROR_NO_PERMISSION": "changing GPU clocks needs root",
               "NVML_ERROR_NOT_FOUND": "no such GPU on this node (the engine's GPU must be on the agent's node)",
               "NVML_ERROR_NOT_SUPPORTED": "this GPU cannot lock its clocks (Volta or newer is needed)"}


def _nvml_failure(nvml: Any, exc: Exception, what: str) -> ComputeFaultError:
    code = getattr(exc, "value", None)
    hint = next((h for name, h in _NVML_HINTS.items() if code is not None and code == getattr(nvml, name, None)), None)
    return ComputeFaultError(_squashed(f"{what}: NVML: {exc}" + (f": {hint}" if hint else "")))


@contextmanager
def _nvml() -> Iterator[Any]:
    """pynvml, initialised for the block (NVML counts inits: each one is paired with a shutdown)."""
    try:
        import pynvml
    except ImportError as exc:
        raise ComputeFaultError(f"GPU throttle unavailable: pynvml not importable ({exc})") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses, or a missing libnvidia-ml
        raise ComputeFaultError(_squashed(f"GPU throttle unavailable: NVML init failed: {exc}")) from None
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


# --------------------------------------------------------------------------- lock markers


def lock_dir() -> Path:
    """One marker file per GPU whose clocks the project may have locked on this machine."""
    return state_dir() / "gpu-locks"


def locked_uuids() -> list[str]:
    """The GPUs the markers name (what ``testbed faults clear`` resets)."""
    d = lock_dir()
    return sorted(f.name for f in d.iterdir() if f.name.startswith("GPU-")) if d.is_dir() else []


def _mark(uuid: str, key: str) -> None:
    for attempt in range(3):
        try:
            lock_dir().mkdir(parents=True, exist_ok=True)
            (lock_dir() / uuid).write_text(f"{key} pid {os.getpid()}\n")
            return
        except FileNotFoundError:  # the CPU throttle removed the (empty) state dir meanwhile
            if attempt == 2:
                raise ComputeFaultError(f"cannot write the GPU lock marker in {lock_dir()}") from None


def _unmark(uuid: str) -> None:
    (lock_dir() / uuid).unlink(missing_ok=True)
    try:
        lock_dir().rmdir()  # only when empty
    except OSError:
        pass
    rmdir_state_dir()


def reset_project_gpu_locks() -> list[str]:
    """``testbed faults clear`` for GPUs: reset every GPU a marker says the project locked on this
    machine (an agent killed by SIGKILL never reset its own). Idempotent; returns the UUIDs reset.
    Without markers NVML is not touched: a CPU host needs no pynvml."""
    uuids = locked_uuids()
    if not uuids:
        return []
    require_root("testbed faults clear")
    done: list[str] = []
    errors: list[ComputeFaultError] = []
    with _nvml() as nvml:
        for uuid in uuids:
            try:
                nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByUUID(uuid))
            except nvml.NVMLError as exc:
                errors.append(_nvml_failure(nvml, exc, f"GPU {uuid}: resetting SM clocks failed"))
                continue
            _unmark(uuid)
            done.append(uuid)
    if errors:
        raise ComputeFaultError(f"{len(errors)} GPU(s) could not be reset, first: {errors[0]}")
    return done


# --------------------------------------------------------------------------- the throttle


class GpuClockThrottle:
    """Locked SM clocks on the GPUs ``uuids`` (one UUID, or a pod's several): ``max SM clock / factor``.

    Whole devices are slowed, whoever runs on them: ``pids`` is accepted for the
    common interface and ignored. The measured factor is the maximum SM clock over
    the current one after a short settle, of the least slowed GPU. An idle GPU may
    park its clock below the lock, so on an idle device the figure can read above
    the asked factor (and ``clear`` above 1); under load it is the locked clock
    that counts. Locking needs root and a Volta or newer GPU; otherwise
    :class:`ComputeFaultError` says why, in one line.
    """

    SETTLE_S = 0.5

    def __init__(self, key: str, uuids: str | Sequence[str]) -> None:
        self.key = sanitize_key(key)
        given = [uuids] if isinstance(uuids, (str, int)) else list(uuids)
        if not given:
            raise ComputeFaultError(f"GPU throttle {self.key}: no GPU UUID given")
        for u in given:
            if not isinstance(u, str):  # an index: NVML's would name a physical GPU, maybe not the engine's
                raise ComputeFaultError(f"GPU throttle {self.key}: GPUs are addressed by UUID (GPU-...), got {u!r}")
        try:
            self.uuids: tuple[str, ...] = tuple(dict.fromkeys(nvml_uuid(u) for u in given))
        except GpuLookupError as exc:
            raise ComputeFaultError(str(exc)) from None
        self.factor: float | None = None
        self._locked: set[str] = set()  # GPUs whose clocks may be locked by this throttle
        self._lock = threading.RLock()

    @property
    def active(self) -> bool:
        return bool(self._locked)

    def _measure(self, nvml: Any, settle_s: float) -> float:
        time.sleep(settle_s)
        factors = []
        for uuid in self.uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            max_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
            cur = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            if cur <= 0:
                raise ComputeFaultError(f"GPU {uuid} reports an SM clock of {cur} MHz")
            factors.append(max_mhz / cur)
        return min(factors)

    def apply(self, pids: Sequence[int], factor: float) -> float:
        """Lock every GPU's SM clock to max/factor (1: reset them); ``pids`` is ignored (whole GPUs slow).
        All or nothing: when any GPU fails, every GPU of this throttle is reset before the error."""
        factor = float(factor)
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ComputeFaultError(f"factor must be >= 1 (1 = no limit), got {factor}")
        if factor == 1.0:
            return self.clear()
        require_root(f"GPU throttle {self.key}")
        with self._lock, _nvml() as nvml:
            what = f"GPU throttle {self.key}"
            try:
                # every GPU found and read before any is changed: an unknown UUID changes nothing
                targets: dict[str, tuple[Any, int]] = {}
                for uuid in self.uuids:
                    what = f"GPU {uuid}: locking SM clocks at {factor}x failed"
                    handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                    max_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
                    targets[uuid] = (handle, max(1, int(max_mhz / factor)))
                register(self)  # before the first set: from here on, interpreter exit resets what got locked
                for uuid, (handle, mhz) in targets.items():
                    what = f"GPU {uuid}: locking SM clocks at {factor}x failed"
                    _mark(uuid, self.key)  # before the set: after a SIGKILL, `testbed faults clear` finds it
                    self._locked.add(uuid)
                    try:
                        nvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
                    except nvml.NVMLError:
                        self._forget(uuid)  # a set that failed changed nothing
                        raise
                self.factor = factor
                what = f"GPU throttle {self.key}: measuring the locked clocks failed"
                return self._measure(nvml, self.SETTLE_S)
            except BaseException as exc:
                try:
                    self._reset(nvml)
                except ComputeFaultError:
                    pass  # what stays locked stays registered: exit and `testbed faults clear` retry
                if isinstance(exc, nvml.NVMLError):
                    raise _nvml_failure(nvml, exc, what) from None
                raise

    def clear(self) -> float:
        """Reset every GPU this throttle locked (idempotent); returns max / current SM clock afterwards
        (NaN when NVML answers the reset but not the measurement: the clocks are reset all the same).
        A GPU whose reset fails stays locked and registered, so the agent's TTL timer tries again."""
        with self._lock:
            if self._locked:
                with _nvml() as nvml:
                    self._reset(nvml)
            try:
                with _nvml() as nvml:
                    try:
                        return self._measure(nvml, self.SETTLE_S)
                    except nvml.NVMLError:
                        return math.nan
            except ComputeFaultError:  # NVML gone, or a 0 MHz reading: nothing to measure with
                return math.nan

    def _forget(self, uuid: str) -> None:
        self._locked.discard(uuid)
        _unmark(uuid)

    def _reset(self, nvml: Any) -> list[str]:
        """Reset the clocks of every GPU this throttle may have locked; returns their UUIDs."""
        if self._locked:
            require_root(f"GPU throttle {self.key}")
        done: list[str] = []
        errors: list[ComputeFaultError] = []
        for uuid in sorted(self._locked):
            try:
                nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByUUID(uuid))
            except nvml.NVMLError as exc:
                errors.append(_nvml_failure(nvml, exc, f"GPU {uuid}: resetting SM clocks failed"))
                continue
            self._forget(uuid)
            done.append(uuid)
        if not self._locked:
            self.factor = None
            unregister(self)
        if errors:
            raise errors[0]
        return done

    def _teardown(self) -> list[str]:
        """Reset without measuring (the exit registry's undo); returns what was reset."""
        with self._lock:
            if not self._locked:
                unregister(self)
                return []
            with _nvml() as nvml:
                return [f"gpu:{u}" for u in self._reset(nvml)]
