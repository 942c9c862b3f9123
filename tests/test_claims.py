"""study.verdicts: a claim's verdict by the rule of analysis/rule/verdict.py, on hand-built effects whose
intervals and answers are worked out here from the inputs with numpy and scipy."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from study.verdicts import ClaimRule, claim_table, fieller
from analysis.rule.verdict import ONE_SEED, RULE_VERSION, Prior, interval as rule_interval, seeds_for_power

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

T3 = stats.t.ppf(0.95, 2)  # 3 seeds, one-sided 5 %: the 90 % interval
FR = "failure_rate"
PRIOR = Prior(0.01, 2)  # one run's prior, as core/defaults/priors.yaml would give it


def effects(claim: str, sim=(), tb=(), rep=(), a=None, b=None) -> pd.DataFrame:
    """Long rows of one claim, seeds 0, 1, ...; ``a``/``b``: per world the two cells' values."""
    rows = []
    for world, values in (("sim", sim), ("testbed", tb), ("repeat", rep)):
        for i, v in enumerate(values):
            ai = (a or {}).get(world, [math.nan] * len(values))[i]
            bi = (b or {}).get(world, [math.nan] * len(values))[i]
            rows.append({"claim": claim, "world": world, "seed": i, "value": v, "a": ai, "b": bi})
    return pd.DataFrame(rows, columns=["claim", "world", "seed", "value", "a", "b"])


def judge(eff: pd.DataFrame, rule: ClaimRule, repeat=None) -> pd.Series:
    name = eff["claim"].iloc[0]
    repeats = {(rule.metric, rule.kind): repeat} if repeat is not None else {}
    return claim_table(eff, {name: rule}, repeats).set_index("claim").loc[name]


def interval(x, prior: Prior = PRIOR, cells: int = 2) -> tuple[float, float, float]:
    """By hand: the seeds' variance pooled with the prior of an effect of ``cells`` runs."""
    x = np.asarray(x, dtype=float)
    s0, d0 = prior.sigma * math.sqrt(cells), prior.df
    df = d0 + x.size - 1
    s = math.sqrt((d0 * s0 ** 2 + (x.size - 1) * x.var(ddof=1)) / df)
    half = stats.t.ppf(0.95, df) * s / math.sqrt(x.size)
    return x.mean(), x.mean() - half, x.mean() + half


DECREASE = ClaimRule(FR, "decrease", 0.03, prior=PRIOR)
NONE = ClaimRule(FR, "none", 0.03, prior=PRIOR)


def test_equal_effects_carry_over_and_hold_in_both_worlds():
    sim, tb = [-0.10, -0.125, -0.10], [-0.10, -0.125, -0.125]
    r = judge(effects("cut", sim, tb), DECREASE)
    assert (r.sim_mean, r.sim_low, r.sim_high) == pytest.approx(interval(sim))
    assert (r.tb_mean, r.tb_low, r.tb_high) == pytest.approx(interval(tb))
    assert (r.paired_mean, r.paired_low, r.paired_high) == pytest.approx(interval(np.subtract(tb, sim)))
    assert (r.sim_status, r.tb_status, r.equivalence) == ("holds", "holds", "pass")
    assert r.verdict == "carries over" and r.reason.endswith("the claim holds in both worlds")
    assert r.rule == RULE_VERSION and r.n_seeds == 3 and r.prior_sigma == pytest.approx(0.01 * math.sqrt(2))


def test_no_effect_in_either_world_carries_the_finding_over_and_refutes_the_claim_in_both():
    r = judge(effects("zero", [0, 0, 0], [0, 0, 0]), DECREASE)
    assert (r.tb_low, r.tb_high) == pytest.approx(interval([0, 0, 0])[1:])  # the prior's width, never zero
    assert r.tb_high > r.tb_low
    assert (r.sim_status, r.tb_status) == ("refuted", "refuted") and r.no_effect_either
    assert r.verdict == "carries over" and "refuted in both worlds (no effect in either world)" in r.reason
    n = judge(effects("zero", [0, 0, 0], [0, 0, 0]), NONE)
    assert (n.sim_status, n.tb_status, n.equivalence, n.verdict) == ("holds", "holds", "pass", "carries over")
    # without a prior, seeds that never vary decide nothing
    bare = judge(effects("zero", [0, 0, 0], [0, 0, 0]), replace(NONE, prior=Prior(0.0, 0)))
    assert bare.verdict == "undecided" and "zero width" in bare.reason and bare.sim_status == "open"


