"""Starting an emulated cluster's Ray nodes and waiting for them (testbed/cluster/emulated.py).

Two launchers. ``ray_up`` (netns mode, as a real cluster comes up; testbed/cluster/rayup.py):
an sshd per node in its namespace, then ``ray up`` on a generated local-provider cluster file
from the head's namespace, and ``ray down`` before the teardown. ``direct`` (and local mode):
each node a ``ray start --block`` process in its own session. Either way every process started
is recorded in the run's state file as it starts (so ``down`` finds it after a crash), and a
node that exits while the cluster comes up fails the start at once with its last log line.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core.util.files import write_json_atomic
from testbed.machine import netns as nn
from testbed.cluster import rayup
from testbed.machine.netns import HEAD, Fabric, NodeLink, pod_name
from testbed.machine.procs import RUN_MARKER_ENV, proc_stat
from vocab import LAUNCH_RAY_UP, MODE_LOCAL, MODE_NETNS

log = logging.getLogger(__name__)

RAY_PORT = 6379

# Ray defaults that hurt an emulated cluster (docs/verified.md "Ray settings for an emulated
# cluster"): SIGTERM would wait
# 30 s for a drain, and slow links would make Ray resend object chunks.
NODE_ENV = {
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    "RAY_object_manager_pull_timeout_ms": "120000",
    "RAY_USAGE_STATS_ENABLED": "0",
}

# The direct launcher's namespaces only: UCX (NIXL's KV transport) must use TCP over eth0, or it
# sees one host and copies across processes (CMA), bypassing the veth and its shaping. The engines
# set the same in their own environment (testbed/engines/engine.py), as they must on a real node;
# the ray_up launcher gives its nodes none of it (HEAD_ONLY_ENV and its comment).
NETNS_NODE_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0"}

# The ray_up launcher gives a node only what cluster.yaml's start commands give a real node's
# `ray start`: NODE_ENV (cluster.yaml exports the same, tests/test_cluster_file.py holds them
# equal), autoscaler v1 on the head, and the ssh session's own environment (start_node). Nothing
# of the process that planned the cluster: whatever the emulation supplied beyond a real node's
# environment would hide what a real node lacks (the KV port range once did). Beside it only the
# emulation's housekeeping, which changes nothing an engine or agent does: PYTHONPATH (the checkout
# the nodes run, as cluster.yaml's `cd ~/pd-reliability-testbed`), PATH (the interpreter's folder
# first, as a node's login shell with its venv active), TMPDIR (the run's own, removed with it),
# the run's marker (as TESTBED_RAY_NODE on a real node) and its Ray auth token.
HEAD_ONLY_ENV = {"RAY_enable_autoscaler_v2": "0"}
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # sshd's default PATH (Debian)
HOUSEKEEPING_ENV = ("PYTHONPATH", "PATH", "TMPDIR", RUN_MARKER_ENV, "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")

# Runs in the head's namespace: waits until the expected nodes are alive with
# their resources, then prints them as one JSON line.
_WAIT_NODES = r"""
import json, sys, time
import ray
address, count, resources, timeout = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + timeout
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    have = {r for n in nodes for r in n["Resources"]}
    if len(nodes) >= count and all(r in have for r in resources):
        break
    if time.monotonic() > deadline:
        sys.stderr.write("only %d of %d nodes alive after %.0f s (resources %s)\n" % (len(nodes), count, timeout, sorted(have)))
        sys.exit(3)
    time.sleep(0.2)
