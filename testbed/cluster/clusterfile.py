"""The Ray cluster file (``cluster.yaml``): check it, and tell a node which pod it is.

``cluster.yaml`` at the top of the repository starts a real GPU cluster with Ray's
``local`` (on-premises) provider::

    RAY_UP_enable_autoscaler_v2=0 ray up -y cluster.yaml

Its file_mounts copy the project, cluster.yaml included, to ``~/pd-reliability-testbed``
on every node, and its start commands call this module there::

    python -m testbed.cluster.clusterfile check [FILE]           # exit 0, or one line naming what is unfilled
    python -m testbed.cluster.clusterfile node-ip [FILE]         # this node's address, as the file lists it
    python -m testbed.cluster.clusterfile node-resources [FILE]  # this node's Ray resources, as JSON
    python -m testbed.cluster.clusterfile stop-ray [FILE]        # stop the Ray this file started here, nothing else

FILE defaults to ``cluster.yaml`` in the working directory. Errors are one line on
stderr and exit status 2.

**Placeholders.** What a user must fill in is written ``@FILL_IN_<WHAT>@``, always as a
whole value. "@" cannot start a YAML value, so while one is left the file is not valid
YAML, and ``ray up`` stops within a second in Ray's own loader ("Cluster config invalid
... found character '@' that cannot start any token", quoting the line), instead of
retrying ssh to a host named like a placeholder for 15 minutes. ``load`` (and the
``check`` command) name every one left in one line.

**Pods.** ``provider.worker_ips[i]`` is pod ``i``: its Ray node carries the custom
resource ``{"pod<i>": 1}``, by which the runtime places pod i's engines and fault agent,
as on the emulated cluster (``testbed/cluster/emulated.py``); the head carries
``{"head": 1}``. ``provider.pods`` (optional) places the pods otherwise: pod i on the node
listed i-th, the head or a worker, a node once per pod it holds (a node with several GPUs,
several pods; pods sharing a node share its NIC, so a link fault on one is refused:
testbed/runs/driver.py discover_pods). All workers share one ``worker_start_ray_commands``, so each finds
itself in the file: by the address it routes to the head from (the address Ray itself
would pick), else by any address of its interfaces, else by ``$TESTBED_NODE_IP``; entries
may be host names, resolved as Ray's local provider resolves them (``gethostbyname``).

**Stopping.** Ray's default start commands begin with ``ray stop``, which kills every Ray
process of the user on the node. Here the start commands export
``TESTBED_RAY_NODE=<path of the cluster file>`` into the environment of ``ray start``,
which every Ray process (and engine) it starts inherits; ``stop-ray`` stops exactly the
processes of this user that carry that marker for this file.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"@FILL_IN_[A-Za-z0-9_]+@")
_UNQUOTED = re.compile(r"(?<![\"'])" + PLACEHOLDER.pattern + r"(?![\"'])")
HEAD = "head"  # the head's resource, as on the emulated cluster (testbed.machine.netns.HEAD)
NODE_IP_ENV = "TESTBED_NODE_IP"  # a node's own address, where finding it by route and interfaces is not enough
MARKER_ENV = "TESTBED_RAY_NODE"  # set by cluster.yaml's start commands on `ray start`: the cluster file's path
RAY_PORT = 6379  # the head's GCS port in cluster.yaml; only the route towards it is looked up, nothing is sent
DEFAULT_FILE = "cluster.yaml"
# provider.pods (optional; Ray's schema lets a provider section hold keys of its own and the local
# provider reads only its own): pod i's node, the head or a worker, listed once per pod it holds
PODS_KEY = "pods"


def pod_name(pod: int) -> str:
    """Pod ``pod``'s Ray resource, as on the emulated cluster (testbed.machine.netns.pod_name)."""
    return f"pod{pod}"


class ClusterFileError(ValueError):
    """A cluster file that cannot be used, or a node not found in it; one-line message."""


@dataclass(frozen=True)
class Placeholder:
    field: str  # e.g. "provider.worker_ips[0]"
    placeholder: str  # e.g. "@FILL_IN_WORKER_IP_0@"


@dataclass(frozen=True)
class Node:
    name: str  # "head", "pod0", "pod1", ... ("node<k>" for a worker holding no pod or several)
    entry: str  # as the file lists it (address or host name)
    address: str  # resolved IPv4 address
    pods: tuple[int, ...]  # the pods it holds (provider.pods; by default worker k holds pod k)
    head: bool = False

    @property
    def resources(self) -> dict[str, int]:
        return {**({HEAD: 1} if self.head else {}), **{pod_name(i): 1 for i in self.pods}}


