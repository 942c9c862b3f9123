"""Fault agents as Ray actors: one per node, acting in that node's network namespace.

:class:`FaultAgentActor` is a thin adapter around :class:`testbed.faults.agent.FaultAgent`.
It is *detached*, so it outlives a driver that dies: its own timer thread then
removes every fault when its time to live runs out. SIGINT and SIGTERM to its
process clear every fault before the process exits, and so does normal exit.

:class:`FaultAgents` is the driver's handle on all of them (pods and head).
:func:`clear_host_faults` is ``testbed faults clear``: everything the project
set on this machine, in the root namespace and in every testbed namespace.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import signal
import tempfile
import threading
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import ray

from core.util.logs import configure_from_env
from testbed.faults.probe_paths import HEAD, NodeAgent, ProbePath, choose_peer

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from testbed.faults.compute_common import Backend

AGENT_NAMESPACE = "testbed-faults"  # Ray namespace of the named, detached agents
TTL_TICK_S = 0.2


@ray.remote(num_cpus=0, max_concurrency=4)
class FaultAgentActor:
    def __init__(self, node: str, allowlist: Sequence[str]) -> None:
        from ray.util import get_node_ip_address

        configure_from_env()  # the driver's level (core/util/logs.py)

        from testbed.faults.agent import FaultAgent

        self.agent = FaultAgent(node, allowlist)
        self.ip = get_node_ip_address()
        self._stop = threading.Event()
        threading.Thread(target=self._ttl_loop, name="fault-ttl", daemon=True).start()
        atexit.register(self._clear_quietly)
        self.signals = self._install_signal_handlers()

    def _ttl_loop(self) -> None:
        while not self._stop.wait(TTL_TICK_S):
            try:
                self.agent.expire()
            except Exception as e:  # keep the timer alive; the next tick retries
                log.warning("fault agent %s: expiring faults failed: %s", self.agent.node, e)

    def _clear_quietly(self) -> None:
        try:
            self.agent.clear_all()
        except Exception as e:
            log.warning("fault agent %s: clearing faults at exit failed: %s", self.agent.node, e)

    def _install_signal_handlers(self) -> list[str]:
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            prev = signal.getsignal(sig)

            def handler(signum: int, frame: Any, prev: Any = prev) -> None:
                self._clear_quietly()
                if callable(prev):
                    prev(signum, frame)
                else:
                    os._exit(128 + signum)

            try:
                signal.signal(sig, handler)
                installed.append(signal.Signals(sig).name)
            except ValueError:  # not the main thread of this worker: atexit and the TTL still hold
                pass
        return installed

    def info(self) -> dict[str, Any]:
        import socket

        from testbed.machine.interfaces import interface_addresses

        names = [name for _, name in socket.if_nameindex()]
        return {"node": self.agent.node, "ip": self.ip, "pid": os.getpid(), "euid": os.geteuid(),
                "signals": self.signals, "node_id": ray.get_runtime_context().get_node_id(), "interfaces": names,
                # every IPv4 address of the node but loopback's: where other agents may probe it
                "addresses": [a for n in names if n != "lo" for a in interface_addresses(n)]}

    def apply_link(self, key: str, ifname: str, sides: list[str], rate_bps: float, ttl_s: float,
                   kv_only: bool = False, delay_ms: float = 0.0, loss: float = 0.0) -> dict[str, Any]:
        return self.agent.apply_link(key, ifname, sides, rate_bps, ttl_s, kv_only, delay_ms, loss)  # type: ignore[arg-type]

    def apply_link_dcb(self, key: str, ifname: str, sides: list[str], rate_bps: float, ttl_s: float,
                       traffic_class: int) -> dict[str, Any]:
        return self.agent.apply_link_dcb(key, ifname, sides, rate_bps, ttl_s, traffic_class)  # type: ignore[arg-type]

    def apply_compute(self, key: str, pids: list[int], factor: float, ttl_s: float, backend: Backend = "cpu",
                      cores: float | None = None, gpu_uuids: Sequence[str] = ()) -> float:
        return self.agent.apply_compute(key, pids, factor, ttl_s, backend, cores, gpu_uuids)

    def measure_uplink(self, ifname: str, peer: str, port: int, offered_bps: float, window_s: float = 0.4) -> float:
        return self.agent.measure_uplink(ifname, peer, port, offered_bps, window_s)

    def tx_bytes(self, ifname: str) -> int:
        return self.agent.tx_bytes(ifname)

    def measure_downlink(self, ifname: str, window_s: float = 0.4) -> float:
        return self.agent.measure_downlink(ifname, window_s)

    def fill(self, peer: str, port: int, offered_bps: float, duration_s: float) -> int:
        return self.agent.fill(peer, port, offered_bps, duration_s)

    def sink_port(self) -> int:
        return self.agent.sink_port()

    def probe_address(self, ifname: str) -> str:
        return self.agent.probe_address(ifname)

    def route_via(self, ifname: str, candidates: list[str]) -> str | None:
        return self.agent.route_via(ifname, candidates)

    def kill_engine(self, pid: int) -> float:
        return self.agent.kill_engine(pid)

    def clear(self, key: str) -> Any:
        return self.agent.clear(key)

    def clear_all(self) -> list[str]:
        return self.agent.clear_all()

    def active(self) -> dict[str, dict[str, Any]]:
        return self.agent.active()

    def shutdown(self) -> list[str]:
        """Clear everything and stop the timer; the caller then kills the actor."""
        self._stop.set()
        self.agent.close_sink()
        return self.agent.clear_all()


class FaultAgents:
    """One agent per pod node plus one on the head (a probe peer that shapes nothing)."""

    def __init__(self, pods: int, allowlist: Sequence[str], head_resource: str) -> None:
        def make(node: str, resources: dict[str, float]) -> Any:
            return FaultAgentActor.options(name=f"fault-agent-{node}", namespace=AGENT_NAMESPACE, lifetime="detached",
                                           get_if_exists=True, resources=resources).remote(node, list(allowlist))

        self.pods = [make(f"pod{i}", {f"pod{i}": 0.01}) for i in range(pods)]
        self.head = make("head", {head_resource: 0.001})
        infos = ray.get([a.info.remote() for a in self.all])
        # Per pod, the interface its faults shape: the first allowlisted one its node has.
        from testbed.machine.interfaces import pick_interface

        self.pod_ifnames = [pick_interface(allowlist, i["interfaces"], f"pod{k}'s node ({i['ip']})")
                            for k, i in enumerate(infos[:pods])]
        self._nodes = [NodeAgent(i["node"], i["node_id"], tuple(i["addresses"])) for i in infos]
        self.pod_euids = [int(i["euid"]) for i in infos[:pods]]  # what may change GPU clocks (root)

    @property
    def all(self) -> list[Any]:
        return self.pods + [self.head]

    def probe_paths(self, faulted: Collection[int]) -> dict[int, ProbePath]:
        """The probe of each pod in ``faulted`` (every pod a link fault of the command's runs
        shapes): testbed/faults/probe_paths.py. Raises ProbePathError (one line) for a pod no
        other node can measure."""
        paths: dict[int, ProbePath] = {}
        for pod in sorted(set(faulted)):
            agent, ifname = self.pods[pod], self.pod_ifnames[pod]
            taken = Counter(p.peer for p in paths.values())
            peer, peer_ip = choose_peer(pod, ifname, self._nodes[:-1], self._nodes[-1], faulted,
                                        lambda addrs: ray.get(agent.route_via.remote(ifname, list(addrs))), taken)
            paths[pod] = ProbePath(ray.get(agent.probe_address.remote(ifname)), ray.get(agent.sink_port.remote()),
                                   peer, peer_ip, ray.get(self.agent_of(peer).sink_port.remote()))
        return paths

    def agent_of(self, peer: int) -> Any:
        """A peer index's agent (probe_paths.HEAD: the head's)."""
        return self.head if peer == HEAD else self.pods[peer]

    def _in_phases(self, method: str, timeout_s: float) -> list[list[str]]:
        """``method`` on the pods' agents at once, then on the head's: a pod on the head's node shares
        its namespace, where the head agent's sweep of leftovers would race the pod agent's own clear."""
        out = ray.get([getattr(a, method).remote() for a in self.pods], timeout=timeout_s)
        return out + [ray.get(getattr(self.head, method).remote(), timeout=timeout_s)]

    def clear_all(self, timeout_s: float = 60) -> list[str]:
        return [k for ks in self._in_phases("clear_all", timeout_s) for k in ks]

    def shutdown(self) -> None:
        """Clear every fault, then remove the (detached) actors."""
        try:
            self._in_phases("shutdown", 60)
        finally:
            for a in self.all:
                ray.kill(a)


def clear_lock_path() -> Path:
    """The host-wide lock file of :func:`clear_host_faults` (/run/testbed as root, else the temp dir)."""
    from testbed.machine.netns import DEFAULT_STATE_DIR

    if os.geteuid() == 0 and DEFAULT_STATE_DIR.parent.is_dir():
        return DEFAULT_STATE_DIR / "clear-faults.lock"
    return Path(tempfile.gettempdir()) / f"testbed-clear-faults-{os.geteuid()}.lock"


@contextmanager
def _host_lock() -> Iterator[None]:
    """One clear at a time on this machine: the nodes of an emulated cluster are namespaces of one
    host, and each one's clear sweeps every namespace. flock is released when the holder exits."""
    path = clear_lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (unlinking it would race a waiter)


