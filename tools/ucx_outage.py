"""A link outage under NIXL/UCX over TCP, without vLLM: when does a read caught by the outage end,
and do reads work again once the link is back? (docs/testbed.md "The outage after the outage".)

Two NIXL agents with the UCX backend (UCX_TLS=tcp, as the engines: testbed/engines/engine.py), each
in a network namespace of its own on the project's fabric (testbed/machine/netns.py): the source in
pod0 registers a buffer, as a prefill engine holds KV; the reader on the head reads it again and
again (a NIXL READ, as a decode engine pulls). At DOWN_AT_S pod0's interface drops everything it
sends and receives (the link fault of `residual_bw: 0`, testbed/faults/shaping.py; --direction)
for --down-s, then heals as the testbed heals it. Every read is printed with its start, end and state; each UCX setting given
with --env runs as a case of its own on a fresh pair of agents.

    python tools/ucx_outage.py                          # UCX's defaults
    python tools/ucx_outage.py --env UCX_TCP_KEEPIDLE=1s,UCX_TCP_KEEPINTVL=1s,UCX_TCP_KEEPCNT=3
    python tools/ucx_outage.py --reconnect              # after a failed read: drop and re-add the peer

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

from testbed.faults import shaping  # noqa: E402
from testbed.machine.netns import Fabric, create_fabric, destroy_fabric, in_netns, netns_exec_argv  # noqa: E402

DOWN_AT_S = 5.0  # the reads have settled into their line-rate rhythm by then
READ_BYTES = 32 << 20  # one read: about a prompt's KV for a 1.6k-token prompt of an 8B model at fp16

# The source: registers READ_BYTES, publishes its metadata and the buffer's address, then serves
# (its progress thread answers the reads) until killed.
SOURCE = r"""
import base64, ctypes, json, sys, time
from nixl._api import nixl_agent, nixl_agent_config
n = int(sys.argv[2])
agent = nixl_agent("source", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
buf = (ctypes.c_char * n)()
ctypes.memset(buf, 0x5A, n)
agent.register_memory([(ctypes.addressof(buf), n, 0, "")], "DRAM")
meta = {"agent": base64.b64encode(agent.get_agent_metadata()).decode(), "addr": ctypes.addressof(buf), "n": n}
open(sys.argv[1] + ".tmp", "w").write(json.dumps(meta))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
"""

# The reader: reads the source's buffer back to back until argv[3] seconds have passed, each read
# watched to its end (or to argv[4] s); prints one JSON line per read. With argv[5] == "1", after
# a failed read it drops the peer and adds it again (a fresh UCX endpoint) before the next.
READER = r"""
import base64, ctypes, json, sys, time
from nixl._api import nixl_agent, nixl_agent_config
meta = json.loads(open(sys.argv[1]).read())
n, until, limit, reconnect = meta["n"], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
agent = nixl_agent("reader", nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
buf = (ctypes.c_char * n)()
agent.register_memory([(ctypes.addressof(buf), n, 0, "")], "DRAM")
blob = base64.b64decode(meta["agent"])
peer = agent.add_remote_agent(blob)
local = agent.get_xfer_descs([(ctypes.addressof(buf), n, 0)], "DRAM")
remote = agent.get_xfer_descs([(meta["addr"], n, 0)], "DRAM")
t0 = float(sys.argv[2])
i = 0
while time.time() - t0 < until:
    start = time.time()
    row = {"read": i, "start_s": start - t0}
    try:
        h = agent.initialize_xfer("READ", local, remote, peer, b"r")
        state = agent.transfer(h)
        while state not in ("DONE", "ERR") and time.time() - start < limit:
            time.sleep(0.002)
            state = agent.check_xfer_state(h)
        row["state"] = state if state in ("DONE", "ERR") else "WAITING"
        try:
            agent.release_xfer_handle(h)
        except Exception as e:
            row["release"] = type(e).__name__
    except Exception as e:
        row["state"] = "RAISED"
        row["error"] = " ".join(str(e).split())[:160]
    row["end_s"] = time.time() - t0
    print(json.dumps(row), flush=True)
    if row["state"] != "DONE":
        if reconnect:
            try:
                agent.remove_remote_agent(peer)
                peer = agent.add_remote_agent(blob)
                row2 = {"reconnected_s": time.time() - t0}
            except Exception as e:
                row2 = {"reconnect_error": " ".join(str(e).split())[:160]}
            print(json.dumps(row2), flush=True)
        time.sleep(0.2)  # a failed read returns at once: do not spin
    i += 1
"""


def start_source(pod: object, work: Path, n: int, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """The NIXL source in ``pod``'s namespace holding ``n`` bytes, once it has published its metadata
    (the file returned); the process is the caller's to kill."""
    meta = work / "source.json"
    proc = subprocess.Popen(netns_exec_argv(pod.netns, [sys.executable, "-c", SOURCE, str(meta), str(n)]), env=env)
    deadline = time.time() + 60
    while not meta.exists():
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the source did not publish its metadata")
        time.sleep(0.1)
    return proc, meta


def run_case(env: dict[str, str], down_s: float, total_s: float, limit_s: float, reconnect: bool,
             directions: tuple[str, ...] = ("egress", "ingress")) -> list[dict]:
    """One case on a fresh fabric (head + pod0): the rows the reader printed, and the fault's times."""
    fabric = Fabric.plan(uuid.uuid4().hex[:8], 1, subnet="10.98.0.0/24")
    head, pod = fabric.nodes
    work = Path(tempfile.mkdtemp(prefix="ucx-outage-"))
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    base = {**os.environ, "UCX_TLS": "tcp", "UCX_NET_DEVICES": pod.ifname, **env}
    try:
        create_fabric(fabric)
        source, meta = start_source(pod, work, READ_BYTES, base)
        procs.append(source)
        t0 = time.time()
        reader = subprocess.Popen(netns_exec_argv(head.netns, [sys.executable, "-c", READER, str(meta), str(t0),
                                                               str(total_s), str(limit_s), "1" if reconnect else "0"]),
                                  env={**base, "UCX_NET_DEVICES": head.ifname}, stdout=subprocess.PIPE, text=True)
        procs.append(reader)
        time.sleep(max(0.0, t0 + DOWN_AT_S - time.time()))
        with in_netns(pod.netns):
            for d in directions:
                shaping.shape(shaping.Shaping(pod.ifname, d, 0.0))
        rows.append({"fault": "down", "at_s": time.time() - t0})
        time.sleep(max(0.0, t0 + DOWN_AT_S + down_s - time.time()))
        with in_netns(pod.netns):
            for d in directions:
                shaping.unshape(pod.ifname, d)
        rows.append({"fault": "healed", "at_s": time.time() - t0})
        out, _ = reader.communicate(timeout=total_s + limit_s + 60)
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        destroy_fabric(fabric)
        for f in work.iterdir():
            f.unlink()
        work.rmdir()
    return rows


def summary(rows: list[dict]) -> str:
    """The reads around the outage: the last before it, those it caught, the first that worked after."""
    down = next(r["at_s"] for r in rows if r.get("fault") == "down")
    healed = next(r["at_s"] for r in rows if r.get("fault") == "healed")
    reads = [r for r in rows if "read" in r]
    before = [r for r in reads if r["end_s"] <= down and r["state"] == "DONE"]
    caught = [r for r in reads if r["start_s"] < down < r["end_s"]]
    after = [r for r in reads if r["start_s"] >= down]
    ok_after = [r for r in after if r["state"] == "DONE" and r["start_s"] >= healed]
    each = sorted(r["end_s"] - r["start_s"] for r in before)
    lines = [f"link down {down:.2f} s, healed {healed:.2f} s; {len(reads)} reads, {len(before)} done before it"
             + (f" (median {each[len(each) // 2]:.3f} s each)" if each else "")]
    for r in caught:
        lines.append(f"  caught: read {r['read']} started {r['start_s']:.2f} s, ended {r['state']} at "
                     f"{r['end_s']:.2f} s ({r['end_s'] - down:.1f} s after the link went down)")
    states: dict[str, int] = {}
    for r in after:
        states[r["state"]] = states.get(r["state"], 0) + 1
    lines.append(f"  started after it went down: {states}")
    if ok_after:
        lines.append(f"  first read done after the heal: started {ok_after[0]['start_s']:.2f} s "
                     f"({ok_after[0]['start_s'] - healed:.1f} s after it)")
    else:
        lines.append("  no read worked after the heal")
    for r in rows:
        if "reconnected_s" in r or "reconnect_error" in r:
            lines.append(f"  {r}")
            break
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", default=[], help="UCX settings of one case, comma-separated "
                                                               "(repeat for more cases; none: UCX's defaults)")
    ap.add_argument("--down-s", type=float, default=20.0, help="how long the link is down (the e2e's outage: 20 s)")
    ap.add_argument("--total-s", type=float, default=120.0, help="how long the reader keeps reading")
    ap.add_argument("--limit-s", type=float, default=150.0, help="how long one read is watched at most")
    ap.add_argument("--reconnect", action="store_true", help="after a failed read, drop and re-add the peer")
    ap.add_argument("--direction", choices=["both", "uplink", "downlink"], default="both",
                    help="what of pod0's link goes down (a link fault's direction; default both, as the spec's)")
    ap.add_argument("--rows", action="store_true", help="print every read, not only the summary")
    args = ap.parse_args()
    cases = [dict(kv.split("=", 1) for kv in e.split(",")) for e in args.env] or [{}]
    for env in cases:
        directions = {"both": ("egress", "ingress"), "uplink": ("egress",), "downlink": ("ingress",)}[args.direction]
        rows = run_case(env, args.down_s, args.total_s, args.limit_s, args.reconnect, directions)
        print(f"== {args.direction} down {args.down_s:g} s, {' '.join(f'{k}={v}' for k, v in env.items()) or 'UCX defaults'}"
              f"{' (reconnect)' if args.reconnect else ''}", flush=True)
        if args.rows:
            for r in rows:
                print("  ", json.dumps(r))
        print(summary(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