def test_an_effect_in_one_world_only_does_not_carry_over():
    r = judge(effects("one", [-0.10, -0.125, -0.10], [0.0, 0.0, 0.025]), DECREASE)
    assert (r.sim_status, r.tb_status) == ("holds", "refuted")
    assert r.verdict == "does not carry over" and r.reason.startswith("the worlds differ by more than ±0.03")
    assert "holds in the simulator and is refuted on the testbed" in r.reason
    assert not r.no_effect_either


def test_a_huge_spread_is_undecided_with_the_seeds_a_decision_needs_80_percent_of_the_time():
    sim, tb = [-0.1, 0.0, 0.05], [-0.05, -0.05, 0.05]
    r = judge(effects("wide", sim, tb), DECREASE)
    assert (r.sim_status, r.tb_status, r.equivalence) == ("open", "open", "undecided")
    assert r.verdict == "undecided" and r.reason.startswith("the paired difference's interval straddles ±0.03")
    paired = rule_interval(np.subtract(tb, sim), PRIOR.times(2))
    assert r.pooled_sd == pytest.approx(paired.sd)
    need = seeds_for_power(paired.sd, -0.03, 0.03, paired.mean, PRIOR.times(2), either=True)
    assert r.seeds_needed == need and need > 3


def test_a_testbed_that_does_not_repeat_itself_cannot_carry_over():
    sim, tb = [-0.10, -0.125, -0.10], [-0.10, -0.125, -0.125]
    drift = ("fail", rule_interval([0.1, 0.125], PRIOR.times(2)))
    r = judge(effects("cut", sim, tb), DECREASE, drift)
    assert r.verdict == "undecided" and r.reason.startswith("the testbed does not repeat itself within ±0.03")
    assert r["repeat"] == "fail" and r.equivalence == "pass"
    steady = judge(effects("cut", sim, tb), DECREASE, ("pass", rule_interval([0.0, 0.0], PRIOR.times(2))))
    assert steady.verdict == "carries over" and steady["repeat"] == "pass"
    assert judge(effects("cut", sim, tb), DECREASE)["repeat"] == "not run"


def test_a_ratio_claim_is_judged_on_its_difference_and_reports_the_fieller_interval():
    a = {"sim": [0.025, 0.05, 0.025], "testbed": [0.025, 0.025, 0.05]}  # FaultAwareOTF-R
    b = {"sim": [0.10, 0.125, 0.10], "testbed": [0.10, 0.10, 0.125]}  # FaultAwareLC
    sim = np.subtract(a["sim"], b["sim"])
    tb = np.subtract(a["testbed"], b["testbed"])
    rule = ClaimRule(FR, "decrease", 0.03, "ratio", prior=PRIOR)
    r = judge(effects("ratio", sim, tb, a=a, b=b), rule)
    assert r.verdict == "carries over"
    assert r.ratio_sim == pytest.approx(np.mean(a["sim"]) / np.mean(b["sim"]))
    # Fieller by hand: the R where (mean a - R mean b)^2 = t^2 var(a - R b) / n, each cell's variance and
    # their covariance pooled with one run's prior (df 2 + 2)
    x, y = np.asarray(a["testbed"]), np.asarray(b["testbed"])
    t4 = stats.t.ppf(0.95, 4)

    def g(R: float) -> float:
        va = (2 * 0.01 ** 2 + 2 * x.var(ddof=1)) / 4
        vb = (2 * 0.01 ** 2 + 2 * y.var(ddof=1)) / 4
        cab = np.cov(x, y, ddof=1)[0, 1] * 2 / 4
        return (x.mean() - R * y.mean()) ** 2 - t4 ** 2 * (va - 2 * R * cab + R * R * vb) / 3

    lo, hi = r.ratio_tb_low, r.ratio_tb_high
    assert lo < r.ratio_tb < hi and g(lo) == pytest.approx(0, abs=1e-12) and g(hi) == pytest.approx(0, abs=1e-12)
    assert g(r.ratio_tb) < 0  # inside: not distinguishable from the ratio's own value


def test_fieller_is_undefined_where_the_baseline_never_fails_and_unbounded_where_it_may_be_zero():
    assert all(math.isnan(v) for v in fieller(np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0])))
    ratio, lo, hi = fieller(np.array([0.025, 0.0, 0.025]), np.array([0.025, 0.0, 0.0]))
    assert ratio == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)


def test_one_seed_decides_nothing_and_a_missing_claim_is_undecided():
    r = judge(effects("one", [-0.10], [-0.10]), DECREASE)
    assert r.verdict == "undecided" and r.reason.startswith(ONE_SEED)
    half = stats.t.ppf(0.95, 2) * 0.01 * math.sqrt(2)  # shown with the prior's width
    assert (r.tb_low, r.tb_high) == pytest.approx((-0.10 - half, -0.10 + half))
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
