"""`testbed doctor`: a preflight of this machine, or of every node of a Ray cluster.

The checks live in testbed/cluster/preflight.py; this gathers and prints them, one line per check
per node, and exits 1 when any failed (n/a is no failure). An emulated cluster's head is reached
only from its own namespace: there the command runs itself again, as `testbed cluster status` does,
after checking the ports its forwarders take on the host.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.cluster import IN_HEAD_ENV
from cli.common import out_console
from vocab import MODE_NETNS

Group = tuple[str, Sequence[Any]]  # a title and its checks (testbed.cluster.preflight.Check)


def add_doctor_parser(sub: Any) -> None:
    d = sub.add_parser("doctor", help="preflight: can the testbed run on this machine, or on every node of a "
                                      "Ray cluster? One line per check; exit status 1 if any failed")
    d.add_argument("spec", nargs="?", help="experiment YAML whose testbed block (mode, fault_interfaces, ports, "
                                           "gpus_per_engine) is checked (default: the embedded testbed scenario)")
    d.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="check every node of this Ray cluster, a task pinned to each (default: $RAY_ADDRESS; "
                        "without either, this machine alone)")
    d.set_defaults(fn=cmd_doctor)


def render(groups: Sequence[Group], console: Any) -> int:
    """Print each group's checks, one line each (never wrapped, for logs); the number of FAILs."""
    from rich.text import Text

    from testbed.cluster.checks import FAIL, NA, OK

    style = {OK: "green", FAIL: "bold red", NA: "dim"}
    width = max((len(c.name) for _, checks in groups for c in checks), default=0)
    counts = {OK: 0, NA: 0, FAIL: 0}
    for title, checks in groups:
        console.print(Text(title, style="bold"), soft_wrap=True)
        for c in checks:
            counts[c.status] += 1
            line = Text("  ")
            line.append(f"{c.status:<4}", style=style[c.status])
            line.append(f"  {c.name:<{width}}  {c.detail}")
            if c.fix:
                line.append(f"; fix: {c.fix}")
            console.print(line, soft_wrap=True)
    verdict = "the testbed can run here" if not counts[FAIL] else f"fix the lines marked {FAIL}"
    console.print(f"{counts[OK]} {OK}, {counts[NA]} {NA}, {counts[FAIL]} {FAIL}: {verdict}", soft_wrap=True)
    return counts[FAIL]


def cmd_doctor(args: argparse.Namespace) -> int:
    from core.spec.model import load_spec
    from testbed.cluster.preflight import Params, node_checks

    spec = load_spec(args.spec, default="testbed.yaml")
    params = Params.from_spec(spec)
    console = out_console()
    if not os.environ.get(IN_HEAD_ENV):  # (a run inside an emulated cluster's head: said once, before)
        console.print(f"spec: {args.spec or 'the embedded testbed scenario'} (testbed.mode {params.mode}, "
                      f"fault_interfaces {', '.join(params.fault_interfaces)}, {params.pods} pods)", soft_wrap=True)
    if args.address:
        return _on_cluster(args, params, console)
    return 1 if render([(f"this machine ({socket.gethostname()})", node_checks(params))], console) else 0


def _on_cluster(args: argparse.Namespace, params: Any, console: Any) -> int:
    from testbed.cluster.preflight import check_port, check_ray, check_reachable, cluster_checks, fail

    address = args.address
    if not os.environ.get(IN_HEAD_ENV):
        from testbed.runs.launch import emulated_cluster_at

        c = emulated_cluster_at(address)
        if c is not None:
            failed = 0
            if c.mode == MODE_NETNS:  # a run forwards these host ports into the head (testbed/runs/launch.py)
                failed = render([(f"this machine, host of the emulated cluster {c.run_id}", [
                    check_port("metrics", *params.metrics), check_port("ingress", *params.ingress, " (run --serve)")])],
                    console)
            where = f"inside its head's namespace {c.fabric.head.netns}" if c.mode == MODE_NETNS else "here (local mode)"
            console.print(f"emulated cluster {c.run_id}: the checks run {where}", soft_wrap=True)
            argv = [sys.executable, "-m", "cli", "doctor", "--address", address]
            argv += [str(Path(args.spec).resolve())] if args.spec else []
            rc = c.run_in_head(argv, env={IN_HEAD_ENV: "1"}).returncode
            return rc or (1 if failed else 0)
    top = [check_ray()]
    if not top[-1].failed:
        top.append(check_reachable(address))
    if not top[-1].failed:
        import ray

        from core.util.ray_start import ray_init

        try:
            ray_init(address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:
            top.append(fail("ray.init", f"{address}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                            f"ray status on the head; the same Ray here ({ray.__version__}) as there; with token "
                            "auth, RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH as its nodes have them"))
    title = f"Ray cluster at {address}"
    if top[-1].failed:
        return 1 if render([(title, top)], console) else 0
    more, nodes = cluster_checks(params)
    groups: list[Group] = [(title, top + more)] + [(n.label, n.checks) for n in nodes]
    return 1 if render(groups, console) else 0
