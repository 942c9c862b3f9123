"""Sim vs testbed: does a result found in simulation carry over? (``testbed compare SIM TESTBED``)

Two sets of runs of one scenario, one per world, compared policy by policy; the testbed (the measured
world) is the reference. Each world's "mean" is the mean over seeds and "CI" its 95% half-width
(:func:`analysis.run.summary.mean_ci`), a description. Tolerances are the ``metrics.fidelity`` block of
the testbed runs' spec (``core.spec.metrics.FidelityTolerances``): the difference that matters.

Every check is judged by the rule of analysis/rule/verdict.py (docs/verdicts.md) on the deviation it
names, one value per seed both worlds ran (the seeds' workloads are the same in both), its seeds'
variance pooled with the check's prior (below): "pass" when the interval lies inside the tolerance,
"fail" when it lies wholly outside, "undecided" when the seeds cannot tell (one seed never can),
with the seeds that would give the test 80% power (analysis/compare/checks.py):

* failure rate: diff = testbed - sim (absolute; printed in percentage points), inside
  +-failure_rate_abs.
* outcome agreement (analysis/compare/paired.py): the share of the requests matched by (policy, seed, id)
  that end the same way in both worlds; the deviation is 1 - the seed's agreement (the share that
  ended differently), at most 1 - outcome_agreement_min; in the table sim = the pooled agreement,
  diff = 1 - it, testbed NaN.
* TTFT and E2E p50 and p90 over ok requests: each run's percentile; rel_error = (sim - testbed) /
  testbed, the simulator's error relative to the measured value as simulator-accuracy studies define
  it (Vidur, Agrawal et al., MLSys 2024), per seed, inside +-latency_p50_rel (p50) or
  +-latency_p90_rel (p90).
* traffic deflection ratio: diff = testbed - sim, inside +-deflection_abs.
* failure composition: per stage of core.stages plus "unknown", the mean over seeds of the stage's share
  of the failures (runs without failures, whose shares are NaN, left out); a description.
* rank: for every pair of policies, whether the worlds order them alike (``pair_table``: each world's
  order of the pair from its interval of the failure-rate difference, "=" within failure_rate_abs;
  "agree" when the worlds' per-seed deviation in that difference lies within it or both worlds decide
  the same order, "disagree" when its deviation lies wholly outside it and both decide different
  orders, else "open"). The Kendall tau
  verdict counts agreeing pairs as concordant (2 C / P - 1) against kendall_tau_min, the open pairs
  counted both ways; the order verdict asks every pair of the named policies (rank_policies) to agree. Kendall tau-b of the
  worlds' mean failure rates and each world's order of the named policies (ties within 1e-12 written
  "=") are printed as descriptions.
* noise floor: per run, among routed requests that touched no degraded pod (neither prefill_pod nor
  decode_pod is a pod of the faults table, :func:`analysis.run.metrics.fault_window`), the failure rate;
  without faults every routed request counts. In the simulator it is normally 0; on the testbed such
  failures come from the host, not the fault. noise_explained = clean_failure_share(testbed) -
  clean_failure_share(sim), where clean_failure_share = failed clean requests / all requests: the part
  of the failure-rate difference made of failures that no fault explains.

The prior of a check: core/defaults/priors.yaml's for its metric under the testbed spec's kind of
fault and run size (analysis/rule/priors.py), fixed before the runs. Given a second set of testbed runs
(``--repeat``), the testbed is judged against itself: every check's deviation with the repeat in the
simulator's place, pooled over its policies and seeds, inside the check's tolerance; a check whose
testbed does not repeat itself cannot pass (``repeat_verdict`` in fidelity.csv); the repeat's spread
(analysis.rule.verdict.Spread) is written as a description (fidelity_spread.csv). The paired report (analysis/compare/paired.py): per request, outcome
confusion, per-stage latency errors, where the E2E gap comes from inside and outside the fault window,
MAPE. Comparisons allow 1e-12 of float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from analysis.run.names import Metric as M
from analysis.compare.engine_death import engine_common, engine_table, notice_table
from analysis.checks.calibration import calibration_check
from analysis.checks.host_demand import host_demand_check
from analysis.checks.host_window import host_window_table
from analysis.run.metrics import fault_window, latency_percentiles
from analysis.compare.checks import (REPEAT, WORLDS, Rank, calibration_spreads, check_priors, composition_table,
                                      fidelity_table, noise_table, pair_table, rank_agreement, repeat_checks,
                                      repeat_spreads, repeat_table, seed_mean)
from analysis.compare.paired import PairedReport, concat_frames, paired_from_frames, request_frame
from analysis.compare.repeatability import add_repeatability
from analysis.rule.verdict import FAIL, NO_PRIOR, PASS, UNDECIDED, Interval, Prior, Spread
from analysis.rule.priors import fault_kind
from core.spec.sizes import workload_requests
from analysis.run.data import RunData, load_run
from analysis.run.scalars import run_metrics
from analysis.run.plots import RunCurves, run_curves
from analysis.run.summary import discover_runs, runs_frame
from core.spec.metrics import FidelityTolerances
from core.records import read_meta
from vocab import SIM, TESTBED, Outcome

NAN = math.nan
# What defines a scenario. Engine speeds, link rates and KV parameters may differ: the simulator's side
# is calibrated to the testbed's hardware.
SCENARIO_FIELDS = ("workload", "faults", "deadline_s", "health", "telemetry", "router", "weights")
TOPOLOGY_FIELDS = ("pods", "workers_per_pod", "prefill_fraction", "placement")


# --------------------------------------------------------------------------- same scenario?


class _Absent:
    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def _flatten(value: Any, key: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            _flatten(v, f"{key}.{k}", out)
    elif isinstance(value, (list, tuple)) and value:
        for i, v in enumerate(value):
            _flatten(v, f"{key}.{i}", out)
    else:
        out[key] = value


def scenario_fingerprint(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario-defining parts of a resolved spec (run.json["spec"]) as {dotted field: value}:
    workload, faults, deadline_s, health, telemetry, router, weights, each policy's weights
    (policies.<name>.weights) and topology's pods, workers_per_pod, prefill_fraction, placement."""
    out: dict[str, Any] = {}
    for k in SCENARIO_FIELDS:
        _flatten(spec.get(k), k, out)
    topo = spec.get("topology")
    for k in TOPOLOGY_FIELDS:
        out[f"topology.{k}"] = topo.get(k) if isinstance(topo, Mapping) else None
    for p in spec.get("policies") or []:
        name, weights = (p, None) if isinstance(p, str) else (p.get("name"), p.get("weights"))
        _flatten(weights, f"policies.{name}.weights", out)
    return out


