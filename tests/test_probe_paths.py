"""The other end of a link fault's probe (testbed/faults/probe_paths.py): a node the pod reaches
through its shaped interface, on another node, carrying no link fault of the run."""

from __future__ import annotations

import pytest

from testbed.faults.probe_paths import HEAD, NodeAgent, ProbePathError, choose_peer

pytestmark = pytest.mark.background

HEAD_NODE = NodeAgent("head", "n-head", ("10.0.0.1",))


def pods(*nodes: str) -> list[NodeAgent]:
    return [NodeAgent(f"pod{k}", n, (f"10.0.0.{10 + k}",)) for k, n in enumerate(nodes)]


def reach_all(addrs):
    return addrs[0]


def test_the_head_on_its_own_node_is_every_pods_peer():
    assert choose_peer(0, "eth0", pods("n0", "n1"), HEAD_NODE, {0, 1}, reach_all) == (HEAD, "10.0.0.1")


def test_a_pod_on_the_heads_node_is_probed_from_a_pod_the_run_does_not_fault():
    nodes = pods("n-head", "n1", "n2")
    assert choose_peer(0, "eth0", nodes, HEAD_NODE, {0, 1}, reach_all) == (2, "10.0.0.12")
    # and the head, sharing a faulted pod's node, is no peer for the other faulted pod either
    assert choose_peer(1, "eth0", nodes, HEAD_NODE, {0, 1}, reach_all) == (2, "10.0.0.12")


def test_only_an_address_reached_through_the_shaped_interface_makes_a_peer():
    # the head is reached through another NIC (a separate KV NIC), pod1 through eth0
    def via_eth0(addrs):
        return next((a for a in addrs if a != "10.0.0.1"), None)

    assert choose_peer(0, "eth0", pods("n0", "n1"), HEAD_NODE, {0}, via_eth0) == (1, "10.0.0.11")


def test_a_pod_nothing_can_measure_is_refused_in_one_line_with_each_reason():
    with pytest.raises(ProbePathError) as e:
        choose_peer(0, "ens1f0", pods("n-head", "n1", "n-head"), HEAD_NODE, {0, 1}, reach_all)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("pod0's link fault cannot be measured")
    assert "head shares its node" in msg and "pod1's node carries a link fault of the run" in msg
    assert "pod2 shares its node" in msg and "ens1f0" in msg


def test_pods_faulted_together_are_spread_over_the_nodes_that_may_probe_them():
    nodes = pods("n0", "n1", "n2", "n3")
    # pod 0 has the head; pod 1, with the head taken once, the first unfaulted pod's node
    assert choose_peer(0, "eth0", nodes, HEAD_NODE, {0, 1}, reach_all, {}) == (HEAD, "10.0.0.1")
    assert choose_peer(1, "eth0", nodes, HEAD_NODE, {0, 1}, reach_all, {HEAD: 1}) == (2, "10.0.0.12")
    # every candidate taken as often: the preference order again (the head first)
    assert choose_peer(1, "eth0", nodes, HEAD_NODE, {0, 1}, reach_all, {HEAD: 1, 2: 1, 3: 1}) == (HEAD, "10.0.0.1")