# -- reading and checking

def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def parse(text: str) -> tuple[dict[str, Any], list[Placeholder]]:
    """The cluster file's content, and the placeholders left in it (as strings in place).

    Placeholders are quoted before parsing, so a file with some left still parses here
    (Ray's loader rejects it, which is the point); other YAML errors propagate.
    """
    quoted = _UNQUOTED.sub(lambda m: f'"{m.group(0)}"', text)
    config = yaml.safe_load(quoted)
    if not isinstance(config, dict):
        raise ClusterFileError("expected a mapping of Ray's cluster settings at the top level")
    found = [Placeholder(field, m) for field, value in _walk(config, "") for m in PLACEHOLDER.findall(value)]
    return config, found


def check(config: dict[str, Any], placeholders: Sequence[Placeholder] = (), source: str = DEFAULT_FILE) -> None:
    """Raise ClusterFileError (one line) if placeholders are left or the local provider's
    node list cannot work: head_ip and a non-empty worker_ips, every address once."""
    if placeholders:
        left = ", ".join(f"{p.field} ({p.placeholder})" for p in placeholders)
        raise ClusterFileError(f"{source}: fill in {left}: replace each @FILL_IN_...@ with your cluster's value "
                               "(see the file's header)")
    provider = config.get("provider")
    if not isinstance(provider, dict):
        raise ClusterFileError(f"{source}: no provider section")
    if provider.get("type") != "local":
        return  # cloud providers list no nodes: nothing more to check here
    head = provider.get("head_ip")
    workers = provider.get("worker_ips")
    if not isinstance(head, str) or not head:
        raise ClusterFileError(f"{source}: provider.head_ip: expected the head node's address, got {head!r}")
    # no workers: only where provider.pods puts every pod on the head (one machine of several GPUs)
    if (not isinstance(workers, list) or not all(isinstance(w, str) and w for w in workers)
            or not (workers or provider.get(PODS_KEY))):
        raise ClusterFileError(f"{source}: provider.worker_ips: expected a list of worker addresses (one per pod), "
                               f"got {workers!r}")
    seen: set[str] = set()
    for i, w in enumerate(workers):
        if w == head:
            raise ClusterFileError(f"{source}: provider.worker_ips[{i}] is the head ({w}): list the head in "
                                   "provider.pods to give it a pod")
        if w in seen:
            raise ClusterFileError(f"{source}: provider.worker_ips[{i}] ({w}) is listed twice")
        seen.add(w)
    pods = provider.get(PODS_KEY)
    if pods is None:
        return
    if not isinstance(pods, list) or not pods or not all(isinstance(p, str) and p for p in pods):
        raise ClusterFileError(f"{source}: provider.{PODS_KEY}: expected a list of node addresses (pod i on the "
                               f"i-th), got {pods!r}")
    for i, p in enumerate(pods):
        if p != head and p not in seen:
            raise ClusterFileError(f"{source}: provider.{PODS_KEY}[{i}] ({p}) is neither provider.head_ip nor in "
                                   "provider.worker_ips")


def load(path: str | os.PathLike[str] = DEFAULT_FILE) -> dict[str, Any]:
    """The cluster file at ``path``, checked (see ``check``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ClusterFileError(f"{path}: cannot read the cluster file ({e.strerror or e})") from None
    try:
        config, placeholders = parse(text)
    except yaml.YAMLError as e:
        first = " ".join(str(e).split())
        raise ClusterFileError(f"{path}: not valid YAML ({first})") from None
    check(config, placeholders, str(path))
    return config


# -- which node is this

def _resolve(host: str, field: str) -> str:
    try:
        return socket.gethostbyname(host)  # as Ray's local provider (LocalNodeProvider.internal_ip)
    except OSError as e:
        raise ClusterFileError(f"{field}: cannot resolve {host!r} ({e})") from None


def pod_entries(config: dict[str, Any]) -> list[str]:
    """Pod i's node as the file lists it: ``provider.pods[i]`` where given (a node may hold several
    pods, the head too), else ``provider.worker_ips[i]``."""
    provider = config["provider"]
    return list(provider.get(PODS_KEY) or provider["worker_ips"])


def nodes(config: dict[str, Any]) -> list[Node]:
    """The head, then every worker in the order of ``provider.worker_ips``, addresses resolved,
    each with its pods."""
    provider = config["provider"]
    entries = pod_entries(config)
    mine = lambda entry: tuple(i for i, e in enumerate(entries) if e == entry)  # noqa: E731
    out = [Node(HEAD, provider["head_ip"], _resolve(provider["head_ip"], "provider.head_ip"),
                mine(provider["head_ip"]), head=True)]
    for k, w in enumerate(provider["worker_ips"]):
        pods = mine(w)
        out.append(Node(pod_name(pods[0]) if len(pods) == 1 else f"node{k}", w,
                        _resolve(w, f"provider.worker_ips[{k}]"), pods))
    return out


def _route_source(address: str) -> str | None:
    """The local address packets to ``address`` leave from (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, RAY_PORT))
            return s.getsockname()[0]
    except OSError:
        return None


