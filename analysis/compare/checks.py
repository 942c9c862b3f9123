"""The checks of `testbed compare` on runs tables: each check's per-seed deviation, the testbed's
spread of it, the verdict by the rule of analysis/rule/verdict.py, and the rank of the policies judged pair
by pair. analysis/compare/fidelity.py's docstring says what each check compares; docs/verdicts.md the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from scipy import stats

from analysis.run.names import Metric as M, latency
from analysis.compare.paired import OUTCOME_AGREEMENT
from analysis.run.summary import mean_ci
from analysis.rule.verdict import (FAIL, NO_PRIOR, NO_SPREAD, PASS, RULE_VERSION, UNDECIDED, Interval, Prior, Spread,
                              inside, interval, seeds_for_power, shipped_prior)
from core.spec.metrics import FidelityTolerances
from core.stages import FAILURE_STAGES
from vocab import TESTBED

NAN = math.nan
EPS = 1e-12  # float rounding in ties
WORLDS = ("sim", "testbed")
REPEAT = "repeat"  # the world label of a second set of testbed runs (repeatability)
COMPOSITION_STAGES = (*FAILURE_STAGES, "unknown")


def seed_mean(runs: pd.DataFrame, world: str, policy: str, metric: str) -> tuple[float, float, int]:
    """(mean, CI half-width, n) over the seeds of ``world`` and ``policy`` in a runs table; NaN, NaN, 0
    when the table has no such runs or no such column."""
    if metric not in runs.columns:
        return NAN, NAN, 0
    sel = (runs["world"] == world) & (runs["policy"] == policy)
    return mean_ci(runs.loc[sel, metric].to_numpy(dtype=float))


def seed_values(runs: pd.DataFrame, world: str, policy: str, metric: str) -> pd.Series:
    """``metric`` per seed of ``world`` and ``policy`` (NaN values left out); empty without the column."""
    if metric not in runs.columns or runs.empty:
        return pd.Series(dtype=float)
    sel = runs.loc[(runs["world"] == world) & (runs["policy"] == policy)]
    return sel.set_index("seed")[metric].astype(float).dropna()


def _checks(tol: FidelityTolerances) -> list[tuple[str, str, float]]:
    """(metric, "abs" | "rel" | "min", tolerance) of each per-policy check."""
    rel = {50: tol.latency_p50_rel, 90: tol.latency_p90_rel}
    return [(M.FAILURE_RATE, "abs", tol.failure_rate_abs),
            *((latency(k, q), "rel", rel[q]) for k in ("ttft", "e2e") for q in (50, 90)),
            (M.TRAFFIC_DEFLECTION_RATIO, "abs", tol.deflection_abs),
            (OUTCOME_AGREEMENT, "min", tol.outcome_agreement_min)]


def bounds(kind: str, tolerance: float) -> tuple[float, float]:
    """The region a check's deviation must lie in: +-tolerance ("abs", "rel"); for "min" (an agreement
    of at least ``tolerance``) a disagreement of at most 1 - tolerance."""
    return (-math.inf, 1.0 - tolerance) if kind == "min" else (-tolerance, tolerance)


def deviations(runs: pd.DataFrame, policy: str, metric: str, kind: str, other: str = "sim",
               agreement_by_seed: pd.DataFrame | None = None) -> pd.Series:
    """The deviation a check judges, per seed both sides hold: "abs" testbed - other, "rel" (other -
    testbed) / testbed (left out where the testbed's value is 0), "min" 1 - the seed's outcome
    agreement (``agreement_by_seed``: policy, seed, agreement; empty without it)."""
    if kind == "min":
        if agreement_by_seed is None or agreement_by_seed.empty:
            return pd.Series(dtype=float)
        a = agreement_by_seed[agreement_by_seed["policy"] == policy].set_index("seed")["agreement"].astype(float)
        return (1.0 - a).dropna()
    tb, ot = seed_values(runs, "testbed", policy, metric), seed_values(runs, other, policy, metric)
    both = tb.index.intersection(ot.index)
    tb, ot = tb[both], ot[both]
    if kind == "abs":
        return tb - ot
    keep = tb != 0
    return ((ot - tb) / tb)[keep]


def repeat_spreads(runs: pd.DataFrame, repeat_runs: pd.DataFrame, policies: Sequence[str], tol: FidelityTolerances,
                   agreement_by_seed: pd.DataFrame | None) -> dict[str, Spread]:
    """The testbed's spread of each check's deviation (analysis.rule.verdict.Spread.of): the repeat in the
    simulator's place, pooled over every policy and seed the repeat holds."""
    both = pd.concat([runs[runs["world"] == TESTBED], repeat_runs], ignore_index=True)
    out = {}
    for metric, kind, _ in _checks(tol):
        d = [deviations(both, p, metric, kind, REPEAT, agreement_by_seed) for p in policies]
        out[metric] = Spread.of(pd.concat(d).to_numpy() if d else [])
    return out


def check_priors(tol: FidelityTolerances, kind: str, requests: float) -> dict[str, Prior]:
    """The prior of each check's deviation for a run of ``requests`` under a kind of fault
    (core/defaults/priors.yaml); NO_PRIOR where none is shipped."""
    return {metric: shipped_prior(metric, kind, requests) for metric, _, _ in _checks(tol)}


def repeat_checks(runs: pd.DataFrame, repeat_runs: pd.DataFrame, policies: Sequence[str], tol: FidelityTolerances,
                  agreement_by_seed: pd.DataFrame | None,
                  priors: Mapping[str, Prior]) -> dict[str, tuple[str, Interval]]:
    """Does the testbed repeat itself, check by check: the deviation of each check with the repeat in
    the simulator's place, pooled over every policy and seed the repeat holds (the pair is the unit),
    judged inside the check's own bounds by the rule with the prior of a difference of two runs."""
    both = pd.concat([runs[runs["world"] == TESTBED], repeat_runs], ignore_index=True)
    out = {}
    for metric, kind, limit in _checks(tol):
        d = [deviations(both, p, metric, kind, REPEAT, agreement_by_seed) for p in policies]
        prior = priors.get(metric, NO_PRIOR)
        iv = interval(pd.concat(d).to_numpy() if d else [], prior.times(2) if prior.known else prior)
        out[metric] = (inside(iv, *bounds(kind, limit)), iv)
    return out


def calibration_spreads(testbed_runs: pd.DataFrame, calibrated: Sequence[pd.DataFrame], policies: Sequence[str],
                        tol: FidelityTolerances,
                        agreement_by_seed: Sequence[pd.DataFrame | None]) -> dict[str, Spread]:
    """The simulator's spread over calibrations of each check's deviation, a spread every seed shares
    (analysis/rule/verdict.py, "Common spread"). ``calibrated`` holds one runs frame of sim runs (world
    "sim") per calibration, the same policies and seeds each, and ``agreement_by_seed`` each one's
    agreement with the testbed per seed. Per policy the deviation's mean over seeds under each
    calibration, its variance over the k calibrations (ddof 1), pooled as the mean over policies;
    df k - 1 (the policies share the calibrations, so they add no degrees of freedom). Empty with
    fewer than two calibrations."""
    if len(calibrated) < 2:
        return {}
    tb = testbed_runs[testbed_runs["world"] == TESTBED]
    out = {}
    for metric, kind, _ in _checks(tol):
        variances = []
        for policy in policies:
            means = [deviations(pd.concat([tb, runs], ignore_index=True), policy, metric, kind, "sim", agree).mean()
                     for runs, agree in zip(calibrated, agreement_by_seed)]
            means = [m for m in means if not math.isnan(m)]
            if len(means) >= 2:
                variances.append(float(pd.Series(means).var(ddof=1)))
        out[metric] = Spread(math.sqrt(sum(variances) / len(variances)), len(calibrated) - 1) if variances else NO_SPREAD
    return out


def calibration_range(calibrated: Sequence[pd.DataFrame], policy: str, metric: str) -> tuple[float, float]:
    """The least and the greatest of the simulator's mean over seeds of ``metric`` over the calibrations."""
    means = [seed_mean(runs, "sim", policy, metric)[0] for runs in calibrated]
    means = [m for m in means if not math.isnan(m)]
    return (min(means), max(means)) if means else (NAN, NAN)


def fidelity_table(runs: pd.DataFrame, policies: Sequence[str], tol: FidelityTolerances,
                   agreement: Mapping[str, tuple[float, int]] | None = None, other: str = "sim",
                   agreement_by_seed: pd.DataFrame | None = None,
                   priors: Mapping[str, Prior] | None = None,
                   common: Mapping[str, Spread] | None = None,
                   calibrated: Sequence[pd.DataFrame] = (),
                   repeats: Mapping[str, tuple[str, Interval]] | None = None) -> pd.DataFrame:
    """One row per policy and checked metric (failure_rate, TTFT/E2E p50/p90, traffic_deflection_ratio,
    outcome_agreement), the testbed against ``other`` (a world of ``runs``: "sim", or "repeat"): other's
    and the testbed's mean, 95% CI half-width and n (columns <other>, <other>_ci, <other>_n, testbed,
    ...), diff = testbed - other and rel_error = (other - testbed) / testbed of the means (NaN where the
    testbed's is 0 or NaN), and the verdict by the rule of analysis/rule/verdict.py: the per-seed
    :func:`deviations`' mean (``deviation``), its interval with the seeds' variance pooled with
    ``priors[metric]`` (dev_low, dev_high, n_seeds, prior_sigma, prior_df), the tolerance and its kind,
    the ``verdict`` (pass: the interval inside :func:`bounds`; fail: wholly outside; undecided:
    neither, or the interval decides nothing: ``why``), and the seeds at which the check would decide,
    either way, with 80% probability, were its mean and pooled standard deviation as measured. ``repeats``
    (:func:`repeat_checks`) judge the testbed against its repeat: a check whose testbed does not repeat
    itself within its bounds cannot pass (``repeat_verdict``: pass, fail, undecided, or "not run"). ``agreement`` maps a policy to its pooled (outcome agreement, matched requests)
    (:meth:`analysis.compare.paired.PairedReport.agreement_of`): its row holds the agreement as <other>, the
    matched requests as both n, and diff = 1 - agreement. ``common`` (the simulator's spread over
    calibrations, :func:`calibration_spreads`) widens each interval by a spread every seed shares
    (cal_sigma, cal_df); ``calibrated``, the sim's runs under each calibration, gives the sim's range
    of means over them (sim_cal_low, sim_cal_high; NaN without)."""
    rows = []
    priors = priors or {}
    common = common or {}
    repeats = repeats or {}
    for policy in policies:
        for metric, kind, limit in _checks(tol):
            if kind == "min":
                a, n = (agreement or {}).get(policy, (NAN, 0))
                om, oh, on, tm, th, tn, diff, rel = a, NAN, n, NAN, NAN, n, 1.0 - a, NAN
            else:
                om, oh, on = seed_mean(runs, other, policy, metric)
                tm, th, tn = seed_mean(runs, "testbed", policy, metric)
                diff = tm - om
                rel = (om - tm) / tm if tm != 0 and not math.isnan(tm) else NAN
            prior, shared = priors.get(metric, NO_PRIOR), common.get(metric, NO_SPREAD)
            iv = interval(deviations(runs, policy, metric, kind, other, agreement_by_seed), prior, shared)
            low, high = calibration_range(calibrated, policy, metric) if calibrated and kind != "min" else (NAN, NAN)
            lo, hi = bounds(kind, limit)
            verdict, why = inside(iv, lo, hi), iv.why_not
            rep = repeats.get(metric)
            if verdict == PASS and rep is not None and rep[0] != PASS:
                verdict, why = UNDECIDED, f"the testbed does not repeat itself within the tolerance (its repeat: {rep[0]})"
            needed = _seeds_needed(iv, lo, hi, prior, shared)
            rows.append({"policy": policy, "metric": metric, other: om, f"{other}_ci": oh, f"{other}_n": on,
                         "testbed": tm, "testbed_ci": th, "testbed_n": tn, "diff": diff, "rel_error": rel,
                         "deviation": iv.mean, "dev_low": iv.low, "dev_high": iv.high, "n_seeds": iv.n,
                         "prior_sigma": prior.sigma, "prior_df": prior.df,
                         "cal_sigma": shared.sigma, "cal_df": shared.pairs, "sim_cal_low": low, "sim_cal_high": high,
                         "tolerance": limit, "tolerance_kind": kind, "verdict": verdict, "why": why,
                         "repeat_verdict": "not run" if rep is None else rep[0],
                         "seeds_needed": NAN if needed is None else needed, "rule": RULE_VERSION})
    return pd.DataFrame(rows)


def repeat_table(runs: pd.DataFrame, repeat_runs: pd.DataFrame, policies: Sequence[str], tol: FidelityTolerances,
                 agreement: Mapping[str, tuple[float, int]], agreement_by_seed: pd.DataFrame | None = None) -> pd.DataFrame:
    """The testbed against its repeat, check by check (:func:`fidelity_table` with the repeat as the other
    side; the testbed's runs only of the (policy, seed) pairs the repeat holds), each row's mean
    ``deviation``, without tolerance, verdict or interval: a description of the instrument."""
    tb = runs[runs["world"] == TESTBED]
    held = pd.MultiIndex.from_frame(repeat_runs[["policy", "seed"]])
    tb = tb[pd.MultiIndex.from_frame(tb[["policy", "seed"]]).isin(held)]
    table = fidelity_table(pd.concat([tb, repeat_runs], ignore_index=True), policies, tol, agreement, REPEAT,
                           agreement_by_seed)
    return table.drop(columns=["tolerance", "verdict", "why", "repeat_verdict", "dev_low", "dev_high", "prior_sigma",
                               "prior_df", "cal_sigma", "cal_df", "sim_cal_low", "sim_cal_high", "seeds_needed",
                               "rule"])


def _seeds_needed(iv: Interval, lo: float, hi: float, prior: Prior, common: Spread) -> int | None:
    """The seeds at which the check would decide, either way, with 80% probability, were its mean and
    pooled standard deviation as measured (None: not within 100, or nothing measured)."""
    if not iv.n or math.isnan(iv.sd):
        return None
    return seeds_for_power(iv.sd, lo, hi, iv.mean, prior, common, either=True)


def composition_table(runs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy and stage (core.stages plus "unknown"): sim_share and testbed_share, the mean over seeds
    of fail_share_<stage> (runs without failures left out), and diff_share = testbed - sim."""
    rows = []
    for policy in policies:
        for stage in COMPOSITION_STAGES:
            s = seed_mean(runs, "sim", policy, f"fail_share_{stage}")[0]
            t = seed_mean(runs, "testbed", policy, f"fail_share_{stage}")[0]
            rows.append({"policy": policy, "stage": stage, "sim_share": s, "testbed_share": t, "diff_share": t - s})
    return pd.DataFrame(rows)


def noise_table(runs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy: means over seeds of noise_floor, clean_share, clean_failure_share and failure_rate in
    each world (columns <name>_sim, <name>_testbed), failure_rate_diff, noise_explained =
    clean_failure_share_testbed - clean_failure_share_sim, and noise_explained_fraction =
    noise_explained / failure_rate_diff (NaN when the difference is 0)."""
    rows = []
    for policy in policies:
        row: dict[str, Any] = {"policy": policy}
        for name in (M.FAILURE_RATE, M.NOISE_FLOOR, M.CLEAN_SHARE, M.CLEAN_FAILURE_SHARE):
            for world in WORLDS:
                row[f"{name}_{world}"] = seed_mean(runs, world, policy, name)[0]
        row["failure_rate_diff"] = row["failure_rate_testbed"] - row["failure_rate_sim"]
        row["noise_explained"] = row["clean_failure_share_testbed"] - row["clean_failure_share_sim"]
        d = row["failure_rate_diff"]
        row["noise_explained_fraction"] = row["noise_explained"] / d if abs(d) > EPS else NAN
        rows.append(row)
    return pd.DataFrame(rows)


Order = tuple[tuple[str, ...], ...]


def policy_order(means: Mapping[str, float]) -> Order:
    """Policies by mean failure rate, lowest first, as groups of ties (means within 1e-12; names sorted
    inside a group). NaN means are left out."""
    items = sorted(((v, p) for p, v in means.items() if not math.isnan(v)))
    groups: list[list[str]] = []
    first = NAN
    for v, p in items:
        if groups and v - first <= EPS:
            groups[-1].append(p)
        else:
            groups.append([p])
            first = v
    return tuple(tuple(sorted(g)) for g in groups)


AGREE, DISAGREE, OPEN_PAIR = "agree", "disagree", "open"
PAIR_COLUMNS = ("a", "b", "sim_diff", "sim_low", "sim_high", "sim_order", "testbed_diff", "testbed_low",
                "testbed_high", "testbed_order", "deviation", "dev_low", "dev_high", "agreement")


def pair_order(iv: Any, margin: float) -> str:
    """How one world orders a pair from its interval of the per-seed failure-rate difference a - b:
    "=" when it lies inside +-margin (no difference that matters), "<" when below 0, ">" when above 0,
    "?" when the seeds cannot tell."""
    if inside(iv, -margin, margin) == PASS:
        return "="
    if iv.defined and iv.high < 0:
        return "<"
    if iv.defined and iv.low > 0:
        return ">"
    return "?"


def pair_table(runs: pd.DataFrame, policies: Sequence[str], margin: float, prior: Prior = NO_PRIOR) -> pd.DataFrame:
    """Every pair (a, b) of ``policies``: in each world the mean failure-rate difference a - b over
    seeds, its interval pooled with two runs' ``prior``, and its order (:func:`pair_order`); and the
    per-seed deviation of that difference across the worlds (testbed - sim, pooled likewise), judged by
    its equivalence test. The pair "agree"s when the deviation lies inside +-margin (the worlds separate
    the pair alike) or both worlds decide the same order; it "disagree"s only when its equivalence
    test fails (the deviation wholly outside +-margin) and both worlds decide different orders; it is
    "open" otherwise."""
    rows = []
    for i, a in enumerate(policies):
        for b in policies[i + 1:]:
            row: dict[str, Any] = {"a": a, "b": b}
            orders, diffs = [], {}
            for w in WORLDS:
                diffs[w] = (seed_values(runs, w, a, M.FAILURE_RATE) - seed_values(runs, w, b, M.FAILURE_RATE)).dropna()
                iv = interval(diffs[w].to_numpy(), prior.times(2))
                orders.append(pair_order(iv, margin))
                row.update({f"{w}_diff": iv.mean, f"{w}_low": iv.low, f"{w}_high": iv.high, f"{w}_order": orders[-1]})
            seeds = diffs["testbed"].index.intersection(diffs["sim"].index)
            dev = interval((diffs["testbed"][seeds] - diffs["sim"][seeds]).to_numpy(), prior.times(2))
            row.update({"deviation": dev.mean, "dev_low": dev.low, "dev_high": dev.high})
            eq = inside(dev, -margin, margin)
            decided = "?" not in orders
            row["agreement"] = AGREE if eq == PASS or (decided and orders[0] == orders[1]) else \
                DISAGREE if eq == FAIL and decided else OPEN_PAIR
            rows.append(row)
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))


