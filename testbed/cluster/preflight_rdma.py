"""The preflight check of the KV over RDMA (`testbed doctor`'s `rdma` line; testbed/cluster/preflight.py):
the node's RDMA devices, and whether the spec's link faults can limit the KV there with the NIC's own
rate limit of its traffic class (testbed/faults/dcb.py). Reads only: ``dcb maxrate show``, sysfs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.cluster.checks import Check, fail, fault_refs, na, ok
from testbed.faults.dcb import DcbError, Runner, dcb_support, fmt_rate, read_maxrates
from testbed.machine.rdma import SYSFS, rdma_devices
from testbed.machine.netns import NODE_IFNAME
from vocab import MODE_LOCAL

_NO_NIC = f"each node's {NODE_IFNAME} is a veth the project makes, with no NIC rate limit"
_FIX_DCB = ("a NIC whose driver has DCB maxrate (ConnectX: mlx5_core) first in testbed.fault_interfaces, and "
            "iproute2's dcb (apt-get install iproute2); else drop the link faults or set testbed.transport: tcp")


def check_rdma(transport: str, method: str, traffic_class: int, link_faults: Sequence[int], ifname: str | None,
               emulated: bool = False, sysfs: Path = SYSFS, runner: Runner | None = None) -> Check:
    """``link_faults``: the spec's link faults that act on this node; ``ifname``: the interface they
    limit (None: none of the allowlist is here); ``emulated``: this machine alone, whose nodes are
    namespaces behind veths."""
    if transport != "rdma":
        return na("rdma", f"testbed.transport is {transport}: the KV crosses TCP, which tc shapes")
    devices = rdma_devices(sysfs)
    if not devices:
        return fail("rdma", "no RDMA device (/sys/class/infiniband lists none): UCX would move the KV over TCP",
                    "load the NIC's RDMA driver (ConnectX: mlx5_ib, with rdma-core), or set testbed.transport: tcp")
    listed = "; ".join(f"{d} ({', '.join(n) or 'no interface'})" for d, n in devices.items())
    on = NODE_IFNAME if emulated else ifname
    why = _NO_NIC if emulated else dcb_support(ifname, runner) if ifname else "none of testbed.fault_interfaces is here"
    if why is None and on and not any(on in nets for nets in devices.values()):
        why = f"{on} is no RDMA device's interface, so the KV's RDMA does not cross it"
    if not link_faults:
        dcb = "dcb maxrate answers" if why is None else f"dcb maxrate unusable ({why})"
        return ok("rdma", f"{listed}; {dcb}; no link fault of the spec limits this node")
    if method != "dcb_maxrate":
        return fail("rdma", f"{fault_refs(link_faults)} shape with tc, which RDMA bypasses",
                    "set testbed.rdma_link_faults: dcb_maxrate, or testbed.transport: tcp")
    if why is not None:
        return fail("rdma", f"{listed}; {fault_refs(link_faults)} cannot limit traffic class {traffic_class}: {why}",
                    _FIX_DCB)
    assert ifname is not None  # why is None only where dcb answered for it
    try:
        now = read_maxrates(ifname, runner)[traffic_class]
    except DcbError as exc:  # it answered a moment ago
        return fail("rdma", f"{listed}; {exc}", _FIX_DCB)
    more = f"; only {ifname}'s NIC is limited, of {len(devices)}" if len(devices) > 1 else ""
    return ok("rdma", f"{listed}; {fault_refs(link_faults)} limit traffic class {traffic_class} of {ifname} (now "
                      f"{fmt_rate(now)}) with dcb maxrate{more}; mapping the KV's DSCP to it is the node's (dcb app, "
                      "dcb ets)")


def rdma_line(params: Any, role: Any, device: str | None) -> Check:
    """The `rdma` line of a node with a pod, from preflight's Params and Role (``device``: the
    interface its link faults act on, on a cluster node)."""
    if not role.cluster and params.mode == MODE_LOCAL:
        here: list[int] = []  # local mode refuses faults
    else:
        here = [i for i, _, pods in params.link_faults
                if not role.cluster or any(f"pod{p}" in role.pods for p in pods)]
    return check_rdma(params.transport, params.rdma_link_faults, params.kv_traffic_class, here, device,
                      emulated=not role.cluster)
