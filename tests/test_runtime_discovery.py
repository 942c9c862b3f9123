"""Pods found from a Ray cluster's node resources, and what a spec may ask of them."""

from __future__ import annotations

import pytest

from builders import parse, shipped_spec_dict
from testbed.runs.pods import discover_pods


def _node(ip: str, *, alive: bool = True, gpus: float = 0, **res: float) -> dict:
    return {"Alive": alive, "NodeManagerAddress": ip, "NodeID": f"id-{ip}",
            "Resources": {"CPU": 4.0, **({"GPU": gpus} if gpus else {}), **res}}


def _spec(pods: int = 2, workers: int = 2, gpus: int = 0, **testbed) -> object:
    return parse(shipped_spec_dict("testbed.yaml", faults=[],
                                   topology={"pods": pods, "workers_per_pod": workers, "placement": "within_pod"},
                                   testbed={"gpus_per_engine": gpus, **testbed}))


def test_pods_come_from_node_resources_and_extra_nodes_are_ignored():
    nodes = [_node("10.0.0.1", head=1), _node("10.0.0.3", pod1=1, gpus=2), _node("10.0.0.2", pod0=1, gpus=2),
             _node("10.0.0.4", pod2=1), _node("10.0.0.9", alive=False, pod0=1)]
    pods = discover_pods(_spec(gpus=1), nodes)
    assert {i: p["ip"] for i, p in pods.items()} == {0: "10.0.0.2", 1: "10.0.0.3"}


def test_a_spec_bigger_than_the_cluster_is_refused_saying_what_was_found():
    nodes = [_node("10.0.0.1", head=1), _node("10.0.0.2", pod0=1), _node("10.0.0.3", alive=False, pod1=1)]
    with pytest.raises(ValueError) as e:
        discover_pods(_spec(pods=2), nodes)
    assert str(e.value) == ("topology: 2 pods, but the cluster's alive nodes have pod0@10.0.0.2 (0 GPU) "
                            "(missing pod1; a pod is a node with the custom resource pod<i>)")


def test_engines_asking_for_more_gpus_than_a_pod_has_are_refused():
    nodes = [_node("10.0.0.2", pod0=1, gpus=2), _node("10.0.0.3", pod1=1, gpus=1)]
    with pytest.raises(ValueError, match=r"pod1's node holds 1 pod\(s\) of 2 engines x 1 GPUs = 2, but has 1"):
        discover_pods(_spec(gpus=1), nodes)


def test_pods_may_share_a_node_whose_gpus_they_share_but_not_a_link_fault():
    """cluster.yaml's provider.pods: the head holding pod 0, pods 1 and 2 on one node of 4 GPUs."""
    nodes = [_node("10.0.0.1", head=1, pod0=1, gpus=2), _node("10.0.0.2", pod1=1, pod2=1, gpus=4)]
    pods = discover_pods(_spec(pods=3, gpus=1), nodes)
    assert [pods[i]["ip"] for i in range(3)] == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]
    with pytest.raises(ValueError, match=r"pod1's node holds 2 pod\(s\) of 2 engines x 1 GPUs = 4, but has 3"):
        discover_pods(_spec(pods=3, gpus=1), [nodes[0], _node("10.0.0.2", pod1=1, pod2=1, gpus=3)])
    link = {"kind": "link", "residual_bw": 0.1, "start_s": 1.0, "duration_s": 2.0, "kv_only": True}
    spec = parse(shipped_spec_dict("testbed.yaml", faults=[{**link, "pods": [0]}, {**link, "pods": [2]}],
                                   topology={"pods": 3, "workers_per_pod": 2, "placement": "within_pod"}))
    with pytest.raises(ValueError) as e:
        discover_pods(spec, nodes)
    assert str(e.value).startswith("faults[1]: a link fault on pod2 shapes the NIC of its node 10.0.0.2, which pods "
                                   "1, 2 share") and "\n" not in str(e.value)
    assert discover_pods(parse(shipped_spec_dict("testbed.yaml", faults=[{**link, "pods": [0]}],
                                                 topology={"pods": 3, "workers_per_pod": 2, "placement": "within_pod"})),
                         nodes)  # pod 0 alone on the head: its NIC is its own


def test_rdma_refuses_a_link_fault_in_one_line():
    base = shipped_spec_dict("testbed.yaml")
    assert any(f["kind"] == "link" for f in base["faults"])
    from core.spec.model import SpecError

    with pytest.raises(SpecError) as e:
        parse(base, "x.yaml", testbed={"transport": "rdma"})
    assert "RDMA bypasses" in str(e.value) and "\n" not in str(e.value)


def test_each_node_shapes_the_first_allowlisted_interface_it_has():
    from testbed.machine.interfaces import pick_interface

    allow = ["eth0", "ens1f0"]
    assert pick_interface(allow, ["lo", "ens1f0"]) == "ens1f0"
    assert pick_interface(allow, ["lo", "ens1f0", "eth0"]) == "eth0"  # allowlist order decides
    with pytest.raises(ValueError) as e:
        pick_interface(allow, ["lo", "ib0"], "pod1's node (10.0.0.3)")
    assert str(e.value) == "pod1's node (10.0.0.3) has none of testbed.fault_interfaces (eth0, ens1f0); it has ib0, lo"
    assert pick_interface(["lo"]) == "lo"  # this process's own interfaces by default