print(json.dumps([{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"], "resources": n["Resources"]} for n in nodes]))
"""


class ClusterError(RuntimeError):
    """The emulated cluster could not be brought up or down; one-line message."""


@dataclass(frozen=True)
class NodeInfo:
    name: str  # "head", "pod0", ...
    address: str  # the node's IP (its --node-ip-address)
    netns: str | None  # None in local mode
    ray_node_id: str
    resources: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class ClusterInfo:
    run_id: str
    mode: str
    address: str  # "ip:port" of the head's GCS
    nodes: tuple[NodeInfo, ...]


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 just now (local mode's head takes them)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def log_tail(path: str | Path, lines: int = 1) -> str:
    """The last ``lines`` non-empty lines of a log, joined by `` | `` ("" where unreadable)."""
    try:
        text = [l.strip() for l in Path(path).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class RayNodes:
    """The node-starting half of :class:`testbed.cluster.emulated.EmulatedCluster`, mixed into it:
    the cluster holds the attributes declared here, its addresses and its commands (``head_argv``,
    ``driver_env``)."""

    run_id: str
    mode: str
    launcher: str
    n_pods: int
    head_pods: int
    fabric: Fabric
    state_path: Path
    temp_root: Path
    log_dir: Path
    head_cpus: int
    pod_cpus: int
    object_store_bytes: int
    pod_resource: float
    extra_env: dict[str, str]
    ready_timeout_s: float
    _ports: dict[str, int]
    _popen: dict[str, subprocess.Popen]
    # EmulatedCluster's properties
    head_ip: str
    address: str
    node_ips: dict[str, str]
    auth_env: dict[str, str]

    def _node_env(self, name: str) -> dict[str, str]:
        """The environment of the node's ``ray start``. ray_up: a real node's (HEAD_ONLY_ENV's
        comment), on top of the ssh session's; direct: this process's, with NETNS_NODE_ENV."""
        root = str(Path(__file__).resolve().parents[2])  # the nodes' workers import the project's code
        if self.launcher == LAUNCH_RAY_UP:
            env = {**NODE_ENV, **(HEAD_ONLY_ENV if name == HEAD else {}), "PYTHONPATH": root,
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{LOGIN_PATH}"}
        else:
            env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
            env.update(NODE_ENV)
            if self.mode == MODE_NETNS:
                env.update(NETNS_NODE_ENV)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        tmp = self.temp_root / name / "tmp"  # run-owned TMPDIR: engines' socket files go with the run
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env[RUN_MARKER_ENV] = self.run_id
        env.update(self.auth_env)
        env.update(self.extra_env)
        return env

    def _ray_argv(self, name: str) -> list[str]:
        node_dir = self.temp_root / name / "ray"
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                f"--object-store-memory={self.object_store_bytes}", "--disable-usage-stats", f"--temp-dir={node_dir}"]
        on_head = {name: self.pod_resource for name in self.head_pod_names}
        if self.mode == MODE_LOCAL:
            resources = {HEAD: 1.0} | {p.name: self.pod_resource for p in self.fabric.pods} | on_head
            p = self._ports
            # No --node-ip-address: Ray replaces 127.0.0.1 with the host's routable address anyway.
            return argv + ["--head", "--include-dashboard=false", f"--port={p['gcs']}",
                           f"--num-cpus={self.head_cpus + (self.n_pods + self.head_pods) * self.pod_cpus}",
                           f"--resources={json.dumps(resources)}",
                           f"--dashboard-agent-listen-port={p['agent_http']}",
                           f"--dashboard-agent-grpc-port={p['agent_grpc']}",
                           f"--runtime-env-agent-port={p['runtime_env']}", f"--metrics-export-port={p['metrics']}"]
        node = self.fabric.node(name)
        if name == HEAD:
            return argv + ["--head", "--include-dashboard=false", f"--node-ip-address={node.address}", f"--port={RAY_PORT}",
                           f"--num-cpus={self.head_cpus + self.head_pods * self.pod_cpus}",
                           f"--resources={json.dumps({HEAD: 1.0} | on_head)}"]
        return argv + [f"--address={self.fabric.head.address}:{RAY_PORT}", f"--node-ip-address={node.address}",
                       f"--num-cpus={self.pod_cpus}", f"--resources={json.dumps({name: self.pod_resource})}"]

    def _start_node(self, name: str) -> None:
        argv = self._ray_argv(name)
        if self.mode == MODE_NETNS:
            argv = nn.netns_exec_argv(self.fabric.node(name).netns, argv)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(argv, env=self._node_env(name), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=self.temp_root)
        self._record_process(name, proc, log_path, self.fabric.node(name).netns if self.mode == MODE_NETNS else None)

    def _record_process(self, name: str, proc: subprocess.Popen, log_path: Path, netns: str | None) -> None:
        self._popen[name] = proc
        st = proc_stat(proc.pid)
        entry = {"node": name, "pid": proc.pid, "start_ticks": st[2] if st else -1, "log": str(log_path),
                 "netns": netns}
        state = nn.read_state(self.state_path)
        nn.update_state(self.state_path, processes=state.get("processes", []) + [entry])

    def _ray_up(self) -> None:
        """Every node's sshd, then ``ray up`` on the run's cluster file from the head's namespace."""
        root = self.temp_root
        rayup.make_keys(root, self.fabric)
        write_json_atomic(root / "fabric.json", {"run_id": self.run_id, "nodes": [
            {"name": n.name, "address": n.address} for n in self.fabric.nodes]})
        rayup.write_node_commands(root, {n.name: ([a for a in self._ray_argv(n.name) if a != "--block"],
                                                  self._node_env(n.name)) for n in self.fabric.nodes})
        rayup.ensure_privsep_dir()
        for n in self.fabric.nodes:
            log_path = self.log_dir / f"{n.name}.log"  # sshd's, and what the node's sessions print
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(nn.netns_exec_argv(n.netns, rayup.sshd_argv(rayup.sshd_config(root, n))),
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=root)
            self._record_process(n.name, proc, log_path, n.netns)
        for n in self.fabric.nodes:
            self._wait_port(n, 22, "sshd")
        path = rayup.write_cluster_file(self.fabric, root)
        log_path = self.log_dir / "ray-up.log"
        env = self.driver_env({**rayup.RAY_UP_ENV, "TMPDIR": str(root)})
        with open(log_path, "ab") as out:
            try:
                rc = subprocess.run(self.head_argv(rayup.ray_cli_argv("up", path)), env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                    timeout=self.ready_timeout_s).returncode
            except subprocess.TimeoutExpired:
                raise ClusterError(f"ray up {path}: not done after {self.ready_timeout_s:.0f} s "
                                   f"(log: {log_path})") from None
        if rc != 0:
            raise ClusterError(f"ray up {path} exited with status {rc} ({log_tail(log_path) or 'no output'}; "
                               f"log: {log_path})")
        self._wait_gcs()

    def _ray_down(self) -> None:
        """``ray down`` on the run's cluster file (stops the head; the caller removes the rest)."""
        path = self.temp_root / rayup.CLUSTER_FILE
        if self.mode != MODE_NETNS or not path.exists() or not nn.netns_path(self.fabric.head.netns).exists():
            return
        log_path = self.temp_root / "logs" / "ray-down.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.driver_env({**rayup.RAY_UP_ENV, "TMPDIR": str(self.temp_root)})
        with open(log_path, "ab") as out:
            try:
                subprocess.run(self.head_argv(rayup.ray_cli_argv("down", path)), env=env, stdin=subprocess.DEVNULL,
                               stdout=out, stderr=subprocess.STDOUT, cwd=self.temp_root, timeout=60)
            except subprocess.TimeoutExpired:
                log.warning("ray down %s: not done after 60 s; removing the run's processes", path)
        rayup.remove_bootstrap_files(self.fabric, self.temp_root)

    def _wait_port(self, node: NodeLink, port: int, what: str) -> None:
        self._wait_reachable(node.address, port, f"{what} on {node.name} ({node.address}:{port}) not reachable",
                             self.log_dir / f"{node.name}.log", 0.1)

    def _wait_reachable(self, ip: str, port: int, failure: str, log_path: Path, every_s: float) -> None:
        """Until ``ip:port`` accepts a connection from the head's namespace (this one in local mode),
        failing early when a node process exits and after ``ready_timeout_s``."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            self._check_nodes_running()
            try:
                if self.mode == MODE_NETNS:
                    with nn.in_netns(self.fabric.head.netns):  # the socket belongs to the head's namespace
                        socket.create_connection((ip, port), timeout=1.0).close()
                else:
                    socket.create_connection((ip, port), timeout=1.0).close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{failure} after {self.ready_timeout_s:.0f} s (log: {log_path})")
            time.sleep(every_s)

    def _check_nodes_running(self) -> None:
        for name, proc in self._popen.items():
            if proc.poll() is not None:
                log_path = self.log_dir / f"{name}.log"
                raise ClusterError(f"ray node {name} exited with status {proc.returncode} during start "
                                   f"({log_tail(log_path) or 'no output'}; log: {log_path})")

    def _wait_gcs(self) -> None:
        port = self._ports.get("gcs", RAY_PORT)
        self._wait_reachable(self.head_ip, port, f"ray head: GCS port {self.head_ip}:{port} not open",
                             self.log_dir / "head.log", 0.2)

    @property
    def head_pod_names(self) -> list[str]:
        """The pods on the head's node (EmulatedCluster's ``head_pods``), after the namespaced ones."""
        return [pod_name(self.n_pods + j) for j in range(self.head_pods)]

    def _wait_nodes(self) -> ClusterInfo:
        want = [HEAD] + [p.name for p in self.fabric.pods]
        count = len(want) if self.mode == MODE_NETNS else 1
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            check = subprocess.Popen(
                self.head_argv([sys.executable, "-c", _WAIT_NODES, self.address, str(count),
                                json.dumps(want + self.head_pod_names),
                                str(self.ready_timeout_s)]),
                env=self.driver_env({"TMPDIR": str(self.temp_root)}), stdout=out, stderr=err, cwd=self.temp_root)
            try:
                while check.poll() is None:
                    self._check_nodes_running()
                    time.sleep(0.2)
            finally:
                if check.poll() is None:
                    check.kill()
                    check.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        if check.returncode != 0:
            last = next((l for l in reversed(stderr.splitlines()) if l.strip()), "no output")
            raise ClusterError(f"ray nodes not ready: {last.strip()} (logs: {self.log_dir})")
        ray_nodes = json.loads(stdout.strip().splitlines()[-1])
        by_ip = {n["ip"]: n for n in ray_nodes}
        if self.mode == MODE_LOCAL:  # one node, at whatever address Ray chose for it
            rn = ray_nodes[0]
            return ClusterInfo(run_id=self.run_id, mode=self.mode, address=self.address, nodes=(
                NodeInfo(name=HEAD, address=rn["ip"], netns=None, ray_node_id=rn["node_id"],
                         resources=tuple(sorted(rn["resources"].items()))),))
        nodes = []
        for name in want:
            ip = self.node_ips[name]
            rn = by_ip.get(ip)
            if rn is None:
                raise ClusterError(f"ray node {name}: no live Ray node with address {ip} (found {sorted(by_ip)})")
            nodes.append(NodeInfo(name=name, address=ip, netns=self.fabric.node(name).netns, ray_node_id=rn["node_id"],
                                  resources=tuple(sorted(rn["resources"].items()))))
        return ClusterInfo(run_id=self.run_id, mode=self.mode, address=self.address, nodes=tuple(nodes))