def _policy_of(key: str) -> str | None:
    return key.removeprefix("policies.").partition(".weights")[0] if key.startswith("policies.") else None


def fingerprint_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """The first field (in a's order, then b's) whose values differ, as (field, a's, b's; ABSENT where a
    side lacks it), or None. Weights of a policy listed in only one spec are not compared: one world may
    run a subset of the policies."""
    both = {_policy_of(k) for k in a} & {_policy_of(k) for k in b}
    for key in [*a, *(k for k in b if k not in a)]:
        policy = _policy_of(key)
        if policy is not None and policy not in both:
            continue
        va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
        if va != vb:
            return key, va, vb
    return None


def _spec_of(path: Path, meta: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = meta.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{path / 'run.json'}: spec must be a mapping, got {type(spec).__name__}")
    return spec


def check_same_scenario(sim: Sequence[tuple[Path, Mapping[str, Any]]],
                        testbed: Sequence[tuple[Path, Mapping[str, Any]]]) -> str:
    """Refuse (one-line ValueError) unless every run of ``sim`` is a sim run and every run of ``testbed`` a
    testbed run, all of one scenario name, with one scenario fingerprint; returns the scenario name.
    Each side is a list of (run directory, run.json contents)."""
    sides = {"sim": sim, "testbed": testbed}
    for world, metas in sides.items():
        if not metas:
            raise ValueError(f"compare: no {world} runs given")
        for path, meta in metas:
            if meta.get("world") != world:
                raise ValueError(f"compare: {path} is a {meta.get('world')!r} run, but was given as a {world} run")
    names = {w: sorted({str(m.get("scenario")) for _, m in metas}) for w, metas in sides.items()}
    for world, ns in names.items():
        if len(ns) > 1:
            raise ValueError(f"compare: the {world} runs hold several scenarios ({', '.join(ns)}); "
                             "give one scenario's runs per side")
    if names["sim"] != names["testbed"]:
        raise ValueError(f"compare: the sim runs are scenario {names['sim'][0]!r} and the testbed runs "
                         f"scenario {names['testbed'][0]!r}")
    ref: dict[str, dict[str, Any]] = {}
    for world, metas in sides.items():
        path0, meta0 = metas[0]
        ref[world] = scenario_fingerprint(_spec_of(path0, meta0))
        for path, meta in metas[1:]:
            d = fingerprint_difference(ref[world], scenario_fingerprint(_spec_of(path, meta)))
            if d:
                raise ValueError(f"compare: the {world} runs differ among themselves in {d[0]} "
                                 f"({d[1]!r} vs {d[2]!r}): {path0} and {path}")
    d = fingerprint_difference(ref["sim"], ref["testbed"])
    if d:
        raise ValueError(f"compare: sim and testbed runs differ in {d[0]} ({d[1]!r} vs {d[2]!r})")
    return names["sim"][0]


def check_repeat(testbed: Sequence[tuple[Path, Mapping[str, Any]]],
                 repeat: Sequence[tuple[Path, Mapping[str, Any]]]) -> None:
    """Refuse (one-line ValueError) a repeat set that is empty, holds a run of another world, scenario
    name or scenario fingerprint than the first testbed run, or a run whose policy and seed the testbed
    runs lack (it would repeat nothing). Each side is a list of (run directory, run.json contents)."""
    if not repeat:
        raise ValueError("compare: --repeat names no testbed runs")
    path0, meta0 = testbed[0]
    ref = scenario_fingerprint(_spec_of(path0, meta0))
    held = {(str(m.get("policy")), m.get("seed")) for _, m in testbed}
    for path, meta in repeat:
        if meta.get("world") != TESTBED:
            raise ValueError(f"compare: the repeat {path} is a {meta.get('world')!r} run; a repeat is a testbed run")
        if meta.get("scenario") != meta0.get("scenario"):
            raise ValueError(f"compare: the repeat {path} is scenario {meta.get('scenario')!r}, the testbed runs "
                             f"scenario {meta0.get('scenario')!r}")
        d = fingerprint_difference(ref, scenario_fingerprint(_spec_of(path, meta)))
        if d:
            raise ValueError(f"compare: the repeat {path} differs from the testbed runs in {d[0]} "
                             f"({d[2]!r} vs {d[1]!r})")
        if (str(meta.get("policy")), meta.get("seed")) not in held:
            raise ValueError(f"compare: the repeat {path} is {meta.get('policy')} seed {meta.get('seed')}, which "
                             "the testbed runs do not hold; a repeat runs the testbed's policies and seeds again")


# --------------------------------------------------------------------------- per run


def clean_failures(requests: pd.DataFrame, degraded_pods: Sequence[int]) -> dict[str, float]:
    """Noise floor of one run. A request is *clean* when it was routed (prefill_pod or decode_pod >= 0)
    and neither its prefill_pod nor its decode_pod is a degraded pod; requests never routed went
    nowhere and are not clean. noise_floor = failed clean / clean requests; clean_share = clean / all
    requests; clean_failure_share = failed clean / all requests. NaN where a denominator is 0."""
    pp = requests["prefill_pod"].to_numpy()
    dp = requests["decode_pod"].to_numpy()
    pods = np.asarray(degraded_pods, dtype=np.int64)
    clean = ((pp >= 0) | (dp >= 0)) & ~np.isin(pp, pods) & ~np.isin(dp, pods)
    failed = ~requests["outcome"].eq(Outcome.OK).to_numpy(dtype=bool, na_value=False)
    n, n_clean, n_bad = len(requests), int(clean.sum()), int((clean & failed).sum())
    return {
        M.NOISE_FLOOR: n_bad / n_clean if n_clean else NAN,
        M.CLEAN_SHARE: n_clean / n if n else NAN,
        M.CLEAN_FAILURE_SHARE: n_bad / n if n else NAN,
    }


def run_row(run: RunData) -> dict[str, Any]:
    """:func:`analysis.run.scalars.run_metrics` of a run, plus TTFT/TPOT/E2E p50 and p90 (whatever the spec's
    percentiles) and its :func:`clean_failures`."""
    row = run_metrics(run)
    row.update(latency_percentiles(run.requests, (50, 90)))
    window = fault_window(run.faults, run.requests)
    row.update(clean_failures(run.requests, window.pods if window else ()))
    return row


# --------------------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Fidelity:
    """The comparison of one scenario's sim and testbed runs."""

    scenario: str
    policies: tuple[str, ...]  # in both worlds, in the testbed spec's order
    only_sim: tuple[str, ...]
    only_testbed: tuple[str, ...]
    runs: pd.DataFrame  # one row per run of either world (run_row)
    table: pd.DataFrame  # fidelity_table: fidelity.csv
    composition: pd.DataFrame  # composition_table: fidelity_composition.csv
    noise: pd.DataFrame  # noise_table: fidelity_noise.csv
    rank: Rank  # fidelity_rank.csv
    tolerances: FidelityTolerances
    calibration_noise: dict[str, float]
    paired: PairedReport | None = None  # the testbed against the sim, request by request
    repeat: PairedReport | None = None  # the testbed against its repeat (None without one)
    repeatability: pd.DataFrame | None = None  # repeat_table: fidelity_repeatability.csv
    priors: dict[str, Prior] | None = None  # each check's prior (module docstring)
    prior_source: str = ""  # which priors, in words
    repeats: dict[str, tuple[str, Interval]] | None = None  # the testbed against its repeat, judged per check
    calibrations: int = 0  # the calibrations the simulator ran under, its own among them (0: one, no spread)
    calibration_spreads: dict[str, Spread] | None = None  # the simulator's spread over them, per check
    own_spreads: dict[str, Spread] | None = None  # the repeat's alone: fidelity_spread.csv
    engines: pd.DataFrame | None = None  # analysis.compare.engine_death.engine_table: fidelity_engines.csv
    notices: pd.DataFrame | None = None  # analysis.compare.engine_death.notice_table: fidelity_notices.csv
    # analysis.checks.calibration: each fit against the quiet requests; calibration_check.csv
    calibration_check: pd.DataFrame | None = None
    # analysis.checks.host_demand: the host's demand by state in the runs against the calibration's; host_demand.csv
    host_demand: pd.DataFrame | None = None
    # analysis.checks.host_window: the testbed's host inside and outside the fault window; host_window.csv
    host_window: pd.DataFrame | None = None
    out_dir: Path | None = None
    files: tuple[Path, ...] = ()

    def verdicts(self) -> list[tuple[str, str, str]]:
        """Every check as (policy or "all", metric, verdict): the per-policy checks, the rank's, and the
        engine-death comparison's where the runs had an engine fault."""
        out = [(r.policy, r.metric, r.verdict) for r in self.table.itertuples()]
        if self.engines is not None:
            out += [(r.policy, f"engine {r.metric}", r.verdict) for r in self.engines.itertuples()]
        out.append(("all", "kendall_tau", self.rank.tau_verdict))
        out.append(("all", "rank_order", self.rank.order_verdict))
        return out

    def counts(self) -> dict[str, int]:
        v = [x[2] for x in self.verdicts()]
        return {k: v.count(k) for k in (PASS, FAIL, UNDECIDED)}


class Measured(NamedTuple):
    """What :func:`measure` found: the comparison, and what its figures are drawn from (each run's
    curves, each world's requests)."""

    fidelity: Fidelity
    curves: list[RunCurves]
    frames: dict[str, pd.DataFrame]


def prior_source(kind: str, requests: float) -> str:
    """Which priors the checks' intervals pool with, in words."""
    size = "" if math.isnan(requests) else f", {requests:.0f} requests a run"
    return f"core/defaults/priors.yaml for a {kind.replace('_', ' ')} fault{size}" if kind != "none" else \
        f"core/defaults/priors.yaml without a fault{size}"


def calibration_noise(calibration: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric entries under calibration["noise"] (the JSON `testbed calibrate` writes; any other
    content is ignored)."""
    noise = (calibration or {}).get("noise")
    if not isinstance(noise, Mapping):
        return {}
    return {str(k): float(v) for k, v in noise.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _policy_names(spec: Mapping[str, Any]) -> list[str]:
    return [p if isinstance(p, str) else str(p.get("name")) for p in spec.get("policies") or []]


def _read_runs(dirs: Mapping[str, list[Path]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                       dict[str, list[pd.DataFrame]], list[RunCurves],
                                                       FidelityTolerances]:
    """Every run of every world read once, one in memory at a time (sim runs can hold millions of
    requests): (the runs' rows, the repeat's rows, each world's request frames, the curves, the
    testbed spec's tolerances)."""
    rows: list[dict[str, Any]] = []
    repeat_rows: list[dict[str, Any]] = []
    frames: dict[str, list[pd.DataFrame]] = {w: [] for w in dirs}
    curves: list[RunCurves] = []
    tol: FidelityTolerances | None = None
    for world, ds in dirs.items():
        for d in ds:
            run = load_run(d)
            frames[world].append(request_frame(run))
            if world == REPEAT:
                repeat_rows.append({**run_row(run), "world": REPEAT})
                continue
            rows.append(run_row(run))
            curves.append(run_curves(run))
            if tol is None and run.world == TESTBED:
                tol = run.spec.fidelity
    # (FidelityTolerances() is not reached: check_same_scenario refuses an empty testbed side)
    return rows, repeat_rows, frames, curves, tol or FidelityTolerances()


def _common_policies(have: Mapping[str, set[str]], testbed_spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The policies both worlds ran, in the testbed spec's order (others after, sorted); refused if none."""
    spec_order = _policy_names(testbed_spec)
    ordered = [p for p in spec_order if p in have["testbed"]] + sorted(have["testbed"] - set(spec_order))
    policies = tuple(p for p in ordered if p in have["sim"])
    if not policies:
        raise ValueError(f"compare: no policy in common: sim has {', '.join(sorted(have['sim']))}; "
                         f"testbed has {', '.join(sorted(have['testbed']))}")
    return policies


def measure(sim_paths: Iterable[Path | str], testbed_paths: Iterable[Path | str],
            calibration: Mapping[str, Any] | None = None, repeat_paths: Iterable[Path | str] | None = None,
            calibration_sims: Sequence[Iterable[Path | str]] = ()) -> Measured:
    """Compare the sim runs in or below ``sim_paths`` with the testbed runs in or below ``testbed_paths``
    (same scenario; refused otherwise, see :func:`check_same_scenario`), and, given ``repeat_paths``, the
    testbed runs with a second set of testbed runs of the same scenario, policies and seeds (refused
    otherwise, see :func:`check_repeat`): the verdicts and every table, nothing written or printed
    (analysis/compare/console.py ``compare`` does both). ``calibration_sims`` holds, per further
    calibration, the sim runs of the same policies and seeds under it: with them every check's interval
    carries the simulator's spread over calibrations (``sim_paths``' among them;
    :func:`analysis.compare.checks.calibration_spreads`); given ``calibration``, each fit is checked
    against the testbed runs' own quiet requests, the host's demand too."""
    sim_paths, testbed_paths = list(sim_paths), list(testbed_paths)
    repeat_paths = list(repeat_paths) if repeat_paths is not None else []
    dirs = {"sim": discover_runs(sim_paths), "testbed": discover_runs(testbed_paths)}
    if repeat_paths:
        dirs[REPEAT] = discover_runs(repeat_paths)
    metas = {w: [(d, read_meta(d)) for d in ds] for w, ds in dirs.items()}
    scenario = check_same_scenario(metas["sim"], metas["testbed"])
    if repeat_paths:
        check_repeat(metas["testbed"], metas[REPEAT])

    rows, repeat_rows, frames, curves, tol = _read_runs(dirs)
    runs = runs_frame(rows)
    have = {w: set(runs.loc[runs["world"] == w, "policy"]) for w in WORLDS}
    policies = _common_policies(have, _spec_of(*metas["testbed"][0]))
    means = {w: {p: seed_mean(runs, w, p, M.FAILURE_RATE)[0] for p in policies} for w in WORLDS}
    tb_frame = concat_frames(frames["testbed"])
    paired = paired_from_frames(tb_frame, concat_frames(frames["sim"]), "sim", policies)
    tb_spec = _spec_of(*metas["testbed"][0])
    kind, requests = fault_kind(tb_spec.get("faults") or []), workload_requests(tb_spec.get("workload") or {})
    requests = math.nan if requests is None else requests
    priors = check_priors(tol, kind, requests)
    repeat, rep_table, own, repeats = None, None, {}, None
    repeat_runs = runs_frame(repeat_rows) if repeat_rows else None
    if repeat_rows:
        repeat = paired_from_frames(tb_frame, concat_frames(frames[REPEAT]), REPEAT, policies)
        own = repeat_spreads(runs, repeat_runs, policies, tol, repeat.agreement_seeds)
        repeats = repeat_checks(runs, repeat_runs, policies, tol, repeat.agreement_seeds, priors)
        rep_table = repeat_table(runs, repeat_runs, policies, tol, {p: repeat.agreement_of(p) for p in policies},
                                 repeat.agreement_seeds)
    calibrated, common = _calibrated(runs, tb_frame, calibration_sims, metas["testbed"], policies, tol,
                                     paired.agreement_seeds)
    table = fidelity_table(runs, policies, tol, {p: paired.agreement_of(p) for p in policies},
                           agreement_by_seed=paired.agreement_seeds, priors=priors, common=common,
                           calibrated=calibrated, repeats=repeats)
    pairs = pair_table(runs, policies, tol.failure_rate_abs, priors.get(M.FAILURE_RATE, NO_PRIOR))
    engines = engine_table(runs, repeat_runs, policies, tol, kind, requests, engine_common(calibrated, policies))
    fid = Fidelity(
        scenario=scenario,
        policies=policies,
        only_sim=tuple(sorted(have["sim"] - set(policies))),
        only_testbed=tuple(sorted(have["testbed"] - set(policies))),
        runs=runs,
        table=add_repeatability(table, rep_table),
        composition=composition_table(runs, policies),
        noise=noise_table(runs, policies),
        rank=rank_agreement(means["sim"], means["testbed"], tol, pairs),
        tolerances=tol,
        calibration_noise=calibration_noise(calibration),
        paired=paired,
        repeat=repeat,
        repeatability=rep_table,
        priors=priors,
        prior_source=prior_source(kind, requests),
        repeats=repeats,
        calibrations=len(calibrated),
        calibration_spreads=common,
        own_spreads=own,
        engines=engines,
        notices=notice_table([*dirs["testbed"], *dirs.get(REPEAT, [])]) if engines is not None else None,
    )
    check = demand = None
    if calibration is not None:  # each fit against the run's own quiet requests, the host's too
        check = calibration_check(dirs["testbed"], calibration)
        demand = host_demand_check(dirs["testbed"], _calibrated_demand(calibration))
    busy = host_window_table(dirs["testbed"])  # the fault window's share of the host (no calibration needed)
    fid = replace(fid, calibration_check=check, host_demand=demand, host_window=busy)
    return Measured(fid, curves, {w: concat_frames(fs) for w, fs in frames.items() if fs})


def _calibrated(runs: pd.DataFrame, tb_frame: pd.DataFrame, calibration_sims: Sequence[Iterable[Path | str]],
                testbed_metas: Sequence[tuple[Path, Mapping[str, Any]]], policies: Sequence[str],
                tol: FidelityTolerances, agreement: pd.DataFrame) -> tuple[list[pd.DataFrame], dict[str, Spread]]:
    """The sim's runs frame under each calibration (``runs``' own first, then one per set of
    ``calibration_sims``, each refused unless it is sim runs of the testbed's scenario holding the
    same policies and seeds) and the simulator's spread over them per check; ([], {}) without any."""
    if not calibration_sims:
        return [], {}
    own = runs[runs["world"] == SIM]
    held = set(zip(own["policy"], own["seed"]))
    frames, agreements = [own], [agreement]
    for paths in calibration_sims:
        paths = list(paths)
        metas = [(d, read_meta(d)) for d in discover_runs(paths)]
        check_same_scenario(metas, testbed_metas)
        loaded = [load_run(d) for d, _ in metas]
        theirs = runs_frame([run_row(r) for r in loaded])
        if set(zip(theirs["policy"], theirs["seed"])) != held:
            raise ValueError(f"compare: the sim runs in {', '.join(map(str, paths))} are not the same policies and "
                             "seeds as the simulator's first set; each calibration runs them all")
        frames.append(theirs)
        agreements.append(paired_from_frames(tb_frame, concat_frames([request_frame(r) for r in loaded]), "sim",
                                             policies).agreement_seeds)
    return frames, calibration_spreads(runs, frames, policies, tol, agreements)


def _calibrated_demand(calibration: Mapping[str, Any]) -> dict[str, float]:
    """The calibration's demand by state (HostCalibration.demand); empty where it has none."""
    return dict((calibration.get("host") or {}).get("demand") or {})
