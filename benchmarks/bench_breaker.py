"""The router's circuit breaker measured like a policy, in both worlds (not a test: prints figures).

    python benchmarks/bench_breaker.py [--spec FILE] [--factor 4] [--policies LC,OTF-R] [--seeds 0,1]
                                       [--no-testbed]

A scenario (default: the embedded testbed scenario, 4 pods `by_pod`, pod 0's link at r = 0.01
from 10 s to 35 s) at ``factor`` x its rate, each policy without and with
``router.circuit_breaker`` (sgl-router's defaults: 5 failures in a row blamed on a pod open it
for 30 s, 2 successes close it), in the simulator and, unless ``--no-testbed``, on the emulated
testbed (root; one set of engines serves every run, as in `testbed twin`: a throttled link
heals, so a run does not carry a fault's after-effects into the next).

Per run, read from its run directory: failure rate, the share of requests routed through the
faulted pods while their faults were on (the load the breaker moves elsewhere), how often
breakers opened and for how many pod-seconds, and the time to recover: from the faults' end to
the last breaker closing, once every breaker is closed again ("open at the end" otherwise).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _variants(spec: str | None, factor: float) -> list[Any]:
    from core.spec.model import load_spec, parse_spec

    base = load_spec(spec, default="testbed.yaml").model_dump(mode="json", exclude={"study"})
    arrival = {**base["workload"]["arrival"], "rate_rps": base["workload"]["arrival"]["rate_rps"] * factor}
    return [parse_spec({**base, "name": f"{base['name']}_x{factor:g}_{tag}", "workload": {**base["workload"], "arrival": arrival},
                        "router": {**base["router"], "circuit_breaker": cb}})
            for tag, cb in (("plain", None), ("breaker", {}))]


def _figures(run_dir: Path) -> dict[str, Any]:
    from analysis.run.data import load_run
    from analysis.run.scalars import run_metrics

    run = load_run(run_dir)
    m = run_metrics(run)
    br = run.breaker.sort_values("time_s", kind="stable")
    final = br.groupby("pod").state.last()
    if br.empty:
        recover = ""
    elif (final == "closed").all():
        recover = f"{br.time_s.max() - m['fault_end_s']:.1f}"
    else:
        recover = "open at the end"
    return {"policy": m["policy"], "n": m["n_requests"], "failure_rate": m["failure_rate"],
            "share_during": m["degraded_share_during"], "opens": m["breaker_opens"],
            "open_pod_s": m["breaker_open_pod_s"], "recover": recover}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="a spec file (default: the embedded testbed scenario)")
    ap.add_argument("--factor", type=float, default=4.0, help="times the scenario's rate (default 4)")
    ap.add_argument("--policies", default="LC,FaultAwareLC,OTF-R,FaultAwareOTF-R")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--no-testbed", action="store_true", help="the simulator only (no root, no engines)")
    ap.add_argument("--tabulate", metavar="DIR", help="only print the table of an earlier run's directories")
    args = ap.parse_args()
    policies, seeds = args.policies.split(","), [int(s) for s in args.seeds.split(",")]
    from both_worlds import run_dirs, run_variants

    work = Path(args.tabulate) if args.tabulate else \
        run_variants(_variants(args.spec, args.factor), policies, seeds, "bench-breaker-", not args.no_testbed)
    rows = [{"world": world, "spec": d.parent.parent.name, **_figures(d)} for world, d in run_dirs(work)]
    table = Table(title=f"The circuit breaker, without and with, at {args.factor:g}x the scenario's rate")
    for col in ("world", "scenario", "breaker", "policy", "requests", "failure rate", "through faulted pods during faults",
                "breaker opens", "open, pod-s", "all closed after the faults, s"):
        table.add_column(col, justify="left" if col in ("world", "scenario", "breaker", "policy") else "right")
    for r in sorted(rows, key=lambda r: (r["world"], r["policy"], r["spec"])):
        scenario, _, tag = r["spec"].rpartition("_")
        table.add_row(r["world"], scenario, "on" if tag == "breaker" else "off", r["policy"], f"{r['n']:,}",
                      f"{r['failure_rate']:.4f}",
                      f"{r['share_during']:.3f}", str(r["opens"]), f"{r['open_pod_s']:.0f}", r["recover"])
    Console(width=170).print(table)
    print(f"run directories: {work}")


if __name__ == "__main__":
    main()
