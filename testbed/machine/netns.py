"""Network namespaces for the emulated cluster (pyroute2 only, no ``ip``/``tc``).

One namespace per node, joined by a veth pair to a bridge in a "core"
namespace. For run id ``R`` and pods ``0 .. P-1``, with the default subnet::

    tb-R-core    bridge br0 and the core-side veth ends v-head, v-pod0, ...
    tb-R-head    lo, eth0 = 10.77.0.1/24
    tb-R-pod<i>  lo, eth0 = 10.77.0.<i+2>/24

The addresses exist only inside these namespaces and there is no default
route, so nothing reaches (or leaks to) the host's networks. Shaping the pod
side ``eth0`` limits what leaves a pod; shaping the core side ``v-pod<i>``
limits what enters it.

Why not pyroute2's ``NetNS()`` or ``netns.create()``: both fork a helper
process, which is unsafe in processes with threads (Ray drivers and actors).
``setns(2)`` and ``unshare(2)`` act on the calling *thread*, so this module
switches only the calling thread (``in_netns``) and opens, uses and closes
every ``IPRoute`` handle in that thread while it is switched: a pyroute2 0.9
handle used from another thread talks to that thread's namespace.

A JSON state file is written before anything is created, so a crashed run can
be cleaned by the next ``destroy_fabric`` (or ``EmulatedCluster`` ``down``).
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2 import netns as _pr_netns

from core.util.files import write_json_atomic

NETNS_DIR = Path("/run/netns")
DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_STATE_DIR = Path("/run/testbed")
PREFIX = "tb"
HEAD = "head"
NODE_IFNAME = "eth0"
BRIDGE = "br0"

_CLONE_NEWNET = 0x40000000
_MS_BIND, _MS_REC, _MS_SHARED = 0x1000, 0x4000, 0x100000
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,12}$")
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """A namespace operation failed; the message is one line."""


class NetnsPermissionError(NetnsError):
    """This process lacks the privileges to build namespaces."""


def effective_caps(status_text: str | None = None) -> int:
    """This process's effective capability bits (``CapEff`` of ``/proc/self/status``, or of ``status_text``)."""
    if status_text is None:
        status_text = Path("/proc/self/status").read_text()
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status_text, re.M)
    return int(m.group(1), 16) if m else 0


def has_net_admin(status_text: str | None = None) -> bool:
    """CAP_NET_ADMIN in the effective set: what shaping an interface needs (a cluster node's agent)."""
    return bool(effective_caps(status_text) >> _CAP_NET_ADMIN & 1)


