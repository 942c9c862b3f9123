"""Retries (router.retry) measured like a policy, in both worlds (not a test: prints figures).

    python benchmarks/bench_retry.py [--spec FILE] [--factor 1] [--attempt-ttft off,2,4,7]
                                     [--policies LC,FaultAwareOTF-R] [--seeds 0] [--no-testbed]

A scenario (default: the embedded testbed scenario, 4 pods `by_pod`, pod 0's link at r = 0.01
from 10 s to 35 s) at ``factor`` x its rate, each policy without retries ("off") and with
sgl-router's retries (5 attempts, 50 ms x 1.5^k backoff, +-20% jitter) and a per-try time to
first token of each ``--attempt-ttft`` value (seconds): no derivation fixes that value for a
cluster, so the table is its sensitivity. In the simulator and, unless ``--no-testbed``, on the
emulated testbed (root; one set of engines serves every run, as in `testbed twin`).

Per run, read from its run directory: failure rate, TTFT p99 of the requests served, the retries
made and the share of requests retried, those rescued (retried, then ok), the extra load (prompt
tokens of given-up attempts that had passed prefill, over all prompt tokens; and their KV bytes),
and the time to recover (from the faults' end to the end of the last bin of arrivals whose success
ratio is below the pre-fault one).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _variants(spec: str | None, factor: float, ttfts: list[str]) -> list[Any]:
    from core.spec.model import load_spec, parse_spec

    base = load_spec(spec, default="testbed.yaml").model_dump(mode="json", exclude={"study"})
    arrival = {**base["workload"]["arrival"]}
    if "rate_rps" in arrival:
        arrival["rate_rps"] = arrival["rate_rps"] * factor
    out = []
    for v in ttfts:
        retry = None if v == "off" else {"attempt_ttft_s": float(v)}
        tag = "off" if v == "off" else f"t{float(v):g}"
        out.append(parse_spec({**base, "name": f"{base['name']}_x{factor:g}_{tag}",
                               "workload": {**base["workload"], "arrival": arrival},
                               "router": {**base["router"], "retry": retry}}))
    return out


def _figures(run_dir: Path) -> dict[str, Any]:
    from analysis.run.scalars import run_metrics

    m = run_metrics(run_dir)
    return {"policy": m["policy"], "seed": m["seed"], "n": m["n_requests"], "failure_rate": m["failure_rate"],
            "ttft_p99": m["ttft_p99_s"], "retries": m["retries"], "retried": m["retried_share"],
            "rescued": m["retry_rescued"], "extra_prefill": m["retry_extra_prefill_share"],
            "extra_kv_gb": m["retry_kv_bytes"] / 1e9, "recovery_s": m["recovery_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="a spec file (default: the embedded testbed scenario)")
    ap.add_argument("--factor", type=float, default=1.0, help="times the scenario's rate (default 1)")
    ap.add_argument("--attempt-ttft", default="off,2,4,7",
                    help="comma-separated per-try times to first token in seconds; 'off': no retries")
    ap.add_argument("--policies", default="LC,FaultAwareOTF-R")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--no-testbed", action="store_true", help="the simulator only (no root, no engines)")
    ap.add_argument("--tabulate", metavar="DIR", help="only print the table of an earlier run's directories")
    args = ap.parse_args()
    policies, seeds = args.policies.split(","), [int(s) for s in args.seeds.split(",")]
    from both_worlds import run_dirs, run_variants

    specs = [] if args.tabulate else _variants(args.spec, args.factor, args.attempt_ttft.split(","))
    work = Path(args.tabulate) if args.tabulate else run_variants(specs, policies, seeds, "bench-retry-",
                                                                  not args.no_testbed)
    rows = [{"world": world, "spec": d.parent.parent.name, **_figures(d)} for world, d in run_dirs(work)]
    table = Table(title=f"Retries, without and with a per-try time to first token, at {args.factor:g}x the rate")
    cols = ("world", "scenario", "per-try TTFT", "policy", "seed", "requests", "failure rate", "TTFT p99, s", "retries",
            "retried", "rescued", "extra prefill", "extra KV, GB", "recovered after, s")
    for col in cols:
        table.add_column(col, justify="left" if col in cols[:4] else "right")
    for r in sorted(rows, key=lambda r: (r["world"], r["policy"], r["seed"], r["spec"])):
        scenario, _, tag = r["spec"].rpartition("_")
        table.add_row(r["world"], scenario, "off" if tag == "off" else f"{tag[1:]} s", r["policy"], str(r["seed"]),
                      f"{r['n']:,}", f"{r['failure_rate']:.4f}", f"{r['ttft_p99']:.2f}", f"{r['retries']:,}",
                      f"{r['retried']:.3f}", f"{r['rescued']:,}", f"{r['extra_prefill']:.3f}",
                      f"{r['extra_kv_gb']:.2f}", f"{r['recovery_s']:.0f}")
    Console(width=200).print(table)
    print(f"run directories: {work}")


if __name__ == "__main__":
    main()
