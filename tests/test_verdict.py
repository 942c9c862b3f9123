"""analysis.verdict: the rule every verdict of the project is judged by, on values whose answers are
worked out here with numpy and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.verdict import (NO_SPREAD, Spread, check_seeds_needed, claim_verdict, inside, interval,
                              prediction_interval, world_status)

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def test_the_spread_of_duplicates_is_dahlbergs_and_scales_with_the_runs_in_an_effect():
    d = [0.025, 0.0, -0.025, 0.0, 0.05]
    s = Spread.of([*d, math.nan])
    assert s.pairs == 5 and s.sigma == pytest.approx(math.sqrt(sum(x * x for x in d) / 10))
    assert s.times(2).sigma == pytest.approx(s.sigma * math.sqrt(2)) and s.times(2).pairs == 5
    assert not Spread.of([]).known and not NO_SPREAD.known


def test_the_interval_is_the_90_percent_t_interval_with_the_spread_as_its_floor():
    x = [0.1, 0.15, 0.2]
    iv = interval(x)
    half = stats.t.ppf(0.95, 2) * np.std(x, ddof=1) / math.sqrt(3)
    assert (iv.mean, iv.low, iv.high, iv.n, iv.df) == pytest.approx((0.15, 0.15 - half, 0.15 + half, 3, 2))
    assert not iv.floored
    flat = interval([0.1, 0.1, 0.1], Spread(0.02, 12))
    half = stats.t.ppf(0.95, 2) * 0.02 / math.sqrt(3)  # the seeds' df, the floor's deviation
    assert flat.floored and (flat.low, flat.high) == pytest.approx((0.1 - half, 0.1 + half))
    one = interval([0.1], Spread(0.02, 12))
    half = stats.t.ppf(0.95, 12) * 0.02  # one seed: the spread's own degrees of freedom
    assert (one.low, one.high) == pytest.approx((0.1 - half, 0.1 + half))
    assert not interval([0.1]).defined and interval([]).n == 0


def test_a_common_spread_adds_whole_to_the_means_variance_with_welch_satterthwaites_df():
    x = [0.1, 0.15, 0.2]
    a, b = np.var(x, ddof=1) / 3, 0.05 ** 2  # the seeds' share shrinks with n, the common one does not
    df = (a + b) ** 2 / (a * a / 2 + b * b / 4)
    iv = interval(x, common=Spread(0.05, 4))
    half = stats.t.ppf(0.95, df) * math.sqrt(a + b)
    assert (iv.low, iv.high) == pytest.approx((0.15 - half, 0.15 + half))
    assert iv.high - iv.low > interval(x).high - interval(x).low
    # seeds that never varied: the common spread alone, with its own degrees of freedom
    flat = interval([0.1, 0.1, 0.1], common=Spread(0.05, 2))
    assert (flat.low, flat.high) == pytest.approx((0.1 - stats.t.ppf(0.95, 2) * 0.05, 0.1 + stats.t.ppf(0.95, 2) * 0.05))
    assert inside(interval([0.1, 0.1, 0.1]), -0.15, 0.15) == "pass" and inside(flat, -0.15, 0.15) == "undecided"
    # more seeds do not make a shared error go away
    assert flat.at(100).high - flat.at(100).low == pytest.approx(flat.high - flat.low)
    assert interval(x, common=NO_SPREAD) == interval(x)


def test_inside_outside_and_straddling():
    iv = interval([0.01, 0.02, 0.03])  # about [0.003, 0.037]
    assert inside(iv, -0.05, 0.05) == "pass"
    assert inside(iv, -0.02, 0.02) == "undecided"
    assert inside(iv, -0.002, 0.002) == "fail"
    assert inside(iv, -math.inf, 0.05) == "pass" and inside(iv, -math.inf, 0.001) == "fail"
    assert inside(interval([0.1]), -1, 1) == "undecided"  # no interval


def test_a_directional_claim_holds_on_its_side_and_fails_below_the_margin():
    up = interval([0.10, 0.12, 0.14])
    assert world_status(up, "increase", 0.03) == "holds"
    assert world_status(up, "decrease", 0.03) == "does not hold"  # the opposite, shown
    near_zero = interval([0.0, 0.005, -0.005])
    assert world_status(near_zero, "increase", 0.03) == "does not hold"  # smaller than what matters
    wide = interval([-0.1, 0.0, 0.15])
    assert world_status(wide, "increase", 0.03) == "open"
    assert world_status(near_zero, "none", 0.03) == "holds" and world_status(up, "none", 0.03) == "does not hold"
    with pytest.raises(ValueError, match="unknown direction"):
        world_status(up, "sideways", 0.03)


def test_the_verdicts_exclude_each_other_and_name_their_reason():
    up, zero = interval([0.10, 0.12, 0.14]), interval([0.0, 0.005, -0.005])
    down = interval([-0.10, -0.12, -0.14])
    same = interval([0.0, 0.005, -0.005])
    assert claim_verdict(up, up, same, "increase", 0.03)[0] == "carries over"
    assert claim_verdict(up, down, interval([-0.2, -0.24, -0.28]), "increase", 0.03) == (
        "does not carry over", "holds in opposite directions; the worlds differ by more than ±0.03")
    assert claim_verdict(zero, zero, same, "increase", 0.03) == ("does not carry over", "holds in neither world")
    wide = interval([-0.1, 0.0, 0.15])
    v, why = claim_verdict(up, wide, interval([-0.2, -0.12, 0.01]), "increase", 0.03)
    assert v == "undecided" and why == "the testbed's and the paired difference's interval too wide to tell"


def test_the_seeds_a_check_needs_are_the_fewest_that_decide_it():
    iv = interval([0.01, 0.05, -0.01])  # mean 0.0167, sd 0.0306
    need = check_seeds_needed(iv, -0.05, 0.05)
    m, s = np.mean([0.01, 0.05, -0.01]), np.std([0.01, 0.05, -0.01], ddof=1)

    def half(n: int) -> float:
        return stats.t.ppf(0.95, n - 1) * s / math.sqrt(n)

    assert m + half(need) <= 0.05 < m + half(need - 1)
    assert check_seeds_needed(interval([0.04, 0.05, 0.06]), -0.05, 0.05) is None  # a mean on the bound: never


def test_a_prediction_interval_is_the_samples_range_with_its_coverage():
    lo, hi, cov = prediction_interval([0.3, 0.1, 0.2, math.nan, 0.25])
    assert (lo, hi) == (0.1, 0.3) and cov == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="at least 2 samples"):
        prediction_interval([0.1])
