"""Recorded twin runs against the calibrated simulator, without and with the host model (not a test).

    python benchmarks/sim_host_twin.py TWIN_DIR [--calibration FILE] [--cores N]

TWIN_DIR is a ``testbed twin`` output (``testbed/<spec>/<policy>/seed-<s>/`` and
``calibration.json``). For every recorded testbed run it simulates the run's own spec and seed with
the calibration applied: with one accelerator per engine (``engine.host_cores`` None); with the
engines sharing the calibration's cores (or ``--cores``), each demanding one core whatever it does;
with the demand by state the calibration measured (if it has one); and with the demand by state
measured in the recorded runs themselves (analysis/checks/host_demand.py, pooled). It prints per policy:
failure rate, the prefill stage's median outside and inside the fault window (a request is inside
if it was in flight during a fault), its p90 inside, and TTFT and E2E percentiles of the successful
requests. The testbed is not run again (docs/simulator.md "The host model" shows what it gave).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.checks.calibration import POOLED
from analysis.checks.host_demand import host_demand_check
from core.calibration.fit import apply_calibration, load_calibration
from core.records import read_table
from core.spec.model import parse_spec
from simulator.run import run_sim


def _row(r: pd.DataFrame, windows: list[tuple[float, float]]) -> dict[str, float]:
    inside = np.zeros(len(r), bool)
    for a, b in windows:
        inside |= (r.arrival_s.to_numpy() < b) & (r.end_s.fillna(np.inf).to_numpy() > a)
    pre = r.prefill_end_s - r.prefill_start_s
    ok = r.outcome == "ok"
    ttft, e2e = (r.first_token_s - r.arrival_s)[ok], (r.end_s - r.arrival_s)[ok]
    return {"fail": 1 - ok.mean(), "prefill_out_p50": pre[~inside].median(), "prefill_in_p50": pre[inside].median(),
            "prefill_in_p90": pre[inside].quantile(0.9), "ttft_p50": ttft.median(), "ttft_p90": ttft.quantile(0.9),
            "e2e_p50": e2e.median()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("twin_dir", type=Path)
    ap.add_argument("--calibration", type=Path, help="default: TWIN_DIR/calibration.json")
    ap.add_argument("--cores", type=float, help="the shared host's cores (default: the calibration's, else 2)")
    args = ap.parse_args()
    cal = load_calibration(args.calibration or args.twin_dir / "calibration.json")
    cores = args.cores or (cal.host.cores if cal.host is not None else 2.0)
    one_core = {f"host_{k}_cores": 1.0 for k in ("hold", "pull", "decode")} | {"host_background_cores": 0.0}
    pooled = host_demand_check([args.twin_dir / "testbed"], {})
    pooled = pooled[pooled["policy"] == POOLED].set_index("state")["run_cores"].dropna()
    print("demand by state measured in the runs (cores):", pooled.round(2).to_dict())
    print("the calibration's:", cal.host.demand if cal.host is not None else None)
    variants = [("sim", {"host_cores": None}), (f"sim, {cores:g} cores", {"host_cores": cores, **one_core})]
    if cal.host is not None and cal.host.demand:
        variants.append(("sim, calibrated demand", {"host_cores": cores}))  # apply_calibration set it
    variants.append(("sim, the runs' demand", {"host_cores": cores, **one_core,
                                               **{f"host_{k}_cores": float(v) for k, v in pooled.items()}}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for meta_path in sorted((args.twin_dir / "testbed").glob("*/*/seed-*/run.json")):
            meta = json.loads(meta_path.read_text())
            spec = apply_calibration(parse_spec(meta["spec"]), cal)
            windows = [(f.start_s, f.start_s + f.duration_s) for f in spec.faults]
            policy, seed = meta["policy"], meta["seed"]
            rows.append({"policy": policy, "world": "testbed", **_row(read_table(meta_path.parent, "requests"), windows)})
            for world, update in variants:
                engine = spec.engine.model_copy(update=update)
                run = run_sim(spec.model_copy(update={"engine": engine}), policy, seed, Path(tmp) / world)
                rows.append({"policy": policy, "world": world, **_row(read_table(run, "requests"), windows)})
    pd.set_option("display.width", 200)
    # over the recorded seeds: the failure rate's mean, the latencies' median of the per-run figures
    df = pd.DataFrame(rows)
    table = df.groupby(["policy", "world"], sort=False).agg({c: "mean" if c == "fail" else "median"
                                                            for c in df.columns if c not in ("policy", "world")})
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
