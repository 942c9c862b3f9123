"""The per-node fault agent, as a plain object: shaping, compute slow-down, TTLs.

One agent per node (the Ray actor in ``testbed.faults.agent_actor`` is a thin
adapter around it). It acts only on its own node: the link shaping in the
calling thread's network namespace (the node's), the compute slow-down on
processes of the node. Safety lives here, not in the caller:

* only interfaces on the allowlist are touched; anything else raises
  :class:`FaultRefused` before anything changes;
* every fault carries a time to live, ``expire(now)`` removes what is due,
  and the actor calls it on its own timer, so a fault expires even when the
  driver that set it died;
* ``clear_all`` undoes everything the agent set (the actor calls it on
  SIGINT/SIGTERM and at exit).

A link fault on RDMA, which tc cannot shape, takes :meth:`FaultAgent.apply_link_dcb`: the NIC's
own rate limit of the KV's traffic class (testbed/faults/dcb.py), with the same keys, TTLs and
``clear_all``.

Faults are keyed (``"f0/pod1/link"``); applying a key again is "make it so".
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence

from testbed.faults import dcb, load, readings, shaping
from testbed.faults.shaping import Shaping, ShapingError
from testbed.machine.interfaces import interface_addresses
from vocab import FAULT_COMPUTE

if TYPE_CHECKING:
    from testbed.faults.compute_common import Backend

Side = Literal["uplink", "downlink"]
_DIRECTION: dict[str, shaping.Direction] = {"uplink": "egress", "downlink": "ingress"}
# The title Ray gives an engine actor's worker process (testbed/engines/actor.py EngineActor).
ENGINE_TITLE = "ray::EngineActor"


class FaultRefused(ShapingError):
    """A request the agent's safety rules do not allow (nothing was changed)."""


@dataclass
class _Active:
    key: str
    kind: str
    expires_at: float
    undo: Callable[[], Any]
    detail: dict[str, Any] = field(default_factory=dict)


