"""The verdict rule: one rule that says whether a result holds, whether the two worlds agree, and when
the runs cannot tell. The carry-over study's claims (study/verdicts.py), every check of `testbed
compare` / `testbed twin` (analysis/compare/fidelity.py) and the engine-death comparison
(analysis/compare/engine_death.py) are judged by it; docs/verdicts.md states it for users.

* **Values.** One number per seed: a claim's effect in one world, or one world's deviation from the
  other (testbed minus simulator, paired by seed: the seeds' workloads are the same in both worlds).
  The seed is the unit: a repeat of one seed measures the instrument, not how the worlds' difference
  varies over workloads, so **one seed decides nothing** (``MIN_SEEDS``).
* **Interval.** The mean over the n seeds with a Student-t interval at confidence 1 - 2 ALPHA (90 %):
  mean -+ t(1 - ALPHA, df) * s_p / sqrt(n), so that every test below is one-sided at ALPHA = 5 % and
  an equivalence test is the interval form of two one-sided tests (Schuirmann, J. Pharmacokin.
  Biopharm. 15, 1987). Why the t interval with 3 to 5 seeds: a bootstrap of 3 values has 10 distinct
  resamples, and a sign or signed-rank test of 3 values cannot reach 5 % (its smallest one-sided p is
  1/8); the t interval can, on the assumption that each seed's value, a mean over a run's requests,
  is roughly normal.
* **Variance pooled with a prior** (:class:`Prior`). s_p^2 = (d0 s0^2 + (n - 1) s^2) / (d0 + n - 1)
  with df = d0 + n - 1: the seeds' sample variance s^2 moderated by a prior variance s0^2 worth d0
  degrees of freedom, fixed in advance per metric and kind of fault from the studies on record
  (core/defaults/priors.yaml; the scaled-inverse-chi-square prior of the normal model, whose
  posterior for the mean is exactly this t; Gelman et al., Bayesian Data Analysis, 3rd ed., 3.3;
  Smyth, Stat. Appl. Genet. Mol. Biol. 3, 2004, for the same moderation). Seeds that never vary get
  the prior's width, not zero; seeds that vary more than the prior widen it. A width of exactly 0
  (no prior, seeds equal) is no interval: **nothing is decided on an interval of zero width**.
* **Common spread.** A spread shared by every seed, not drawn anew per seed: the simulator's
  calibration, one measurement that every simulated seed uses, so its error does not average out
  over seeds. Measured by simulating the same seeds under k calibrations made on engines started
  anew (sigma_c: the standard deviation over the calibrations of the seeds' mean deviation, df
  k - 1), it adds to the mean's variance whole: half-width t(1 - ALPHA, df) * sqrt(s_p^2 / n +
  sigma_c^2), df by Welch-Satterthwaite ((a + b)^2 / (a^2 / df_s + b^2 / df_c), a = s_p^2 / n,
  b = sigma_c^2). Without it the interval is the one above.
* **Spread** of the testbed in one metric, from duplicate runs: k pairs of a first and a repeated
  testbed run of the same cell (scenario, policy, seed), d their difference; sigma = sqrt(sum d^2 / 2k)
  (the error of a single measurement from duplicates, Dahlberg 1940). It describes the instrument;
  the repeat itself is judged by the rule (:func:`repeat_verdict`): a check or claim whose testbed
  does not repeat itself within its margin cannot pass.
* **Looks.** A study may judge its claims at two or three looks, every test of each at ALPHA / K
  (study/looks.py); the functions here take that level as ``alpha``.
* **Inside a region** (:func:`inside`): "pass" when the interval lies inside [lo, hi], "fail" when it
  lies wholly outside, "undecided" when it straddles a bound or cannot decide (:attr:`Interval.why_not`).

A claim (:func:`claim_verdict`) is a verdict on the **simulated finding**: it carries over when the
seed-paired difference testbed - simulator lies inside +-margin, does not when it lies wholly
outside, and is undecided otherwise. Beside it each world's status of the claim
(:func:`world_status`). How many seeds a decision needs is a power computation
(:func:`tost_power`, :func:`seeds_for_power`): exact, integrating the t statistic's variance
estimate over its chi-square law, at a stated planning difference and standard deviation. A parameter
fitted from testbed runs is judged on other runs against its prediction interval
(:func:`prediction_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
from scipy import integrate, stats

from analysis.rule.priors import NONE, prior_of

# Recorded with every verdict table (claims.csv, fidelity.csv, fidelity_engines.csv): a change to the
# rule, its priors' meaning or ALPHA changes it, and verdicts judged by another rule are not comparable.
RULE_VERSION = "tost-prior-2"
ALPHA = 0.05  # one-sided, every test; intervals are shown at 1 - 2 ALPHA
CONFIDENCE = 1.0 - 2.0 * ALPHA
POWER = 0.8  # the power a plan sizes a study for
EPS = 1e-12  # float rounding at a bound
MIN_SEEDS = 2  # one seed is one workload: no replication, no decision
MAX_SEEDS = 100  # seeds_for_power looks no further

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
HOLDS, REFUTED, OPEN = "holds", "refuted", "open"
CARRIES, DOES_NOT, UNDECIDED_CLAIM = "carries over", "does not carry over", "undecided"
DIRECTIONS = ("increase", "decrease", "none")
ONE_SEED = "one seed: a repeat of one workload is not replication"
ZERO_WIDTH = "an interval of zero width: the seeds never varied and no prior gives the instrument's spread"


@dataclass(frozen=True)
class Spread:
    """The testbed's run-to-run spread of one quantity: ``sigma`` per run, and ``pairs``, the repeated
    runs it was pooled from (its degrees of freedom); or a spread every seed shares (the simulator's
    over calibrations), ``pairs`` then its degrees of freedom."""

    sigma: float
    pairs: int

    @classmethod
    def of(cls, differences: Iterable[float]) -> Spread:
        """Dahlberg's sigma = sqrt(sum d^2 / 2k) of the non-NaN differences d between a first and a
        repeated run of the same cell; NaN with none."""
        d = np.asarray(list(differences), dtype=float)
        d = d[np.isfinite(d)]
        if d.size == 0:
            return NO_SPREAD
        return cls(float(math.sqrt(np.sum(d * d) / (2 * d.size))), int(d.size))

    def times(self, runs: float) -> Spread:
        """The spread of a quantity made of ``runs`` independent testbed runs (a difference of two: 2)."""
        return replace(self, sigma=self.sigma * math.sqrt(runs))

    @property
    def known(self) -> bool:
        return self.pairs > 0 and not math.isnan(self.sigma)


NO_SPREAD = Spread(math.nan, 0)


@dataclass(frozen=True)
class Prior:
    """A prior for the seeds' variance of one quantity, fixed before the runs: standard deviation
    ``sigma`` per seed worth ``df`` degrees of freedom (module docstring), and where it comes from. A
    prior of zero width or no degrees of freedom is no prior: it must never make an interval narrow."""

    sigma: float
    df: float
    source: str = ""

    @property
    def known(self) -> bool:
        return self.df > 0 and math.isfinite(self.sigma) and self.sigma > 0

    def times(self, runs: float) -> Prior:
        """The prior of a quantity made of ``runs`` independent runs (a difference of two cells: 2)."""
        return replace(self, sigma=self.sigma * math.sqrt(runs))


NO_PRIOR = Prior(math.nan, 0.0)


def shipped_prior(metric: str, kind: str = NONE, requests: float = math.nan) -> Prior:
    """The prior of one run of ``metric`` under a kind of fault (core/defaults/priors.yaml), scaled to
    a run of ``requests`` where it is a share of them; NO_PRIOR where none is shipped."""
    p = prior_of(metric, kind, requests)
    return NO_PRIOR if p is None else Prior(p[0], p[1], f"core/defaults/priors.yaml {metric} ({kind})")


@dataclass(frozen=True)
class Interval:
    """A mean over seeds and its interval (module docstring). ``sd`` is the pooled standard deviation
    the interval used and ``df`` its degrees of freedom (before a common spread's Welch correction)."""

    mean: float
    low: float
    high: float
    n: int
    sd: float
    df: float
    prior: Prior = NO_PRIOR
    common: Spread = NO_SPREAD  # shared by every seed (module docstring)
    alpha: float = ALPHA  # each one-sided test's level: the interval is at 1 - 2 alpha

    @property
    def defined(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def why_not(self) -> str:
        """Why this interval decides nothing ("" where it may): no value, one seed, no interval, or
        an interval of zero width."""
        if self.n == 0:
            return "no value"
        if self.n < MIN_SEEDS:
            return ONE_SEED
        if not self.defined:
            return "no interval"
        if self.high - self.low <= EPS:
            return ZERO_WIDTH
        return ""

    @property
    def decidable(self) -> bool:
        return not self.why_not


def pooled_sd(s2: float | np.ndarray, n: int, prior: Prior = NO_PRIOR) -> tuple[float | np.ndarray, float]:
    """(s_p, df) of the seeds' sample variance ``s2`` over ``n`` seeds moderated by ``prior`` (module
    docstring); (NaN, 0) with no degrees of freedom at all. ``s2`` may be an array of many studies'
    variances (study/looks.py simulates designs with it): s_p is then one per study."""
    d0 = prior.df if prior.known else 0.0
    df = d0 + n - 1
    if df <= 0:
        return (math.nan if np.ndim(s2) == 0 else np.full(np.shape(s2), math.nan)), 0.0
    v = ((d0 * prior.sigma ** 2 if d0 else 0.0) + (n - 1) * (s2 if n > 1 else 0.0)) / df
    return (math.sqrt(v) if np.ndim(v) == 0 else np.sqrt(v)), df


def half_width(sd: float, n: int, df: float, common: Spread = NO_SPREAD, alpha: float = ALPHA) -> tuple[float, float]:
    """(half-width, df) of the interval of a mean over ``n`` seeds of pooled standard deviation ``sd``
    with ``df`` degrees of freedom, widened by a spread every seed shares (Welch-Satterthwaite), for
    one-sided tests at ``alpha`` (a look of a group-sequential design uses its share: study/looks.py)."""
    a = sd * sd / n
    b = common.sigma ** 2 if common.known else 0.0
    dfe = df
    if b > 0:  # a = 0 (seeds that never varied, no prior) leaves the common df
        dfe = (a + b) ** 2 / ((a * a / df if a > 0 else 0.0) + b * b / common.pairs)
    return float(stats.t.ppf(1.0 - alpha, dfe)) * math.sqrt(a + b), dfe


def _make(mean: float, sd: float, n: int, df: float, prior: Prior, common: Spread, alpha: float) -> Interval:
    if n < 1 or math.isnan(sd) or df <= 0:
        return Interval(mean, math.nan, math.nan, n, sd, df, prior, common, alpha)
    half, _ = half_width(sd, n, df, common, alpha)
    return Interval(mean, mean - half, mean + half, n, sd, df, prior, common, alpha)


def interval(values: Iterable[float], prior: Prior = NO_PRIOR, common: Spread = NO_SPREAD,
             alpha: float = ALPHA) -> Interval:
    """The interval of the non-NaN ``values`` (one per seed), their variance pooled with ``prior`` and
    ``common``, a spread shared by every seed, added whole (module docstring). No values: everything
    NaN; one value: the prior's interval, shown but deciding nothing (NaN bounds without a prior).
    ``alpha``: each one-sided test's level (the interval is at 1 - 2 alpha)."""
    x = np.asarray(list(values), dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, 0, prior, common, alpha)
    s2 = float(x.var(ddof=1)) if n > 1 else 0.0
    sd, df = pooled_sd(s2, n, prior)
    return _make(float(x.mean()), sd, n, df, prior, common, alpha)


def inside(iv: Interval, lo: float, hi: float) -> str:
    """"pass" when the interval lies inside [lo, hi], "fail" when wholly outside it, "undecided" when
    it straddles a bound or decides nothing (:attr:`Interval.why_not`; bounds may be infinite)."""
    if not iv.decidable:
        return UNDECIDED
    if iv.low >= lo - EPS and iv.high <= hi + EPS:
        return PASS
    if iv.high < lo - EPS or iv.low > hi + EPS:
        return FAIL
    return UNDECIDED


def oriented(iv: Interval, direction: str) -> tuple[float, float]:
    """(low, high) of the interval with the claimed direction made positive (a decrease negated)."""
    return (-iv.high, -iv.low) if direction == "decrease" else (iv.low, iv.high)


def world_status(iv: Interval, direction: str, margin: float) -> str:
    """A claim's status in one world. Directional (increase, decrease): "refuted" when the interval's
    upper end, the claimed direction positive, is below ``margin`` (no effect that matters, or the
    opposite); "holds" when its lower end is above 0 and it is not refuted; "open" otherwise. Null
    (none): "holds" inside +-``margin``, "refuted" wholly outside, "open" otherwise. An interval
    that decides nothing is "open"."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})")
    if not iv.decidable:
        return OPEN
    if direction == "none":
        return {PASS: HOLDS, FAIL: REFUTED, UNDECIDED: OPEN}[inside(iv, -margin, margin)]
    lo, hi = oriented(iv, direction)
    if hi < margin - EPS:
        return REFUTED
    return HOLDS if lo > EPS else OPEN


def no_effect(iv: Interval, margin: float) -> bool:
    """The world shows no effect that matters: its interval decides and lies inside +-``margin``."""
    return inside(iv, -margin, margin) == PASS


_SAID = {HOLDS: "holds", REFUTED: "is refuted", OPEN: "is open"}


def claim_status(sim: Interval, tb: Interval, direction: str, margin: float) -> str:
    """The claim's status in the two worlds in words, and "no effect in either world" where each
    world's interval lies inside +-``margin``."""
    s, t = world_status(sim, direction, margin), world_status(tb, direction, margin)
    said = f"the claim {_SAID[s]} in both worlds" if s == t else \
        f"the claim {_SAID[s]} in the simulator and {_SAID[t]} on the testbed"
    if no_effect(sim, margin) and no_effect(tb, margin):
        said += " (no effect in either world)"
    return said


# The verdict on a simulated finding from its paired difference's equivalence test.
FINDING = {PASS: CARRIES, FAIL: DOES_NOT, UNDECIDED: UNDECIDED_CLAIM}


def with_repeat(verdict: str, repeat: str | None) -> str:
    """A finding's verdict once the testbed's repeat is judged: "carries over" stands only where the
    testbed repeats itself ("pass"), or where no repeat was run (None)."""
    return UNDECIDED_CLAIM if verdict == CARRIES and repeat is not None and repeat != PASS else verdict


def claim_verdict(sim: Interval, tb: Interval, paired: Interval, direction: str,
                  margin: float) -> tuple[str, str]:
    """(verdict, reason) on the simulated finding: "carries over" when the seed-paired difference
    (testbed - simulator) lies inside +-margin (two one-sided tests), "does not carry over" when it
    lies wholly outside, "undecided" otherwise; the reason says why, then the claim's status in each
    world (:func:`claim_status`)."""
    eq = inside(paired, -margin, margin)
    why = {PASS: f"the paired difference lies within ±{margin:g}",
           FAIL: f"the worlds differ by more than ±{margin:g}"}.get(eq) or paired.why_not or \
        f"the paired difference's interval straddles ±{margin:g}"
    return FINDING[eq], f"{why}; {claim_status(sim, tb, direction, margin)}"


def repeat_verdict(differences: Iterable[float], margin: float, prior: Prior = NO_PRIOR) -> tuple[str, Interval]:
    """Does the testbed repeat itself: the differences between a first and a repeated run of the same
    cells (the pair is the unit), their variance pooled with the ``prior`` of a difference of two
    runs, judged inside +-``margin`` by the rule. A check or claim whose testbed does not repeat
    itself ("fail", or "undecided") cannot pass."""
    iv = interval(differences, prior)
    return inside(iv, -margin, margin), iv


def wrong_to_expect(decided: int, what: str = "verdicts") -> str:
    """A line saying how many of ``decided`` verdicts are expected wrong at the rule's level: each
    decision is a one-sided test at ALPHA where it errs (its interval lands wholly on the wrong side
    of a bound), so at most ALPHA of them, without an adjustment for the table's many tests."""
    return (f"{decided} {what} decided; at the rule's level ({ALPHA:g} a decision) about {ALPHA * decided:.1f} "
            f"of them may be wrong (no adjustment for the table's many tests)")


# --------------------------------------------------------------------------- power and planning


def tost_power(n: int, sigma: float, lo: float, hi: float, delta: float = 0.0, prior: Prior = NO_PRIOR,
               common: Spread = NO_SPREAD, either: bool = False, alpha: float = ALPHA) -> float:
    """The probability that :func:`inside` says "pass" for [lo, hi] over ``n`` seeds whose values are
    normal with mean ``delta`` and standard deviation ``sigma``, pooled with ``prior`` and widened by
    ``common`` as :func:`interval` does. Exact: the mean and the sample variance are independent,
    (n - 1) s^2 / sigma^2 is chi-square with n - 1 df, and for each s the pass region of the mean
    is an interval, so the power is the integral over the chi-square law of the normal probability
    of that region (the integral Owen's Q computes for a plain TOST; Owen, Biometrika 52, 1965).
    The mean's own variance is sigma^2 / n plus the common spread's square (one draw per study).
    ``either``: the probability of a decision either way, "pass" or "fail" (the interval wholly
    outside [lo, hi]), which is what a study still undecided needs. ``alpha``: each test's level."""
    if n < MIN_SEEDS or not (sigma >= 0):
        return 0.0
    k = n - 1
    c2 = common.sigma ** 2 if common.known else 0.0
    se = math.sqrt(sigma * sigma / n + c2)

    def given(w: float) -> float:
        sd, df = pooled_sd(sigma * sigma * w / k, n, prior)
        half, _ = half_width(sd, n, df, common, alpha)
        if not half > EPS:
            return 0.0
        up, down = hi - half, lo + half
        if se == 0:
            inside_p = float(down <= delta <= up)
            outside_p = float(delta > hi + half or delta < lo - half)
        else:
            inside_p = max(0.0, float(stats.norm.cdf((up - delta) / se) - stats.norm.cdf((down - delta) / se))) \
                if up > down else 0.0
            outside_p = float(stats.norm.sf((hi + half - delta) / se) + stats.norm.cdf((lo - half - delta) / se))
        return inside_p + (outside_p if either else 0.0)

    law = stats.chi2(k)
    hi_w = float(law.ppf(1 - 1e-10))
    value, _ = integrate.quad(lambda w: given(w) * law.pdf(w), 0.0, hi_w, limit=200)
    return min(1.0, max(0.0, value))


def seeds_for_power(sigma: float, lo: float, hi: float, delta: float = 0.0, prior: Prior = NO_PRIOR,
                    common: Spread = NO_SPREAD, power: float = POWER, n_max: int = MAX_SEEDS,
                    either: bool = False, alpha: float = ALPHA) -> int | None:
    """The fewest seeds (from MIN_SEEDS) at which :func:`tost_power` (``either``: of a decision either
    way) reaches ``power``; None where not within ``n_max`` (a common spread can cap the power below
    it however many seeds run, and a true difference on a bound never decides)."""
    def enough(n: int) -> bool:
        return tost_power(n, sigma, lo, hi, delta, prior, common, either, alpha) >= power

    if not enough(n_max):
        return None
    a, b = MIN_SEEDS, n_max  # power grows with n: bisect for the first n that is enough
    while a < b:
        mid = (a + b) // 2
        if enough(mid):
            b = mid
        else:
            a = mid + 1
    return a


def prediction_interval(samples: Iterable[float]) -> tuple[float, float, float]:
    """(low, high, coverage) of a distribution-free prediction interval for one new draw from the
    distribution ``samples`` were drawn from: [x_(k), x_(n+1-k)] of the n sorted samples holds a new
    draw with probability (n + 1 - 2k) / (n + 1) whatever the distribution (Wilks 1941); k is the
    largest that keeps it at the rule's level (CONFIDENCE) or above, 1 ([min, max]) where none does,
    and the coverage says so. A fitted parameter is judged on runs it was not fitted on: a new value
    outside this interval is a fail to explain, not a reason to refit."""
    x = np.sort(np.asarray(list(samples), dtype=float))
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n < 2:
        raise ValueError(f"a prediction interval needs at least 2 samples, got {n}")
    k = max(1, int(math.floor((n + 1) * (1.0 - CONFIDENCE) / 2.0 + EPS)))
    return float(x[k - 1]), float(x[n - k]), (n + 1 - 2 * k) / (n + 1)
