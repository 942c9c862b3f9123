"""Where the flagship's separation of the policies holds, and where it vanishes.

    python benchmarks/physics_sensitivity.py [--seeds 1] [--jobs 2]

The embedded default scenario (core/defaults/default.yaml: 32 x 32 workers, pods 0-3 at
r = 0.20, 0.10, 0.05, 0.01) in the simulator, moving one physical default at a time away
from its cited value (core/spec/model.py, faults/spec.py): the core links' oversubscription, the
time-to-first-token limit, the load, and the health model. Prints the failure rate of LC,
FaultAwareLC, OTF-R and OracleAvoidance per setting (mean over seeds), instead of tuning any
of them until the result looks right.
"""

from __future__ import annotations

import argparse
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

POLICIES = ("LC", "FaultAwareLC", "OTF-R", "OracleAvoidance")
# (label, spec overrides): the cited defaults first, then one change at a time.
SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("defaults (3:1, TTFT 60 s, 246 req/s, checks)", {}),
    ("oversubscription 1:1", {"topology": {"oversubscription": 1.0}}),
    ("oversubscription 2:1", {"topology": {"oversubscription": 2.0}}),
    ("oversubscription 4:1", {"topology": {"oversubscription": 4.0}}),
    ("TTFT limit 30 s", {"ttft_timeout_s": 30.0}),
    ("TTFT limit 120 s", {"ttft_timeout_s": 120.0}),
    ("no TTFT limit (600 s deadline only)", {"ttft_timeout_s": None}),
    ("load 0.4 (164 req/s)", {"workload": {"arrival": {"kind": "poisson", "rate_rps": 164.0}}}),
    ("load 0.8 (328 req/s)", {"workload": {"arrival": {"kind": "poisson", "rate_rps": 328.0}}}),
    ("health: alert after 5 s", {"health": {"model": "alert", "detection_delay_s": 5.0, "clear_delay_s": 5.0}}),
)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _one(job: tuple[str, dict[str, Any], str, int]) -> dict[str, Any]:
    from core.records import read_table
    from core.spec.model import load_spec, parse_spec
    from simulator.run import run_sim

    label, over, policy, seed = job
    spec = parse_spec(_merge(load_spec(None).model_dump(mode="json"), over))
    with tempfile.TemporaryDirectory() as out:
        r = read_table(run_sim(spec, policy, seed, Path(out)), "requests")
    return {"setting": label, "policy": policy, "seed": seed, "failure_pct": 100.0 * float((r.outcome != "ok").mean())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = [(label, over, p, s) for label, over in SETTINGS for p in POLICIES for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_one, jobs))
    df = pd.DataFrame(rows).groupby(["setting", "policy"], sort=False).failure_pct.mean().unstack("policy")
    print(f"failure rate, % of all requests (mean over {args.seeds} seed(s)); default scenario, 240 s")
    print(df[list(POLICIES)].round(3).to_string())


if __name__ == "__main__":
    main()
