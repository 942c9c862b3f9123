"""The compute slow-down for the engines' device: :func:`make_throttle` picks the backend.

The backends (``cpu``, ``gpu``) import :mod:`testbed.faults.compute_common` for what they share (the
protocol, the error, the exit registry); the choice between them lives here, above both, so that
no module imports one that imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from testbed.faults.cpu import CpuQuotaThrottle
from testbed.faults.gpu import GpuClockThrottle
from testbed.machine.gpu import gpu_available
from testbed.faults.compute_common import BACKENDS, Backend, ComputeFaultError, ComputeThrottle

__all__ = ["make_throttle"]


def make_throttle(key: str, backend: Backend, cores: float | None = None,
                  gpu_uuids: Sequence[str] = ()) -> ComputeThrottle:
    """The slow-down for engines running on ``backend``: ``"cpu"`` quota (of ``cores / factor``;
    ``cores`` None: every core the processes may use) or ``"gpu"`` clocks of ``gpu_uuids``.

    ``backend`` is the testbed's engine device: a CPU testbed on a host that has a
    GPU must still slow its CPU engines (and leave the GPU alone), so the host is
    never probed to choose. ``"gpu"`` without a usable NVML is a
    :class:`ComputeFaultError`; an unknown backend a :class:`ValueError`.

    ``gpu_uuids`` are the NVML UUIDs of the engines' GPUs, resolved in the engines'
    processes (``Engine.gpu_uuid``). NVML indices ignore CUDA_VISIBLE_DEVICES, so
    without UUIDs a GPU fault is refused rather than aimed at physical GPU 0."""
    if backend == "cpu":
        return CpuQuotaThrottle(key, baseline_cores=cores)
    if backend == "gpu":
        if not gpu_uuids:
            raise ComputeFaultError(f"GPU throttle {key}: no GPU UUID given (the engines' gpu_uuid() must come "
                                    "with a GPU compute fault): refused, nothing changed")
        reason = gpu_available()
        if reason is not None:
            raise ComputeFaultError(f"GPU throttle {key} unavailable: {' '.join(reason.split())}")
        return GpuClockThrottle(key, list(gpu_uuids))
    raise ValueError(f"unknown compute throttle backend {backend!r}: known are {', '.join(BACKENDS)}")
