"""analysis.claims: a claim's verdict by the rule of analysis/verdict.py, on hand-built effects whose
intervals and answers are worked out here from the inputs with numpy and scipy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import ClaimRule, claim_table, fieller
from analysis.verdict import RULE_VERSION, Spread

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

T3 = stats.t.ppf(0.95, 2)  # 3 seeds, one-sided 5 %: the 90 % interval
FR = "failure_rate"


def effects(claim: str, sim=(), tb=(), rep=(), a=None, b=None) -> pd.DataFrame:
    """Long rows of one claim, seeds 0, 1, ...; ``a``/``b``: per world the two cells' values."""
    rows = []
    for world, values in (("sim", sim), ("testbed", tb), ("repeat", rep)):
        for i, v in enumerate(values):
            ai = (a or {}).get(world, [math.nan] * len(values))[i]
            bi = (b or {}).get(world, [math.nan] * len(values))[i]
            rows.append({"claim": claim, "world": world, "seed": i, "value": v, "a": ai, "b": bi})
    return pd.DataFrame(rows, columns=["claim", "world", "seed", "value", "a", "b"])


def judge(eff: pd.DataFrame, rule: ClaimRule, spread: Spread | None = None) -> pd.Series:
    name = eff["claim"].iloc[0]
    return claim_table(eff, {name: rule}, {rule.metric: spread} if spread else {}).set_index("claim").loc[name]


def interval(x, floor: float = 0.0) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=float)
    s = max(x.std(ddof=1), floor)
    half = stats.t.ppf(0.95, x.size - 1) * s / math.sqrt(x.size)
    return x.mean(), x.mean() - half, x.mean() + half


DECREASE = ClaimRule(FR, "decrease", 0.03)
NONE = ClaimRule(FR, "none", 0.03)


def test_equal_effects_with_a_small_spread_carry_over():
    sim, tb = [-0.10, -0.125, -0.10], [-0.10, -0.125, -0.10]
    spread = Spread(0.005, 15)
    r = judge(effects("c", sim, tb), DECREASE, spread)
    floor = 0.005 * math.sqrt(2)
    assert (r.sim_mean, r.sim_low, r.sim_high) == pytest.approx(interval(sim, floor))
    assert (r.tb_mean, r.tb_low, r.tb_high) == pytest.approx(interval(tb, floor))
    # the worlds agree seed by seed: the paired interval is the floor's (zero-width without it)
    assert (r.paired_mean, r.paired_low, r.paired_high) == pytest.approx(interval(np.subtract(tb, sim), floor))
    assert r.tb_high < 0 and r.sim_high < 0 and -0.03 < r.paired_low and r.paired_high < 0.03  # the case is so
    assert (r.sim_status, r.tb_status, r.equivalence) == ("holds", "holds", "pass")
    assert r.verdict == "carries over" and "holds in both worlds" in r.reason
    assert r.rule == RULE_VERSION and r.n_seeds == 3


