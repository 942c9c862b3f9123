"""How the twin scenario's simulated result moves with the deadline and the fault's severity.

    python benchmarks/twin_sensitivity.py [--calibration runs/twin/calibration.json] [--seeds 5]

The embedded twin scenario (core/defaults/testbed.yaml) in the simulator, calibrated when a
calibration file is given, for every (deadline, r) of a small grid: the failure rate of LC,
OTF-R and OracleAvoidance, mean over seeds. It shows where the scenario's separation of the
policies holds and where it vanishes, instead of tuning the deadline until it looks right.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from core.calibration.fit import apply_calibration, load_calibration
from core.records import read_table
from core.spec.model import load_spec, parse_spec
from simulator.run import run_sim

DEADLINES = (10.0, 15.0, 20.0, 30.0, 60.0)
SEVERITIES = (0.2, 0.05, 0.01)
POLICIES = ("LC", "OTF-R", "OracleAvoidance")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibration")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    base = load_spec(None, default="testbed.yaml")
    if args.calibration:
        base = apply_calibration(base, load_calibration(args.calibration))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for deadline in DEADLINES:
            for r in SEVERITIES:
                d = base.model_dump(mode="json")
                d["deadline_s"] = deadline
                d["faults"] = [{**d["faults"][0], "residual_bw": r}]
                spec = parse_spec(d)
                for policy in POLICIES:
                    rates = []
                    for seed in range(args.seeds):
                        req = read_table(run_sim(spec, policy, seed, Path(tmp)), "requests")
                        rates.append(float((req.outcome != "ok").mean()))
                    rows.append({"deadline_s": deadline, "r": r, "policy": policy,
                                 "failure_rate": sum(rates) / len(rates)})
    table = pd.DataFrame(rows).pivot_table(index=["deadline_s", "r"], columns="policy", values="failure_rate")
    print(f"failure rate, mean over {args.seeds} seeds ({'calibrated' if args.calibration else 'spec'} engine):")
    print(table[list(POLICIES)].round(3).to_string())


if __name__ == "__main__":
    main()
