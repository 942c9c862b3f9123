"""NIC shaping with pyroute2 (no ``tc`` CLI): the link fault of the testbed.

Everything here acts on the calling thread's network namespace (the fault
agent runs inside its node's namespace; tests wrap calls in
``testbed.machine.netns.in_netns``) and opens, uses and closes its own
``IPRoute`` handle: a pyroute2 0.9 handle belongs to the thread that opened it.

Layout on an interface ``dev``, every handle in the project's own major
``7e57`` so that ``clear_all`` can find what the project set and nothing else:

* egress (``uplink``, what leaves the node: KV pulled *from* its prefill
  engine): ``htb`` root ``7e57:`` on ``dev`` with class ``7e57:1`` limited to
  the rate and class ``7e57:2`` left at line rate;
* ingress (``downlink``, what enters it: KV its decode engine pulls): an
  ``ingress`` qdisc on ``dev`` redirects every packet (u32 + mirred) to an
  ``ifb`` device ``tb-ifb-<dev>``, which carries the same ``htb``;
* which traffic is limited: everything (default class ``:1``), or with
  ``kv_only`` only TCP/UDP over IPv4 or IPv6 with a port in the range every engine tells UCX to
  listen on (``UCX_TCP_PORT_RANGE``, testbed/machine/kv_ports.py); Ray's control
  traffic then stays at line rate;
* delay and loss: a ``netem`` child under ``7e57:1``. Kernels without netem
  (this machine) get a :class:`ShapingError` saying so;
* a link down (rate 0): htb cannot go below its rate's floor, and this kernel has
  no ``gact`` (tc's drop action) nor netem's 100% loss, so ``7e57:1`` gets a
  ``pfifo`` child of ``limit 0``, which drops every packet it is given (measured:
  a TCP connect across it times out, and the qdisc counts the drops);
* a clear heals before it removes: the shaped class is lifted to line rate and the
  qdisc removed once its queue has left (``_drain``), since removing a qdisc drops
  what it holds.

htb rather than tbf: the second class is what makes ``kv_only`` possible, and
htb is as exact as tbf for one flow (measured in tests/test_faults_shaping.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import TC_H_ROOT

# UCX listens for its TCP connections in this range (UCX_TCP_PORT_RANGE), so every KV connection
# has one end in it.
from testbed.machine.kv_ports import KV_PORT_BASE, KV_PORT_MASK

MAJOR = 0x7E57  # "test": every qdisc/class of the project has this major
ROOT = MAJOR << 16
SHAPED = ROOT | 0x1
LINE_RATE = ROOT | 0x2
NETEM = 0x7E580000
DROP = 0x7E590000
INGRESS = 0xFFFF0000
IFB_PREFIX = "tb-ifb-"
_UNLIMITED_BPS = 100e9  # the line-rate class: above anything a NIC here carries
# The most one clear waits for a healed queue to empty before removing it (see _drain):
# twice a 64 KB packet's time at 250 kbit/s, r = 0.001 of the shipped baseline.
DRAIN_S = 5.0
GSO_MAX_BYTES = 65536  # the largest packet a qdisc sees here (GSO/TSO segments, veth)
_ETH_P_ALL, _ETH_P_IP, _ETH_P_IPV6 = 0x0003, 0x0800, 0x86DD

Direction = Literal["egress", "ingress"]


class ShapingError(RuntimeError):
    """A shaping request that cannot be carried out; the message is one line."""


@dataclass(frozen=True)
class Shaping:
    """What is installed on one direction of one interface."""

    ifname: str
    direction: Direction
    rate_bps: float  # bits per second; 0: drop everything it shapes (a link down)
    kv_only: bool = False
    delay_ms: float = 0.0
    loss: float = 0.0  # fraction of packets dropped


@contextmanager
def _iproute() -> Iterator[IPRoute]:
    """An IPRoute handle on a loop of its own: pyroute2 builds its loop from the current
    policy, and under uvloop (Ray's workers) netlink sockets fail to open."""
    loop = asyncio.SelectorEventLoop()
    try:
        with IPRoute(use_event_loop=loop) as ipr:
            yield ipr
    finally:
        loop.close()


def ifb_name(ifname: str) -> str:
    return (IFB_PREFIX + ifname)[:15]  # IFNAMSIZ - 1


def _index(ipr: IPRoute, ifname: str) -> int:
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        raise ShapingError(f"interface {ifname}: not found in this network namespace")
    return idx[0]


def _root_handle(ipr: IPRoute, idx: int) -> int | None:
    for q in ipr.get_qdiscs(index=idx):
        if q["parent"] == TC_H_ROOT:
            return q["handle"]
    return None


def _del_root(ipr: IPRoute, idx: int) -> bool:
    """Remove the root qdisc if it is the project's; True if one was removed."""
    if _root_handle(ipr, idx) != ROOT:
        return False
    try:
        ipr.tc("del", index=idx, handle=ROOT, parent=TC_H_ROOT)  # needs parent=root (docs/verified.md "Deleting a root qdisc")
    except NetlinkError as e:
        if e.code != 2:  # ENOENT: removed meanwhile
            raise
    return True


@dataclass(frozen=True)
class RootQdisc:
    """An interface's root qdisc, as a link fault finds it (what `testbed doctor` reports)."""

    ifname: str
    kind: str  # mq, noqueue, pfifo_fast, fq_codel, htb, mqprio, ...
    handle: int  # 0: the kernel's own, made when the link came up
    tx_queues: int  # the device's transmit queues: mq gives each its own child qdisc

    @property
    def owner(self) -> Literal["kernel", "project", "other"]:
        """Whose it is: the kernel's default (a fault replaces it, and removing the fault's root
        gives the kernel's default back), the project's (a fault is on), or someone else's (a
        fault on the interface is refused: :func:`shape`)."""
        return "kernel" if self.handle == 0 else "project" if self.handle == ROOT else "other"


def root_qdisc(ifname: str) -> RootQdisc:
    """``ifname``'s root qdisc in this thread's network namespace (read only)."""
    with _iproute() as ipr:
        idx = _index(ipr, ifname)
        link = ipr.link("get", index=idx)[0]
        queues = int(link.get_attr("IFLA_NUM_TX_QUEUES") or 1)
        for q in ipr.get_qdiscs(index=idx):
            if q["parent"] == TC_H_ROOT:
                return RootQdisc(ifname, q.get_attr("TCA_KIND"), q["handle"], queues)
    return RootQdisc(ifname, "noqueue", 0, queues)  # a device without one transmits directly


def queued_bytes(ifname: str, direction: Direction) -> int:
    """Bytes the project's shaping of one direction of ``ifname`` holds in its queue now."""
    with _iproute() as ipr:
        idx = ipr.link_lookup(ifname=ifname if direction == "egress" else ifb_name(ifname))
        return _backlog(ipr, idx[0]) if idx else 0


def _backlog(ipr: IPRoute, idx: int) -> int:
    """Bytes the project's root qdisc on ``idx`` holds (0 if there is none)."""
    for q in ipr.get_qdiscs(index=idx):
        if q["parent"] == TC_H_ROOT and q["handle"] == ROOT:
            stats = q.get_attr("TCA_STATS") or {}
            return int(stats.get("backlog", 0))
    return 0


def _shaped_rate_Bps(ipr: IPRoute, idx: int) -> float | None:
    """The shaped class's rate (bytes/s) on ``idx``; None if there is no such class."""
    for c in ipr.get_classes(index=idx):
        if c["handle"] == SHAPED:
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS") if opts else None
            return float((opts.get_attr("TCA_HTB_RATE64") if opts else None) or (parms["rate"] if parms else 0))
    return None


def _drain(ipr: IPRoute, idx: int) -> int:
    """Lift the shaped class to line rate and wait until the project's root qdisc on ``idx``
    holds nothing, so that removing it drops no packet; returns the bytes left (0: drained).

    Why: a link that heals delivers what its queue holds. Deleting a qdisc drops its queue,
    and a throttled KV connection keeps seconds of data there (measured on the engines: up
    to 3 MB, 12 s at 2 Mbit/s), so a TCP sender whose tail was dropped resends only after
    its retransmission timeout, which that queue's delay had grown to 15-19 s: every pull
    on the connection then stalled that long after the heal
    (docs/testbed.md "When a link heals"). The wait: htb keeps a class's debt in time, not
    bytes, so the class releases its queue once the debt of its last packet at the old rate
    is paid, at most one GSO-sized packet plus the burst at that rate (0.26 s at 2 Mbit/s);
    bounded by DRAIN_S."""
    if _root_handle(ipr, idx) != ROOT or any(q["handle"] == DROP for q in ipr.get_qdiscs(index=idx)):
        return 0  # nothing of ours, or a link down: its pfifo of no room holds nothing
    old = _shaped_rate_Bps(ipr, idx)
    if not old:
        return _backlog(ipr, idx)
    line = int(_UNLIMITED_BPS / 8)
    ipr.tc("change-class", "htb", idx, SHAPED, parent=ROOT, rate=line, ceil=line, quantum=200000)
    deadline = time.monotonic() + min(DRAIN_S, 2 * (GSO_MAX_BYTES + max(3200, old * 0.004)) / old)
    while (left := _backlog(ipr, idx)) and time.monotonic() < deadline:
        time.sleep(0.005)
    return left


def _has_ingress(ipr: IPRoute, idx: int) -> bool:
    return any(q["handle"] == INGRESS for q in ipr.get_qdiscs(index=idx))


def netem_missing() -> str | None:
    """None if this kernel has netem, else why delay/loss cannot be applied."""
    try:
        with open("/proc/config.gz", "rb") as f:
            import gzip

            config = gzip.decompress(f.read()).decode()
        if "CONFIG_NET_SCH_NETEM=y" in config or "CONFIG_NET_SCH_NETEM=m" in config:
            return None
        return "this kernel has no netem (CONFIG_NET_SCH_NETEM is not set): delay and loss faults cannot be applied"
    except OSError:
        pass
    import glob
    import os

    release = os.uname().release
    if glob.glob(f"/lib/modules/{release}/kernel/net/sched/sch_netem.ko*") or os.path.isdir("/sys/module/sch_netem"):
        return None
    return f"no netem module for kernel {release}: delay and loss faults cannot be applied"


def burst_bytes(rate_bps: float) -> int:
    """What the shaped class lets through at once at ``rate_bps`` (its burst and cburst): one
    MTU-sized burst at low rates; 4 ms of traffic at high ones (timer granularity)."""
    return max(3200, int(max(rate_bps / 8, 125) * 0.004))


def _install_htb(ipr: IPRoute, idx: int, s: Shaping) -> None:
    rate_Bps = max(int(s.rate_bps / 8), 125)  # htb takes bytes/s; at least 1 kbit/s
    burst = burst_bytes(s.rate_bps)
    ipr.tc("add", "htb", idx, ROOT, default=(LINE_RATE if s.kv_only else SHAPED) & 0xFFFF)
    ipr.tc("add-class", "htb", idx, SHAPED, parent=ROOT, rate=rate_Bps, ceil=rate_Bps, burst=burst, cburst=burst,
           quantum=1514)
    line = int(_UNLIMITED_BPS / 8)
    ipr.tc("add-class", "htb", idx, LINE_RATE, parent=ROOT, rate=line, ceil=line, quantum=200000)
    if s.kv_only:
        # Source or destination port in the KV range: the 32-bit word after the IP header holds
        # both ports, at offset 20 in IPv4 (no IP options, as on every UCX/TCP packet) and 40 in
        # IPv6 (no extension headers, as on TCP).
        # (one priority per protocol: the kernel keeps one protocol's filters per priority)
        for prio, proto, offset in ((10, _ETH_P_IP, 20), (11, _ETH_P_IPV6, 40)):
            for key in (f"0x{KV_PORT_BASE << 16:08x}/0x{KV_PORT_MASK << 16:08x}+{offset}",
                        f"0x{KV_PORT_BASE:08x}/0x{KV_PORT_MASK:08x}+{offset}"):
                ipr.tc("add-filter", "u32", idx, parent=ROOT, prio=prio, protocol=proto, target=SHAPED, keys=[key])
    if s.rate_bps == 0:  # a pfifo of no room: every packet classified here is dropped
        ipr.tc("add", "pfifo", idx, DROP, parent=SHAPED, limit=0)
    elif s.delay_ms > 0 or s.loss > 0:
        why = netem_missing()
        if why:
            raise ShapingError(why)
        ipr.tc("add", "netem", idx, NETEM, parent=SHAPED, delay=int(s.delay_ms * 1000), loss=s.loss * 100)


def _ensure_ifb(ipr: IPRoute, dev_idx: int, ifname: str) -> int:
    name = ifb_name(ifname)
    found = ipr.link_lookup(ifname=name)
    if not found:
        if _has_ingress(ipr, dev_idx):  # without the project's ifb, the ingress qdisc is someone else's
            raise ShapingError(f"{ifname} ingress: an ingress qdisc the project did not set is there; "
                               "refusing to replace it")
        try:
            ipr.link("add", ifname=name, kind="ifb")
        except NetlinkError as e:
            raise ShapingError(f"cannot create ifb device {name} for ingress shaping ({e.args[1] if len(e.args) > 1 else e})") from None
        found = ipr.link_lookup(ifname=name)
    ifb = found[0]
    ipr.link("set", index=ifb, state="up")
    if not _has_ingress(ipr, dev_idx):
        ipr.tc("add", "ingress", dev_idx, INGRESS)
        ipr.tc("add-filter", "u32", dev_idx, parent=INGRESS, prio=10, protocol=_ETH_P_ALL, keys=["0x0/0x0+0"],
               target=0x1, action=dict(kind="mirred", direction="egress", action="redirect", ifindex=ifb))
    return ifb


def shape(s: Shaping) -> None:
    """Make it so: ``s`` is what shapes ``s.direction`` of ``s.ifname`` (replacing the project's earlier one)."""
    if not s.rate_bps >= 0:
        raise ShapingError(f"{s.ifname}: rate must be 0 (down) or positive, got {s.rate_bps}")
    with _iproute() as ipr:
        dev = _index(ipr, s.ifname)
        target = _ensure_ifb(ipr, dev, s.ifname) if s.direction == "ingress" else dev
        root = _root_handle(ipr, target)
        # Handle 0 is the kernel's default root (mq over a multi-queue NIC's queues, noqueue on a
        # veth): replaced while the fault is on; removing the project's root brings it back.
        if root not in (None, ROOT, 0):
            raise ShapingError(f"{s.ifname} {s.direction}: a root qdisc (handle {root >> 16:x}:) the project did not "
                               "set is there; refusing to replace it")
        _del_root(ipr, target)
        try:
            _install_htb(ipr, target, s)
        except BaseException:
            _del_root(ipr, target)
            if s.direction == "ingress":
                _remove_ingress(ipr, s.ifname)
            raise


def _remove_ingress(ipr: IPRoute, ifname: str) -> int | None:
    """Remove the project's ingress shaping of ``ifname``: None if there was none, else the bytes
    its queue still held when removed (dropped; 0: delivered whole)."""
    removed, left = False, 0
    dev = ipr.link_lookup(ifname=ifname)
    ifb = ipr.link_lookup(ifname=ifb_name(ifname))
    if ifb:
        left = _drain(ipr, ifb[0])  # before the redirect goes: what the ifb holds is delivered
    if dev and ifb and _has_ingress(ipr, dev[0]):
        # Only an ingress qdisc whose redirect the project made (its ifb exists) is removed.
        ipr.tc("del", "ingress", dev[0], INGRESS)
        removed = True
    if ifb:
        ipr.link("del", index=ifb[0])
        removed = True
    return left if removed else None


def remove(ifname: str, direction: Direction) -> int | None:
    """Heal and remove the project's shaping of one direction of ``ifname``; idempotent. None if
    there was none, else the bytes its queue still held when removed, which the removal dropped
    (0: what it held was delivered, see _drain): the counter that tells a heal that cost its
    connections a resend from one that did not."""
    with _iproute() as ipr:
        if direction == "egress":
            dev = ipr.link_lookup(ifname=ifname)
            if not dev:
                return None
            left = _drain(ipr, dev[0])
            return left if _del_root(ipr, dev[0]) else None
        return _remove_ingress(ipr, ifname)


def unshape(ifname: str, direction: Direction) -> bool:
    """Remove the project's shaping from one direction of ``ifname``; idempotent. True if something was removed."""
    return remove(ifname, direction) is not None


def installed(ifname: str) -> dict[str, float]:
    """Rates (bit/s) the project's shaping sets on ``ifname``, by direction; {} if none."""
    out: dict[str, float] = {}
    with _iproute() as ipr:
        for direction, name in (("egress", ifname), ("ingress", ifb_name(ifname))):
            idx = ipr.link_lookup(ifname=name)
            if not idx or _root_handle(ipr, idx[0]) != ROOT:
                continue
            if any(q["handle"] == DROP for q in ipr.get_qdiscs(index=idx[0])):
                out[direction] = 0.0
                continue
            rate = _shaped_rate_Bps(ipr, idx[0])
            if rate is not None:
                out[direction] = rate * 8
    return out


def clear_all(allowlist: frozenset[str] | None = None) -> list[str]:
    """Remove every shaping the project set in this namespace (``allowlist``: only on those
    interfaces). Returns what was removed, as ``dev/direction``; idempotent."""
    removed = []
    with _iproute() as ipr:
        for link in ipr.get_links():
            name = link.get("ifname")
            if name is None or name.startswith(IFB_PREFIX):
                continue
            if allowlist is not None and name not in allowlist:
                continue
            _drain(ipr, link["index"])
            if _del_root(ipr, link["index"]):
                removed.append(f"{name}/egress")
            if _remove_ingress(ipr, name) is not None:
                removed.append(f"{name}/ingress")
        # An ifb whose parent interface went away (or was renamed) is still the project's.
        for link in ipr.get_links():
            name = link.get("ifname") or ""
            if name.startswith(IFB_PREFIX) and (allowlist is None or name[len(IFB_PREFIX):] in allowlist):
                ipr.link("del", index=link["index"])
                removed.append(name)
    return removed


def settled(clear: Callable[[], list[str]], tries: int = 3) -> list[str]:
    """``clear()`` again when netlink fails under it: another agent of the namespace clearing its own
    fault meanwhile (its TTL, or a pod's agent beside the head's on one node) makes a qdisc or ifb
    vanish between listing and deleting. Already gone is success; a failure that persists is raised."""
    from pyroute2.netlink.exceptions import NetlinkError

    for attempt in range(tries):
        try:
            return clear()
        except NetlinkError:
            if attempt == tries - 1:
                raise
    return []


def route_via(ifname: str, candidates: Sequence[str]) -> str | None:
    """The first of ``candidates`` whose route from this network namespace leaves through
    ``ifname`` (the kernel's own lookup: ``ip route get``), or None. A local address routes
    over loopback, and an address another interface reaches routes there: neither is a path
    through what a fault on ``ifname`` shapes."""
    with _iproute() as ipr:
        idx = _index(ipr, ifname)
        for addr in candidates:
            try:
                routes = ipr.route("get", dst=addr)
            except NetlinkError:  # unreachable from here
                continue
            if routes and routes[0].get_attr("RTA_OIF") == idx and routes[0]["type"] != 2:  # 2: RTN_LOCAL
                return addr
    return None


def _stats(ifname: str) -> dict[str, int]:
    with _iproute() as ipr:
        idx = _index(ipr, ifname)
        return dict(ipr.link("get", index=idx)[0].get("IFLA_STATS64"))


def tx_bytes(ifname: str) -> int:
    """Bytes ``ifname`` transmitted so far (IFLA_STATS64); for the ifb, what left the ingress shaper."""
    return int(_stats(ifname)["tx_bytes"])


@contextmanager
def counter(ifname: str, received: bool = False) -> Iterator[Callable[[], tuple[int, int | None]]]:
    """A reader of what to measure a rate on ``ifname`` by, over one netlink handle held while it is
    used: (bytes, backlog). Where the project shapes ``ifname`` (looked up once, at the start) the
    bytes its limited class has sent (with ``kv_only`` the interface also carries the unshaped rest)
    and the bytes queued in that class, which say whether the shaper was busy (None for a link down,
    whose queue of no room is never busy); else the interface's transmit counter (with
    ``received``, its receive counter) and None. One handle because a probe reads every few
    milliseconds beside its own load in the same process: a handle opened per read cost 4.2 ms of
    CPU, one held 0.67 ms (2-core machine, 2026-11-30), and the reads' share of the interpreter is
    time the load's threads do not send."""
    with _iproute() as ipr:
        idx = _index(ipr, ifname)
        shaped = not received and _root_handle(ipr, idx) == ROOT
        down = shaped and any(q["handle"] == DROP for q in ipr.get_qdiscs(index=idx))

        def read() -> tuple[int, int | None]:
            if shaped:
                for c in ipr.get_classes(index=idx):
                    if c["handle"] == SHAPED:
                        stats = c.get_attr("TCA_STATS")
                        return int(stats["bytes"]), None if down else int(stats["backlog"])
                raise ShapingError(f"interface {ifname}: the project's limited class went away while it was read")
            stats = ipr.link("get", index=idx)[0].get("IFLA_STATS64")
            return int(stats["rx_bytes" if received else "tx_bytes"]), None

        yield read


def has_link(ifname: str) -> bool:
    with _iproute() as ipr:
        return bool(ipr.link_lookup(ifname=ifname))
