"""The testbed as an instrument: how far two testbed runs of one seed sit apart (docs/twin.md
"Repeatability").

A second set of testbed runs of the same scenario, policies and seeds (``testbed compare SIM TESTBED
--repeat TESTBED2``) is compared with the first with the very maths the simulator is: the first set is
the reference, the repeat the other side (analysis/compare/checks.py's ``repeat_table``,
analysis/compare/paired.py's report). Not to be confused with the noise floor of analysis/compare/fidelity.py, the
failure rate of requests that touched no degraded pod.

* deviation of a check (the quantity its verdict judges): for an "abs" check (failure rate, traffic
  deflection) testbed - other; for a "rel" check (TTFT and E2E p50, p90) (other - testbed) / testbed;
  for a "min" check (outcome agreement) 1 - agreement, the share of matched requests that ended
  differently. Per seed, and its mean over seeds.
* repeatability of a check: the mean deviation of the same check with the repeat as the other side,
  a description beside the simulator's. The same deviations, pooled over the repeated policies and
  seeds, judge the testbed against itself by the verdict rule (analysis/compare/checks.py
  ``repeat_checks``): a check whose testbed does not repeat itself cannot pass.
"""

from __future__ import annotations

import math

import pandas as pd


def add_repeatability(table: pd.DataFrame, repeat: pd.DataFrame | None) -> pd.DataFrame:
    """A copy of the sim-vs-testbed check table with ``repeatability``: the mean deviation of the same
    policy and metric in ``repeat`` (the testbed-vs-repeat table); NaN where it has none or without a
    repeat."""
    out = table.copy()
    rep: dict[tuple[str, str], float] = {}
    if repeat is not None:
        rep = {(r["policy"], r["metric"]): float(r["deviation"]) for _, r in repeat.iterrows()}
    vals = [rep.get((r["policy"], r["metric"]), math.nan) for _, r in table.iterrows()]
    out["repeatability"] = pd.Series(vals, index=table.index, dtype=float)
    return out