def test_zero_in_both_worlds_carries_over_only_as_a_null_claim():
    zeros = effects("z", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    spread = Spread.of([0.025, 0.0, 0.0, 0.0])  # one request in 40 once, in four repeated runs
    r = judge(zeros, DECREASE, spread)
    floor = spread.sigma * math.sqrt(2)  # a difference of two cells
    assert r.effect_floor == pytest.approx(floor)
    assert (r.tb_low, r.tb_high) == pytest.approx(interval([0, 0, 0], floor)[1:])  # floored, not zero-width
    assert (r.sim_status, r.tb_status) == ("does not hold", "does not hold")
    assert r.verdict == "does not carry over" and r.reason == "holds in neither world"
    n = judge(zeros, NONE, spread)
    assert (n.sim_status, n.tb_status, n.equivalence) == ("holds", "holds", "pass")
    assert n.verdict == "carries over"


def test_an_effect_in_one_world_only_does_not_carry_over():
    r = judge(effects("one", [-0.10, -0.125, -0.10], [0.0, 0.0, 0.0]), DECREASE, Spread.of([0.0, 0.025]))
    assert (r.sim_status, r.tb_status) == ("holds", "does not hold")
    assert r.verdict == "does not carry over" and "holds in the simulator only" in r.reason
    assert "the worlds differ by more than ±0.03" in r.reason  # the paired difference is 0.108 [..] too
    other = judge(effects("other", [0.0, 0.0, 0.0], [-0.10, -0.125, -0.10]), DECREASE, Spread.of([0.0, 0.025]))
    assert other.verdict == "does not carry over" and "holds on the testbed only" in other.reason


def test_opposite_directions_do_not_carry_over():
    r = judge(effects("opp", [-0.10, -0.125, -0.10], [0.10, 0.075, 0.10]), DECREASE)
    assert (r.sim_status, r.tb_status) == ("holds", "does not hold")
    assert r.verdict == "does not carry over" and r.reason.startswith("holds in opposite directions")


def test_a_huge_spread_is_undecided_with_the_seeds_a_decision_needs():
    sim, tb = [-0.10, 0.05, -0.15], [-0.125, 0.075, -0.125]
    r = judge(effects("wide", sim, tb), DECREASE)
    assert (r.sim_status, r.tb_status, r.equivalence) == ("open", "open", "undecided")
    assert r.verdict == "undecided"
    assert "the simulator's and the testbed's and the paired difference's interval too wide to tell" == r.reason
    # the seeds it needs: the fewest n at which the same means and deviations would decide
    need = int(r.seeds_needed)
    assert 3 < need <= 100

    def decided(n: int) -> bool:
        """The rule by hand for a decrease: a world holds when its interval lies below 0 and does not
        when its lower end lies above -margin; the worlds agree inside +-margin, differ outside."""
        ivs = []
        for x in (sim, tb, np.subtract(tb, sim)):
            m, s = np.mean(x), np.std(x, ddof=1)
            half = stats.t.ppf(0.95, n - 1) * s / math.sqrt(n)
            ivs.append((m - half, m + half))
        holds = [hi < 0 for _, hi in ivs[:2]]
        fails = [lo > -0.03 and not ok for (lo, _), ok in zip(ivs[:2], holds)]
        lo, hi = ivs[2]
        return (all(holds) and -0.03 <= lo and hi <= 0.03) or any(fails) or hi < -0.03 or lo > 0.03

    assert decided(need) and not decided(need - 1)


def test_a_ratio_claim_is_judged_on_its_difference_and_reports_the_fieller_interval():
    a = {"sim": [0.025, 0.05, 0.025], "testbed": [0.025, 0.025, 0.05]}  # FaultAwareOTF-R
    b = {"sim": [0.10, 0.125, 0.10], "testbed": [0.10, 0.10, 0.125]}  # FaultAwareLC
    sim = np.subtract(a["sim"], b["sim"])
    tb = np.subtract(a["testbed"], b["testbed"])
    rule = ClaimRule(FR, "decrease", 0.03, "ratio")
    r = judge(effects("ratio", sim, tb, a=a, b=b), rule)
    assert r.verdict == "carries over"
    assert r.ratio_sim == pytest.approx(np.mean(a["sim"]) / np.mean(b["sim"]))
    # Fieller by hand: the R where (mean a - R mean b)^2 = t^2 var(a - R b) / n
    x, y = np.asarray(a["testbed"]), np.asarray(b["testbed"])

    def g(R: float) -> float:
        return (x.mean() - R * y.mean()) ** 2 - T3 ** 2 * np.var(x - R * y, ddof=1) / 3

    lo, hi = r.ratio_tb_low, r.ratio_tb_high
    assert lo < r.ratio_tb < hi and g(lo) == pytest.approx(0, abs=1e-12) and g(hi) == pytest.approx(0, abs=1e-12)
    assert g(r.ratio_tb) < 0  # inside: not distinguishable from the ratio's own value


def test_fieller_is_undefined_where_the_baseline_never_fails_and_unbounded_where_it_may_be_zero():
    assert all(math.isnan(v) for v in fieller(np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0])))
    ratio, lo, hi = fieller(np.array([0.025, 0.0, 0.025]), np.array([0.025, 0.0, 0.0]))
    assert ratio == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)


def test_one_seed_is_judged_by_the_spread_alone_and_without_one_is_undecided():
    eff = effects("one", [-0.10], [-0.10])
    none = judge(eff, DECREASE)
    assert none.verdict == "undecided" and math.isnan(none.tb_low)
    spread = Spread(0.01, 15)  # the per-run spread from 15 repeated runs
    r = judge(eff, DECREASE, spread)
    half = stats.t.ppf(0.95, 15) * 0.01 * math.sqrt(2)
    assert (r.tb_low, r.tb_high) == pytest.approx((-0.10 - half, -0.10 + half))
    assert r.verdict == "carries over"


def test_a_margin_below_the_instruments_spread_is_said_and_a_missing_claim_is_undecided():
    r = judge(effects("m", [-0.10, -0.125, -0.10], [-0.10, -0.125, -0.125]), ClaimRule(FR, "decrease", 0.01),
              Spread(0.02, 10))
    assert r.margin_below_floor and "below one run's spread of this effect" in r.reason
    t = claim_table(effects("other", [0.1], [0.1]), {"absent": DECREASE})
    assert t.loc[0, "verdict"] == "undecided" and t.loc[0, "sim_n"] == 0


def test_a_bad_effects_table_or_rule_is_a_one_line_error():
    with pytest.raises(ValueError, match="lacks column"):
        claim_table(pd.DataFrame({"claim": ["x"]}), {})
    bad = effects("x", [0.1], [0.1]).assign(world="simulator")
    with pytest.raises(ValueError, match="unknown world"):
        claim_table(bad, {})
    with pytest.raises(ValueError, match="unknown direction"):
        ClaimRule(FR, "up", 0.03)
    with pytest.raises(ValueError, match="margin must be > 0"):
        ClaimRule(FR, "none", 0.0)
