"""Does NIXL cancel a read in flight? Dead work after a deadline, without vLLM.

A request given up in kv_transfer leaves its NIXL read running in vLLM 0.32 (the scheduler frees
its blocks only once the read ends: delay_free_blocks), so on a degraded link the read keeps
loading it. The stack's own cancel would be NIXL's release of the transfer handle while the read
is in progress (``nixl_agent.release_xfer_handle``; UCX backend: its requests cancelled). This
measures what it does to the traffic: two NIXL agents with the UCX backend over TCP (as the
engines: testbed/engines/engine.py) in namespaces of the project's fabric (testbed/machine/netns.py),
the source's link (pod0, both directions) shaped to ``--mbit`` with the testbed's own shaping
(testbed/faults/shaping.py), one read of ``--mb`` MB given up ``--deadline-s`` after it started
(its handle released, or, with ``--keep``, left alone as vLLM does), and pod0's sent bytes sampled
every 0.25 s until the read would have ended at that rate. Then a second read on the same pair:
does the path still work?

    python tools/nixl_cancel.py                # release at the deadline
    python tools/nixl_cancel.py --keep         # vLLM's behaviour: the read goes on

Root only (namespaces, qdiscs); everything it creates goes at its end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.ucx_outage import start_source  # noqa: E402
from testbed.faults import shaping  # noqa: E402
from testbed.machine.netns import Fabric, create_fabric, destroy_fabric, in_netns, netns_exec_argv  # noqa: E402

# The reader: one read of the source's buffer, given up argv[3] s after it started (released unless
# argv[4] == "keep"), its state watched to its end or argv[5] s; then a second read, watched to its
# end. One JSON line per event.
READER = r"""
import base64, ctypes, json, sys, time
from nixl._api import nixl_agent, nixl_agent_config
meta = json.loads(open(sys.argv[1]).read())
n, deadline, keep, watch = meta["n"], float(sys.argv[3]), sys.argv[4] == "keep", float(sys.argv[5])
t0 = float(sys.argv[2])
agent = nixl_agent("reader", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
buf = (ctypes.c_char * n)()
agent.register_memory([(ctypes.addressof(buf), n, 0, "")], "DRAM")
peer = agent.add_remote_agent(base64.b64decode(meta["agent"]))
local = agent.get_xfer_descs([(ctypes.addressof(buf), n, 0)], "DRAM")
remote = agent.get_xfer_descs([(meta["addr"], n, 0)], "DRAM")
def say(**kw):
    print(json.dumps({"t_s": time.time() - t0, **kw}), flush=True)
for i in range(2):
    start = time.time()
    h = agent.initialize_xfer("READ", local, remote, peer, b"r")
    state = agent.transfer(h)
    say(read=i, event="started", state=state)
    released = False
    while state not in ("DONE", "ERR") and time.time() - start < (deadline if i == 0 else watch):
        time.sleep(0.002)
        state = agent.check_xfer_state(h)
    if i == 0 and state not in ("DONE", "ERR") and not keep:
        try:
            agent.release_xfer_handle(h)
            released = True
            say(read=i, event="released")
        except Exception as e:
            say(read=i, event="release_refused", error=" ".join(str(e).split())[:200])
    if not released:
        while state not in ("DONE", "ERR") and time.time() - start < watch:
            time.sleep(0.01)
            state = agent.check_xfer_state(h)
        say(read=i, event="ended", state=state)
        if state in ("DONE", "ERR"):
            agent.release_xfer_handle(h)
    else:
        time.sleep(max(0.0, watch - (time.time() - start)))  # the traffic is sampled meanwhile
"""


def tx_bytes(netns: str, ifname: str) -> int:
    out = subprocess.run(["ip", "-n", netns, "-s", "-j", "link", "show", "dev", ifname], capture_output=True,
                         text=True, check=True).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def run(mbit: float, mb: int, deadline_s: float, keep: bool) -> list[dict]:
    fabric = Fabric.plan(uuid.uuid4().hex[:8], 1, subnet="10.97.0.0/24")
    head, pod = fabric.nodes
    work = Path(tempfile.mkdtemp(prefix="nixl-cancel-"))
    n = mb << 20
    watch_s = n * 8 / (mbit * 1e6) * 1.3 + 5  # the read's time at the shaped rate, and then some
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    env = {**os.environ, "UCX_TLS": "tcp"}
    try:
        create_fabric(fabric)
        with in_netns(pod.netns):
            for d in ("egress", "ingress"):
                shaping.shape(shaping.Shaping(pod.ifname, d, mbit * 1e6))
        source, meta = start_source(pod, work, n, {**env, "UCX_NET_DEVICES": pod.ifname})
        procs.append(source)
        t0 = time.time()
        reader = subprocess.Popen(netns_exec_argv(head.netns, [sys.executable, "-c", READER, str(meta), str(t0),
                                                               str(deadline_s), "keep" if keep else "release",
                                                               str(watch_s)]),
                                  env={**env, "UCX_NET_DEVICES": head.ifname}, stdout=subprocess.PIPE, text=True)
        procs.append(reader)
        while reader.poll() is None:
            rows.append({"t_s": time.time() - t0, "pod_tx_bytes": tx_bytes(pod.netns, pod.ifname)})
            time.sleep(0.25)
        rows += [json.loads(line) for line in reader.stdout.read().splitlines() if line.startswith("{")]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        destroy_fabric(fabric)  # its namespaces, and the qdiscs in them
        for f in work.iterdir():
            f.unlink()
        work.rmdir()
    return sorted(rows, key=lambda r: r["t_s"])


def summary(rows: list[dict], mbit: float) -> str:
    ev = [r for r in rows if "event" in r]
    tx = [(r["t_s"], r["pod_tx_bytes"]) for r in rows if "pod_tx_bytes" in r]
    first = next(r for r in ev if r.get("read") == 0 and r["event"] == "started")["t_s"]
    gave_up = next((r["t_s"] for r in ev if r.get("read") == 0 and r["event"] in ("released", "release_refused")),
                   None)
    second = next((r for r in ev if r.get("read") == 1 and r["event"] == "started"), None)
    lines = [f"link {mbit:g} Mbit/s; read 0 started {first:.2f} s"]
    for r in ev:
        lines.append(f"  {r['t_s']:.2f} s: read {r.get('read')} {r['event']} {r.get('state', '')} {r.get('error', '')}")
    end = second["t_s"] if second else tx[-1][0]

    def sent(a: float, b: float) -> float:
        pts = [(t, b_) for t, b_ in tx if a <= t <= b]
        return (pts[-1][1] - pts[0][1]) / 1e6 if len(pts) > 1 else float("nan")

    if gave_up is not None:
        lines.append(f"  pod0 sent {sent(first, gave_up):.1f} MB before the give-up and {sent(gave_up, end):.1f} MB "
                     f"from it to the next read ({end - gave_up:.1f} s)")
    else:
        lines.append(f"  pod0 sent {sent(first, end):.1f} MB during read 0")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbit", type=float, default=20.0, help="pod0's shaped rate, both directions (Mbit/s)")
    ap.add_argument("--mb", type=int, default=32, help="the read's size in MiB")
    ap.add_argument("--deadline-s", type=float, default=2.0, help="the read is given up this long after it started")
    ap.add_argument("--keep", action="store_true", help="do not release the handle at the give-up (vLLM 0.32)")
    ap.add_argument("--rows", action="store_true", help="print every sample and event")
    args = ap.parse_args()
    rows = run(args.mbit, args.mb, args.deadline_s, args.keep)
    print(f"== {args.mb} MiB read at {args.mbit:g} Mbit/s, given up at {args.deadline_s:g} s, "
          f"{'kept (vLLM)' if args.keep else 'handle released'}")
    if args.rows:
        for r in rows:
            print("  ", json.dumps(r))
    print(summary(rows, args.mbit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
