"""analysis.rule.verdict: the rule every verdict of the project is judged by, on values whose answers are
worked out here with numpy and scipy: known answers, and the power against a simulation of the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.rule.verdict import (NO_PRIOR, NO_SPREAD, ONE_SEED, ZERO_WIDTH, Prior, Spread, claim_status, claim_verdict,
                              inside, interval, no_effect, pooled_sd, prediction_interval, repeat_verdict,
                              seeds_for_power, shipped_prior, tost_power, world_status)

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def test_the_spread_of_duplicates_is_dahlbergs_and_scales_with_the_runs_in_an_effect():
    d = [0.025, 0.0, -0.025, 0.0, 0.05]
    s = Spread.of([*d, math.nan])
    assert s.pairs == 5 and s.sigma == pytest.approx(math.sqrt(sum(x * x for x in d) / 10))
    assert s.times(2).sigma == pytest.approx(s.sigma * math.sqrt(2)) and s.times(2).pairs == 5
    assert not Spread.of([]).known and not NO_SPREAD.known


def test_the_interval_is_the_90_percent_t_interval_with_the_variance_pooled_with_its_prior():
    x = [0.1, 0.15, 0.2]
    iv = interval(x)  # no prior: the plain t interval
    half = stats.t.ppf(0.95, 2) * np.std(x, ddof=1) / math.sqrt(3)
    assert (iv.mean, iv.low, iv.high, iv.n, iv.df) == pytest.approx((0.15, 0.15 - half, 0.15 + half, 3, 2))
    prior = Prior(0.02, 4)
    pooled = interval(x, prior)
    v = (4 * 0.02 ** 2 + 2 * np.var(x, ddof=1)) / 6  # (d0 s0^2 + (n - 1) s^2) / (d0 + n - 1)
    half = stats.t.ppf(0.95, 6) * math.sqrt(v / 3)
    assert (pooled.low, pooled.high, pooled.df, pooled.sd) == pytest.approx((0.15 - half, 0.15 + half, 6, math.sqrt(v)))
    assert pooled_sd(np.var(x, ddof=1), 3, prior) == pytest.approx((math.sqrt(v), 6))


def test_seeds_that_never_vary_decide_nothing_without_a_prior_and_get_the_priors_width_with_one():
    flat = interval([0.0, 0.0, 0.0])  # a cell that never failed in any seed
    assert flat.why_not == ZERO_WIDTH and not flat.decidable
    assert inside(flat, -0.03, 0.03) == "undecided"  # never "pass" on an interval of zero width
    assert inside(interval([0.0, 0.0, 0.0], Prior(0.0, 15)), -0.03, 0.03) == "undecided"  # a prior of 0 is none
    assert inside(interval([0.0, 0.0, 0.0], Prior(0.02, 0)), -0.03, 0.03) == "undecided"
    with_prior = interval([0.0, 0.0, 0.0], Prior(0.02, 4))
    half = stats.t.ppf(0.95, 6) * math.sqrt(4 * 0.02 ** 2 / 6 / 3)
    assert with_prior.high == pytest.approx(half) and with_prior.decidable
    assert inside(with_prior, -0.03, 0.03) == "pass"


def test_one_seed_decides_nothing_whatever_its_prior():
    one = interval([0.0], Prior(0.02, 100))
    assert one.n == 1 and one.defined and one.why_not == ONE_SEED  # shown with the prior's width
    assert one.high == pytest.approx(stats.t.ppf(0.95, 100) * 0.02)
    assert inside(one, -1, 1) == "undecided" and world_status(one, "none", 1) == "open"
    v, why = claim_verdict(one, one, one, "none", 1.0)
    assert v == "undecided" and why.startswith(ONE_SEED)
    assert not interval([0.1]).defined and interval([]).n == 0 and interval([]).why_not == "no value"


def test_a_common_spread_adds_whole_to_the_means_variance_with_welch_satterthwaites_df():
    x = [0.1, 0.15, 0.2]
    a, b = np.var(x, ddof=1) / 3, 0.05 ** 2  # the seeds' share shrinks with n, the common one does not
    df = (a + b) ** 2 / (a * a / 2 + b * b / 4)
    iv = interval(x, common=Spread(0.05, 4))
    half = stats.t.ppf(0.95, df) * math.sqrt(a + b)
    assert (iv.low, iv.high) == pytest.approx((0.15 - half, 0.15 + half))
    # seeds that never varied, no prior: the common spread alone, with its own degrees of freedom
    flat = interval([0.1, 0.1, 0.1], common=Spread(0.05, 2))
    assert (flat.low, flat.high) == pytest.approx((0.1 - stats.t.ppf(0.95, 2) * 0.05, 0.1 + stats.t.ppf(0.95, 2) * 0.05))
    assert interval(x, common=NO_SPREAD) == interval(x)


def test_inside_outside_and_straddling():
    iv = interval([0.01, 0.02, 0.03])  # about [0.003, 0.037]
    assert inside(iv, -0.05, 0.05) == "pass"
    assert inside(iv, -0.02, 0.02) == "undecided"
    assert inside(iv, -0.002, 0.002) == "fail"
    assert inside(iv, -math.inf, 0.05) == "pass" and inside(iv, -math.inf, 0.001) == "fail"


def test_a_world_is_refuted_below_the_margin_holds_above_zero_otherwise_and_never_both():
    up = interval([0.10, 0.12, 0.14])
    assert world_status(up, "increase", 0.03) == "holds"
    assert world_status(up, "decrease", 0.03) == "refuted"  # the opposite, shown
    near_zero = interval([0.0, 0.005, -0.005])
    assert world_status(near_zero, "increase", 0.03) == "refuted"  # smaller than what matters
    wide = interval([-0.1, 0.0, 0.15])
    assert world_status(wide, "increase", 0.03) == "open"
    assert world_status(near_zero, "none", 0.03) == "holds" and world_status(up, "none", 0.03) == "refuted"
    # inside (0, margin): above 0 and below the margin is "refuted" (too small to matter), not "holds"
    small = interval([0.010, 0.012, 0.014])
    assert small.low > 0 and small.high < 0.03 and world_status(small, "increase", 0.03) == "refuted"
    with pytest.raises(ValueError, match="unknown direction"):
        world_status(up, "sideways", 0.03)


def test_equal_small_effects_are_the_same_status_in_both_worlds_and_their_finding_carries_over():
    # the overlap case: sim [0.008, 0.017], testbed [-0.0001, 0.025] used to be "holds in the simulator only"
    sim, tb = interval([0.010, 0.0125, 0.015]), interval([0.006, 0.0125, 0.019])
    assert world_status(sim, "increase", 0.03) == world_status(tb, "increase", 0.03) == "refuted"
    v, why = claim_verdict(sim, tb, interval([-0.004, 0.0, 0.004]), "increase", 0.03)
    assert v == "carries over" and "simulator only" not in why and "refuted in both worlds" in why


def test_the_verdict_is_on_the_simulated_finding_and_the_worlds_status_is_said_beside_it():
    up, zero = interval([0.10, 0.12, 0.14]), interval([0.0, 0.005, -0.005])
    down = interval([-0.10, -0.12, -0.14])
    same = interval([0.0, 0.005, -0.005])
    assert claim_verdict(up, up, same, "increase", 0.03) == (
        "carries over", "the paired difference lies within ±0.03; the claim holds in both worlds")
    assert claim_verdict(up, down, interval([-0.2, -0.24, -0.28]), "increase", 0.03) == (
        "does not carry over", "the worlds differ by more than ±0.03; the claim holds in the simulator and is "
        "refuted on the testbed")
    # no effect in either world: the finding (no effect) carries over, the claim is refuted in both
    assert claim_verdict(zero, zero, same, "increase", 0.03) == (
        "carries over", "the paired difference lies within ±0.03; the claim is refuted in both worlds "
        "(no effect in either world)")
    wide = interval([-0.1, 0.0, 0.15])
    v, why = claim_verdict(up, wide, interval([-0.2, -0.12, 0.01]), "increase", 0.03)
    assert v == "undecided" and why.startswith("the paired difference's interval straddles ±0.03")


def test_no_effect_in_either_world_only_where_each_worlds_interval_lies_inside_the_margin():
    inside_both = interval([0.0, 0.005, -0.005])
    straddles = interval([-0.04, 0.0, 0.04])  # reaches past the margin: not "no effect"
    assert no_effect(inside_both, 0.03) and not no_effect(straddles, 0.03)
    assert "(no effect in either world)" in claim_status(inside_both, inside_both, "decrease", 0.03)
    assert "no effect" not in claim_status(inside_both, straddles, "decrease", 0.03)
    assert not no_effect(interval([0.0, 0.0, 0.0]), 0.03)  # zero width: nothing is said


def test_a_testbed_that_does_not_repeat_itself_is_judged_so():
    ok, iv = repeat_verdict([0.0, 0.025, 0.0, -0.025, 0.0, 0.0], 0.03, Prior(0.013, 2).times(2))
    assert ok == "pass" and iv.n == 6
    drift, _ = repeat_verdict([0.1, 0.125, 0.1, 0.15], 0.03, Prior(0.013, 2).times(2))
    assert drift == "fail"
    assert repeat_verdict([0.0], 0.03, Prior(0.013, 2))[0] == "undecided"  # one pair: one seed


def _simulated_pass_rate(n: int, sigma: float, delta: float, margin: float, prior: Prior, reps: int,
                         rng: np.random.Generator) -> float:
    """How often the rule itself (interval, inside) passes seeds drawn normal(delta, sigma)."""
    x = rng.normal(delta, sigma, (reps, n))
    return float(np.mean([inside(interval(row, prior), -margin, margin) == "pass" for row in x]))


@pytest.mark.parametrize("delta", [0.0, 0.012, 0.03])
def test_the_power_is_the_exact_tost_power_and_matches_a_simulation_of_the_rule(delta):
    rng = np.random.default_rng(7)
    n, sigma, m = 5, 0.02, 0.03
    # without a prior: the plain TOST, checked against two one-sided t tests written out here
    x = rng.normal(delta, sigma, (40000, n))
    se = x.std(1, ddof=1) / math.sqrt(n)
    t = stats.t.ppf(0.95, n - 1)
    plain = float(np.mean((x.mean(1) - t * se >= -m) & (x.mean(1) + t * se <= m)))
    assert tost_power(n, sigma, -m, m, delta) == pytest.approx(plain, abs=0.01)
    # with a prior: the rule's own interval, simulated
    prior = Prior(0.02, 4)
    assert tost_power(n, sigma, -m, m, delta, prior) == pytest.approx(
        _simulated_pass_rate(n, sigma, delta, m, prior, 4000, rng), abs=0.025)


def test_the_power_at_a_true_difference_of_zero_is_not_the_one_sided_shortcut():
    # At delta = 0 both one-sided tests bind: the normal approximation needs z(1 - beta / 2), not
    # z(1 - beta); for a large n, power = 2 Phi(m sqrt(n) / sigma - z(0.95)) - 1.
    n, sigma, m = 400, 0.1, 0.02
    expected = 2 * stats.norm.cdf(m * math.sqrt(n) / sigma - stats.norm.ppf(0.95)) - 1
    assert tost_power(n, sigma, -m, m, 0.0) == pytest.approx(expected, abs=0.01)
    shortcut_n = math.ceil(((stats.norm.ppf(0.95) + stats.norm.ppf(0.8)) * sigma / m) ** 2)
    assert tost_power(shortcut_n, sigma, -m, m, 0.0) < 0.8  # the shortcut undersizes at delta = 0
    need = seeds_for_power(sigma, -m, m, 0.0, n_max=1000)
    assert need > shortcut_n and tost_power(need, sigma, -m, m) >= 0.8 > tost_power(need - 1, sigma, -m, m)


def test_a_decision_either_way_counts_the_fail_too_and_a_mean_on_a_bound_never_decides():
    # 10 sd beyond the bound: "fail" almost surely, which the equivalence power alone does not count
    assert tost_power(5, 0.02, -0.03, 0.03, 0.1, Prior(0.02, 2), either=True) > 0.99
    assert tost_power(5, 0.02, -0.03, 0.03, 0.1, Prior(0.02, 2)) < 1e-6
    rng = np.random.default_rng(3)
    x = rng.normal(0.04, 0.02, (4000, 5))  # near the bound: some pass, some fail, many straddle
    decided = np.mean([inside(interval(row, Prior(0.02, 2)), -0.03, 0.03) != "undecided" for row in x])
    assert tost_power(5, 0.02, -0.03, 0.03, 0.04, Prior(0.02, 2), either=True) == pytest.approx(decided, abs=0.025)
    assert seeds_for_power(0.02, -0.03, 0.03, 0.03, Prior(0.02, 2), either=True) is None


def test_the_seeds_for_power_are_the_fewest_that_reach_it_and_none_where_a_common_spread_caps_it():
    need = seeds_for_power(0.02, -0.03, 0.03, 0.0, Prior(0.02, 2))
    assert tost_power(need, 0.02, -0.03, 0.03, 0.0, Prior(0.02, 2)) >= 0.8
    assert tost_power(need - 1, 0.02, -0.03, 0.03, 0.0, Prior(0.02, 2)) < 0.8
    assert seeds_for_power(0.02, -0.03, 0.03, 0.0, common=Spread(0.03, 3)) is None  # more seeds do not help
    assert tost_power(1, 0.02, -0.03, 0.03) == 0.0  # one seed never passes


def test_the_shipped_priors_are_positive_scale_with_the_runs_size_and_differ_by_kind():
    fr = shipped_prior("failure_rate", "link", 40)
    assert fr.known and fr.sigma > 0 and fr.df > 0
    assert shipped_prior("failure_rate", "link", 160).sigma == pytest.approx(fr.sigma / 2)  # binomial: 1/sqrt(N)
    assert shipped_prior("failure_rate", "link_down", 40).sigma > fr.sigma
    assert shipped_prior("reaction_s", "link").sigma == shipped_prior("reaction_s", "none").sigma  # no kind of its own
    assert shipped_prior("no_such_metric") == NO_PRIOR
    with pytest.raises(ValueError, match="unknown kind of fault"):
        shipped_prior("failure_rate", "meteor")


def test_a_prediction_interval_is_the_narrowest_order_statistics_at_the_rules_level():
    lo, hi, cov = prediction_interval([0.3, 0.1, 0.2, math.nan, 0.25])
    assert (lo, hi) == (0.1, 0.3) and cov == pytest.approx(3 / 5)  # too few for 90%: [min, max], said
    assert prediction_interval(range(21)) == (0, 20, pytest.approx(20 / 22))  # [min, max]: 91% >= 90%
    assert prediction_interval(range(40)) == (1, 38, pytest.approx(37 / 41))  # one in from each end: 90.2%
    with pytest.raises(ValueError, match="at least 2 samples"):
        prediction_interval([0.1])
