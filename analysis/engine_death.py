"""Engine death in both worlds: does the simulator's engine fault (faults.spec.EngineFault) end the
same requests the same way, and stop the router choosing the dead engine as soon, as the testbed's?

Per policy, for the quantities an engine death decides (:data:`ROWS`): engine_down_s (kill to the
router's down record), engine_up_s (a restart to the router's up record), the failure rate, and the failure composition by stage. Each is the mean over
the seeds of the sim's, the testbed's and, with a repeat (``testbed compare --repeat``), the repeat's
runs; ``diff`` = testbed - sim; ``repeatability`` = testbed - repeat over the seeds the repeat holds;
``beyond_repeatability`` as analysis/repeatability.py judges it: "within" when |diff| <=
|repeatability|, for engine_down_s at least :func:`down_floor_s`. The table
exists where a run of either world had an engine fault's kill.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.metric_names import Metric as M, fail_share
from analysis.repeatability import beyond
from analysis.summary import mean_ci
from core.stages import FAILURE_STAGES

ROWS: tuple[str, ...] = (M.ENGINE_DOWN_S, M.ENGINE_UP_S, M.FAILURE_RATE, *(fail_share(s) for s in FAILURE_STAGES))
FILE = "fidelity_engines.csv"
# One repeat measures the testbed's spread in a time with one draw, and two runs can agree by chance
# far closer than the testbed repeats. A dead core with a call on it is seen when vLLM's front end
# has noticed the death (the simulator's engine.core_death_notice_s, one value: their median), and
# that notice spread from 0.091 to 0.186 s over 21 testbed runs here (docs/reliability.md "The dead
# core's notice, measured"): engine_down_s, a mean over the deaths, is judged against at least that
# range times the share of its deaths that were a core's (engine_core_share), the most such notices
# can move the mean. (The first floor, 0.018 s, was the range of 3 runs; a CI run drew 0.117, 0.172.)
NOTICE_RANGE_S = 0.186 - 0.091


def _mean(runs: pd.DataFrame, world: str, policy: str, metric: str, seeds: set[int] | None = None) -> float:
    sel = (runs["world"] == world) & (runs["policy"] == policy)
    if seeds is not None:
        sel &= runs["seed"].isin(seeds)
    return mean_ci(runs.loc[sel, metric].to_numpy(dtype=float))[0] if metric in runs.columns else math.nan


def down_floor_s(core_share: float) -> float:
    """The least distance engine_down_s is judged against: :data:`NOTICE_RANGE_S` times the share of
    the averaged deaths that were a core's (0 where unknown)."""
    return NOTICE_RANGE_S * (0.0 if math.isnan(core_share) else core_share)


def engine_table(runs: pd.DataFrame, repeat_runs: pd.DataFrame | None, policies: Sequence[str]) -> pd.DataFrame | None:
    """One row per policy and quantity of :data:`ROWS` (module docstring); None where no run has an
    engine killed by a fault (engine_down_s NaN in every run)."""
    if M.ENGINE_DOWN_S not in runs.columns or runs[M.ENGINE_DOWN_S].isna().all():
        return None
    rows = []
    for policy in policies:
        seeds = None
        if repeat_runs is not None:
            seeds = set(repeat_runs.loc[repeat_runs["policy"] == policy, "seed"].tolist())
        shares = [_mean(runs, w, policy, M.ENGINE_CORE_SHARE) for w in ("sim", "testbed")]
        share = max((x for x in shares if not math.isnan(x)), default=math.nan)
        for metric in ROWS:
            sim, tb = _mean(runs, "sim", policy, metric), _mean(runs, "testbed", policy, metric)
            rep = _mean(repeat_runs, "repeat", policy, metric) if repeat_runs is not None else math.nan
            rep_dev = _mean(runs, "testbed", policy, metric, seeds) - rep if seeds else math.nan
            floor = down_floor_s(share) if metric == M.ENGINE_DOWN_S else 0.0
            rows.append({"policy": policy, "metric": metric, "sim": sim, "testbed": tb, "repeat": rep,
                         "diff": tb - sim, "repeatability": rep_dev,
                         "beyond_repeatability": beyond(tb - sim, rep_dev, floor)})
    return pd.DataFrame(rows)


def write_engine_table(table: pd.DataFrame, scenario: str, out_dir: Path) -> Path:
    path = Path(out_dir) / FILE
    df = table.copy()
    df.insert(0, "scenario", scenario)
    df.to_csv(path, index=False)
    return path


def print_engine_table(table: pd.DataFrame, console: Console) -> None:
    t = Table(title="engine death: sim vs testbed (diff = testbed - sim; repeatability = testbed - repeat)")
    for col in ("policy", "metric", "sim", "testbed", "repeat", "diff", "repeatability", "beyond_repeatability"):
        t.add_column(col)
    colour = {"within": "green", "beyond": "yellow", "n/a": "dim"}
    for r in table.itertuples():
        cells = ["–" if isinstance(v, float) and math.isnan(v) else f"{v:.3g}"
                 for v in (r.sim, r.testbed, r.repeat, r.diff, r.repeatability)]
        v = r.beyond_repeatability
        t.add_row(r.policy, r.metric, *cells, f"[{colour[v]}]{v}[/]")
    console.print(t)