class FaultAgent:
    """Applies, measures and clears faults on one node."""

    def __init__(self, node: str, allowlist: Iterable[str], clock: Callable[[], float] = time.monotonic,
                 dcb_limit: Callable[[], dcb.DcbRateLimit] = dcb.DcbRateLimit) -> None:
        self.node = node
        self.dcb_limit = dcb_limit  # makes the RDMA path's limits (a fake NIC's in the tests)
        self.allowlist = frozenset(allowlist)
        if not self.allowlist:
            raise ValueError("fault agent: the interface allowlist is empty")
        self.clock = clock
        self._active: dict[str, _Active] = {}
        self._lock = threading.RLock()  # the TTL timer and calls may run in different threads
        self._sink: load.Sink | None = None  # other agents' probe load lands here (sink_port)

    # --- safety -----------------------------------------------------------
    def check_interface(self, ifname: str) -> None:
        if ifname not in self.allowlist:
            raise FaultRefused(f"interface {ifname!r} is not on the fault allowlist of node {self.node} "
                               f"({', '.join(sorted(self.allowlist))}): refused, nothing changed")

    @staticmethod
    def check_ttl(key: str, ttl_s: float) -> None:
        if not ttl_s > 0:
            raise FaultRefused(f"fault {key}: a time to live > 0 s is required, got {ttl_s}: refused, nothing changed")

    def _register(self, key: str, kind: str, ttl_s: float, undo: Callable[[], Any], **detail: Any) -> None:
        self._active[key] = _Active(key, kind, self.clock() + ttl_s, undo, detail)

    # --- link -------------------------------------------------------------
    def apply_link(self, key: str, ifname: str, sides: Sequence[Side], rate_bps: float, ttl_s: float,
                   kv_only: bool = False, delay_ms: float = 0.0, loss: float = 0.0) -> dict[str, Any]:
        """Shape ``sides`` of ``ifname`` to ``rate_bps``; the key's earlier shaping is replaced."""
        self.check_interface(ifname)
        self.check_ttl(key, ttl_s)
        bad = [s for s in sides if s not in _DIRECTION]
        if bad or not sides:
            raise FaultRefused(f"fault {key}: sides must be uplink and/or downlink, got {list(sides)}")
        if (delay_ms > 0 or loss > 0) and (why := shaping.netem_missing()):
            raise FaultRefused(f"fault {key}: {why}")
        with self._lock:
            if key in self._active:
                self.clear(key)
            done: list[Side] = []

            def undo() -> dict[str, int]:
                # what the heal dropped: a queue removed with packets in it costs their resend
                dropped = [shaping.remove(ifname, _DIRECTION[side]) for side in done]
                return {"dropped_bytes": sum(x or 0 for x in dropped)}

            try:
                for side in sides:
                    shaping.shape(Shaping(ifname, _DIRECTION[side], rate_bps, kv_only, delay_ms, loss))
                    done.append(side)
            except BaseException:
                undo()
                raise
            self._register(key, "link", ttl_s, undo, ifname=ifname, sides=list(sides), rate_bps=rate_bps)
        return {"key": key, "ifname": ifname, "sides": list(sides), "rate_bps": rate_bps, "ttl_s": ttl_s}

    def apply_link_dcb(self, key: str, ifname: str, sides: Sequence[Side], rate_bps: float, ttl_s: float,
                       traffic_class: int) -> dict[str, Any]:
        """A link fault where the KV moves over RDMA: limit ``ifname``'s egress of the KV's traffic class
        to ``rate_bps`` with the NIC's own rate limit (``dcb maxrate``, testbed/faults/dcb.py); the
        key's earlier fault is replaced. Uplink only: the limit acts on egress. Returns the fault, with
        ``configured_bps``: the rate the NIC reads back for the class (quantised by it), the
        configured rate, not a measured one. Never run on an RDMA NIC."""
        self.check_interface(ifname)
        self.check_ttl(key, ttl_s)
        why = next((w for s in sides if (w := dcb.side_refusal(s))), None) if sides else "no side given"
        if why:
            raise FaultRefused(f"fault {key}: {why}: refused, nothing changed")
        with self._lock:
            prev = self._active.get(key)
            same = (prev is not None and prev.detail.get("method") == "dcb_maxrate"
                    and (prev.detail["ifname"], prev.detail["traffic_class"]) == (ifname, traffic_class))
            limit = prev.detail["throttle"] if same else self.dcb_limit()
            if prev is not None and not same:
                self.clear(key)  # tc shaping, or another interface or class, under this key: undo it first
            configured = limit.apply(ifname, traffic_class, rate_bps)

            def undo() -> dict[str, Any]:
                # nothing is queued in the host to drop; what the class reads after the restore
                return {"dropped_bytes": 0, "restored_bps": limit.clear()}

            self._register(key, "link", ttl_s, undo, method="dcb_maxrate", ifname=ifname, sides=["uplink"],
                           rate_bps=rate_bps, traffic_class=traffic_class, configured_bps=configured, throttle=limit)
        return {"key": key, "ifname": ifname, "sides": ["uplink"], "rate_bps": rate_bps, "ttl_s": ttl_s,
                "method": "dcb_maxrate", "traffic_class": traffic_class, "configured_bps": configured}

    def measure_uplink(self, ifname: str, peer: str, port: int, offered_bps: float, window_s: float = 0.4) -> float:
        """Rate (bit/s) out of ``ifname`` while paced TCP streams offer ``offered_bps`` to the sink at
        ``peer:port`` (testbed/faults/load.py; ``peer``: an address the route to leaves through
        ``ifname``, :meth:`route_via`).

        The sink's port is in the KV range, so the load is shaped like KV traffic also with
        ``kv_only``. The rate is read from counters: the limited class's where the project shapes
        the interface (with ``kv_only`` the interface also carries unshaped traffic), else the
        interface's. Concurrent KV traffic counts too: the shaper limits the sum."""
        self.check_interface(ifname)
        return self._rate_while(shaping.counter(ifname), lambda: load.fill(peer, port, offered_bps, window_s + 0.2),
                                window_s)

    def tx_bytes(self, ifname: str) -> int:
        """Bytes ``ifname`` has transmitted (read-only; allowlisted interfaces only): the
        start-up check that the KV crosses the interface the faults shape reads it."""
        self.check_interface(ifname)
        return shaping.tx_bytes(ifname)

    def measure_downlink(self, ifname: str, window_s: float = 0.4) -> float:
        """Rate (bit/s) into the node through ``ifname`` over ``window_s``: call it while a peer
        offers traffic to this agent's sink (:meth:`sink_port`, the peer's :meth:`fill`). Read after
        the ingress shaper (its ifb) when there is one, else from the interface's receive counter;
        0 when nothing arrives."""
        self.check_interface(ifname)
        ifb = shaping.ifb_name(ifname)
        if shaping.has_link(ifb):
            return self._rate_while(shaping.counter(ifb), None, window_s)
        return self._rate_while(shaping.counter(ifname, received=True), None, window_s)

    @staticmethod
    def _rate_while(counter: AbstractContextManager[Callable[[], tuple[int, int | None]]],
                    offer: Callable[[], Any] | None, window_s: float, settle_s: float = 0.1,
                    every_s: float = 0.005) -> float:
        """Bit/s through a shaper's counter (:func:`shaping.counter`) over ``window_s``, read by
        :func:`readings.busy_rate`: step to step, late reads at the ends left out, and only while
        its queue held bytes, so a load starved of the CPU reads as what the link carries while it
        was full, not as the gaps between. The window opens once the load has reached the queue (at
        most ``window_s`` later: a peer's load is started by another process), then ``settle_s``.

        Each read is timed at the middle of its call. A read that came late lumps what moved while
        the sampler waited for the interpreter (the load's threads and another probe's sampler
        share it); at the window's ends that was counted without its time or its time without it:
        one thread busy in the agent's process read r = 0.01 of 10 Gbit/s as 0.43-1.37 of itself
        (docs/history/2026-11-30-probe-reads.md)."""
        t = threading.Thread(target=offer, daemon=True) if offer else None
        with counter as read, load.collector_paused():  # no collection stalls the reads (or the load beside them)
            if t:
                t.start()
            arrive_by = time.monotonic() + window_s
            while (queued := read()[1]) is not None and queued == 0 and time.monotonic() < arrive_by:
                time.sleep(every_s)
            time.sleep(settle_s)  # let the shaper's queue fill: the window then sees its drain rate
            samples: list[tuple[float, int, int | None]] = []
            t_start = time.monotonic()
            while (before := time.monotonic()) - t_start < window_s:
                n, queued = read()
                samples.append(((before + time.monotonic()) / 2, n, queued))
                time.sleep(every_s)
            if t:
                t.join()
        return readings.busy_rate(samples)[0]

    def fill(self, peer: str, port: int, offered_bps: float, duration_s: float) -> int:
        """Offer ``offered_bps`` to the sink at ``peer:port`` for ``duration_s`` (for that peer
        agent's ``measure_downlink``); returns the bytes offered."""
        return load.fill(peer, port, offered_bps, duration_s)

    def sink_port(self) -> int:
        """The port of this agent's sink for other agents' probe load (started on first use)."""
        with self._lock:
            if self._sink is None:
                self._sink = load.Sink()
            return self._sink.port

    def close_sink(self) -> None:
        """Stop the sink (the actor's shutdown)."""
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    def probe_address(self, ifname: str) -> str:
        """The address other nodes probe this node's ``ifname`` at: its first IPv4 address. None
        there: refused (a link fault on it could not be measured)."""
        self.check_interface(ifname)
        found = interface_addresses(ifname)
        if not found:
            raise FaultRefused(f"interface {ifname} of node {self.node} has no IPv4 address: a link fault on it "
                               "could not be measured (the probe reaches a node at an address of the shaped interface)")
        return found[0]

    def route_via(self, ifname: str, candidates: Sequence[str]) -> str | None:
        """The first of ``candidates`` that this node reaches through ``ifname`` (the kernel's route
        to it, its output interface), or None: the peer a link measurement on ``ifname`` may use.
        An address of this node itself is reached over loopback, never through ``ifname``."""
        self.check_interface(ifname)
        return shaping.route_via(ifname, candidates)

    # --- compute ----------------------------------------------------------
    def apply_compute(self, key: str, pids: Sequence[int], factor: float, ttl_s: float,
                      backend: Backend = "cpu", cores: float | None = None,
                      gpu_uuids: Sequence[str] = ()) -> float:
        """Slow the processes ``pids`` (and their threads and later children) by ``factor``;
        returns the measured factor. ``backend`` is the device the engines run on
        (``"cpu"``: a CPU quota on ``pids`` of ``cores / factor``, ``cores`` being what they
        compute on, every core of the host if None; ``"gpu"``: the clocks of the GPUs
        ``gpu_uuids``, the NVML UUIDs the engines resolved in their own processes: a GPU
        fault without them is refused, never aimed at an index)."""
        from testbed.faults.compute import make_throttle

        self.check_ttl(key, ttl_s)
        gpus = list(gpu_uuids) if backend == "gpu" else []
        with self._lock:
            prev = self._active.get(key)
            same = (prev is not None and prev.kind == FAULT_COMPUTE and prev.detail["backend"] == backend
                    and prev.detail["gpu_uuids"] == gpus)
            # The cgroup is named for node, process and key: agents of several pods share one host here.
            throttle = (prev.detail["throttle"] if same
                        else make_throttle(f"{self.node}-{os.getpid()}-{key}", backend, cores, gpus))
            if prev and not same:
                self.clear(key)  # another kind of fault, backend or GPU set under this key: undo it first
            measured = throttle.apply(list(pids), factor)
            self._register(key, "compute", ttl_s, throttle.clear, throttle=throttle, factor=factor,
                           backend=backend, gpu_uuids=gpus)
        return measured

    # --- engines that die ---------------------------------------------------
    def kill_engine(self, pid: int) -> float:
        """SIGKILL one engine process of this node, as a crash or the OOM killer would (an engine
        fault, faults.spec.EngineFault): an engine actor's own process (its title ``ray::EngineActor``,
        which Ray sets as the actor starts) or a process it spawned (vLLM's engine core). Any other
        process is refused, nothing signalled. Nothing to undo and no TTL: a dead engine stays dead
        unless its fault restarts it (the injector asks the engine's actor, not the agent); the driver
        starts a new set before the next run. Returns when it was sent (the agent's clock)."""
        from testbed.machine.procs import cmdline, ppid

        if not (cmdline(pid).startswith(ENGINE_TITLE) or cmdline(ppid(pid)).startswith(ENGINE_TITLE)):
            raise FaultRefused(f"pid {pid} is not an engine's process (neither {ENGINE_TITLE} nor its child): "
                               f"{cmdline(pid)[:80] or 'gone'!r}")
        os.kill(pid, signal.SIGKILL)
        return self.clock()

    # --- lifecycle --------------------------------------------------------
    def clear(self, key: str) -> Any:
        """Undo one fault; returns what its undo returns (compute: the measured factor; link: the
        bytes its queues still held when removed, ``{"dropped_bytes": n}``). Idempotent.
        A fault whose undo fails stays registered, so the TTL timer tries it again."""
        with self._lock:
            a = self._active.get(key)
            if a is None:
                return None
            result = a.undo()
            del self._active[key]
            return result

    def expire(self, now: float | None = None) -> list[str]:
        """Clear every fault whose time to live has run out; returns their keys."""
        now = self.clock() if now is None else now
        with self._lock:
            due = [k for k, a in self._active.items() if a.expires_at <= now]
            errors = []
            for k in due:
                try:
                    self.clear(k)
                except Exception as e:  # the others still expire; this one is retried next time
                    errors.append(f"{k}: {e}")
        if errors:
            raise ShapingError("expiring faults failed for " + "; ".join(errors))
        return due

    def clear_all(self) -> list[str]:
        """Undo everything this agent set, then anything the project left in this namespace
        on the allowlisted interfaces (an earlier agent that was killed): its qdiscs, and the dcb
        limits whose markers name a process that is gone."""
        with self._lock:
            keys = list(self._active)
            errors = []
            for k in keys:
                try:
                    self.clear(k)
                except Exception as e:  # keep clearing the others
                    errors.append(f"{k}: {e}")
            leftovers = shaping.settled(lambda: shaping.clear_all(self.allowlist))  # a neighbour agent may clear too
            try:
                leftovers += [f"dcb:{r}" for r in dcb.restore_leftovers(self.allowlist, only_dead=True)]
            except dcb.DcbError as e:
                errors.append(str(e))
        if errors:
            raise ShapingError("clearing faults failed for " + "; ".join(errors))
        return keys + leftovers

    def active(self) -> dict[str, dict[str, Any]]:
        now = self.clock()
        with self._lock:
            return {k: {"kind": a.kind, "ttl_left_s": a.expires_at - now,
                        **{d: v for d, v in a.detail.items() if d != "throttle"}} for k, a in self._active.items()}
