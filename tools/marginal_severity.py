"""Where a link fault is marginal: the severity r at which a degraded pull takes about the deadline.

    python tools/marginal_severity.py [SPEC] [--calibration FILE] [--seeds 10] [--policy LC]

For the spec's first link fault (default: the embedded twin scenario, core/defaults/testbed.yaml), in
the simulator for every r of a grid: the KV pulls that cross a degraded pod and start while the link
is degraded with at least a deadline of the fault still ahead ([start, end - deadline]), so that a
pull slower than the deadline is slow inside the fault, not cut short by its end. Printed per r: how
many there are over the seeds, the share that timed out, and their median duration (a timed-out pull
counts as longer than the deadline, so the median is "> deadline" once half time out).

The marginal severity is the r at which that median is the deadline, half of those pulls ending ok:
there a request's outcome turns on how fast its pull and engines are, in both worlds. At r = 0.01
the link is jammed (the pulls routed to it share a rate far below what is sent), every such pull
times out and the outcome hardly depends on timing; at large r none does. Picked from this table
before any twin run at that r, so the twin's agreement there is not what chose it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from core.calibration.fit import apply_calibration, load_calibration
from core.records import read_table
from core.spec.model import ExperimentSpec, load_spec, parse_spec
from simulator.run import run_sim
from vocab import Outcome

SEVERITIES = (0.01, 0.02, 0.03, 0.04, 0.042, 0.044, 0.046, 0.048, 0.05, 0.06, 0.08, 0.1, 0.15)


def early_pulls(requests: pd.DataFrame, pods: set[int], start: float, end: float, deadline: float) -> pd.DataFrame:
    """The pulls across ``pods`` that start in [start, end - deadline]: duration (NaN when it did not
    finish) and whether the request timed out."""
    touches = requests["prefill_pod"].isin(pods) | requests["decode_pod"].isin(pods)
    kv0 = requests["kv_start_s"]
    sel = requests[touches & (kv0 >= start) & (kv0 <= end - deadline)]
    return pd.DataFrame({"duration_s": sel["kv_end_s"] - sel["kv_start_s"],
                         "timed_out": sel["outcome"].ne(Outcome.OK).to_numpy()})


def censored_median(durations: np.ndarray, deadline: float) -> float:
    """The median with unfinished pulls (NaN) counted as longer than ``deadline``: inf once half are."""
    d = np.where(np.isnan(durations), np.inf, durations)
    return float(np.median(d)) if d.size else float("nan")


def sweep(base: ExperimentSpec, policy: str, seeds: int, severities: tuple[float, ...]) -> pd.DataFrame:
    link = next((i for i, f in enumerate(base.faults) if f.kind == "link"), None)
    if link is None:
        raise ValueError(f"{base.name}: no link fault to vary")
    fault = base.faults[link]
    start, end = fault.start_s, fault.start_s + fault.duration_s
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in severities:
            d = base.model_dump(mode="json")
            d["faults"][link] = {**d["faults"][link], "residual_bw": r}
            spec = parse_spec(d)
            pulls = pd.concat([early_pulls(read_table(run_sim(spec, policy, s, Path(tmp)), "requests"),
                                           set(fault.pods), start, end, spec.deadline_s) for s in range(seeds)])
            med = censored_median(pulls["duration_s"].to_numpy(dtype=float), spec.deadline_s)
            rows.append({"r": r, "pulls": len(pulls), "timed_out": float(pulls["timed_out"].mean()),
                         "median_s": med})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?")
    ap.add_argument("--calibration")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--policy", default="LC")
    args = ap.parse_args()
    base = load_spec(args.spec, default="testbed.yaml")
    if args.calibration:
        base = apply_calibration(base, load_calibration(args.calibration))
    table = sweep(base, args.policy, args.seeds, SEVERITIES)
    print(f"{args.policy}'s pulls across the degraded link that start with a deadline ({base.deadline_s:g} s) of "
          f"the fault still ahead, {args.seeds} seeds ({'calibrated' if args.calibration else 'spec'} engine):")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
