"""`testbed cluster`, `testbed faults` and `testbed leftovers`: the cluster's nodes and what the
project set or left on them."""

from __future__ import annotations

import argparse
import os
import sys

from cli.common import csv, out_console
from vocab import MODE_NETNS

# Set in a command re-run inside an emulated cluster's head namespace (see in_cluster).
IN_HEAD_ENV = "TESTBED_IN_CLUSTER_HEAD"


def in_cluster(address: str, argv: list[str]) -> int | None:
    """Connect to the Ray cluster at ``address``. An emulated cluster's head is reachable only from
    its own namespace: there this command runs again (its exit status returned); else None, and Ray
    is connected here."""
    from core.util.ray_start import ray_init
    from testbed.runs.launch import emulated_cluster_at

    if not os.environ.get(IN_HEAD_ENV) and (c := emulated_cluster_at(address)) is not None:
        return c.run_in_head([sys.executable, "-m", "cli", *argv], env={IN_HEAD_ENV: "1"}).returncode
    ray_init(address=address, logging_level="ERROR", log_to_driver=False)
    return None


def cmd_cluster(args: argparse.Namespace) -> int:
    from testbed.cluster import emulated

    if args.action == "check":
        from testbed.cluster.clusterfile import main as clusterfile_main

        return clusterfile_main(["check", *(args.run_ids[:1] or ["cluster.yaml"])])
    if args.action == "status" and args.address:
        rc = in_cluster(args.address, ["cluster", "status", "--address", args.address, "--interfaces", args.interfaces])
        if rc is not None:
            return rc
        from testbed.cluster.nodes import cluster_status, render

        render(cluster_status(csv(args.interfaces)), out_console())  # the command's output: stdout
        return 0
    if args.action == "stop-engines":
        if not args.address:
            raise ValueError("stop-engines: name the cluster (--address, or $RAY_ADDRESS)")
        rc = in_cluster(args.address, ["cluster", "stop-engines", "--address", args.address])
        if rc is not None:
            return rc
        from testbed.engines.kept import stop_kept

        stopped = stop_kept()
        print(f"stopped {len(stopped)} kept engines" + (f": {', '.join(stopped)}" if stopped else ""))
        return 0
    if args.action == "up":
        c = emulated.EmulatedCluster(args.pods, mode=args.mode, launcher=args.launcher)
        info = c.up()
        print(f"run {info.run_id} ({info.mode}): head {c.address}; "
              + ", ".join(f"{n.name}={n.address}" for n in info.nodes))
        env = " ".join(f"{k}={v}" for k, v in {"RAY_ADDRESS": c.address, **c.auth_env}.items())
        print(f"drivers: {env} ip netns exec {c.fabric.head.netns} python ..."
              if c.mode == MODE_NETNS else f"drivers: {env} python ...")
        print(f"stop: testbed cluster down {info.run_id}")
    elif args.action == "down":
        done = [emulated.EmulatedCluster.attach(None, r).down() or r for r in args.run_ids] if args.run_ids \
            else emulated.down_all()
        print(f"down: {', '.join(done) if done else 'nothing was up'}")
    else:
        state_dir = emulated.default_state_dir()
        runs = sorted(p.stem for p in state_dir.glob("*.json")) if state_dir.exists() else []
        if not runs:
            print("no emulated cluster recorded")
        for r in runs:
            st = emulated.EmulatedCluster.attach(None, r).status()
            print(f"run {r} ({st.mode}): {'up' if st.up else 'DOWN/partial'}, {len(st.pids)} processes, "
                  f"{len(st.namespaces)} namespaces, {st.pss_bytes / 2**30:.2f} GiB")
    return 0


def cmd_leftovers(args: argparse.Namespace) -> int:
    from testbed.cluster.leftovers import find_leftovers

    found = find_leftovers()
    for item in found:
        print(item.line())
    if not found:
        print("nothing of the project's is left on this machine")
    return 1 if found else 0


def cmd_faults(args: argparse.Namespace) -> int:
    if args.address:
        rc = in_cluster(args.address, ["faults", "clear", "--address", args.address])
        if rc is not None:
            return rc
        from testbed.cluster.nodes import clear_cluster_faults

        failed = 0
        for r in clear_cluster_faults():
            if r.ok:
                print(f"{r.ip}: " + (f"cleared {', '.join(r.value)}" if r.value else "nothing to clear"))
            else:
                failed += 1
                print(f"{r.ip}: FAILED: {r.error}")
        return 1 if failed else 0
    from testbed.faults.agent_actor import clear_host_faults

    removed = clear_host_faults()
    print(f"cleared: {', '.join(removed)}" if removed else "no fault of the project was set on this machine")
    return 0