def clear_host_faults() -> list[str]:
    """Remove every fault the project set on this machine; idempotent. Returns what was removed.

    The root namespace and every testbed namespace lose the project's qdiscs and
    ifb devices (recognised by the project's handle and names, never anyone
    else's); the project's cgroups are removed, their processes moved back; GPUs whose clocks the
    project locked (marker files, written before each lock) get their clocks reset, and traffic
    classes whose NIC rate the project limited (dcb maxrate: marker files too) their rate back. Runs under a
    host-wide lock (:func:`clear_lock_path`), so concurrent calls (one per emulated node) never race.
    "Root namespace" is the namespace of the calling thread: a Ray task on an emulated node sweeps
    its node's namespace there, and every testbed namespace after it."""
    from testbed.faults import shaping
    from testbed.faults.cpu import clear_project_cgroups
    from testbed.faults.dcb import restore_leftovers
    from testbed.faults.gpu import reset_project_gpu_locks

    from testbed.machine import netns as nn

    with _host_lock():
        removed = [f"host:{r}" for r in shaping.settled(shaping.clear_all)]
        for ns in nn.list_namespaces():
            try:
                with nn.in_netns(ns):
                    removed += [f"{ns}:{r}" for r in shaping.settled(shaping.clear_all)]
            except nn.NetnsError:  # removed meanwhile
                pass
        removed += [f"cgroup:{c}" for c in clear_project_cgroups()]
        removed += [f"gpu:{u}" for u in reset_project_gpu_locks()]
        removed += [f"dcb:{r}" for r in restore_leftovers()]
    return removed
