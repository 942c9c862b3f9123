"""GPU backend of the compute slow-down: locked SM clocks through pynvml.

pynvml is imported only when used: a CPU-only install need not have it. The
measured factor is the maximum SM clock over the current one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from .throttle import ComputeFaultError, register, sanitize_key, unregister


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
        self.key = sanitize_key(key)
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
                register(self)
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
                    unregister(self)
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
            unregister(self)
        return []

