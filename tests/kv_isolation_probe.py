"""What a kv_only link fault throttles, measured on a running cluster (tests/e2e_cluster.py runs it
in the head's namespace of the emulated cluster `ray up` started with a real node's environment).

Pod 0's uplink (what leaves its node: KV pulled from its prefill engine, and Ray's replies) is
measured with no fault, under a kv_only fault, then under the same fault on the whole link:

* the KV path: a TCP stream from pod 0 to the head on a port in the range the engines give UCX
  (testbed/machine/kv_ports.py), the traffic a kv_only fault is meant to throttle;
* Ray's own traffic: an object made by a task on pod 0 and fetched by this driver on the head,
  through Ray's object manager on Ray's ports, which a kv_only fault must leave at line rate.

The whole-link fault is the control: the object's fetch then slows to the fault's rate, so a fetch
that keeps its time under kv_only shows the filter, not a measurement blind to the fault.
Prints one JSON line. Usage: python tests/kv_isolation_probe.py ADDRESS
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from testbed.machine.kv_ports import KV_PORT_BASE
from testbed.faults.agent_actor import AGENT_NAMESPACE, FaultAgentActor
from traffic import receive_stamped

FAULT_BPS = 4e6  # the fault's rate: a 2 MB object then needs 4 s, against ~0.1 s at the fabric's rate
BLOB_BYTES = 2_000_000
FETCHES = 3  # objects per condition: the median's time
STREAM_S = 3.0  # the KV stream's length; its first SKIP_S are left out (TCP's slow start, the queue filling)
SKIP_S = 1.0
PORT = KV_PORT_BASE + 0xF0  # inside the KV range, above what the engines' UCX takes first
KEY = "kv-isolation-probe"


@ray.remote(num_cpus=0)
def _blob(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.uint8)


@ray.remote(num_cpus=0)
def _stream(host: str, port: int, seconds: float) -> int:
    """Send as fast as the link lets for ``seconds``; returns the bytes handed to TCP."""
    s = socket.create_connection((host, port), timeout=10)
    s.settimeout(0.2)  # a full send buffer under the fault must not hold the loop past its end
    buf, sent, end = bytes(1 << 16), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sent += s.send(buf)
        except socket.timeout:
            continue
    s.close()
    return sent


def _kv_stream_bps(pin: NodeAffinitySchedulingStrategy, host: str) -> float:
    """Goodput (bit/s) received from pod 0 on the KV port, over the stream's steady part."""
    srv = socket.create_server((host, PORT))
    got: list[tuple[float, int]] = []

    def rx() -> None:
        conn, _ = srv.accept()
        until = time.monotonic() + STREAM_S + 5
        receive_stamped(conn, got, lambda: time.monotonic() < until)

    t = threading.Thread(target=rx, daemon=True)
    t.start()
    ray.get(_stream.options(scheduling_strategy=pin).remote(host, PORT, STREAM_S), timeout=60)
    t.join(10)
    srv.close()
    if not got:
        return 0.0
    t0 = got[0][0] + SKIP_S
    t1 = got[-1][0]
    return sum(n for at, n in got if at >= t0) * 8 / max(t1 - t0, 1e-3)


def _fetch_s(pin: NodeAffinitySchedulingStrategy) -> float:
    """Seconds this driver's fetch of an object made on pod 0 takes (its task done first)."""
    ref = _blob.options(scheduling_strategy=pin).remote(BLOB_BYTES)
    ray.wait([ref], fetch_local=False, timeout=60)
    t0 = time.monotonic()
    ray.get(ref, timeout=120)
    return time.monotonic() - t0


def _measure(pin: NodeAffinitySchedulingStrategy, host: str, fetches: int = FETCHES) -> dict[str, float | list[float]]:
    times = [_fetch_s(pin) for _ in range(fetches)]
    return {"kv_bps": _kv_stream_bps(pin, host), "ray_fetch_s": times,
            "ray_bps": BLOB_BYTES * 8 / statistics.median(times)}


def main(address: str) -> dict:
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    pod0 = next(n for n in ray.nodes() if n["Alive"] and "pod0" in n["Resources"])
    pin = NodeAffinitySchedulingStrategy(pod0["NodeID"], soft=False)
    host = ray.util.get_node_ip_address()  # the head's address: this driver runs there
    agent = FaultAgentActor.options(name="fault-agent-pod0", namespace=AGENT_NAMESPACE, lifetime="detached",
                                    get_if_exists=True, resources={"pod0": 0.01}).remote("pod0", ["eth0"])
    ifname = "eth0"
    out: dict = {"fault_bps": FAULT_BPS, "blob_bytes": BLOB_BYTES, "none": _measure(pin, host)}
    try:
        for name, kv_only in (("kv_only", True), ("whole", False)):
            ray.get(agent.apply_link.remote(KEY, ifname, ["uplink"], FAULT_BPS, 120.0, kv_only), timeout=30)
            out[name] = _measure(pin, host, FETCHES if kv_only else 1)  # the control: one 4 s fetch
    finally:
        ray.get(agent.clear.remote(KEY), timeout=60)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