def missing_privileges(status_text: str | None = None) -> str | None:
    """Why this process cannot build namespaces (one line), or None if it can.

    Reads the effective capabilities (``CapEff`` of ``/proc/self/status``)
    rather than the uid: root in a container may lack them, and a capable
    non-root process would do."""
    caps = effective_caps(status_text)
    lacking = [name for bit, name in ((_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"), (_CAP_NET_ADMIN, "CAP_NET_ADMIN"))
               if not caps >> bit & 1]
    if not lacking:
        return None
    return (f"network namespaces need root ({' and '.join(lacking)} missing, uid {os.geteuid()}): "
            "run as root, or use the single-node local mode")


def require_privileges() -> None:
    reason = missing_privileges()
    if reason is not None:
        raise NetnsPermissionError(reason)


def pod_name(pod: int) -> str:
    return f"pod{pod}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run_id {run_id!r}: expected 1-12 characters of [a-z0-9]")
    return run_id


def run_prefix(run_id: str) -> str:
    """Prefix of every namespace of the run (``tb-<run id>-``)."""
    return f"{PREFIX}-{check_run_id(run_id)}-"


@dataclass(frozen=True)
class NodeLink:
    """One emulated node: its namespace, address, and the two ends of its veth."""

    name: str  # "head", "pod0", ...
    netns: str  # namespace holding the node and the ``ifname`` end
    address: str  # IPv4 address of ``ifname``
    core_ifname: str  # the other end, in the core namespace, enslaved to the bridge
    ifname: str = NODE_IFNAME


@dataclass(frozen=True)
class Fabric:
    """The planned (pure) layout of one run's namespaces and links."""

    run_id: str
    core_netns: str
    bridge: str
    subnet: str
    nodes: tuple[NodeLink, ...]  # head first, then pods in order

    @classmethod
    def plan(cls, run_id: str, n_pods: int, subnet: str = DEFAULT_SUBNET) -> Fabric:
        prefix = run_prefix(run_id)
        if not isinstance(n_pods, int) or n_pods < 1:
            raise ValueError(f"n_pods: expected a positive integer, got {n_pods!r}")
        try:
            net = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as e:
            raise ValueError(f"subnet {subnet!r}: not an IPv4 network ({e})") from None
        hosts = net.hosts()
        names = [HEAD] + [pod_name(i) for i in range(n_pods)]
        nodes = []
        for name in names:
            address = next(hosts, None)
            if address is None:
                raise ValueError(f"subnet {subnet}: too small for {len(names)} nodes (head + {n_pods} pods)")
            nodes.append(NodeLink(name=name, netns=prefix + name, address=str(address), core_ifname=f"v-{name}"))
        return cls(run_id=run_id, core_netns=prefix + "core", bridge=BRIDGE, subnet=str(net), nodes=tuple(nodes))

    @property
    def prefixlen(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen

    @property
    def head(self) -> NodeLink:
        return self.nodes[0]

    @property
    def pods(self) -> tuple[NodeLink, ...]:
        return self.nodes[1:]

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the run, core last (it goes last on teardown)."""
        return tuple(n.netns for n in self.nodes) + (self.core_netns,)

    def node(self, name: str) -> NodeLink:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"node {name!r}: not in run {self.run_id} (nodes: {', '.join(n.name for n in self.nodes)})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fabric:
        return cls(run_id=d["run_id"], core_netns=d["core_netns"], bridge=d["bridge"], subnet=d["subnet"],
                   nodes=tuple(NodeLink(**n) for n in d["nodes"]))


@dataclass(frozen=True)
class LinkCounters:
    """An interface's byte and packet counters (``IFLA_STATS64``), since creation."""

    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


# ---------------------------------------------------------------- state file

def state_file(state_dir: str | Path, run_id: str) -> Path:
    return Path(state_dir) / f"{check_run_id(run_id)}.json"


def read_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise NetnsError(f"state file {path}: not valid JSON ({e})") from None


def update_state(path: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into the state file (created if absent), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = read_state(path) if path.exists() else {}
    state.update(fields)
    write_json_atomic(path, state, indent=1)
    return state


# ---------------------------------------------------------------- namespaces

def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def list_namespaces(prefix: str = PREFIX + "-") -> list[str]:
    """Named namespaces (in /run/netns) whose name starts with ``prefix``."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def _setns_fd(fd: int) -> None:
    # pyroute2's setns with an open fd: the syscall on this thread, no fork.
    _pr_netns.setns(fd)


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the block with the calling thread (only) inside namespace ``name``.

    Sockets and ``IPRoute`` handles opened in the block belong to ``name``;
    open, use and close them in this thread."""
    try:
        target = os.open(netns_path(name), os.O_RDONLY)
    except FileNotFoundError:
        raise NetnsError(f"namespace {name}: does not exist") from None
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns_fd(target)
        try:
            yield
        finally:
            _setns_fd(saved)
    finally:
        os.close(target)
        os.close(saved)


def _ensure_shared_rundir() -> None:
    # As iproute2 does: make /run/netns a shared mount, so the bind mounts in
    # it (and their removal) propagate to mount namespaces made by netns_exec.
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    d = bytes(NETNS_DIR)
    if _libc.mount(b"none", d, None, _MS_SHARED | _MS_REC, None) == 0:
        return
    if _libc.mount(d, d, b"none", _MS_BIND | _MS_REC, None) != 0 or \
            _libc.mount(b"none", d, None, _MS_SHARED | _MS_REC, None) != 0:
        raise NetnsError(f"{NETNS_DIR}: cannot make it a shared mount ({os.strerror(ctypes.get_errno())})")


def create_namespace(name: str) -> None:
    """Create the named namespace ``name`` without forking (unshare on this thread, bind-mount, switch back)."""
    require_privileges()
    _ensure_shared_rundir()
    path = netns_path(name)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    except FileExistsError:
        raise NetnsError(f"namespace {name}: exists already (left by a crashed run? tear it down first)") from None
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if _libc.unshare(_CLONE_NEWNET) != 0:
            raise NetnsError(f"namespace {name}: unshare failed ({os.strerror(ctypes.get_errno())})")
        try:
            if _libc.mount(b"/proc/thread-self/ns/net", bytes(path), b"none", _MS_BIND, None) != 0:
                raise NetnsError(f"namespace {name}: bind mount failed ({os.strerror(ctypes.get_errno())})")
        finally:
            _setns_fd(saved)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(saved)


def remove_namespace(name: str) -> bool:
    """Unmount and unlink the named namespace; False if it was not there.

    The kernel frees it once no process (or open fd) holds it any more."""
    if not netns_path(name).exists():
        return False
    try:
        _pr_netns.remove(name)  # umount2(MNT_DETACH) + unlink, no fork
    except FileNotFoundError:
        return False
    return True


def _ns_inodes(names: Iterable[str]) -> dict[tuple[int, int], str]:
    inodes = {}
    for name in names:
        try:
            st = os.stat(netns_path(name))
        except FileNotFoundError:
            continue
        inodes[(st.st_dev, st.st_ino)] = name
    return inodes


def _pids_in(inodes: dict[tuple[int, int], str]) -> dict[int, str]:
    found: dict[int, str] = {}
    if not inodes:
        return found
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, zombie, or not ours to see
            continue
        name = inodes.get((st.st_dev, st.st_ino))
        if name is not None:
            found[int(entry)] = name
    return found


def processes_in_namespaces(names: Iterable[str]) -> dict[int, str]:
    """PIDs of processes (other than this one) whose network namespace is one of ``names``."""
    return _pids_in(_ns_inodes(names))


def _kill_all_in(inodes: dict[tuple[int, int], str], timeout_s: float) -> list[int]:
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while pids := _pids_in(inodes):
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {sorted(pids)} in {sorted(set(pids.values()))} survived SIGKILL for {timeout_s} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed


def kill_processes_in(names: Iterable[str], timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process inside ``names`` and wait until none is left; return the PIDs killed."""
    return _kill_all_in(_ns_inodes(names), timeout_s)


# ---------------------------------------------------------------- the fabric

def create_fabric(fabric: Fabric, state_path: str | Path | None = None) -> None:
    """Build the namespaces, bridge and veth links of ``fabric``.

    With ``state_path`` the layout is recorded there *before* anything is
    created. On any failure everything made so far is removed again."""
    require_privileges()
    clash = sorted(set(fabric.namespaces) & set(list_namespaces(run_prefix(fabric.run_id))))
    if clash:
        raise NetnsError(f"namespaces {', '.join(clash)} exist already (a crashed run {fabric.run_id}? "
                         "run its down first)")
    if state_path is not None:
        update_state(state_path, run_id=fabric.run_id, fabric=fabric.to_dict())
    try:
        for name in fabric.namespaces:
            create_namespace(name)
        node_fds = {n.name: os.open(netns_path(n.netns), os.O_RDONLY) for n in fabric.nodes}
        try:
            with in_netns(fabric.core_netns), IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                ipr.link("add", ifname=fabric.bridge, kind="bridge")
                br = ipr.link_lookup(ifname=fabric.bridge)[0]
                ipr.link("set", index=br, state="up")
                for n in fabric.nodes:
                    # The peer is born inside the node's namespace: no rename, no move.
                    ipr.link("add", ifname=n.core_ifname, kind="veth",
                             peer={"ifname": n.ifname, "net_ns_fd": node_fds[n.name]})
                    ipr.link("set", index=ipr.link_lookup(ifname=n.core_ifname)[0], master=br, state="up")
        finally:
            for fd in node_fds.values():
                os.close(fd)
        for n in fabric.nodes:
            with in_netns(n.netns), IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                idx = ipr.link_lookup(ifname=n.ifname)[0]
                ipr.addr("add", index=idx, address=n.address, prefixlen=fabric.prefixlen)
                ipr.link("set", index=idx, state="up")
    except BaseException:
        destroy_fabric(fabric)
        raise


def destroy_fabric(fabric: Fabric | None = None, run_id: str | None = None, kill_stragglers: bool = True) -> list[str]:
    """Remove a run's links and namespaces; idempotent. Returns the namespaces removed.

    Also removes namespaces with the run's prefix that the layout does not
    name (a crash between creating and recording). Processes still inside
    are SIGKILLed first (``kill_stragglers``), since a namespace only goes
    away once nothing holds it. The veths and the bridge are deleted
    explicitly: the kernel frees a dropped namespace asynchronously."""
    if fabric is None and run_id is None:
        raise ValueError("destroy_fabric: give a fabric or a run_id")
    run_id = fabric.run_id if fabric is not None else run_id
    names = set(list_namespaces(run_prefix(run_id)))
    if fabric is not None:
        names |= {n for n in fabric.namespaces if netns_path(n).exists()}
    if not names:
        return []
    # Hold every namespace open until the end: its inode number cannot be reused by
    # another namespace meanwhile, so the final sweep by inode kills nothing of anyone else's.
    held = {}
    for n in names:
        try:
            held[n] = os.open(netns_path(n), os.O_RDONLY)
        except FileNotFoundError:
            pass
    try:
        nsfs = os.stat("/proc/self/ns/net").st_dev  # a name whose mount never happened is a plain file
        inodes = {(st.st_dev, st.st_ino): n for n, st in ((n, os.fstat(fd)) for n, fd in held.items())
                  if st.st_dev == nsfs}
        if kill_stragglers:
            _kill_all_in(inodes, 5.0)
        core = fabric.core_netns if fabric is not None else run_prefix(run_id) + "core"
        if core in inodes.values():
            with in_netns(core), IPRoute() as ipr:
                for link in ipr.get_links():
                    if link.get("ifname") != "lo":
                        try:
                            ipr.link("del", index=link["index"])
                        except Exception:  # a veth vanishes with its peer: already gone is fine
                            pass
        removed = [n for n in sorted(names, key=lambda n: n == core) if remove_namespace(n)]
        if kill_stragglers:  # one that opened a namespace just before its name went, and entered after the scan
            _kill_all_in(inodes, 5.0)
    finally:
        for fd in held.values():
            os.close(fd)
    return removed


def destroy_fabric_from_state(state_path: str | Path) -> list[str]:
    """``destroy_fabric`` for the run recorded in a state file (no-op if it records no fabric)."""
    state = read_state(state_path)
    if state.get("fabric"):
        return destroy_fabric(Fabric.from_dict(state["fabric"]))
    if state.get("run_id"):
        return destroy_fabric(run_id=state["run_id"])
    return []


# ---------------------------------------------------------------- use

@contextmanager
def link_stats(netns: str, ifname: str) -> Iterator[Callable[[], dict[str, int]]]:
    """A reader of interface ``ifname``'s counters (``IFLA_STATS64``) in namespace ``netns``, for
    one thread: the block runs inside the namespace, with one netlink socket for every read."""
    with in_netns(netns), IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise NetnsError(f"interface {ifname}: not in namespace {netns}")
        yield lambda: dict(ipr.link("get", index=idx[0])[0].get("IFLA_STATS64"))


def link_counters(netns: str, ifname: str) -> LinkCounters:
    """Byte/packet counters of interface ``ifname`` in namespace ``netns``."""
    with link_stats(netns, ifname) as read:
        stats = read()
    return LinkCounters(rx_bytes=int(stats["rx_bytes"]), tx_bytes=int(stats["tx_bytes"]),
                        rx_packets=int(stats["rx_packets"]), tx_packets=int(stats["tx_packets"]))


# Runs in a fresh interpreter (python -I -S) so that no thread exists when it
# switches, then execs the command. Like ``ip netns exec`` it also gives the
# command a private mount namespace with /sys remounted, so /sys/class/net
# lists the namespace's own devices (UCX looks for eth0 there). Unlike it, the
# cgroup mounts under /sys/fs/cgroup stay: a fresh sysfs has none, and the node's
# compute-fault agent finds the cpu controller there (testbed/faults/cgroups.py;
# docs/testbed.md "Compute slow-down"). They are held aside first and mounted back
# onto the new sysfs after, the same hierarchies, so a process's cgroup is the host's.
_EXEC_SHIM = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def die(what, err=None):
    err = ctypes.get_errno() if err is None else err
    sys.stderr.write("netns exec %s: %s failed: %s\n" % (sys.argv[1], what, os.strerror(err)))
    os._exit(126)
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as e:
    die("open", e.errno)
if libc.setns(fd, 0x40000000):
    die("setns")
os.close(fd)
if libc.unshare(0x00020000):
    die("unshare(CLONE_NEWNS)")
if libc.mount(b"none", b"/", None, 0x80000 | 0x4000, None):
    die("mount --make-rslave /")
MS_BIND, MS_REC, MNT_DETACH = 0x1000, 0x4000, 2
cg = "/sys/fs/cgroup"
with open("/proc/self/mountinfo") as f:
    has_cg = any(l.split()[4] == cg or l.split()[4].startswith(cg + "/") for l in f)
tree = aside = None
if has_cg:
    # open_tree(OPEN_TREE_CLONE | AT_RECURSIVE) holds the hierarchies as a detached
    # mount with no path, so a shim killed half-way leaves nothing behind (Linux 5.2+;
    # syscall numbers 428/429 are the same on every architecture).
    tree = libc.syscall(428, -100, cg.encode(), 0x1 | 0o2000000 | 0x8000)
    if tree < 0:
        tree = None
        import tempfile
        aside = tempfile.mkdtemp(prefix="testbed-netns-cgroup-")
        if libc.mount(cg.encode(), aside.encode(), None, MS_BIND | MS_REC, None):
            die("bind " + cg)
libc.umount2(b"/sys", MNT_DETACH)
if libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None):
    die("mount /sys")
if tree is not None:
    if libc.syscall(429, tree, b"", -100, cg.encode(), 0x4):  # move_mount, MOVE_MOUNT_F_EMPTY_PATH
        die("move_mount " + cg)
    os.close(tree)
elif aside is not None:
    if libc.mount(aside.encode(), cg.encode(), None, MS_BIND | MS_REC, None):
        die("bind back " + cg)
    libc.umount2(aside.encode(), MNT_DETACH)
    os.rmdir(aside)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write("netns exec %s: %s: %s\n" % (sys.argv[1], sys.argv[2], e.strerror))
    os._exit(127)
"""


def netns_exec_argv(netns: str, argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` inside namespace ``netns`` (like ``ip netns exec``).

    The shim execs, so the PID of the process started with it is the
    command's own PID."""
    if not argv:
        raise ValueError("netns_exec_argv: empty command")
    return [sys.executable, "-I", "-S", "-c", _EXEC_SHIM, str(netns_path(netns)), *map(str, argv)]
