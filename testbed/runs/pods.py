"""The cluster's pods, found from its alive nodes' Ray resources and checked against a spec."""

from __future__ import annotations

from typing import Any

import ray

from core.spec.model import ExperimentSpec
from vocab import FAULT_LINK


def discover_pods(spec: ExperimentSpec, nodes: list[dict[str, Any]] | None = None) -> dict[int, dict[str, Any]]:
    """The cluster's pods, from its alive nodes' resources (``pod<i>``: cluster.yaml's start
    commands and the emulated cluster give them), checked against what ``spec`` needs: pods
    0 .. topology.pods - 1, each on one node, with the GPUs its engines ask for. Returns pod
    index -> {ip, node_id, CPU, GPU}; anything missing is one ValueError saying what was found."""
    nodes = ray.nodes() if nodes is None else nodes
    pods: dict[int, dict[str, Any]] = {}
    for n in nodes:
        if not n.get("Alive"):
            continue
        for r in n["Resources"]:
            if r.startswith("pod") and r[3:].isdigit():
                pods[int(r[3:])] = {"ip": n["NodeManagerAddress"], "node_id": n["NodeID"],
                                    "CPU": n["Resources"].get("CPU", 0.0), "GPU": n["Resources"].get("GPU", 0.0)}
    topo, t = spec.topology, spec.testbed
    found = ", ".join(f"pod{i}@{p['ip']} ({p['GPU']:g} GPU)" for i, p in sorted(pods.items())) or "no pod resource"
    missing = [i for i in range(topo.pods) if i not in pods]
    if missing:
        raise ValueError(f"topology: {topo.pods} pods, but the cluster's alive nodes have {found} "
                         f"(missing pod{missing[0]}; a pod is a node with the custom resource pod<i>)")
    # pods on one node (cluster.yaml's provider.pods) share its GPUs and its NIC
    sharing: dict[str, list[int]] = {}
    for i in range(topo.pods):
        sharing.setdefault(pods[i]["node_id"], []).append(i)
    need = topo.workers_per_pod * t.gpus_per_engine
    short = [i for i in range(topo.pods) if pods[i]["GPU"] < need * len(sharing[pods[i]["node_id"]])]
    if short:
        mates = sharing[pods[short[0]]["node_id"]]
        raise ValueError(f"testbed.gpus_per_engine: pod{short[0]}'s node holds {len(mates)} pod(s) of "
                         f"{topo.workers_per_pod} engines x {t.gpus_per_engine} GPUs = {need * len(mates)}, but has "
                         f"{pods[short[0]]['GPU']:g} ({found})")
    # A link fault shapes a node's NIC: on a pod that shares its node it would throttle the other
    # pods' KV too, a fault the spec did not ask for (the simulator's pods have links of their own).
    for k, f in enumerate(spec.faults):
        if f.kind != FAULT_LINK:
            continue
        for p in f.pods:
            mates = sharing.get(pods[p]["node_id"], []) if p in pods else []
            if len(mates) > 1:
                raise ValueError(f"faults[{k}]: a link fault on pod{p} shapes the NIC of its node {pods[p]['ip']}, "
                                 f"which pods {', '.join(map(str, mates))} share: it would throttle them all; give "
                                 "faulted pods nodes of their own (cluster.yaml provider.pods)")
    return {i: pods[i] for i in range(topo.pods)}
