"""Which GPU is which: NVML's UUID of a GPU, the one CUDA shows this process, and whether NVML can
drive a GPU here.

GPUs are addressed by UUID, never by index: NVML numbers devices physically and ignores
CUDA_VISIBLE_DEVICES, so "device 0" in a fault agent is whichever GPU the host lists first, not
the engine's. The engine resolves the UUID of its own GPU in its own process, where Ray set
CUDA_VISIBLE_DEVICES (:func:`visible_gpu_uuid`). pynvml and torch are imported only when used.
"""

from __future__ import annotations

import os
import re

_HEX32 = re.compile(r"[0-9a-f]{32}")


class GpuLookupError(ValueError):
    """A GPU that cannot be named: not a UUID, or no CUDA device visible (one line)."""


def nvml_uuid(raw: object) -> str:
    """``raw`` spelled as NVML spells a GPU's UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``.

    ``raw`` is torch's ``get_device_properties(i).uuid`` (a ``_CUuuid``: its ``bytes``
    are the 16 bytes of CUDA's ``cudaDeviceProp.uuid``, the same bytes NVML prints
    in lower-case hex behind ``GPU-``), 16 raw bytes, or a string with or without the
    prefix. Anything else, a MIG instance's ``MIG-...`` included (a MIG slice cannot
    lock clocks of its own), is a :class:`GpuLookupError`."""
    data = raw if isinstance(raw, (bytes, bytearray)) else getattr(raw, "bytes", None)
    if data is not None:
        try:
            hexed = bytes(data).hex()
        except (TypeError, ValueError):
            hexed = ""
    else:
        hexed = str(raw).strip().lower()
        hexed = (hexed[4:] if hexed.startswith("gpu-") else hexed).replace("-", "")
    if not _HEX32.fullmatch(hexed):
        raise GpuLookupError(f"not a GPU UUID: {raw!r} (NVML's form is GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return f"GPU-{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def visible_gpu_uuid(device: int = 0) -> str:
    """NVML UUID of CUDA device ``device`` as *this* process sees it (after CUDA_VISIBLE_DEVICES).

    Call it in the engine's process: CUDA itself names the device, so neither the
    host's numbering nor CUDA_DEVICE_ORDER can make it point at another GPU. It
    initialises CUDA in the calling process."""
    import torch

    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        raise GpuLookupError(f"no CUDA device {device} visible to process {os.getpid()} "
                                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return nvml_uuid(torch.cuda.get_device_properties(device).uuid)


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
