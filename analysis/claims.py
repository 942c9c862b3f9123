"""Does a claim measured in the simulator carry over to the testbed: a verdict per claim, by the rule of
analysis/verdict.py (docs/verdicts.md).

A claim (core/study_spec.py ``ClaimSpec``) names its metric, its expected direction (``increase``,
``decrease``, or ``none``: no effect), its measure (a ``difference``, or a ``ratio`` reported beside
it) and its margin: the smallest effect that matters, and for a null claim the band inside which "no
effect" holds. Its effect is one number per world and seed: the metric of its cell (``a``) minus that
of its ``vs`` cell (``b``) on the same seed, or ``a`` alone without ``vs``. The input is a long table
(:data:`COLUMNS`): claim, world ("sim", "testbed", or "repeat": the testbed's second run of a seed,
shown, not judged), seed, value = a - b, a, b (NaN without ``vs``).

Per claim (:func:`claim_row`):

* each world's interval over seeds (:func:`analysis.verdict.interval`), floored by the testbed's
  spread of the effect: the spread of its metric, pooled over every repeated cell of the study
  (analysis/study_claims.py), times sqrt(the cells in the effect: 1, or 2 with ``vs``). The floor
  holds for the simulator's interval too: the simulator is exact per seed, and without it a claim
  would hold there on a precision the testbed cannot have;
* whether it holds in each world (:func:`analysis.verdict.world_status`);
* the paired difference testbed - simulator over the seeds both have, its interval with the same
  floor, and whether it lies inside +-margin: an equivalence test (two one-sided tests);
* the verdict, its reason and the seeds a decision needs (:func:`analysis.verdict.claim_verdict`,
  :func:`analysis.verdict.claim_seeds_needed`), the means and spreads staying as measured: for a
  decided claim the fewest that would have decided it;
* for a ratio claim, mean(a) / mean(b) per world with its Fieller interval (:func:`fieller`): NaN
  where mean(b) is 0 (the baseline never fails), unbounded (NaN bounds) where b's interval holds 0.
  The verdict judges the difference, which is defined either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from analysis.verdict import (ALPHA, DIRECTIONS, NO_SPREAD, RULE_VERSION, UNDECIDED_CLAIM, Interval, Spread,
                              claim_seeds_needed, claim_verdict, inside, interval, world_status)

WORLDS = ("sim", "testbed", "repeat")
COLUMNS = ("claim", "world", "seed", "value", "a", "b")
MEASURES = ("difference", "ratio")
TABLE_COLUMNS = (
    "claim", "direction", "measure", "margin",
    "sim_mean", "sim_low", "sim_high", "sim_n", "sim_status",
    "tb_mean", "tb_low", "tb_high", "tb_n", "tb_status",
    "paired_mean", "paired_low", "paired_high", "n_seeds", "equivalence",
    "spread_sigma", "spread_pairs", "effect_floor", "margin_below_floor",
    "ratio_sim", "ratio_sim_low", "ratio_sim_high", "ratio_tb", "ratio_tb_low", "ratio_tb_high",
    "verdict", "reason", "seeds_needed", "rule")


@dataclass(frozen=True)
class ClaimRule:
    """What judges one claim: its metric (whose spread floors it), direction, margin, measure, and how
    many cells its effect is made of (1, or 2 with ``vs``)."""

    metric: str
    direction: str
    margin: float
    measure: str = "difference"
    cells: int = 2

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {self.direction!r} (known: {', '.join(DIRECTIONS)})")
        if self.measure not in MEASURES:
            raise ValueError(f"unknown measure {self.measure!r} (known: {', '.join(MEASURES)})")
        if not self.margin > 0:
            raise ValueError(f"a claim's margin must be > 0, got {self.margin!r}")


def check_effects(effects: pd.DataFrame) -> None:
    """A one-line ValueError for a missing column, an unknown world or a (claim, world, seed) given
    twice."""
    missing = [c for c in COLUMNS if c not in effects.columns]
    if missing:
        raise ValueError(f"effects table lacks column(s) {', '.join(missing)} (needs {', '.join(COLUMNS)})")
    unknown = sorted(set(effects["world"].astype(str)) - set(WORLDS))
    if unknown:
        raise ValueError(f"unknown world(s) {', '.join(unknown)} in the effects table (known: {', '.join(WORLDS)})")
    dup = effects.duplicated(["claim", "world", "seed"], keep=False)
    if dup.any():
        r = effects.loc[dup].iloc[0]
        raise ValueError(f"claim {r['claim']!r} has two values for world={r['world']} seed={r['seed']}")


def fieller(a: np.ndarray, b: np.ndarray, floor: Spread = NO_SPREAD) -> tuple[float, float, float]:
    """(ratio, low, high) of mean(a) / mean(b) over paired seeds, with Fieller's interval at the rule's
    confidence (Fieller, J. R. Stat. Soc. B 16, 1954): the ratios R for which mean(a) - R mean(b) is
    not distinguishable from 0, i.e. (a - R b)^2 <= t^2 var(a - R b) / n, a quadratic in R. Each cell's
    variance is floored by ``floor`` (one testbed run's spread of the metric). NaN ratio where mean(b)
    = 0; NaN bounds where the interval is unbounded (b's own interval holds 0) or with fewer than 2
    seeds and no floor."""
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    n = a.size
    if n == 0 or abs(float(b.mean())) < 1e-15:
        return math.nan, math.nan, math.nan
    ma, mb = float(a.mean()), float(b.mean())
    f2 = floor.sigma ** 2 if floor.known else 0.0
    if n >= 2:
        va, vb = max(float(a.var(ddof=1)), f2), max(float(b.var(ddof=1)), f2)
        cab, df = float(np.cov(a, b, ddof=1)[0, 1]), n - 1
    elif floor.known:
        va = vb = f2
        cab, df = 0.0, floor.pairs
    else:
        return ma / mb, math.nan, math.nan
    t2 = float(stats.t.ppf(1.0 - ALPHA, df)) ** 2 / n
    qa, qb, qc = mb * mb - t2 * vb, ma * mb - t2 * cab, ma * ma - t2 * va
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return ma / mb, math.nan, math.nan
    root = math.sqrt(disc)
    return ma / mb, (qb - root) / qa, (qb + root) / qa


def _world(g: pd.DataFrame, world: str) -> pd.DataFrame:
    return g.loc[g["world"] == world].set_index("seed")[["value", "a", "b"]].astype(float).dropna(subset=["value"])


def effect_floor(spread: Spread, rule: ClaimRule) -> Spread:
    """The floor of a claim's intervals: the testbed's spread of one run of its metric, times
    sqrt(the cells its effect is made of); none where the spread is unknown."""
    return spread.times(rule.cells) if spread.known else NO_SPREAD


def claim_row(g: pd.DataFrame, rule: ClaimRule, spread: Spread = NO_SPREAD) -> dict[str, object]:
    """The verdict of one claim from its (checked) rows, ``spread`` being the testbed's spread of one run
    of its metric: see the module docstring."""
    sim, tb = _world(g, "sim"), _world(g, "testbed")
    floor = effect_floor(spread, rule)
    s, t = interval(sim["value"], floor), interval(tb["value"], floor)
    both = tb.index.intersection(sim.index)
    p = interval(tb.loc[both, "value"] - sim.loc[both, "value"], floor)
    verdict, reason = claim_verdict(s, t, p, rule.direction, rule.margin)
    if not (s.n and t.n):
        reason = "no value " + ("in either world" if not (s.n or t.n) else "in the simulator" if not s.n else
                                "on the testbed")
    below = bool(floor.known and rule.margin < floor.sigma)
    if below:
        reason += f" (the margin {rule.margin:g} is below one run's spread of this effect, {floor.sigma:.3g})"
    needed = claim_seeds_needed(s, t, p, rule.direction, rule.margin)
    if needed is None and verdict != UNDECIDED_CLAIM:  # decided on the spread's degrees of freedom
        needed = max(s.n, t.n)
    ratios: dict[str, float] = {}
    for key, w in (("sim", sim), ("tb", tb)):
        r = fieller(w["a"].to_numpy(), w["b"].to_numpy(), spread) if rule.measure == "ratio" else (math.nan,) * 3
        ratios.update({f"ratio_{key}": r[0], f"ratio_{key}_low": r[1], f"ratio_{key}_high": r[2]})
    return {"direction": rule.direction, "measure": rule.measure, "margin": rule.margin,
            **_iv("sim", s, world_status(s, rule.direction, rule.margin)),
            **_iv("tb", t, world_status(t, rule.direction, rule.margin)),
            "paired_mean": p.mean, "paired_low": p.low, "paired_high": p.high, "n_seeds": p.n,
            "equivalence": inside(p, -rule.margin, rule.margin),
            "spread_sigma": spread.sigma, "spread_pairs": spread.pairs, "effect_floor": floor.sigma,
            "margin_below_floor": below, **ratios, "verdict": verdict, "reason": reason,
            "seeds_needed": needed if needed is not None else math.nan, "rule": RULE_VERSION}


def _iv(key: str, iv: Interval, status: str) -> dict[str, object]:
    return {f"{key}_mean": iv.mean, f"{key}_low": iv.low, f"{key}_high": iv.high, f"{key}_n": iv.n,
            f"{key}_status": status}


def claim_table(effects: pd.DataFrame, rules: Mapping[str, ClaimRule],
                spreads: Mapping[str, Spread] | None = None) -> pd.DataFrame:
    """One row per claim of ``rules`` (in its order; :data:`TABLE_COLUMNS`), each judged by
    :func:`claim_row` with the spread of its metric from ``spreads`` (none where absent). A claim
    without a row in ``effects`` is undecided, with nothing measured. A malformed table raises a
    one-line ValueError."""
    check_effects(effects)
    spreads = spreads or {}
    rows = []
    for name, rule in rules.items():
        g = effects.loc[effects["claim"] == name]
        rows.append({"claim": name, **claim_row(g, rule, spreads.get(rule.metric, NO_SPREAD))})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
