"""A pod on the head's node, probed as the fault injector probes a faulted pod (tests/e2e_cluster.py
runs it in the head's namespace of the emulated cluster, whose last pod `ray up` started on the
head, as cluster.yaml's provider.pods can).

The head's agent cannot be the far end of a pod on its own node: that load would cross loopback, not
the interface a fault shapes. So the pod's probe path (testbed/faults/probe_paths.py) comes from
another pod's node, through the head's eth0, and the injector's own measurement
(testbed/faults/injector.py ``measure_side``) of a kv_only limit on both directions at once must read
that limit. With every pod faulted, the head's NIC included, no node is left to measure from: the
first pod is refused in one line, as a run is before its engines start (testbed/runs/driver.py).
Prints one JSON line. Usage: python tests/head_pod_probe.py ADDRESS POD
"""

from __future__ import annotations

import asyncio
import json
import sys

import ray
from ray.util import get_node_ip_address

from faults.telemetry import probe_offered_bps
from testbed.cluster.nodes import RAY_HEAD_RESOURCE
from testbed.faults.agent_actor import FaultAgents
from testbed.faults.injector import PodTargets, measure_side
from testbed.faults.probe_paths import ProbePathError

BASELINE_BPS, R = 1e9, 0.05  # a 50 Mbit/s limit: far below the veths' rate, quick to measure


async def _both(tg: PodTargets) -> list[float]:
    offered = probe_offered_bps(R, 1.0, BASELINE_BPS)
    return list(await asyncio.gather(*(measure_side(tg, side, offered) for side in ("uplink", "downlink"))))


def main(address: str, pod: int) -> dict:
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    agents = FaultAgents(pod + 1, ["eth0"], RAY_HEAD_RESOURCE)
    out: dict = {"head_ip": get_node_ip_address()}
    try:
        try:
            agents.probe_paths(range(pod + 1))
            out["refused"] = ""
        except ProbePathError as e:
            out["refused"] = str(e)
        p = agents.probe_paths({pod})[pod]
        out["path"] = {"pod_ip": p.pod_ip, "peer": p.peer, "peer_ip": p.peer_ip}
        tg = PodTargets(agents.pods[pod], agents.pod_ifnames[pod], [], probe=p, peer=agents.agent_of(p.peer))
        ray.get(tg.agent.apply_link.remote("head-pod-probe", tg.ifname, ["uplink", "downlink"], R * BASELINE_BPS,
                                           60.0, kv_only=True))
        out["factor"] = [bps / BASELINE_BPS for bps in asyncio.run(_both(tg))]
        out["r"] = R
    finally:
        agents.shutdown()  # clears the limit; the test then finds nothing left on the head's eth0
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))), flush=True)
