"""A multi-node Ray cluster emulated on one machine.

Each pod is a network namespace holding a real Ray worker node (custom
resource ``pod<i>``), the head node lives in a namespace of its own, and the
namespaces are joined by veth links through a bridge (see ``netns``), so Ray
objects and KV transfers between pods cross links that can be shaped.

Without the privileges for namespaces, ``mode="auto"`` falls back to a
single-node *local* mode: one Ray head on 127.0.0.1 that carries every pod's
resource, so code that places work by pod resource runs unchanged (but
nothing crosses a link).

In netns mode the nodes come up the way a real cluster does (``launcher="ray_up"``,
testbed/cluster/rayup.py): an sshd per node, then ``ray up`` on a generated
local-provider cluster file, ``ray down`` before the teardown. ``launcher="direct"``
(and local mode) starts each node as a ``ray start --block`` process in its own
session. Nodes are stopped by process group and by namespace, never with
``ray stop`` (which kills every Ray process on the host, other runs' included). PIDs go into a JSON state file
(``<state_dir>/<run_id>.json``) as they start, so ``down`` works for a
crashed run too (``EmulatedCluster.attach`` or ``down_all``). How the nodes are
started and waited for is in testbed/cluster/raynodes.py; the run's processes as /proc
shows them, in testbed/machine/procs.py.

Drivers must run inside the head's namespace: use ``popen_in_head`` /
``run_in_head`` (or ``head_argv`` to build the command), which also set
``RAY_ADDRESS``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cluster import rayup
from testbed.cluster.raynodes import RAY_PORT, ClusterError, ClusterInfo, RayNodes, free_ports
from testbed.machine import netns as nn
from testbed.machine import procs
from testbed.machine.netns import DEFAULT_STATE_DIR, DEFAULT_SUBNET, HEAD, Fabric
from testbed.machine.procs import RUN_MARKER_ENV, all_pids
from vocab import EMULATED_MODES, LAUNCHERS, LAUNCH_RAY_UP, MODE_AUTO, MODE_LOCAL, MODE_NETNS, EmulatedMode, Launcher

log = logging.getLogger(__name__)

# Ray's sockets live at <temp_root>/<node>/ray/session_<date>_<pid>/sockets/plasma_store,
# and a unix socket path holds at most 107 bytes.
MAX_TEMP_ROOT_CHARS = 32


@dataclass(frozen=True)
class NodeStatus:
    name: str
    pid: int | None
    alive: bool
    netns: str | None
    netns_exists: bool


@dataclass(frozen=True)
class ClusterStatus:
    run_id: str
    mode: str
    nodes: tuple[NodeStatus, ...]
    namespaces: tuple[str, ...]  # the run's namespaces that exist
    pids: tuple[int, ...]  # every live process of the run (nodes, raylets, workers, ...)
    pss_bytes: int  # their proportional set size, summed

    @property
    def up(self) -> bool:
        return bool(self.nodes) and all(n.alive and (n.netns is None or n.netns_exists) for n in self.nodes)

    @property
    def empty(self) -> bool:
        """Nothing of the run is left: no process, no namespace."""
        return not self.pids and not self.namespaces


# ---------------------------------------------------------------- the cluster

class EmulatedCluster(RayNodes):
    """Head + ``n_pods`` Ray nodes, each in its own network namespace (or one local node)."""

    def __init__(
        self,
        n_pods: int,
        state_dir: str | Path | None = None,
        run_dir: str | Path | None = None,
        *,
        run_id: str | None = None,
        mode: EmulatedMode = "auto",
        subnet: str = DEFAULT_SUBNET,
        head_cpus: int = 1,
        pod_cpus: int = 1,
        object_store_bytes: int = 300_000_000,
        pod_resource: float = 1.0,
        env: Mapping[str, str] | None = None,
        temp_root: str | Path | None = None,
        ready_timeout_s: float = 120.0,
        stop_timeout_s: float = 10.0,
        launcher: Launcher | None = None,
        head_pods: int = 0,
    ) -> None:
        self.run_id = nn.check_run_id(run_id if run_id is not None else uuid.uuid4().hex[:8])
        if mode not in EMULATED_MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(EMULATED_MODES)}")
        if mode == MODE_AUTO:
            reason = nn.missing_privileges()
            mode = "netns" if reason is None else "local"
            if reason is not None:
                log.warning("emulated cluster: single-node local mode (%s)", reason)
        elif mode == MODE_NETNS:
            nn.require_privileges()
        self.mode: str = mode
        # netns: through `ray up`, as a real cluster (testbed/cluster/rayup.py); local mode has no
        # node addresses to ssh into, so its one node is started directly.
        launcher = launcher or ("ray_up" if mode == MODE_NETNS else "direct")
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
        if launcher == LAUNCH_RAY_UP and mode != MODE_NETNS:
            raise ValueError("launcher ray_up needs the netns mode (a node address to ssh into per node)")
        if launcher == LAUNCH_RAY_UP and (why := rayup.missing_tools()):
            raise ClusterError(why)
        self.launcher: str = launcher
        self.n_pods = n_pods
        self.fabric = Fabric.plan(self.run_id, n_pods, subnet)  # validates n_pods and subnet in both modes
        # Pods n_pods .. n_pods + head_pods - 1 on the head's node, sharing its namespace and NIC, as
        # cluster.yaml's provider.pods can put a pod there (testbed/cluster/clusterfile.py).
        if not isinstance(head_pods, int) or head_pods < 0:
            raise ValueError(f"head_pods: expected a non-negative integer, got {head_pods!r}")
        self.head_pods = head_pods
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.state_path = nn.state_file(self.state_dir, self.run_id)
        self.temp_root = Path(temp_root) if temp_root is not None else Path(tempfile.gettempdir()) / f"tb-{self.run_id}"
        if len(str(self.temp_root)) > MAX_TEMP_ROOT_CHARS:
            raise ValueError(f"temp_root {str(self.temp_root)!r}: longer than {MAX_TEMP_ROOT_CHARS} characters, "
                             "too long for Ray's unix socket paths (set temp_root, or a shorter TMPDIR)")
        self.log_dir = Path(run_dir) / "cluster" if run_dir is not None else self.temp_root / "logs"
        self.head_cpus, self.pod_cpus = head_cpus, pod_cpus
        self.object_store_bytes = object_store_bytes
        self.pod_resource = pod_resource
        self.extra_env = dict(env or {})
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self._ports: dict[str, int] = {}
        self._popen: dict[str, subprocess.Popen] = {}
        self.info: ClusterInfo | None = None

    # -- addresses and commands

    @property
    def head_ip(self) -> str:
        return self.fabric.head.address if self.mode == MODE_NETNS else "127.0.0.1"

    @property
    def address(self) -> str:
        """The head's GCS address, for ``ray.init(address=...)`` inside the head namespace."""
        return f"{self.head_ip}:{self._ports.get('gcs', RAY_PORT)}"

    @property
    def node_ips(self) -> dict[str, str]:
        """Each node's IP; in local mode every name maps to the one node (known after ``up``)."""
        if self.mode == MODE_LOCAL:
            ip = self.info.nodes[0].address if self.info is not None else "127.0.0.1"
            return {n.name: ip for n in self.fabric.nodes}
        return {n.name: n.address for n in self.fabric.nodes}

    def head_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside the head's namespace (unchanged in local mode)."""
        return nn.netns_exec_argv(self.fabric.head.netns, list(argv)) if self.mode == MODE_NETNS else list(map(str, argv))

    @property
    def auth_env(self) -> dict[str, str]:
        """Ray token authentication with this run's own token, for every node and driver.

        Ray 2.60 turns token auth on for a head whenever ``~/.ray/auth_token`` exists (any
        earlier local ``ray.init()`` writes one), but a worker joining with ``ray start
        --address`` then sends no token and is refused ("InvalidAuthToken"). Setting the
        mode and the token explicitly makes the cluster the same whatever the machine holds."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.temp_root / "auth_token")}

    def _write_auth_token(self) -> None:
        path = self.temp_root / "auth_token"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))

    def driver_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a driver: this one, ``RAY_ADDRESS`` and the run's auth set, ``env`` on top."""
        out = dict(os.environ)
        out["RAY_ADDRESS"] = self.address
        out.update(self.auth_env)
        out.update(env or {})
        return out

    def popen_in_head(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(self.head_argv(argv), env=self.driver_env(env), **kwargs)

    def run_in_head(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` inside the head's namespace (e.g. a Python driver)."""
        return subprocess.run(self.head_argv(argv), env=self.driver_env(env), **kwargs)

    # -- up

    def __enter__(self) -> EmulatedCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> ClusterInfo:
        """Create the namespaces, start every node and wait until all are alive in Ray.

        On failure everything is torn down again (the node logs stay in
        ``log_dir``) and ``ClusterError`` names the node and its last log line."""
        if self.state_path.exists():
            raise ClusterError(f"run {self.run_id}: state file {self.state_path} exists (already up, or crashed: down it first)")
        if importlib.util.find_spec("ray") is None:
            raise ClusterError("emulated cluster: Ray is not installed (pip install 'ray[default]')")
        if self.launcher == LAUNCH_RAY_UP and (other := rayup.bootstrap_owner()) not in (None, self.run_id):
            # before anything is created: the other cluster and its files stay as they are
            raise ClusterError(f"ray up: emulated cluster {other} is up through ray up on this machine, and its "
                               f"head's autoscaler reads ~/{rayup.BOOTSTRAP_FILES[0]}, which a second ray up "
                               f"would replace and so terminate its nodes: bring it down first (testbed cluster "
                               f"down {other})")
        started = time.monotonic()
        nn.update_state(self.state_path, run_id=self.run_id, mode=self.mode, n_pods=self.n_pods, head_pods=self.head_pods,
                        temp_root=str(self.temp_root), creator_start_ticks=procs.self_start_ticks(), processes=[],
                        launcher=self.launcher)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._write_auth_token()
            if self.mode == MODE_NETNS:
                nn.create_fabric(self.fabric, self.state_path)
            else:
                gcs, *rest = free_ports(5)
                self._ports = {"gcs": gcs, "agent_http": rest[0], "agent_grpc": rest[1],
                               "runtime_env": rest[2], "metrics": rest[3]}
                nn.update_state(self.state_path, ports=self._ports)
            if self.launcher == LAUNCH_RAY_UP:
                self._ray_up()
            else:
                self._start_node(HEAD)
                self._wait_gcs()
                if self.mode == MODE_NETNS:
                    for pod in self.fabric.pods:
                        self._start_node(pod.name)
            self.info = self._wait_nodes()
        except BaseException:
            self.down(keep_logs=True)
            raise
        log.info("emulated cluster %s (%s, %d pods) up in %.1f s", self.run_id, self.mode, self.n_pods,
                 time.monotonic() - started)
        return self.info

    # -- down and status

    def _run_pids(self, state: Mapping[str, Any]) -> set[int]:
        """Every live process of the run: the node sessions (started after the run began),
        anything carrying the run's marker in its environment, and anything in its namespaces."""
        sids = {p["pid"] for p in state.get("processes", [])}
        min_ticks = state.get("creator_start_ticks", 0)
        marker = f"{RUN_MARKER_ENV}={self.run_id}".encode()
        found = set()
        for pid in all_pids():
            st = procs.proc_stat(pid)
            if st is None or st[0] == "Z":
                continue
            if st[1] in sids and st[2] >= min_ticks:
                found.add(pid)
                continue
            try:
                if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.add(pid)
            except OSError:
                pass
        if self.mode == MODE_NETNS:
            found |= set(nn.processes_in_namespaces(self.fabric.namespaces))
        return found - procs.protected_pids()

    def down(self, keep_logs: bool = False) -> None:
        """Stop every process of the run (SIGTERM to the node sessions, SIGKILL after
        ``stop_timeout_s``), then remove the namespaces, the Ray temp dirs and the state
        file, and the compute faults' cgroups the run's processes left empty (a cgroup outlives
        its processes, and the agent whose time to live would remove it is gone with them).
        Idempotent; works from the state file alone (see ``attach``)."""
        state = nn.read_state(self.state_path) if self.state_path.exists() else {}
        if self.launcher == LAUNCH_RAY_UP:
            self._ray_down()
        for p in state.get("processes", []):
            if procs.alive(p["pid"], p["start_ticks"]):
                try:
                    os.killpg(p["pid"], signal.SIGTERM)  # the node's session: ray start, gcs, raylet, workers
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.stop_timeout_s
        signalled: set[int] = set()
        while (pids := self._run_pids(state)) and time.monotonic() < deadline:
            for pid in pids - signalled:  # workers and agents outside the node's group, strays of a crash
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            signalled |= pids
            time.sleep(0.1)
        for _ in range(50):
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
            pids = self._run_pids(state)
        if pids:
            raise ClusterError(f"run {self.run_id}: processes {sorted(pids)} survived SIGKILL")
        for proc in self._popen.values():  # reap our children (no zombies)
            proc.wait()
        self._popen.clear()
        if self.mode == MODE_NETNS:
            nn.destroy_fabric(self.fabric)
        if self.launcher == LAUNCH_RAY_UP:
            rayup.remove_ssh_control_dir(self.fabric)
        if not keep_logs:
            shutil.rmtree(self.temp_root, ignore_errors=True)
        self.state_path.unlink(missing_ok=True)
        self.info = None
        from testbed.faults.cpu import clear_project_cgroups

        clear_project_cgroups(only_empty=True)  # another run's live throttles stay

    def status(self) -> ClusterStatus:
        """Which of the run's namespaces and processes exist (from the state file)."""
        state = nn.read_state(self.state_path) if self.state_path.exists() else {}
        namespaces = tuple(n for n in self.fabric.namespaces if nn.netns_path(n).exists()) if self.mode == MODE_NETNS else ()
        nodes = []
        recorded = {p["node"]: p for p in state.get("processes", [])}
        for n in self.fabric.nodes if self.mode == MODE_NETNS else self.fabric.nodes[:1]:
            p = recorded.get(n.name)
            ns = n.netns if self.mode == MODE_NETNS else None
            nodes.append(NodeStatus(name=n.name, pid=p["pid"] if p else None,
                                    alive=bool(p) and procs.alive(p["pid"], p["start_ticks"]),
                                    netns=ns, netns_exists=ns is not None and ns in namespaces))
        pids = tuple(sorted(self._run_pids(state)))
        return ClusterStatus(run_id=self.run_id, mode=self.mode, nodes=tuple(nodes), namespaces=namespaces,
                             pids=pids, pss_bytes=procs.pss_bytes(pids))

    @classmethod
    def attach(cls, state_dir: str | Path | None, run_id: str) -> EmulatedCluster:
        """The cluster of a recorded run (e.g. a crashed one), for ``status`` and ``down``."""
        state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        path = nn.state_file(state_dir, run_id)
        if not path.exists():
            raise ClusterError(f"run {run_id}: no state file {path}")
        state = nn.read_state(path)
        fabric = Fabric.from_dict(state["fabric"]) if state.get("fabric") else None
        obj = cls.__new__(cls)
        obj.run_id = run_id
        obj.mode = state.get("mode", "netns")
        obj.launcher = state.get("launcher", "direct")
        obj.n_pods = state.get("n_pods", len(fabric.pods) if fabric else 1)
        obj.head_pods = state.get("head_pods", 0)
        obj.fabric = fabric if fabric is not None else Fabric.plan(run_id, obj.n_pods)
        obj.state_dir, obj.state_path = Path(state_dir), path
        obj.temp_root = Path(state.get("temp_root", Path(tempfile.gettempdir()) / f"tb-{run_id}"))
        obj.log_dir = obj.temp_root / "logs"
        obj.head_cpus = obj.pod_cpus = 1
        obj.object_store_bytes, obj.pod_resource, obj.extra_env = 0, 1.0, {}
        obj.ready_timeout_s, obj.stop_timeout_s = 120.0, 10.0
        obj._ports = dict(state.get("ports", {}))
        obj._popen, obj.info = {}, None
        return obj


def default_state_dir() -> Path:
    """/run/testbed for root; a per-user folder under the temp dir otherwise (local mode)."""
    if os.geteuid() == 0:
        return DEFAULT_STATE_DIR
    return Path(tempfile.gettempdir()) / f"testbed-state-{os.geteuid()}"


def down_all(state_dir: str | Path | None = None) -> list[str]:
    """``down`` every run recorded in ``state_dir`` (cleanup after crashes); returns their run ids."""
    state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
    done = []
    for path in sorted(state_dir.glob("*.json")):
        run_id = path.stem
        EmulatedCluster.attach(state_dir, run_id).down()
        done.append(run_id)
    return done
