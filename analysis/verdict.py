"""The verdict rule: one rule that says whether a result holds, whether the two worlds agree, and when
the runs cannot tell. The carry-over study's claims (analysis/claims.py), every check of `testbed
compare` / `testbed twin` (analysis/fidelity.py) and the engine-death comparison
(analysis/engine_death.py) are judged by it; docs/verdicts.md states it for users.

* **Values.** One number per seed: a claim's effect in one world, or one world's deviation from the
  other (testbed minus simulator, paired by seed: the seeds' workloads are the same in both worlds).
* **Interval.** The mean over the n seeds with a Student-t interval at confidence 1 - 2 ALPHA (90 %):
  mean -+ t(1 - ALPHA, df) * s / sqrt(n), so that every test below is one-sided at ALPHA = 5 % and an
  equivalence test is the interval form of two one-sided tests (Schuirmann, J. Pharmacokin.
  Biopharm. 15, 1987). Why the t interval with 3 to 5 seeds: a bootstrap of 3 values has 10 distinct
  resamples, and a sign or signed-rank test of 3 values cannot reach 5 % (its smallest one-sided p is
  1/8); the t interval can, on the assumption that each seed's value, a mean over a run's requests,
  is roughly normal.
* **Floor.** s = max(the seeds' sample standard deviation, the spread the testbed is measured to have
  in that quantity) (:class:`Spread`). A cell that never varies over 3 seeds (a failure count of 0 in
  every seed) gives s = 0 and an interval of zero width, a certainty the instrument does not have:
  the testbed's own run-to-run spread is the least it can be. df = n - 1; with one seed the interval
  is the spread's alone, with the spread's degrees of freedom (its pairs); with one seed and no
  spread there is no interval.
* **Common spread.** A spread shared by every seed, not drawn anew per seed: the simulator's
  calibration, one measurement that every simulated seed uses, so its error does not average out
  over seeds. Measured by simulating the same seeds under k calibrations made on engines started
  anew (sigma_c: the standard deviation over the calibrations of the seeds' mean deviation, df
  k - 1), it adds to the mean's variance whole: half-width t(1 - ALPHA, df) * sqrt(s^2 / n +
  sigma_c^2), df by Welch-Satterthwaite ((a + b)^2 / (a^2 / df_s + b^2 / df_c), a = s^2 / n,
  b = sigma_c^2). Without it the interval is the one above.
* **Spread** of the testbed in one metric, from duplicate runs: k pairs of a first and a repeated
  testbed run of the same cell (scenario, policy, seed), d their difference; sigma = sqrt(sum d^2 / 2k)
  (the error of a single measurement from duplicates, Dahlberg 1940), pooled over every repeated
  seed, policy and point of that metric. An effect made of r testbed runs (a difference of two cells:
  r = 2) has sigma * sqrt(r).
* **Inside a region** (:func:`inside`): "pass" when the interval lies inside [lo, hi], "fail" when it
  lies wholly outside, "undecided" when it straddles a bound or there is no interval.

What is judged against what is the caller's: a claim's world holds when its interval lies on the
claimed side of 0 (:func:`world_status`), the worlds agree when the paired difference lies inside
+-margin (:func:`inside`), and a claim's verdict combines the three (:func:`claim_verdict`). A
parameter fitted from testbed runs is judged on other runs against its prediction interval
(:func:`prediction_interval`), where an observation inside passes and one outside fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

# Recorded with every verdict table (claims.csv, fidelity.csv, fidelity_engines.csv): a change to the
# rule or to ALPHA changes it, and verdicts judged by another rule are not comparable.
RULE_VERSION = "tost-floor-1"  # a common spread (below) widens the same rule; none given, it is the same
ALPHA = 0.05  # one-sided, every test; intervals are shown at 1 - 2 ALPHA
CONFIDENCE = 1.0 - 2.0 * ALPHA
EPS = 1e-12  # float rounding at a bound
MAX_SEEDS = 100  # seeds_to_decide looks no further

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
HOLDS, FAILS, OPEN = "holds", "does not hold", "open"
CARRIES, DOES_NOT, UNDECIDED_CLAIM = "carries over", "does not carry over", "undecided"
DIRECTIONS = ("increase", "decrease", "none")


@dataclass(frozen=True)
class Spread:
    """The testbed's run-to-run spread of one quantity: ``sigma`` per run, and ``pairs``, the repeated
    runs it was pooled from, which are its degrees of freedom (a spread from n samples' standard
    deviation has n - 1)."""

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
class Interval:
    """A mean over seeds and its interval (module docstring). ``sd`` is the standard deviation the
    interval used (the seeds' or the floor), ``floored`` whether the floor set it."""

    mean: float
    low: float
    high: float
    n: int
    sd: float
    df: float
    floored: bool
    common: Spread = NO_SPREAD  # shared by every seed (module docstring)

    @property
    def defined(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def at(self, n: int) -> Interval:
        """The interval the same mean and standard deviation would have over ``n`` seeds (df n - 1):
        how many seeds a decision needs."""
        return _make(self.mean, self.sd, n, n - 1, self.floored, self.common)


def _make(mean: float, sd: float, n: int, df: float, floored: bool, common: Spread = NO_SPREAD) -> Interval:
    if n < 1 or math.isnan(sd) or df < 1:
        return Interval(mean, math.nan, math.nan, n, sd, df, floored, common)
    a = sd * sd / n
    b = common.sigma ** 2 if common.known else 0.0
    dfe = df
    if b > 0:  # Welch-Satterthwaite; a = 0 (seeds that never varied, no floor) leaves the common df
        dfe = (a + b) ** 2 / ((a * a / df if a > 0 else 0.0) + b * b / common.pairs)
    half = float(stats.t.ppf(1.0 - ALPHA, dfe)) * math.sqrt(a + b)
    return Interval(mean, mean - half, mean + half, n, sd, df, floored, common)


def interval(values: Iterable[float], spread: Spread = NO_SPREAD, common: Spread = NO_SPREAD) -> Interval:
    """The interval of the non-NaN ``values`` (one per seed) with ``spread`` as its floor and
    ``common``, a spread shared by every seed, added whole (module docstring). No values: everything
    NaN; one value and no known spread: NaN bounds."""
    x = np.asarray(list(values), dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, 0, False, common)
    mean = float(x.mean())
    floor = spread.sigma if spread.known else 0.0
    if n == 1:
        return (_make(mean, floor, 1, spread.pairs, True, common) if spread.known
                else _make(mean, math.nan, 1, 0, False, common))
    s = float(x.std(ddof=1))
    return _make(mean, max(s, floor), n, n - 1, floor > s, common)


def inside(iv: Interval, lo: float, hi: float) -> str:
    """"pass" when the interval lies inside [lo, hi], "fail" when wholly outside it, "undecided" when
    it straddles a bound or is undefined (bounds may be infinite)."""
    if not iv.defined:
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
    """Whether a claim holds in one world. A directional claim (increase, decrease) holds when its
    interval lies on the claimed side of 0, and does not hold when it shows the effect smaller than
    the smallest effect that matters (its upper end, the claimed direction positive, below
    ``margin``: no effect, or the opposite); a null claim (none) holds when its interval lies inside
    +-``margin`` and does not when it lies wholly outside. Otherwise "open"."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r} (known: {', '.join(DIRECTIONS)})")
    if not iv.defined:
        return OPEN
    if direction == "none":
        return {PASS: HOLDS, FAIL: FAILS, UNDECIDED: OPEN}[inside(iv, -margin, margin)]
    lo, hi = oriented(iv, direction)
    if lo > EPS:
        return HOLDS
    if hi < margin - EPS:
        return FAILS
    return OPEN


def claim_verdict(sim: Interval, tb: Interval, paired: Interval, direction: str,
                  margin: float) -> tuple[str, str]:
    """(verdict, reason) of a claim from its interval in each world and the paired difference (testbed
    - simulator): "carries over" when it holds in both worlds and the paired difference lies inside
    +-margin; "does not carry over" when it does not hold in a world (holds in one only, in opposite
    directions, in neither) or the paired difference lies wholly outside +-margin; "undecided"
    otherwise, naming the intervals too wide to tell."""
    s, t = world_status(sim, direction, margin), world_status(tb, direction, margin)
    eq = inside(paired, -margin, margin)
    if s == HOLDS and t == HOLDS and eq == PASS:
        return CARRIES, f"holds in both worlds; their paired difference lies within ±{margin:g}"
    why: list[str] = []
    if s == FAILS and t == FAILS:
        why.append("holds in neither world")
    elif HOLDS in (s, t) and FAILS in (s, t):
        failing = tb if t == FAILS else sim
        if direction != "none" and oriented(failing, direction)[1] < -EPS:
            why.append("holds in opposite directions")
        else:
            why.append("holds in the simulator only" if s == HOLDS else "holds on the testbed only")
    elif FAILS in (s, t):
        why.append("does not hold " + ("in the simulator" if s == FAILS else "on the testbed"))
    if eq == FAIL:
        why.append(f"the worlds differ by more than ±{margin:g}")
    if why:
        return DOES_NOT, "; ".join(why)
    wide = [name for name, st in (("the simulator's", s), ("the testbed's", t)) if st == OPEN]
    if eq == UNDECIDED:
        wide.append("the paired difference's")
    return UNDECIDED_CLAIM, " and ".join(wide) + " interval too wide to tell"


def seeds_to_decide(decided: Callable[[int], bool], n_max: int = MAX_SEEDS) -> int | None:
    """The fewest seeds (from 2) at which ``decided(n)`` is true, the means and standard deviations
    staying as measured; None if not within ``n_max``."""
    for n in range(2, n_max + 1):
        if decided(n):
            return n
    return None


def claim_seeds_needed(sim: Interval, tb: Interval, paired: Interval, direction: str, margin: float) -> int | None:
    """How many seeds in both worlds :func:`claim_verdict` needs to decide, if the means and standard
    deviations stayed as measured (None: more than MAX_SEEDS, or nothing to project from)."""
    if not (sim.n and tb.n and paired.n) or any(math.isnan(iv.sd) for iv in (sim, tb, paired)):
        return None
    return seeds_to_decide(lambda n: claim_verdict(sim.at(n), tb.at(n), paired.at(n), direction, margin)[0]
                           != UNDECIDED_CLAIM)


def check_seeds_needed(iv: Interval, lo: float, hi: float) -> int | None:
    """How many seeds :func:`inside` needs to decide for this interval, its mean and standard
    deviation staying as measured (None: more than MAX_SEEDS, or nothing to project from)."""
    if not iv.n or math.isnan(iv.sd):
        return None
    return seeds_to_decide(lambda n: inside(iv.at(n), lo, hi) != UNDECIDED)


def prediction_interval(samples: Iterable[float]) -> tuple[float, float, float]:
    """(low, high, coverage) of a distribution-free prediction interval for one new draw from the
    distribution ``samples`` were drawn from: [min, max], which holds a new draw with probability
    (n - 1) / (n + 1) whatever the distribution (n independent samples; Wilks 1941). A fitted
    parameter is judged on runs it was not fitted on: a new value outside this interval is a fail to
    explain, not a reason to refit."""
    x = np.sort(np.asarray(list(samples), dtype=float))
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"a prediction interval needs at least 2 samples, got {x.size}")
    return float(x[0]), float(x[-1]), (x.size - 1) / (x.size + 1)
