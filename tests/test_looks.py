"""study/looks.py: the group-sequential design. Its error rate at the margin by simulation (at or
below the rule's level with the level split, above it without), its one look against the exact
power, a decided claim never judged again, and a claim judged at the look that decides it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from study.verdicts import ClaimRule, claim_table
from study.looks import first_decided, look_level, look_seeds, simulate
from analysis.rule.verdict import ALPHA, MIN_SEEDS, UNDECIDED, Prior, interval, tost_power
from core.spec.model import SpecError, parse_spec
from core.spec.study import LOOK_MIN_SEEDS

pytestmark = pytest.mark.background  # needs no core of its own (tests/conftest.py)

SIGMA, MARGIN = 0.5, 1.0  # a design that decides: at a true difference of 0, 98% carry over by look 2
PRIOR = Prior(SIGMA, 2)  # a hand-made prior worth 2 degrees of freedom
REPS = 20000
MC = 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)  # three standard errors of a share near ALPHA


@pytest.mark.parametrize("looks", [(3, 6), (2, 4, 8)])
@pytest.mark.parametrize("delta", [MARGIN, -MARGIN])
def test_the_error_rate_at_the_margin_is_at_most_the_rules_level(looks, delta):
    """A true paired difference on the margin: "carries over" is the wrong verdict; over every look
    it happens at most ALPHA of the time (the level split ALPHA / K per look)."""
    got = simulate(looks, SIGMA, -MARGIN, MARGIN, delta, PRIOR, reps=REPS, seed=1)
    assert got["pass"] <= ALPHA + MC
    assert got["pass"] + got["fail"] + got["undecided"] == pytest.approx(1.0)


def test_without_the_split_the_looks_inflate_the_error_rate():
    """The same three looks with each test at ALPHA: the chances add up past the rule's level, which
    is what the split prevents (a test of the simulation, which could fail)."""
    split = simulate((2, 4, 8), SIGMA, -MARGIN, MARGIN, MARGIN, PRIOR, reps=REPS, seed=2)
    naive = simulate((2, 4, 8), SIGMA, -MARGIN, MARGIN, MARGIN, PRIOR, reps=REPS, seed=2, level=ALPHA)
    assert naive["pass"] > ALPHA + MC > split["pass"]


@pytest.mark.parametrize("delta", [0.5, 0.8])
def test_one_look_is_the_single_test_whose_exact_power_the_plan_computes(delta):
    got = simulate((6,), SIGMA, -MARGIN, MARGIN, delta, PRIOR, reps=REPS, seed=3)
    exact = tost_power(6, SIGMA, -MARGIN, MARGIN, delta, PRIOR)
    assert got["pass"] == pytest.approx(exact, abs=3 * math.sqrt(exact * (1 - exact) / REPS) + 1e-9)


def test_a_second_look_decides_more_and_runs_fewer_seeds_than_its_maximum():
    one = simulate((3,), SIGMA, -MARGIN, MARGIN, 0.5, PRIOR, reps=REPS, seed=4)
    two = simulate((3, 6), SIGMA, -MARGIN, MARGIN, 0.5, PRIOR, reps=REPS, seed=4)
    assert two["pass"] > one["pass"] and 3 < two["mean_seeds"] < 6


def test_the_seeds_of_each_look_and_its_level():
    assert look_seeds((2, 4), [7, 3, 9, 1]) == [[7, 3], [7, 3, 9, 1]]
    assert look_seeds(None, [7, 3]) == [[7, 3]]
    assert look_level(1) == ALPHA and look_level(3) == pytest.approx(ALPHA / 3)
    for bad in ((1, 4), (3, 2, 4), (2, 3)):
        with pytest.raises(ValueError, match="must rise"):
            look_seeds(bad, [0, 1, 2, 3])
    assert LOOK_MIN_SEEDS == MIN_SEEDS  # the spec refuses what the rule could not decide


def test_a_decided_claim_is_never_judged_again_and_a_look_not_run_is_not_read():
    calls = []

    def judge(seeds, level):
        calls.append((tuple(seeds), level))
        return ("pass" if len(seeds) == 4 else UNDECIDED), len(seeds)

    assert first_decided((2, 4, 6), list(range(6)), judge) == (2, 4, "")
    assert calls == [((0, 1), ALPHA / 3), ((0, 1, 2, 3), ALPHA / 3)]  # look 3 never judged

    def short(seeds, level):
        return (UNDECIDED, len(seeds)) if len(seeds) == 2 else ("", None)

    assert first_decided((2, 4), list(range(4)), short) == (1, 2, "look 2 needs 4 seeds in both worlds")


def _effects(tb_minus_sim: list[float]) -> pd.DataFrame:
    rows = []
    for seed, d in enumerate(tb_minus_sim):
        rows += [{"claim": "c", "world": "sim", "seed": seed, "value": 0.0, "a": math.nan, "b": math.nan},
                 {"claim": "c", "world": "testbed", "seed": seed, "value": d, "a": math.nan, "b": math.nan}]
    return pd.DataFrame(rows)


RULE = ClaimRule("failure_rate", "none", 0.1, cells=1, prior=Prior(0.01, 2))


def test_a_claim_decided_at_look_one_keeps_that_verdict_whatever_later_seeds_hold():
    """Seeds 0-2 agree within the margin: carried over at look 1, at half the level; seeds 3-5 (run for
    another claim's sake) would refute it and are not read."""
    d = [0.0, 0.01, -0.01, 5.0, 5.0, 5.0]
    r = claim_table(_effects(d), {"c": RULE}, looks=[3, 6], seeds=list(range(6))).iloc[0]
    want = interval(d[:3], Prior(0.01, 2), alpha=ALPHA / 2)
    assert (r.look, r.alpha, r.n_seeds, r.verdict) == (1, ALPHA / 2, 3, "carries over")
    assert (r.paired_low, r.paired_high) == pytest.approx((want.low, want.high))
    assert want.high - want.low > interval(d[:3], Prior(0.01, 2)).high - interval(d[:3], Prior(0.01, 2)).low


def test_a_claim_undecided_at_look_one_is_judged_on_every_seed_at_look_two():
    d = [0.0, 0.3, -0.2, 0.02, -0.01, 0.0]  # look 1 straddles the margin; six seeds settle it
    r = claim_table(_effects(d), {"c": RULE}, looks=[3, 6], seeds=list(range(6))).iloc[0]
    assert (r.look, r.n_seeds) == (2, 6)
    assert r.paired_mean == pytest.approx(np.mean(d))
    # the same runs without look 2's seeds: undecided at look 1, and the reason names the missing look
    r = claim_table(_effects(d[:4]), {"c": RULE}, looks=[3, 6], seeds=list(range(6))).iloc[0]
    assert (r.look, r.verdict) == (1, "undecided") and r.reason.startswith("look 2 needs 6 seeds")


def test_a_spec_with_looks_that_do_not_fit_its_seeds_is_refused_in_one_line():
    from builders import shipped_spec_dict

    data = shipped_spec_dict("testbed.yaml", exclude={"study"})
    data["study"] = {"seeds": [0, 1, 2, 3], "looks": [2, 3],
                     "sweeps": [{"name": "severe", "axes": {"severity": [0.01]}}],
                     "claims": [{"name": "c", "metric": "failure_rate", "policy": "LC", "at": {"sweep": "severe"},
                                 "direction": "increase", "margin": 0.1}]}
    with pytest.raises(SpecError, match=r"looks \[2, 3\] must rise from at least 2 seeds to the 4") as e:
        parse_spec(data, "s")
    assert "\n" not in str(e.value)
