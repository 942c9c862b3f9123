"""A node's RDMA devices as sysfs shows them, and the engine settings that put the KV in a traffic class.

Read by the dcb rate limit (testbed/faults/dcb.py), the doctor's ``rdma`` line and the engines'
environment (testbed/engines/engine.py), which must not import the fault injectors: so here, below
both. Never run on an RDMA NIC (none on these machines): the tests read a sysfs tree written from the
kernel's layout (docs/cluster.md "RDMA: what could fault it").
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS = Path("/sys")
# UCX's own RoCEv2 traffic class when unset (UCT_IB_DEFAULT_ROCEV2_DSCP in src/uct/ib/base/ib_device.h):
# the IP header's whole TOS byte, DSCP 26 in its six high bits and ECT(0) in its two ECN bits.
UCX_ROCE_TRAFFIC_CLASS = 106


def nic_driver(ifname: str, sysfs: Path = SYSFS) -> str | None:
    """The kernel driver of ``ifname``'s device (``mlx5_core`` on ConnectX); None for a virtual one."""
    try:
        return Path(os.readlink(sysfs / "class" / "net" / ifname / "device" / "driver")).name
    except OSError:
        return None


def rdma_devices(sysfs: Path = SYSFS) -> dict[str, tuple[str, ...]]:
    """Each RDMA device of this node (/sys/class/infiniband) with the network interfaces of its PCI device."""
    root = sysfs / "class" / "infiniband"
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        return {}
    found = {}
    for name in names:
        try:
            found[name] = tuple(sorted(p.name for p in (root / name / "device" / "net").iterdir()))
        except OSError:
            found[name] = ()
    return found


def rdma_port_of(ifname: str, sysfs: Path = SYSFS) -> str | None:
    """The RDMA port whose network interface is ``ifname``, as UCX_NET_DEVICES names it ("mlx5_0:1"), or
    None: the netdev of each port's first GID (ports/N/gid_attrs/ndevs/0, where UCX reads it too), else
    port 1 of a device whose PCI function has that interface."""
    root = sysfs / "class" / "infiniband"
    for dev, nets in rdma_devices(sysfs).items():
        try:
            ports = sorted((p for p in (root / dev / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            ports = []
        for port in ports:
            try:
                if (port / "gid_attrs" / "ndevs" / "0").read_text().strip() == ifname:
                    return f"{dev}:{port.name}"
            except OSError:
                continue
        if ifname in nets:
            return f"{dev}:1"
    return None


def kv_class_environment(dscp: int, priority: int | None = None, rdma_device: str | None = None) -> dict[str, str]:
    """The engine environment entries that put the KV in its class: UCX's RoCEv2 traffic class, the IP
    header's TOS byte (UCX_IB_TRAFFIC_CLASS, "IB Traffic Class / RoCEv2 Differentiated Services Code
    Point", UCX's src/uct/ib/base/ib_iface.c), as ``dscp`` in its six high bits with the two ECN bits
    of UCX's own default (106: DSCP 26, ECT(0)), so only the DSCP differs from what UCX sends unasked.
    ``priority``: UCX_IB_SL, which on RoCEv2 is the Ethernet priority (a NIC that trusts PCP maps it
    to a class; one that trusts DSCP, as docs/cluster.md has it, ignores it). ``rdma_device``
    ("mlx5_0:1"): UCX_NET_DEVICES, so the KV takes the NIC whose class is limited and no other."""
    if isinstance(dscp, bool) or not isinstance(dscp, int) or not 0 <= dscp <= 63:
        raise ValueError(f"a DSCP is 0-63, got {dscp!r}")
    env = {"UCX_IB_TRAFFIC_CLASS": str(dscp << 2 | UCX_ROCE_TRAFFIC_CLASS & 0b11)}
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 7:
            raise ValueError(f"an Ethernet priority is 0-7, got {priority!r}")
        env["UCX_IB_SL"] = str(priority)
    if rdma_device:
        env["UCX_NET_DEVICES"] = rdma_device
    return env
