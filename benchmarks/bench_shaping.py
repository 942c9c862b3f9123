"""How exact and how fast the testbed's link faults are, on real traffic between namespaces.

    sudo python benchmarks/bench_shaping.py [--rates 200,50,10,2] [--seconds 2]

Builds a throwaway fabric (head + 2 pods, veth links to a bridge), runs one TCP
stream from pod0 to pod1 and, per rate, shapes pod0's uplink (egress ``htb``)
then pod1's downlink (ingress via ``ifb``) through a :class:`testbed.faults.agent.FaultAgent`.
Prints per rate and direction: goodput over the target, the agent's own
measurement (its paced TCP load + counters) over the target, how long the apply call took,
when the stream's rate first fell under twice the limit (50 ms bins), and how
long after clearing the stream was back above ten times the limit. The fabric
is removed at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.faults.agent import FaultAgent
from testbed.faults.load import Sink, fill
from testbed.faults.shaping import KV_PORT_BASE
from testbed.machine.netns import Fabric, create_fabric, destroy_fabric, in_netns
from faults.telemetry import probe_window_s

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the measuring stream: tests/traffic.py
from traffic import TcpStream  # noqa: E402

KV_PORT = KV_PORT_BASE + 7  # a port a kv_only fault would shape too


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="200,50,10,2", help="Mbit/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.0, help="measuring window per rate")
    args = ap.parse_args()
    rates = [float(r) * 1e6 for r in args.rates.split(",")]
    fab = Fabric.plan(uuid.uuid4().hex[:10], 2)
    table = Table("direction", "Mbit/s", "goodput / target", "agent measured / target", "apply call ms",
                  "effect after ms", "restored after ms")
    create_fabric(fab)
    try:
        pod0, pod1 = fab.node("pod0"), fab.node("pod1")
        s = TcpStream(fab, "pod0", "pod1", KV_PORT)
        try:
            time.sleep(0.5)
            for rate in rates:
                for side, node in (("uplink", pod0), ("downlink", pod1)):
                    agent = FaultAgent(node.name, ["eth0"])
                    with in_netns(node.netns):
                        t0 = time.monotonic()
                        agent.apply_link("bench", "eth0", [side], rate, ttl_s=120)
                        t1 = time.monotonic()
                    time.sleep(0.5 + args.seconds)
                    goodput = s.rate(t1 + 0.5, t1 + 0.5 + args.seconds)
                    effect = next((k * 50 for k in range(40) if s.rate(t0 + k * 0.05, t0 + (k + 1) * 0.05) < 2 * rate),
                                  None)
                    measured = _measure(agent, side, pod0, pod1, rate)
                    with in_netns(node.netns):
                        t2 = time.monotonic()
                        agent.clear("bench")
                    back = None
                    while back is None and time.monotonic() - t2 < 5:
                        time.sleep(0.05)
                        if s.last(0.05) > 10 * rate:
                            back = (time.monotonic() - t2) * 1000
                    table.add_row(side, f"{rate / 1e6:g}", f"{goodput / rate:.3f}", f"{measured / rate:.3f}",
                                  f"{(t1 - t0) * 1000:.1f}", str(effect), f"{back:.0f}" if back else "> 5000")
        finally:
            s.close()
    finally:
        destroy_fabric(fab)
    Console().print(table)


def _measure(agent: FaultAgent, side: str, pod0, pod1, rate: float) -> float:
    window = probe_window_s(2 * rate)  # as the testbed measures, its load to a sink on pod1
    with in_netns(pod1.netns):
        sink = Sink()
    try:
        if side == "uplink":
            with in_netns(pod0.netns):
                return agent.measure_uplink("eth0", pod1.address, sink.port, 2 * rate, window)
        out: dict[str, float] = {}

        def measure() -> None:
            with in_netns(pod1.netns):
                out["rate"] = agent.measure_downlink("eth0", window)

        t = threading.Thread(target=measure)
        t.start()
        with in_netns(pod0.netns):
            fill(pod1.address, sink.port, 2 * rate, window + 0.3)
        t.join()
        return out["rate"]
    finally:
        sink.close()


if __name__ == "__main__":
    main()
