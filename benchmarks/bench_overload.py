"""Overload: the shipped scenarios at 10x their rate, without and with the router's admission
limit, in both worlds (not a test: prints figures).

    python benchmarks/bench_overload.py [--factor 10] [--no-testbed]

* the embedded testbed scenario (4 pods, one vLLM CPU engine each, pod 0's link at r = 0.01)
  at ``factor`` x its rate, policy LC, in the simulator and on the emulated testbed (root;
  its engines start once and serve both variants);
* the embedded simulator scenario (32 x 32 workers, core-link faults) at ``factor`` x its
  rate in the simulator, where the volume is large enough for memory to tell.

The limit is ``router.max_in_flight`` = the engines' batch capacity, prefill_slots x prefill
workers + decode_max_batch x decode workers (what lies beyond it can only queue). Reported per
run, read from its run directory: requests by outcome, the peak in flight (rebuilt from the
records: routed to ended, a failure at its limit at the latest), TTFT p50 of the requests that
succeeded, and the peak resident memory of the process that ran the router (run.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]


def _variants(default: str, factor: float) -> list[Any]:
    from core.spec.model import load_spec, parse_spec

    base = load_spec(None, default=default).model_dump(mode="json", exclude={"study"})
    arrival = {**base["workload"]["arrival"], "rate_rps": base["workload"]["arrival"]["rate_rps"] * factor}
    e, t = base["engine"], base["topology"]
    workers = t["pods"] * t["workers_per_pod"]
    n_prefill = max(1, round(workers * t["prefill_fraction"]))
    capacity = e["prefill_slots"] * n_prefill + e["decode_max_batch"] * (workers - n_prefill)
    out = []
    for tag, limit in (("free", None), ("limited", capacity)):
        out.append(parse_spec({**base, "name": f"{base['name']}_x{factor:g}_{tag}", "policies": ["LC"],
                               "workload": {**base["workload"], "arrival": arrival},
                               "router": {**base["router"], "max_in_flight": limit}}))
    return out


def _sim_child(spec_json: str, out: str) -> None:
    from core.spec.model import parse_spec
    from simulator.run import run_sim

    run_sim(parse_spec(json.loads(spec_json)), "LC", 0, Path(out))


def _figures(run_dir: Path) -> dict[str, Any]:
    from analysis.run.metrics import peak_in_flight
    from core.records import read_meta, read_table
    from core.spec.model import parse_spec

    meta = read_meta(run_dir)
    spec = parse_spec(meta["spec"])
    r = read_table(run_dir, "requests")
    ok = r[r.outcome == "ok"]
    return {"n": len(r), **{k: int((r.outcome == k).sum()) for k in ("ok", "timeout", "error", "rejected")},
            "peak_in_flight": peak_in_flight(r, spec.first_token_limit_s, spec.deadline_s),
            "ttft_p50_s": float(np.median(ok.first_token_s - ok.arrival_s)) if len(ok) else float("nan"),
            "rss_bytes": meta.get("router_peak_rss_bytes", float("nan")), "limit": meta["spec"]["router"]["max_in_flight"]}


def simulate(specs: list[Any], work: Path) -> list[dict[str, Any]]:
    rows = []
    for spec in specs:
        subprocess.run([sys.executable, __file__, "--sim-child", spec.model_dump_json(), "--out", str(work / "sim")],
                       check=True)  # a fresh process each: its peak memory is this run's
        rows.append({"world": "sim", "spec": spec.name, **_figures(work / "sim" / spec.name / "LC" / "seed-0")})
    return rows


def testbed(specs: list[Any], work: Path) -> list[dict[str, Any]]:
    from testbed.runs.launch import run_testbed

    first, *more = specs
    run_testbed(first, work / "testbed", ["LC"], [0], more=[(s, ["LC"], [0]) for s in more])
    return [{"world": "testbed", "spec": s.name, **_figures(work / "testbed" / s.name / "LC" / "seed-0")} for s in specs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, default=10.0, help="times the scenarios' rates (default 10)")
    ap.add_argument("--no-testbed", action="store_true", help="the simulator only (no root, no engines)")
    ap.add_argument("--tabulate", metavar="DIR", help="only print the table of an earlier run's directories")
    ap.add_argument("--sim-child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sim_child:
        _sim_child(args.sim_child, args.out)
        return
    console = Console(width=160)
    if args.tabulate:
        work = Path(args.tabulate)
        rows = [{"world": d.parent.parent.parent.name, "spec": d.parent.parent.name, **_figures(d)}
                for world in ("sim", "testbed") for d in sorted((work / world).glob("*/LC/seed-0"))]
        rows.sort(key=lambda r: (not r["spec"].startswith("twin"), r["world"], r["spec"]))
    else:
        work = Path(tempfile.mkdtemp(prefix="bench-overload-"))
        small = _variants("testbed.yaml", args.factor)
        rows = simulate(small, work)
        if not args.no_testbed:
            rows += testbed(small, work)
        rows += simulate(_variants("default.yaml", args.factor), work)
    table = Table(title=f"LC at {args.factor:g}x the shipped scenarios' rates, without and with router.max_in_flight")
    for col in ("world", "scenario", "limit", "requests", "ok", "timeout", "error", "rejected", "peak in flight",
                "TTFT p50 (ok), s", "router process peak RSS"):
        table.add_column(col, justify="left" if col in ("world", "scenario") else "right")
    for r in rows:
        table.add_row(r["world"], r["spec"], str(r["limit"] or "none"), f"{r['n']:,}", f"{r['ok']:,}",
                      f"{r['timeout']:,}", f"{r['error']:,}", f"{r['rejected']:,}", f"{r['peak_in_flight']:,}",
                      f"{r['ttft_p50_s']:.2f}", f"{r['rss_bytes'] / 2**20:,.0f} MiB")
    console.print(table)
    print(f"run directories: {work}")


if __name__ == "__main__":
    main()
