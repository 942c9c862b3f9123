"""Does a claim measured in the simulator carry over to the testbed: a verdict per claim, by the rule of
analysis/rule/verdict.py (docs/verdicts.md).

A claim (core/spec/study.py ``ClaimSpec``) names its metric, its expected direction (``increase``,
``decrease``, or ``none``: no effect), its measure (a ``difference``, or a ``ratio`` reported beside
it) and its margin: the smallest effect that matters, and for a null claim the band inside which "no
effect" holds. Its effect is one number per world and seed: the metric of its cell (``a``) minus that
of its ``vs`` cell (``b``) on the same seed, or ``a`` alone without ``vs``. The input is a long table
(:data:`COLUMNS`): claim, world ("sim", "testbed", or "repeat": the testbed's second run of a seed,
shown, not judged), seed, value = a - b, a, b (NaN without ``vs``); a NaN value is a seed that ran
where the metric is undefined (no value, but the seed counts as run for a look).

Per claim (:func:`claim_row`):

* each world's interval over seeds (:func:`analysis.rule.verdict.interval`), the seeds' variance pooled
  with the prior of the claim's metric and kind of fault (core/defaults/priors.yaml, fixed before
  the runs) times sqrt(the cells in the effect: 1, or 2 with ``vs``); the simulator's too, whose
  seeds vary by workload as the testbed's do;
* the claim's status in each world (:func:`analysis.rule.verdict.world_status`);
* the paired difference testbed - simulator over the seeds both have, its interval with the same
  prior, and whether it lies inside +-margin: an equivalence test (two one-sided tests), which is
  the verdict on the simulated finding (:func:`analysis.rule.verdict.claim_verdict`);
* where the testbed repeated seeds, whether it repeats itself within the margin
  (:func:`analysis.rule.verdict.repeat_verdict` of the repeated cells of the claim's metric and kind of
  fault): a claim whose testbed does not cannot carry over, and says so;
* the seeds at which the equivalence test would decide, either way, with 80% probability, were the
  paired difference's mean and pooled standard deviation (prior and seeds, not the seeds' alone) as
  measured (:func:`analysis.rule.verdict.seeds_for_power`; a mean on a bound never decides: NaN);
* for a ratio claim, mean(a) / mean(b) per world with its Fieller interval (:func:`fieller`): NaN
  where mean(b) is 0 (the baseline never fails), unbounded (NaN bounds) where b's interval holds 0.
  The verdict judges the difference, which is defined either way.

A study with looks (study/looks.py) judges each claim look after look, each look's seeds at its
share of the level, and keeps the first look that decides; ``look`` and ``alpha`` say which and at
what level, and everything in the row is that look's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from study.looks import first_decided, look_level
from analysis.rule.verdict import (ALPHA, DIRECTIONS, MIN_SEEDS, NO_PRIOR, RULE_VERSION, UNDECIDED_CLAIM, Interval, Prior,
                              claim_verdict, inside, interval, no_effect, pooled_sd, seeds_for_power, with_repeat,
                              world_status)
from vocab import SIM, TESTBED

WORLDS = ("sim", "testbed", "repeat")
COLUMNS = ("claim", "world", "seed", "value", "a", "b")
MEASURES = ("difference", "ratio")
TABLE_COLUMNS = (
    "claim", "direction", "measure", "margin",
    "sim_mean", "sim_low", "sim_high", "sim_n", "sim_status",
    "tb_mean", "tb_low", "tb_high", "tb_n", "tb_status",
    "paired_mean", "paired_low", "paired_high", "n_seeds", "equivalence", "no_effect_either",
    "kind", "prior_sigma", "prior_df", "pooled_sd",
    "repeat", "repeat_mean", "repeat_low", "repeat_high", "repeat_n",
    "ratio_sim", "ratio_sim_low", "ratio_sim_high", "ratio_tb", "ratio_tb_low", "ratio_tb_high",
    "verdict", "reason", "seeds_needed", "look", "alpha", "rule")


@dataclass(frozen=True)
class ClaimRule:
    """What judges one claim: its metric, direction, margin, measure, how many cells its effect is
    made of (1, or 2 with ``vs``), its kind of fault and the prior of one run of its metric there."""

    metric: str
    direction: str
    margin: float
    measure: str = "difference"
    cells: int = 2
    kind: str = "none"
    prior: Prior = NO_PRIOR

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


def fieller(a: np.ndarray, b: np.ndarray, prior: Prior = NO_PRIOR, alpha: float = ALPHA) -> tuple[float, float, float]:
    """(ratio, low, high) of mean(a) / mean(b) over paired seeds, with Fieller's interval at the rule's
    confidence (Fieller, J. R. Stat. Soc. B 16, 1954): the ratios R for which mean(a) - R mean(b) is
    not distinguishable from 0, i.e. (a - R b)^2 <= t^2 var(a - R b) / n, a quadratic in R. Each cell's
    variance is pooled with ``prior`` (one run of the metric) as the rule pools it. NaN ratio where
    mean(b) = 0; NaN bounds where the interval is unbounded (b's own interval holds 0) or with fewer
    than MIN_SEEDS seeds (one seed decides nothing)."""
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    n = a.size
    if n == 0 or abs(float(b.mean())) < 1e-15:
        return math.nan, math.nan, math.nan
    ma, mb = float(a.mean()), float(b.mean())
    if n < MIN_SEEDS:
        return ma / mb, math.nan, math.nan
    (sa, df), (sb, _) = pooled_sd(float(a.var(ddof=1)), n, prior), pooled_sd(float(b.var(ddof=1)), n, prior)
    va, vb = sa * sa, sb * sb
    cab = float(np.cov(a, b, ddof=1)[0, 1]) * (n - 1) / df  # the covariance shrunk as the variances are
    t2 = float(stats.t.ppf(1.0 - alpha, df)) ** 2 / n
    qa, qb, qc = mb * mb - t2 * vb, ma * mb - t2 * cab, ma * ma - t2 * va
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return ma / mb, math.nan, math.nan
    root = math.sqrt(disc)
    return ma / mb, (qb - root) / qa, (qb + root) / qa


def _world(g: pd.DataFrame, world: str) -> pd.DataFrame:
    return g.loc[g["world"] == world].set_index("seed")[["value", "a", "b"]].astype(float).dropna(subset=["value"])


def effect_prior(rule: ClaimRule) -> Prior:
    """The prior of a claim's effect: one run's prior times sqrt(the cells its effect is made of)."""
    return rule.prior.times(rule.cells) if rule.prior.known else NO_PRIOR


def claim_row(g: pd.DataFrame, rule: ClaimRule, repeat: tuple[str, Interval] | None = None,
              looks: Sequence[int] | None = None, seeds: Sequence[int] | None = None) -> dict[str, object]:
    """The verdict of one claim from its (checked) rows; ``repeat``, where the testbed repeated seeds,
    its :func:`analysis.rule.verdict.repeat_verdict` for the claim's metric and kind of fault; ``looks``
    (seed counts) over the study's ``seeds`` in order, a group-sequential design (study/looks.py):
    see the module docstring."""
    sim, tb = _world(g, "sim"), _world(g, "testbed")
    prior = effect_prior(rule)
    if not looks:  # one look: every seed either world has
        seeds = sorted(set(sim.index) | set(tb.index))
    ran = set(g.loc[g["world"] == SIM, "seed"]) & set(g.loc[g["world"] == TESTBED, "seed"])

    def judge(chosen: list[int], alpha: float) -> tuple[str, tuple[Interval, Interval, Interval, float, list[int]] | None]:
        if looks and not set(chosen) <= ran:
            return "", None  # this look's seeds are not all run in both worlds
        s_, t_ = sim.loc[sim.index.isin(chosen)], tb.loc[tb.index.isin(chosen)]
        both = t_.index.intersection(s_.index)
        p_ = interval(t_.loc[both, "value"] - s_.loc[both, "value"], prior, alpha=alpha)
        got = (interval(s_["value"], prior, alpha=alpha), interval(t_["value"], prior, alpha=alpha), p_, alpha, chosen)
        return inside(p_, -rule.margin, rule.margin), got

    look, kept, waiting = first_decided(looks, seeds or [], judge)
    if kept is None:  # look 1 not reached: nothing judged yet
        alpha = look_level(len(looks) if looks else 1)
        kept = (interval([], prior), interval([], prior), interval([], prior), alpha, [])
    s, t, p, alpha, chosen = kept
    verdict, reason = claim_verdict(s, t, p, rule.direction, rule.margin)
    if not (s.n and t.n):
        reason = "no value " + ("in either world" if not (s.n or t.n) else "in the simulator" if not s.n else
                                "on the testbed")
    if waiting and verdict == UNDECIDED_CLAIM:
        reason = f"{waiting}; {reason}"
    rep_verdict, rep = repeat if repeat is not None else ("not run", interval([]))
    if with_repeat(verdict, None if repeat is None else rep_verdict) != verdict:
        verdict = UNDECIDED_CLAIM
        reason = (f"the testbed does not repeat itself within ±{rule.margin:g} (its repeat: {rep_verdict}, "
                  f"{rep.why_not or f'[{rep.low:.3g}, {rep.high:.3g}]'}); " + reason)
    # at the judged look's level (an undecided claim's is the last look's)
    needed = seeds_for_power(p.sd, -rule.margin, rule.margin, p.mean, prior, either=True, alpha=alpha) \
        if p.n and not math.isnan(p.sd) else None
    ratios: dict[str, float] = {}
    for key, w in (("sim", sim), ("tb", tb)):
        w = w.loc[w.index.isin(chosen)]
        r = fieller(w["a"].to_numpy(), w["b"].to_numpy(), rule.prior, alpha) if rule.measure == "ratio" \
            else (math.nan,) * 3
        ratios.update({f"ratio_{key}": r[0], f"ratio_{key}_low": r[1], f"ratio_{key}_high": r[2]})
    return {"direction": rule.direction, "measure": rule.measure, "margin": rule.margin,
            **_iv("sim", s, world_status(s, rule.direction, rule.margin)),
            **_iv("tb", t, world_status(t, rule.direction, rule.margin)),
            "paired_mean": p.mean, "paired_low": p.low, "paired_high": p.high, "n_seeds": p.n,
            "equivalence": inside(p, -rule.margin, rule.margin),
            "no_effect_either": no_effect(s, rule.margin) and no_effect(t, rule.margin),
            "kind": rule.kind, "prior_sigma": prior.sigma, "prior_df": prior.df, "pooled_sd": p.sd,
            "repeat": rep_verdict, "repeat_mean": rep.mean, "repeat_low": rep.low, "repeat_high": rep.high,
            "repeat_n": rep.n, **ratios, "verdict": verdict, "reason": reason,
            "seeds_needed": needed if needed is not None else math.nan, "look": look, "alpha": alpha,
            "rule": RULE_VERSION}


def _iv(key: str, iv: Interval, status: str) -> dict[str, object]:
    return {f"{key}_mean": iv.mean, f"{key}_low": iv.low, f"{key}_high": iv.high, f"{key}_n": iv.n,
            f"{key}_status": status}


def claim_table(effects: pd.DataFrame, rules: Mapping[str, ClaimRule],
                repeats: Mapping[tuple[str, str], tuple[str, Interval]] | None = None,
                looks: Sequence[int] | None = None, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """One row per claim of ``rules`` (in its order; :data:`TABLE_COLUMNS`), each judged by
    :func:`claim_row` with the repeat's verdict of its (metric, kind of fault) from ``repeats`` (not
    run where absent), at the study's ``looks`` over its ``seeds`` where it has looks. A claim
    without a row in ``effects`` is undecided, with nothing measured. A malformed table raises a
    one-line ValueError."""
    check_effects(effects)
    repeats = repeats or {}
    rows = []
    for name, rule in rules.items():
        g = effects.loc[effects["claim"] == name]
        rows.append({"claim": name, **claim_row(g, rule, repeats.get((rule.metric, rule.kind)), looks, seeds)})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
