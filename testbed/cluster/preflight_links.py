"""The preflight checks of the link faults' path (`testbed doctor`; testbed/cluster/preflight.py):
which interface a pod's faults shape and its KV crosses, and whether a fault on it would reach
only the KV or Ray's control traffic with it."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.cluster.checks import Check, fail, fault_refs, na, ok
from testbed.faults.shaping import RootQdisc
from testbed.machine.interfaces import pick_interface
from testbed.machine.kv_ports import KV_PORT_RANGE, RAY_GCS_PORT, RAY_WORKER_PORTS, SIDE_CHANNEL_BASE_PORT
from testbed.machine.netns import NODE_IFNAME


def check_emulated_interfaces(allowlist: Sequence[str]) -> Check:
    """This machine alone, netns mode: the project makes each node's namespace with one interface,
    NODE_IFNAME (testbed/machine/netns.py); the host's own interfaces do not matter. The spec's
    allowlist must hold it, or every node's fault agent refuses every link fault."""
    names = ", ".join(allowlist)
    if NODE_IFNAME not in allowlist:
        return fail("interfaces", f"each node's namespace has {NODE_IFNAME}, which is not on "
                                  f"testbed.fault_interfaces ({names}): every link fault would be refused",
                    f"add {NODE_IFNAME} to testbed.fault_interfaces in the spec")
    return ok("interfaces", f"{NODE_IFNAME} (in each node's namespace) is on testbed.fault_interfaces; "
                            "the host's NICs do not matter")


def check_interfaces(allowlist: Sequence[str], present: Sequence[str]) -> Check:
    """A pod's node: its faults shape, and its KV crosses, the first allowlisted interface it has
    (testbed/machine/interfaces.py pick_interface)."""
    names = ", ".join(allowlist)
    have = [i for i in allowlist if i in present]
    if not have:
        others = ", ".join(i for i in present if i != "lo") or "none but lo"
        return fail("interfaces", f"none of testbed.fault_interfaces ({names}) is here; this node has {others}",
                    "add this node's NIC to testbed.fault_interfaces in the spec")
    missing = [i for i in allowlist if i not in present]
    return ok("interfaces", f"{have[0]} (first of testbed.fault_interfaces here"
                            + (f"; absent: {', '.join(missing)})" if missing else ")"))


def check_link_faults(link_faults: Sequence[tuple[int, bool]], ifname: str | None, carries_ray: bool,
                      ray_ip: str | None = None) -> Check:
    """A link fault shapes the whole interface unless ``kv_only``: where that interface carries
    the node's Ray address (``carries_ray``), it throttles Ray's control traffic (the router's
    calls, heartbeats, object transfers) and ssh with the KV, and a deep one gets the node
    declared dead. kv_only faults reach the KV by its ports (the `kv ports` line)."""
    if not link_faults:
        return na("link faults", "no link fault of the spec shapes this node")
    whole = [i for i, kv_only in link_faults if not kv_only]
    if not whole:
        return ok("link faults", f"kv_only: {fault_refs(i for i, _ in link_faults)} shape only the KV ports; Ray's "
                                 "control traffic keeps the line rate")
    where = f"this node's Ray address {ray_ip}" if ray_ip else "the node's Ray address"
    if carries_ray:
        return fail("link faults", f"{fault_refs(whole)} shape all of {ifname}, which carries {where}: Ray's control "
                                   "traffic and ssh would be throttled with the KV",
                    f"set kv_only: true on {fault_refs(whole)} (the KV alone is throttled), or give the KV a NIC "
                    "of its own and list it first in testbed.fault_interfaces")
    return ok("link faults", f"{fault_refs(whole)} shape all of {ifname}, which does not carry {where}")


def check_root_qdisc(root: RootQdisc | None) -> Check:
    """What a link fault does to the root qdisc of the interface it shapes (testbed/faults/shaping.py):
    the kernel's default (``mq`` over a multi-queue NIC's queues) is replaced by the fault's one htb
    queue while it is on and comes back when it clears; the project's own means a fault is still on;
    one set by someone else (``mqprio``, a tc set-up of the site's) is never replaced, so every link
    fault there would be refused."""
    if root is None:
        return na("root qdisc", "none of testbed.fault_interfaces is here (the interfaces line)")
    name = f"{root.ifname}: {root.kind} {root.handle >> 16:x}:"
    if root.owner == "project":
        return fail("root qdisc", f"{name} is a link fault of the project's, still on",
                    "wait for its time to live, or testbed faults clear --address <head address>")
    if root.owner == "other":
        return fail("root qdisc", f"{name} was set outside the project: every link fault on {root.ifname} would "
                                  "be refused, never replace it",
                    f"remove it (tc qdisc del dev {root.ifname} root), or list another NIC first in "
                    "testbed.fault_interfaces")
    if root.kind == "mq":
        return ok("root qdisc", f"{root.ifname}: the kernel's mq over {root.tx_queues} transmit queues; a link "
                                "fault puts one htb queue in its place while it is on (all of the NIC's traffic "
                                "then passes one queue, kv_only's unshaped rest too) and the mq comes back "
                                "when it clears")
    return ok("root qdisc", f"{root.ifname}: the kernel's {root.kind}; a link fault puts its htb in its place while "
                            "it is on, and the kernel's comes back when it clears")


def check_firewall(head: bool, engines: int) -> Check:
    """The ports the other nodes (and, on the head, the router's clients) reach this node on: what
    a firewall between the nodes must let through, read from the project's own settings (the doctor
    does not try them from another node)."""
    opened = []
    if head:
        opened.append(f"Ray's GCS {RAY_GCS_PORT}")
    opened.append(f"Ray's workers {RAY_WORKER_PORTS} and its node and object managers (random unless ray start "
                  "pins them)")
    if engines:
        opened += [f"the KV {KV_PORT_RANGE} (UCX)",
                   f"NIXL's side channels {SIDE_CHANNEL_BASE_PORT}-{SIDE_CHANNEL_BASE_PORT + engines - 1}"]
    return ok("firewall", "from the other nodes, TCP to " + "; ".join(opened))


def _picked(allowlist: Sequence[str], present: Sequence[str]) -> str | None:
    """The interface the node's engines use (the agent's own choice), None where there is none."""
    try:
        return pick_interface(allowlist, present)
    except ValueError:
        return None


def _ray_ip() -> str | None:
    """This node's Ray address (what its Ray traffic is sent to), None outside a Ray worker."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return None
