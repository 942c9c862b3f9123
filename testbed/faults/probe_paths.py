"""Where a pod's link fault is measured from: the other end of its probe.

The probe's load (testbed/faults/load.py) must cross what the fault shapes: the pod's shaped
interface, and nothing else a fault of the run shapes. So the peer is another node's fault agent
that the pod reaches through that interface (the kernel's route, not Ray's node address: a node
with a separate KV NIC reaches Ray's address through another one), and that carries no link fault
of the run itself: the head's, unless a faulted pod shares the head's node (the cluster file's
``provider.pods`` allows a pod there), else the node of a pod the run never faults; spread over
those, so that pods faulted at once do not all probe through one node's NIC. A pod that
shares its node with every candidate, or whose candidates are all faulted, cannot be measured:
refused in one line before the first run.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

HEAD = -1  # the head's agent, as a peer index


class ProbePathError(ValueError):
    """No node can measure a pod's link fault; the message is one line."""


@dataclass(frozen=True)
class NodeAgent:
    """What the choice reads of one agent: its node (Ray's node id) and the node's addresses."""

    name: str
    node_id: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class ProbePath:
    """A faulted pod's probe: its own address on the shaped interface and its sink's port (where
    the downlink's load is sent), its peer (HEAD or a pod's index) at an address reached through
    that interface and the peer's sink's port (where the uplink's load is sent)."""

    pod_ip: str
    pod_port: int
    peer: int
    peer_ip: str
    peer_port: int


def choose_peer(pod: int, ifname: str, pods: Sequence[NodeAgent], head: NodeAgent, faulted: Collection[int],
                route_via: Callable[[Sequence[str]], str | None], taken: Mapping[int, int] | None = None
                ) -> tuple[int, str]:
    """Pod ``pod``'s peer and the peer's address: of the nodes that may be one, the one fewest other
    pods probe already (``taken``: peer -> pods given it), so that pods faulted at once do not all
    load one node's NIC with their probes; among those, the head first, then the pods in order.
    ``route_via(addresses)``: the first of them pod ``pod`` reaches through ``ifname`` (its agent's
    :meth:`~testbed.faults.agent.FaultAgent.route_via`), or None."""
    own = pods[pod].node_id
    faulted_nodes = {pods[k].node_id for k in faulted}
    why: list[str] = []
    order = [(HEAD, head)] + [(k, p) for k, p in enumerate(pods) if k != pod]
    for k, cand in sorted(order, key=lambda kc: (taken or {}).get(kc[0], 0)):  # stable: preference kept
        if cand.node_id == own:
            why.append(f"{cand.name} shares its node")
        elif cand.node_id in faulted_nodes:
            why.append(f"{cand.name}'s node carries a link fault of the run")
        elif (ip := route_via(cand.addresses)) is None:
            why.append(f"{cand.name} is not reached through {ifname}")
        else:
            return k, ip
    raise ProbePathError(f"pod{pod}'s link fault cannot be measured: no other node to probe {ifname} from "
                         f"({'; '.join(why)}); put the head, or a pod the run does not fault, on another node "
                         "reached through that interface")
