"""What is on each node of a Ray cluster, and acting on every node: ``testbed cluster status``
and ``testbed faults clear``.

:func:`run_on_every_node` runs one Ray task per alive node, pinned to it
(``NodeAffinitySchedulingStrategy(soft=False)``) and asking for no CPU, so it runs
even when engines hold every CPU of the node. A node whose task fails, or does not
answer in time, is reported as that node's one-line error; the others still finish.

:func:`node_report` is what runs on a node: host name, address, privileges, the
network interfaces (addresses, operstate, speed, whether the project's qdisc is on
them: read only) and the GPUs NVML sees. :func:`cluster_status` joins it with what
Ray knows of each node (resources: CPUs, GPUs, ``pod<i>``, head); :func:`render`
prints it. :func:`clear_cluster_faults` runs ``clear_host_faults`` on every node.

On the emulated cluster every node is a network namespace of one machine, so the
first node's clear already sweeps every testbed namespace of the machine and the
others find nothing left; ``clear_host_faults`` holds a host-wide lock, so those
concurrent sweeps never race each other. A task runs in its node's namespace, so
the label ``host:`` of what it removed names that node's own namespace.

Every function here needs an initialised Ray (the caller connects) except
:func:`node_report`, which only reads the machine it runs on.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray

from testbed.machine.netns import HEAD, has_net_admin, missing_privileges

RAY_HEAD_RESOURCE = "node:__internal_head__"  # Ray's own mark of its head node
_POD_RE = re.compile(r"^pod(\d+)$")
_ERROR_CHARS = 300


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class NodeResult:
    """What one node's task gave: its return value, or a one-line error."""

    node_id: str
    ip: str
    ok: bool
    value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Interface:
    name: str
    index: int
    kind: str | None  # veth, bridge, ifb, ... (None: a physical NIC or loopback)
    mac: str | None
    addresses: tuple[str, ...]  # "10.77.0.2/24", IPv4 first
    operstate: str  # "up", "down", "unknown", ... (sysfs where it describes this namespace, else netlink)
    speed_mbps: int | None  # None: not reported (virtual device, link down, or sysfs of another namespace)
    project_shaping: tuple[str, ...]  # "egress" / "ingress": the project's qdisc is on it


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's (physical) index
    name: str
    uuid: str
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    # NVML has no getter for a locked range: "locked" is what the project's marker files say
    # (written before each lock, removed on reset; `testbed faults clear` resets what they name).
    locked_by_project: bool


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    ip: str | None  # the address Ray knows the node by
    pid: int
    uid: int  # effective
    root: bool
    net_admin: bool  # CAP_NET_ADMIN in the effective set: may shape interfaces
    netns_missing: str | None  # why network namespaces cannot be built here (None: they can)
    interfaces: tuple[Interface, ...]
    gpus: tuple[Gpu, ...]
    gpu_missing: str | None  # why there is no GPU (None when NVML sees GPUs)
    problems: tuple[str, ...]  # parts that could not be read, one line each


@dataclass(frozen=True)
class NodeStatus:
    """One node as Ray lists it, with what its own task reported."""

    node_id: str
    ip: str
    alive: bool
    head: bool  # Ray's head, or the node holding the testbed's ``head`` resource
    cpus: float
    gpus: float  # Ray's GPU resource
    pods: tuple[str, ...]
    report: NodeReport | None
    error: str | None  # the node's task failed (or the node is dead)

    @property
    def interface_names(self) -> tuple[str, ...] | None:
        return None if self.report is None else tuple(i.name for i in self.report.interfaces)


@dataclass(frozen=True)
class PodPlacement:
    """Where a pod resource lives and which allowlisted interfaces exist there (None: unknown)."""

    pod: str
    node_id: str
    ip: str
    allowlisted: tuple[str, ...] | None
    missing: tuple[str, ...] | None


@dataclass(frozen=True)
class ClusterReport:
    nodes: tuple[NodeStatus, ...]  # head first, then by first pod, then by ip
    pods: tuple[str, ...]  # every pod<i> resource found, by i
    placements: tuple[PodPlacement, ...]  # one per (pod, node holding it)
    allowlist: tuple[str, ...]

    @property
    def problems(self) -> tuple[str, ...]:
        """What stands in the way of running (and faulting) an experiment, one line each."""
        out = []
        for n in self.nodes:
            if n.error is not None:
                out.append(f"node {n.ip} ({n.node_id[:8]}): {n.error}")
            elif n.report is not None and n.pods and not n.report.net_admin:
                out.append(f"node {n.ip} holds {', '.join(n.pods)} but lacks CAP_NET_ADMIN: link faults fail there")
        for p in self.placements:
            if p.allowlisted == ():
                out.append(f"{p.pod} on {p.ip}: none of the allowlisted interfaces "
                           f"({', '.join(self.allowlist) or 'empty allowlist'}) exists there")
        for pod in self.pods:
            on = [p.ip for p in self.placements if p.pod == pod]
            if len(on) > 1:
                out.append(f"{pod} is on {len(on)} nodes ({', '.join(on)}): pods are placed by that resource")
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"problems": list(self.problems)}