def _interface_addresses() -> list[str]:
    """The IPv4 address of each network interface that has one (Linux SIOCGIFADDR)."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            out.append(socket.inet_ntoa(raw[20:24]))
    return out


def local_addresses(head_address: str) -> list[str]:
    """This machine's candidate addresses, best first: the one it routes to the head from,
    then those of its interfaces."""
    found = [a for a in [_route_source(head_address)] + _interface_addresses() if a]
    return list(dict.fromkeys(found))


def this_node(config: dict[str, Any], ip: str | None = None) -> Node:
    """The node of the cluster file that this machine is (or that ``ip`` is)."""
    listed = nodes(config)
    ip = ip or os.environ.get(NODE_IP_ENV) or None
    candidates = [_resolve(ip, "the node's address")] if ip else local_addresses(listed[0].address)
    for address in candidates:
        matches = [n for n in listed if n.address == address]
        if len(matches) > 1:
            raise ClusterFileError(f"{address} is listed more than once: "
                                   + ", ".join(f"{n.name} ({n.entry})" for n in matches))
        if matches:
            return matches[0]
    where = f"address {ip}" if ip else f"addresses {', '.join(candidates) or '(none found)'}"
    raise ClusterFileError(f"this node ({where}) is neither provider.head_ip ({listed[0].entry}) nor in "
                           f"provider.worker_ips ({', '.join(n.entry for n in listed[1:])}); "
                           f"list it, or set {NODE_IP_ENV} to its listed address")


# -- stopping this file's Ray

def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rpartition(")")[2].split()[1])
        out.add(pid)
    return out


def _marker(pid: int) -> str | None:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = MARKER_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def ray_processes(cluster_file: str | os.PathLike[str]) -> list[int]:
    """This user's processes started by ``cluster_file``'s start commands (their marker)."""
    want = os.path.realpath(cluster_file)
    skip = _ancestors() | {os.getpid()}
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        value = _marker(int(name))
        if value is not None and os.path.realpath(value) == want:
            out.append(int(name))
    return sorted(out)


def stop_ray(cluster_file: str | os.PathLike[str], timeout_s: float = 15.0) -> list[int]:
    """SIGTERM the processes of ``ray_processes``, SIGKILL what is left after ``timeout_s``;
    returns their pids. Nothing else on the node is touched."""
    pids = ray_processes(cluster_file)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    if left:
        raise ClusterFileError(f"processes {left} of {cluster_file}'s Ray survived SIGKILL")
    return pids


# -- command line

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m testbed.cluster.clusterfile", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("check", "exit 0 if the cluster file is filled in and usable"),
                        ("node-ip", "print this node's address as the cluster file lists it"),
                        ("node-resources", "print this node's Ray resources as JSON: {\"head\": 1} for the head, "
                                           "{\"pod<i>\": 1} for each pod i it holds (provider.pods[i], by "
                                           "default provider.worker_ips[i])"),
                        ("stop-ray", "stop the Ray processes this cluster file's start commands started here")):
        c = sub.add_parser(name, help=help_)
        c.add_argument("file", nargs="?", default=DEFAULT_FILE, help="the cluster file (default: cluster.yaml)")
        if name in ("node-ip", "node-resources"):
            c.add_argument("--ip", help=f"the node's address, instead of finding it (also ${NODE_IP_ENV})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load(args.file)
        if args.command == "check":
            names = [n.name for n in nodes(config)] if config["provider"].get("type") == "local" else []
            print(f"{args.file}: ok" + (f" ({', '.join(names)})" if names else ""))
        elif args.command == "node-ip":
            print(this_node(config, args.ip).address)
        elif args.command == "node-resources":
            print(json.dumps(this_node(config, args.ip).resources))
        elif args.command == "stop-ray":
            pids = stop_ray(args.file)
            print(f"stopped {len(pids)} process(es) of {args.file}'s Ray" if pids else f"no Ray of {args.file} running")
    except ClusterFileError as e:
        print(f"testbed.cluster.clusterfile: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