@dataclass(frozen=True)
class Rank:
    """Rank agreement of the two worlds on failure rate (see the module docstring)."""

    policies: tuple[str, ...]  # the policies tau is over
    kendall_tau: float  # tau-b of the worlds' mean failure rates: a description
    tau_min: float
    tau_low: float  # the share of agreeing pairs as a tau, open pairs counted against, and for
    tau_high: float
    tau_verdict: str
    named: tuple[str, ...]  # the rank_policies present in both worlds
    order_sim: Order
    order_testbed: Order
    order_verdict: str  # pass: every named pair agrees; fail: one disagrees; undecided otherwise
    pairs: pd.DataFrame  # pair_table of the policies


def rank_agreement(sim_means: Mapping[str, float], testbed_means: Mapping[str, float],
                   tol: FidelityTolerances, pairs: pd.DataFrame | None = None) -> Rank:
    """Kendall tau-b over the policies with a finite mean in both mappings and the order of
    tol.rank_policies in each world, as descriptions; the verdicts from ``pairs`` (:func:`pair_table`):
    the tau verdict on a Kendall tau over the pairs, 2 C / P - 1 with C the pairs both worlds order
    alike (ties alike included), bounded below with the open pairs counted as unlike and above as
    alike ("pass" when the lower bound reaches tau_min, "fail" when the upper does not, else
    "undecided"); the order verdict "pass" when every pair of the named policies is ordered alike,
    "fail" when one is ordered otherwise, else (or with fewer than two named) "undecided". tau is NaN
    with fewer than two policies or one world's means all equal."""
    common = tuple(p for p in sim_means if p in testbed_means
                   and not math.isnan(sim_means[p]) and not math.isnan(testbed_means[p]))
    tau = NAN
    if len(common) >= 2:
        # rounded like policy_order's ties, so float noise is no order in either
        x = [round(sim_means[p], 12) for p in common]
        y = [round(testbed_means[p], 12) for p in common]
        if len(set(x)) > 1 and len(set(y)) > 1:  # scipy warns and returns NaN on a constant input
            tau = float(stats.kendalltau(x, y, variant="b").statistic)
    pairs = pairs if pairs is not None else pd.DataFrame(columns=list(PAIR_COLUMNS))
    mine = pairs[pairs["a"].isin(common) & pairs["b"].isin(common)]
    n = len(mine)
    agree, open_ = int((mine["agreement"] == AGREE).sum()), int((mine["agreement"] == OPEN_PAIR).sum())
    low = 2 * agree / n - 1 if n else NAN
    high = 2 * (agree + open_) / n - 1 if n else NAN
    tau_v = UNDECIDED if not n else PASS if low >= tol.kendall_tau_min - EPS else \
        FAIL if high < tol.kendall_tau_min - EPS else UNDECIDED
    named = tuple(p for p in tol.rank_policies if p in common)
    o_sim = policy_order({p: sim_means[p] for p in named})
    o_tb = policy_order({p: testbed_means[p] for p in named})
    nm = pairs[pairs["a"].isin(named) & pairs["b"].isin(named)]["agreement"]
    order_v = UNDECIDED if len(named) < 2 or len(nm) < len(named) * (len(named) - 1) // 2 else \
        FAIL if (nm == DISAGREE).any() else PASS if (nm == AGREE).all() else UNDECIDED
    return Rank(common, tau, tol.kendall_tau_min, low, high, tau_v, named, o_sim, o_tb, order_v, pairs)