# --------------------------------------------------------------------------- running on every node


def _error_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # RayTaskError: the exception the task raised
    err = cause if isinstance(cause, BaseException) else exc
    text = " ".join(str(err).split())
    line = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return line if len(line) <= _ERROR_CHARS else line[: _ERROR_CHARS - 3] + "..."


def _require_ray() -> None:
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised: connect first (ray.init(address=...))")


def _alive(listed: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(n["NodeID"], n.get("NodeManagerAddress", "?")) for n in listed if n.get("Alive")]


def _run_on(nodes: Sequence[tuple[str, str]], fn: Callable[..., Any], args: tuple[Any, ...],
            timeout_s: float) -> list[NodeResult]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(fn)
    name = f"testbed-on-node:{getattr(fn, '__name__', 'fn')}"
    refs = []
    for node_id, _ in nodes:
        refs.append(remote.options(
            num_cpus=0, max_retries=0, retry_exceptions=False, name=name,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(*args))
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    done = set(ready)
    out = []
    for (node_id, ip), ref in zip(nodes, refs):
        if ref not in done:
            try:
                ray.cancel(ref, force=False)  # pending: dropped; running: interrupted (what it does is idempotent)
            except Exception:
                pass
            out.append(NodeResult(node_id, ip, False, error=f"no answer within {timeout_s:g} s"))
            continue
        try:
            out.append(NodeResult(node_id, ip, True, value=ray.get(ref)))
        except Exception as exc:  # the task raised, its worker died, the node went away, ...
            out.append(NodeResult(node_id, ip, False, error=_error_line(exc)))
    return out


def run_on_every_node(fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> list[NodeResult]:
    """Run ``fn(*args)`` once on every alive node (one Ray task each, pinned, ``num_cpus=0``,
    no retry); results in the order ``ray.nodes()`` lists the nodes. Failures and timeouts
    are reported per node, never raised. ``fn`` must be picklable (a module-level function
    is imported by name on the node)."""
    _require_ray()
    return _run_on(_alive(ray.nodes()), fn, args, timeout_s)


# --------------------------------------------------------------------------- what is on this node


def _sysfs_is_this_netns() -> bool:
    """/sys/class/net describes the namespace the process's sysfs was mounted in: trust it only
    when this thread has not been switched into another one (``netns.in_netns``)."""
    try:
        return os.stat("/proc/thread-self/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def _sysfs(name: str, index: int, trust: bool) -> tuple[str | None, int | None]:
    """(operstate, speed in Mbit/s) from /sys/class/net, when it describes this very interface."""
    if not trust:
        return None, None
    d = Path("/sys/class/net") / name
    try:
        if int((d / "ifindex").read_text()) != index:
            return None, None
        state = (d / "operstate").read_text().strip() or None
    except (OSError, ValueError):
        return None, None
    try:
        speed = int((d / "speed").read_text())
    except (OSError, ValueError):  # EINVAL for virtual devices and links that are down
        speed = -1
    return state, (speed if speed > 0 else None)


def _interfaces() -> tuple[Interface, ...]:
    """The interfaces of the calling thread's network namespace. Read only: the project's qdiscs
    are recognised by their handles (egress: root ``7e57:``; ingress: an ingress qdisc with the
    project's ifb beside it, as ``shaping`` sets and clears them)."""
    from pyroute2.netlink.rtnl import TC_H_ROOT

    from testbed.faults import shaping

    trust = _sysfs_is_this_netns()
    with shaping._iproute() as ipr:  # its own event loop: pyroute2 fails under Ray's uvloop otherwise
        links = list(ipr.get_links())
        addrs = list(ipr.get_addr())
        qdiscs = list(ipr.get_qdiscs())
    names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in links}
    by_index: dict[int, list[tuple[int, str]]] = {}
    for a in addrs:
        ip = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
        if ip:
            by_index.setdefault(a["index"], []).append((a["family"], f"{ip}/{a['prefixlen']}"))
    egress = {q["index"] for q in qdiscs if q["parent"] == TC_H_ROOT and q["handle"] == shaping.ROOT}
    ingress_q = {q["index"] for q in qdiscs if q["handle"] == shaping.INGRESS}
    present = set(names.values())
    out = []
    for link in sorted(links, key=lambda lk: lk["index"]):
        idx, name = link["index"], names[link["index"]] or f"if{link['index']}"
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        state, speed = _sysfs(name, idx, trust)
        if state is None:
            state = str(link.get_attr("IFLA_OPERSTATE") or "unknown").lower()
        shaped = (("egress",) if idx in egress else ()) + \
            (("ingress",) if idx in ingress_q and shaping.ifb_name(name) in present else ())
        addresses = tuple(a for _, a in sorted(by_index.get(idx, []), key=lambda fa: fa[0] != socket.AF_INET))
        out.append(Interface(name=name, index=idx, kind=kind, mac=link.get_attr("IFLA_ADDRESS"),
                             addresses=addresses, operstate=state, speed_mbps=speed, project_shaping=shaped))
    return tuple(out)


def gpu_list() -> tuple[tuple[Gpu, ...], str | None, list[str]]:
    """The GPUs NVML sees here, read-only: (the GPUs, why there are none or None, a line per GPU it
    could not read)."""
    from testbed.faults.gpu import locked_uuids
    from testbed.machine.gpu import gpu_available, nvml_uuid

    why = gpu_available()
    if why is not None:
        return (), why, []
    import pynvml

    def read(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:  # NVMLError_NotSupported and the like: the field stays unknown
            return None

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    locked = set(locked_uuids())
    gpus, problems = [], []
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = text(pynvml.nvmlDeviceGetUUID(h))
                try:
                    uuid = nvml_uuid(uuid)
                except Exception:  # a MIG instance's UUID: shown as NVML gives it
                    pass
                gpus.append(Gpu(index=i, name=text(pynvml.nvmlDeviceGetName(h)), uuid=uuid,
                                sm_clock_mhz=read(lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                                max_sm_clock_mhz=read(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                                locked_by_project=uuid in locked))
            except Exception as exc:
                problems.append(f"GPU {i}: {_error_line(exc)}")
    finally:
        pynvml.nvmlShutdown()
    return tuple(gpus), (None if gpus else "NVML could not read any GPU"), problems


def node_report() -> NodeReport:
    """What is on the machine (and network namespace) this runs in. Changes nothing."""
    problems: list[str] = []
    ip: str | None = None
    try:
        ip = ray.util.get_node_ip_address()
    except Exception as exc:
        problems.append(f"node ip: {_error_line(exc)}")
    try:
        interfaces = _interfaces()
    except Exception as exc:
        interfaces = ()
        problems.append(f"interfaces: {_error_line(exc)}")
    try:
        gpus, gpu_missing, gpu_problems = gpu_list()
        problems += gpu_problems
    except Exception as exc:
        gpus, gpu_missing = (), f"reading GPUs failed: {_error_line(exc)}"
    return NodeReport(hostname=socket.gethostname(), ip=ip, pid=os.getpid(), uid=os.geteuid(),
                      root=os.geteuid() == 0, net_admin=has_net_admin(), netns_missing=missing_privileges(),
                      interfaces=interfaces, gpus=gpus, gpu_missing=gpu_missing, problems=tuple(problems))


# --------------------------------------------------------------------------- the cluster


def pods_of(resources: dict[str, Any]) -> tuple[str, ...]:
    """The ``pod<i>`` resources among a Ray node's, in pod order."""
    found = [(int(m.group(1)), r) for r in resources if (m := _POD_RE.match(r))]
    return tuple(r for _, r in sorted(found))


def cluster_status(allowlist: Sequence[str] = ("eth0",), timeout_s: float = 30.0) -> ClusterReport:
    """Every node Ray lists (dead ones too), with its resources and its own :func:`node_report`;
    the pods found, and on each pod's node which ``allowlist`` interfaces (the spec's
    ``testbed.fault_interfaces``) exist there."""
    _require_ray()
    listed = ray.nodes()
    results = {r.node_id: r for r in _run_on(_alive(listed), node_report, (), timeout_s)}
    nodes = []
    for n in listed:
        res = n.get("Resources") or {}
        r = results.get(n["NodeID"])
        alive = bool(n.get("Alive"))
        error = None if r is None or r.ok else r.error
        if not alive:
            error = f"dead ({n.get('DeathReasonMessage') or 'no reason given'})"
        nodes.append(NodeStatus(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"), alive=alive,
                                head=RAY_HEAD_RESOURCE in res or HEAD in res, cpus=float(res.get("CPU", 0)),
                                gpus=float(res.get("GPU", 0)), pods=pods_of(res),
                                report=r.value if r is not None and r.ok else None, error=error))

    def order(s: NodeStatus) -> tuple[Any, ...]:
        first = int(_POD_RE.match(s.pods[0]).group(1)) if s.pods else -1  # type: ignore[union-attr]
        return (not s.head, not s.alive, first, s.ip)

    nodes.sort(key=order)
    allow = tuple(dict.fromkeys(allowlist))
    pods = pods_of({p: 1.0 for s in nodes if s.alive for p in s.pods})
    placements = []
    for pod in pods:
        for s in nodes:
            if s.alive and pod in s.pods:
                have = s.interface_names
                placements.append(PodPlacement(
                    pod=pod, node_id=s.node_id, ip=s.ip,
                    allowlisted=None if have is None else tuple(i for i in allow if i in have),
                    missing=None if have is None else tuple(i for i in allow if i not in have)))
    return ClusterReport(nodes=tuple(nodes), pods=pods, placements=tuple(placements), allowlist=allow)


def _clear_this_node() -> list[str]:
    from testbed.faults.agent_actor import clear_host_faults

    return clear_host_faults()


def clear_cluster_faults(timeout_s: float = 120.0) -> list[NodeResult]:
    """``testbed faults clear`` on every alive node: its qdiscs, ifb devices, cgroups and GPU clock
    locks (``clear_host_faults``). Idempotent; each result's ``value`` is what that node removed."""
    _require_ray()
    return run_on_every_node(_clear_this_node, timeout_s=timeout_s)


# --------------------------------------------------------------------------- rendering


def _fmt_count(x: float) -> str:
    return f"{x:g}"


def _interface_line(i: Interface, allow: Sequence[str]) -> str:
    parts = [f"{i.name}{'*' if i.name in allow else ''}", i.operstate]
    if i.speed_mbps:
        parts.append(f"{i.speed_mbps} Mb/s")
    if i.addresses:
        parts.append(" ".join(i.addresses))
    if i.project_shaping:
        parts.append(f"[shaped: {'+'.join(i.project_shaping)}]")
    return " ".join(parts)


def render(report: ClusterReport, console: Any) -> None:
    """Print ``report`` on a rich ``console``: the nodes, the pods, the problems.
    Interfaces marked ``*`` are in the allowlist (the only ones faults touch)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"nodes ({sum(n.alive for n in report.nodes)} alive)", show_lines=True)
    for col in ("node", "ip", "host", "pods", "CPUs", "GPUs", "root", "interfaces (* allowlisted)"):
        t.add_column(col)
    for n in report.nodes:
        node = n.node_id[:8] + (" (head)" if n.head else "")
        r = n.report
        if r is None:
            t.add_row(node, n.ip, "", ", ".join(n.pods) or "-", _fmt_count(n.cpus), _fmt_count(n.gpus), "",
                      f"[red]{escape(n.error or 'no report')}[/red]")
            continue
        if r.gpus:
            gpus = "\n".join([_fmt_count(n.gpus)] + [f"{g.name} {g.uuid}" + (" [locked]" if g.locked_by_project else "")
                                                       for g in r.gpus])
        else:
            gpus = f"{_fmt_count(n.gpus)}\nno GPU ({r.gpu_missing})"
        root = ("yes" if r.root else f"no (uid {r.uid})") + ("" if r.net_admin else "\nno CAP_NET_ADMIN")
        t.add_row(node, n.ip, r.hostname, ", ".join(n.pods) or "-", _fmt_count(n.cpus), escape(gpus), root,
                  escape("\n".join(_interface_line(i, report.allowlist) for i in r.interfaces)))
    console.print(t)
    if report.placements:
        p = Table(title=f"pods ({len(report.pods)}), allowlist: {', '.join(report.allowlist) or '(empty)'}")
        for col in ("pod", "node", "allowlisted interfaces", "missing"):
            p.add_column(col)
        for pl in report.placements:
            have = "?" if pl.allowlisted is None else (", ".join(pl.allowlisted) or "[red]none[/red]")
            missing = "?" if pl.missing is None else ", ".join(pl.missing)
            p.add_row(pl.pod, pl.ip, have, missing)
        console.print(p)
    else:
        console.print("no pod resource (pod<i>) on any alive node")
    for line in report.problems:
        console.print(f"[yellow]problem:[/yellow] {escape(line)}")
