"""Does a claim measured in the simulator carry over to the testbed: a verdict per claim.

A claim's effect is one number per world and seed (say FaultAwareLC's failure rate minus
FaultAwareOTF-R's). The input is a long table: claim, world ("sim", "testbed", or "repeat": the
testbed's second run of the same seeds), seed, value; NaN values are left out.

Interval of a world's effect: mean over seeds +- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard
deviation (ddof=1), Student t (analysis.summary.mean_ci). With 3 seeds at 95 % that is
mean +- 4.303 * s / sqrt(3), about mean +- 2.48 s; with fewer than 2 seeds there is no interval. The
effect *holds* in a world when its interval excludes 0.

Verdict: the testbed's repeatability is the mean over seeds of |testbed - repeat| (the seeds run
twice); diff = testbed mean - sim mean. "carries over" when the two means have the same sign and
|diff| <= repeatability; "does not carry over" when the signs differ or |diff| > repeatability; "n/a"
with fewer than 2 seeds in either world or no repeat. Why repeatability is the yardstick: a
difference between the worlds no larger than the testbed's difference from itself on the same seeds
cannot be told from the testbed's own noise, and one larger than it can.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from analysis.summary import mean_ci

WORLDS = ("sim", "testbed", "repeat")
COLUMNS = ("claim", "world", "seed", "value")
# Below this an effect counts as zero: equal rates subtracted can leave 1e-17 instead of 0.
ZERO_EFFECT = 1e-12
CARRIES, DOES_NOT, NA = "carries over", "does not carry over", "n/a"
TABLE_COLUMNS = ("claim", "sim_mean", "sim_low", "sim_high", "sim_n", "tb_mean", "tb_low", "tb_high", "tb_n",
                 "n_seeds", "diff", "paired_diff", "paired_low", "paired_high", "repeatability", "n_repeat",
                 "holds_sim", "holds_tb", "same_sign", "within_repeatability", "verdict")


def effect_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of the non-NaN values: low/high = mean -+ the Student-t half-width of
    :func:`analysis.summary.mean_ci`; NaN bounds with n < 2, all NaN with n = 0."""
    mean, half, n = mean_ci(values, confidence)
    return mean, mean - half, mean + half, n


def _sign(x: float) -> int:
    return 0 if abs(x) < ZERO_EFFECT else int(math.copysign(1, x))


def _holds(low: float, high: float) -> bool | None:
    """The interval excludes 0; None (<NA> in the table) without an interval."""
    if math.isnan(low) or math.isnan(high):
        return None
    return bool(low > 0 or high < 0)


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


def claim_row(g: pd.DataFrame, confidence: float) -> dict[str, object]:
    """The verdict of one claim from its (checked) rows: see the module docstring."""
    by = {w: g.loc[g["world"] == w].set_index("seed")["value"].astype(float).dropna() for w in WORLDS}
    sim, tb, rep = by["sim"], by["testbed"], by["repeat"]
    sm, sl, sh, sn = effect_ci(sim.to_numpy(), confidence)
    tm, tl, th, tn = effect_ci(tb.to_numpy(), confidence)
    both = tb.index.intersection(sim.index)
    pm, pl, ph, pn = effect_ci((tb[both] - sim[both]).to_numpy(), confidence)  # matched by seed
    again = tb.index.intersection(rep.index)
    repeatability = float(np.abs(tb[again] - rep[again]).mean()) if len(again) else math.nan
    diff = tm - sm
    defined = not (math.isnan(sm) or math.isnan(tm))
    same_sign = _sign(sm) == _sign(tm) if defined else None
    # |diff| below ZERO_EFFECT is 0: equal means computed in another order differ by 1e-17
    within = bool(abs(diff) < ZERO_EFFECT or abs(diff) <= repeatability) \
        if defined and not math.isnan(repeatability) else None
    if sn < 2 or tn < 2 or math.isnan(repeatability):
        verdict = NA
    elif same_sign and within:
        verdict = CARRIES
    else:
        verdict = DOES_NOT
    return {"sim_mean": sm, "sim_low": sl, "sim_high": sh, "sim_n": sn,
            "tb_mean": tm, "tb_low": tl, "tb_high": th, "tb_n": tn, "n_seeds": pn,
            "diff": diff, "paired_diff": pm, "paired_low": pl, "paired_high": ph,
            "repeatability": repeatability, "n_repeat": len(again),
            "holds_sim": _holds(sl, sh), "holds_tb": _holds(tl, th),
            "same_sign": same_sign, "within_repeatability": within, "verdict": verdict}


def claim_table(effects: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per claim (sorted): each world's effect interval (sim_/tb_ mean, low, high, n), n_seeds
    (seeds with a value in both worlds), diff = tb_mean - sim_mean, the paired difference over those
    seeds (testbed - sim per seed: paired_diff, paired_low, paired_high), repeatability (mean |testbed
    - repeat| over the n_repeat seeds that have both; NaN with none), holds_sim / holds_tb (the interval
    excludes 0), same_sign (|mean| < ZERO_EFFECT counts as 0, so two zeros agree),
    within_repeatability (|diff| <= repeatability), and the verdict of the module docstring. The
    booleans are <NA> where undefined. A malformed table raises a one-line ValueError."""
    check_effects(effects)
    rows = [{"claim": claim, **claim_row(g, confidence)} for claim, g in effects.groupby("claim", sort=True)]
    out = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    for c in ("holds_sim", "holds_tb", "same_sign", "within_repeatability"):
        out[c] = out[c].astype("boolean")
    return out
