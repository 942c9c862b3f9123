"""A carry-over study sized before it runs: per claim, the seeds its equivalence test needs for 80%
power, and what the study's design then costs in runs and wall time on the testbed
(`testbed study SPEC --plan`; docs/carryover.md "Sizing a study before it runs").

Per claim, fixed before any run and computed from the spec alone:

* its kind of fault and prior as the study's report judges it (study.claims.claim_rules:
  the widest kind among the points it reads, the fewest requests their runs hold);
* the planning standard deviation of its seed-paired difference: the shipped prior of its metric
  there (core/defaults/priors.yaml) times sqrt(the cells of its effect), which the rule also pools
  with (a fixed planning value, not a plug-in from a few seeds);
* the planning difference: 0, the worlds agreeing exactly; at 0 both one-sided tests bind, which is
  why the one-sided shortcut t(1 - alpha) + t(1 - beta) undersizes the study (analysis.rule.verdict.tost_power);
* the seeds that give 80% power (analysis.rule.verdict.seeds_for_power) and the power at the spec's own
  seed count.

The study needs the most any claim needs, since every claim reads the same seeds: its runs are the
distinct runs of one seed (cells that cannot differ share a run, study.grid.distinct_runs) times
the seeds, plus the repeated seeds' runs; its wall time each run's (core.spec.sizes footprint: the
arrivals' span and the deadline), the calibration load's runs (core.calibration.fit.LOAD_SEEDS) and
the engines' start (core.spec.sizes.ENGINE_START_S).

With looks (study/looks.py) a claim's power is that of the whole design, by simulation at the
planning values (:func:`study.looks.simulate`), beside the mean seeds it runs; the study then
costs between look 1's runs (every claim decided there) and all its seeds' (none decided early).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from rich.table import Table

from study.verdicts import effect_prior
from study.looks import simulate
from study.claims import claim_rules
from analysis.rule.verdict import POWER, seeds_for_power, tost_power
from core.calibration.fit import LOAD_SEEDS
from analysis.rule.priors import fault_kind
from core.spec.sizes import ENGINE_START_S, expected_requests, footprint
from study.grid import ClaimSides, claim_points

PLAN_COLUMNS = ("claim", "metric", "kind", "cells", "requests", "margin", "planning_sd", "prior_df",
                "power_at_spec_seeds", "seeds_needed", "power_with_looks", "mean_seeds")
PLAN_REPS = 4000  # simulated studies per claim for a design with looks: a power's standard error <= 0.008


def plan_table(sides: Sequence[ClaimSides], point_specs: dict[str, Any], spec_seeds: int,
               looks: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per claim (:data:`PLAN_COLUMNS`; module docstring): ``point_specs`` maps each point to its
    resolved spec, ``spec_seeds`` is the seeds the spec runs, ``looks`` its looks (None: one look)."""
    conditions = {p: (fault_kind(sp.faults), expected_requests(sp) or math.nan) for p, sp in point_specs.items()}
    rules = claim_rules(sides, conditions)  # the kind and prior each claim is judged with
    rows = []
    for s in sides:
        rule = rules[s.name]
        kind, cells, effect = rule.kind, rule.cells, effect_prior(rule)
        requests = min((conditions[p][1] for p in claim_points(s) if p in conditions), default=math.nan)
        sd = effect.sigma if effect.known else math.nan
        need = seeds_for_power(sd, -s.margin, s.margin, 0.0, effect) if effect.known else None
        power = tost_power(spec_seeds, sd, -s.margin, s.margin, 0.0, effect) if effect.known else math.nan
        design = simulate(looks, sd, -s.margin, s.margin, 0.0, effect, reps=PLAN_REPS) \
            if looks and effect.known else {"pass": math.nan, "mean_seeds": math.nan}
        rows.append({"claim": s.name, "metric": s.metric, "kind": kind, "cells": cells, "requests": requests,
                     "margin": s.margin, "planning_sd": sd, "prior_df": effect.df, "power_at_spec_seeds": power,
                     "seeds_needed": math.nan if need is None else need, "power_with_looks": design["pass"],
                     "mean_seeds": design["mean_seeds"]})
    return pd.DataFrame(rows, columns=list(PLAN_COLUMNS))


def study_cost(runs_per_seed: int, repeat_seeds: int, seeds: int, run_spec: Any) -> tuple[int, float]:
    """(runs, wall seconds) of a testbed study of ``seeds`` seeds: each seed's distinct runs, the
    repeated seeds' runs again, each run's wall time (core.spec.sizes footprint), the calibration load's
    runs before them and the engines' start."""
    runs = runs_per_seed * (seeds + repeat_seeds)
    per_run = footprint(run_spec, "testbed").seconds or math.nan
    return runs, (runs + len(LOAD_SEEDS)) * per_run + ENGINE_START_S


def _num(x: float, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def plan_console_table(plan: pd.DataFrame, spec_seeds: int, looks: Sequence[int] | None = None) -> Table:
    t = Table(title=f"plan: seeds each claim needs for {100 * POWER:.0f}% power where the worlds agree exactly "
                    "(planning difference 0, the shipped prior as planning sd)")
    seq = (f"power, looks {', '.join(map(str, looks))}", "mean seeds") if looks else ()
    for c in ("claim", "metric", "kind", "planning sd", "margin", f"power at {spec_seeds} seeds", "seeds needed",
              *seq):
        t.add_column(c, justify="left" if c in ("claim", "metric", "kind") else "right")
    for r in plan.itertuples():
        t.add_row(r.claim, r.metric, r.kind, _num(r.planning_sd, ".3g"), _num(r.margin, "g"),
                  _num(r.power_at_spec_seeds, ".2f"),
                  "> 100" if math.isnan(r.seeds_needed) else f"{r.seeds_needed:.0f}",
                  *((_num(r.power_with_looks, ".2f"), _num(r.mean_seeds, ".1f")) if looks else ()))
    return t
