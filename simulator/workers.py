"""The simulated engines' state: a prefill worker's queue and running batch, a decode worker's
fluid batch and reservations. :class:`simulator.cluster.ClusterSim` moves them; the engine deaths
(simulator/engine_deaths.py) and the shared host (simulator/host.py) read and reset them."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.ticket import Ticket

    from .events import Call

__all__ = ["DecodeWorker", "PrefillWorker"]


class PrefillWorker:
    __slots__ = ("queue", "busy", "pod", "batch", "dead")

    def __init__(self, pod: int) -> None:
        self.queue: deque[Ticket] = deque()
        self.busy = False
        self.pod = pod
        self.batch: list[Ticket] = []  # the running batch
        self.dead = False


class DecodeWorker:
    """Fluid continuous batching: V counts tokens produced per running sequence."""

    __slots__ = ("pod", "heap", "n", "kv_in_batch", "step_s", "V", "t", "timer", "reserved_kv", "reserved_slots",
                 "waiting", "dead")

    def __init__(self, pod: int) -> None:
        self.pod = pod
        self.heap: list[tuple[float, int, Ticket]] = []
        self.n = 0  # running sequences
        self.kv_in_batch = 0  # their prompt tokens (the KV each step reads)
        self.step_s = 0.0  # their step time (ClusterSim.step_s), kept current with n, kv_in_batch, speed
        self.V = 0.0
        self.t = 0.0
        self.timer: Call | None = None  # the pending step-end event; older ones are stale
        self.reserved_kv = 0  # admitted requests (in transfer or decoding)
        self.reserved_slots = 0
        self.waiting: deque[Ticket] = deque()
        self.dead = False
