"""A node's network interfaces: which one its faults shape and its KV crosses, and the addresses
on one."""

from __future__ import annotations

import socket
from collections.abc import Sequence


def pick_interface(allowlist: Sequence[str], present: Sequence[str] | None = None, where: str = "this node") -> str:
    """The interface a node's faults shape and its KV crosses: the first of the allowlist
    (``testbed.fault_interfaces``) that exists on the node, so nodes whose NICs have other names
    (eth0 here, ens1f0 there) can share one spec. None present: one line naming what the node has."""
    if present is None:
        import socket

        present = [name for _, name in socket.if_nameindex()]  # this process's network namespace
    for name in allowlist:
        if name in present:
            return name
    raise ValueError(f"{where} has none of testbed.fault_interfaces ({', '.join(allowlist)}); "
                     f"it has {', '.join(sorted(present)) or 'no interface'}")


def interface_addresses(ifname: str) -> list[str]:
    """The IPv4 addresses on ``ifname`` in this process's network namespace."""
    import psutil

    return [a.address for a in psutil.net_if_addrs().get(ifname, []) if a.family == socket.AF_INET]
