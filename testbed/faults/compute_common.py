"""Compute slow-down of the fault injector: a worker made slower by a factor.

Two backends behind one small :class:`ComputeThrottle` protocol, chosen by the
device the testbed's engines run on (:func:`testbed.faults.compute.make_throttle`),
never by what the host happens to have:

* ``"cpu"``: :class:`testbed.faults.cpu.CpuQuotaThrottle`, CFS
  bandwidth control on the worker's processes (cgroups, see ``cgroups``).
* ``"gpu"``: :class:`testbed.faults.gpu.GpuClockThrottle`, locked SM
  clocks through pynvml on the GPUs named by UUID (never by index).

The factor a caller gets back is *measured*, never the one asked for.

A fault must never outlive the process that set it: active throttles are kept
in a registry (here) that an ``atexit`` hook clears.

This module is what both backends share (the protocol, the error, the key rule, the
registry) and imports neither; the choice between them is :mod:`testbed.faults.compute`.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Literal, Protocol, get_args, runtime_checkable

log = logging.getLogger(__name__)

Backend = Literal["cpu", "gpu"]
BACKENDS: tuple[str, ...] = get_args(Backend)

_KEY_RE = re.compile(r"[^A-Za-z0-9_.-]")


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


class _Registered(Protocol):
    """What the exit registry needs of a throttle: its key and an undo that measures nothing."""

    key: str

    def _teardown(self) -> list[str]: ...


def sanitize_key(key: str) -> str:
    """``key`` with every character outside ``[A-Za-z0-9_.-]`` replaced by ``_`` (a safe file name)."""
    return _KEY_RE.sub("_", key)


# --------------------------------------------------------------------------- registry

_registry: dict[str, _Registered] = {}
_registry_lock = threading.Lock()


def register(t: _Registered) -> None:
    """Record an active throttle, so that interpreter exit undoes it."""
    with _registry_lock:
        _registry[f"{type(t).__name__}:{t.key}"] = t


def unregister(t: _Registered) -> None:
    with _registry_lock:
        _registry.pop(f"{type(t).__name__}:{t.key}", None)


def registered() -> list[_Registered]:
    """The throttles active in this process now (a snapshot)."""
    with _registry_lock:
        return list(_registry.values())


# A forked child inherits the registry but not the faults: its exit must not undo its parent's.
os.register_at_fork(after_in_child=_registry.clear)


@atexit.register
def _clear_all_at_exit() -> None:
    # teardown without the measuring probe: at interpreter exit, spawning processes is
    # the last thing to rely on, and nobody is left to read the figure
    for t in registered():
        try:
            t._teardown()
        except Exception as exc:  # keep clearing the others
            log.error("clearing %s at exit failed: %s", t.key, exc)
