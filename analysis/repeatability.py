"""The testbed as an instrument: how far two testbed runs of one seed sit apart, and whether the
simulator's distance from the testbed is within that or beyond it (docs/twin.md "Repeatability").

A second set of testbed runs of the same scenario, policies and seeds (``testbed compare SIM TESTBED
--repeat TESTBED2``) is compared with the first with the very maths the simulator is: the first set is
the reference, the repeat the other side (analysis/fidelity.py's table, analysis/paired.py's report).
Not to be confused with the noise floor of analysis/fidelity.py, the failure rate of requests that
touched no degraded pod.

* deviation of a check row (:func:`deviation`), the quantity its verdict judges: for an "abs" check
  (failure rate, traffic deflection) diff = reference - other; for a "rel" check (TTFT and E2E p50,
  p90) rel_error = (other - reference) / reference; for a "min" check (outcome agreement) diff =
  1 - agreement, the share of matched requests that ended differently.
* repeatability of a check: the deviation of the same row with the repeat as the other side (the
  testbed's mean over the seeds the repeat holds).
* beyond_repeatability: "within" when |sim deviation| <= |repeatability| (1e-12 of float rounding
  allowed), "beyond" when larger, "n/a" without a repeat or where either is NaN.
"""

from __future__ import annotations

import math

import pandas as pd

EPS = 1e-12  # float rounding, as in analysis/fidelity.py
KINDS = ("abs", "rel", "min")


def deviation(row: pd.Series) -> float:
    """The deviation a check row's verdict judges: rel_error for a "rel" check, diff otherwise."""
    kind = row["tolerance_kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown tolerance kind {kind!r} (known: {', '.join(KINDS)})")
    return float(row["rel_error"] if kind == "rel" else row["diff"])


def beyond(sim_deviation: float, repeat_deviation: float, floor: float = 0.0) -> str:
    """"within" when |sim_deviation| <= max(|repeat_deviation|, ``floor``), "beyond" when larger, "n/a"
    if either is NaN. ``floor``: the spread the testbed is known to have in that quantity from more runs
    than one repeat, where one repeat can agree by chance far closer (analysis/engine_death.py)."""
    if math.isnan(sim_deviation) or math.isnan(repeat_deviation):
        return "n/a"
    return "within" if abs(sim_deviation) <= max(abs(repeat_deviation), floor) + EPS else "beyond"


def with_deviation(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of a check table with a ``deviation`` column (:func:`deviation` of each row)."""
    out = table.copy()
    out["deviation"] = [deviation(r) for _, r in table.iterrows()] if len(table) else pd.Series(dtype=float)
    return out


def add_repeatability(table: pd.DataFrame, repeat: pd.DataFrame | None) -> pd.DataFrame:
    """A copy of the sim-vs-testbed check table with ``repeatability`` (the deviation of the same policy
    and metric in ``repeat``, the testbed-vs-repeat table; NaN where it has none or without a repeat)
    and ``beyond_repeatability`` (:func:`beyond`)."""
    out = table.copy()
    rep: dict[tuple[str, str], float] = {}
    if repeat is not None:
        rep = {(r["policy"], r["metric"]): deviation(r) for _, r in repeat.iterrows()}
    vals = [rep.get((r["policy"], r["metric"]), math.nan) for _, r in table.iterrows()]
    out["repeatability"] = pd.Series(vals, index=table.index, dtype=float)
    out["beyond_repeatability"] = pd.Series(
        [beyond(deviation(r), v) for (_, r), v in zip(table.iterrows(), vals)], index=table.index, dtype=object)
    return out
