"""Engine death in both worlds: does the simulator's engine fault (faults.spec.EngineFault) end the
same requests the same way, and stop the router choosing the dead engine as soon, as the testbed's?

Per policy, for the quantities an engine death decides (:data:`ROWS`): engine_down_s (kill to the
router's down record), engine_up_s (a restart to the router's up record), the failure rate, and the
failure composition by stage. Each is the mean over the seeds of the sim's, the testbed's and, with a
repeat (``testbed compare --repeat``), the repeat's runs, and is judged by the rule of
analysis/rule/verdict.py on the per-seed deviation testbed - sim: "pass" when its interval lies inside the
margin of :func:`margins` (the spec's ``metrics.fidelity``), "fail" when wholly outside, "undecided"
otherwise (one seed always). The seeds' variance is pooled with a prior fixed before the runs: for
engine_down_s the fitted notice's standard deviation times the share of the averaged deaths that
were a core's, with the fit's degrees of freedom; for the failure rate and the composition's shares
core/defaults/priors.yaml's under an engine fault (none shipped for a share or engine_up_s: their
seeds must vary to decide). With a repeat, the testbed is judged against itself per quantity
(analysis.rule.verdict.repeat_verdict): a quantity it does not repeat within the margin cannot pass. Where
the simulator ran the same seeds under several calibrations (``testbed compare --calibration-sims``),
the spread of its mean over them is the calibration's error every seed shares (:func:`engine_common`)
and widens each interval as it does the twin's checks ("Common spread" in analysis/rule/verdict.py). The
table exists where a run of either world had an engine fault's kill.

The dead core's notice (``engine.core_death_notice_s``, the simulator's one value) is a parameter
fitted on named runs (core/defaults/fits.yaml, core/calibration/frozen.py) and frozen. :func:`notice_table` judges
the notices of the runs compared, none of them in the fit, against its prediction interval: inside
passes, outside fails, a fail to explain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.run.names import Metric as M, fail_share
from analysis.run.data import RunData, load_run
from analysis.run.summary import mean_ci
from analysis.rule.verdict import (CONFIDENCE, FAIL, NO_PRIOR, NO_SPREAD, PASS, RULE_VERSION, UNDECIDED, Prior, Spread,
                              inside, interval, prediction_interval, repeat_verdict, seeds_for_power, shipped_prior)
from analysis.rule.priors import ENGINE
from core.calibration.frozen import fit
from core.spec.metrics import FidelityTolerances
from core.stages import FAILURE_STAGES
from vocab import DECODE, ERROR, FAULT_ENGINE, FAULT_LINK, KV_TRANSFER, OK, PREFILL, ROLE_DECODE, ROLE_PREFILL, TESTBED

ROWS: tuple[str, ...] = (M.ENGINE_DOWN_S, M.ENGINE_UP_S, M.FAILURE_RATE, *(fail_share(s) for s in FAILURE_STAGES))
FILE = "fidelity_engines.csv"
NOTICE_FILE = "fidelity_notices.csv"
NOTICE = "core_death_notice_s"  # the fit's name in core/defaults/fits.yaml
# The stage a call on a killed core was in, by the engine's role: the fit's samples are the kills of
# a core whose call failed in prefill (a prefill engine) or decode (a decode engine).
CALL_STAGE = {ROLE_PREFILL: PREFILL, ROLE_DECODE: DECODE}


def margins(tol: FidelityTolerances) -> dict[str, float]:
    """The margin each row of :data:`ROWS` is judged against: the engine lags engine_lag_abs_s, the
    failure rate failure_rate_abs, the composition's shares composition_abs."""
    return {M.ENGINE_DOWN_S: tol.engine_lag_abs_s, M.ENGINE_UP_S: tol.engine_lag_abs_s,
            M.FAILURE_RATE: tol.failure_rate_abs,
            **{fail_share(s): tol.composition_abs for s in FAILURE_STAGES}}


def _values(runs: pd.DataFrame, world: str, policy: str, metric: str) -> pd.Series:
    if runs is None or metric not in runs.columns:
        return pd.Series(dtype=float)
    sel = runs.loc[(runs["world"] == world) & (runs["policy"] == policy)]
    return sel.set_index("seed")[metric].astype(float).dropna()


def _mean(values: pd.Series) -> float:
    return mean_ci(values.to_numpy(dtype=float))[0]


def notice_prior(core_share: float) -> Prior:
    """The fitted notice's spread in engine_down_s as a prior: its samples' standard deviation times
    the share of the averaged deaths that were a core's, with the fit's degrees of freedom; none where
    unknown."""
    if math.isnan(core_share) or core_share <= 0:
        return NO_PRIOR
    f = fit(NOTICE)
    return Prior(float(np.std(f.samples, ddof=1)) * core_share, len(f.samples) - 1, f"fit {NOTICE}")


def engine_common(calibrated: Sequence[pd.DataFrame], policies: Sequence[str]) -> dict[str, Spread]:
    """Per quantity of :data:`ROWS`, the simulator's spread over calibrations: ``calibrated`` holds
    one runs frame of sim runs per calibration (the same policies and seeds); per policy the variance
    over calibrations of the mean over seeds, pooled as the mean over policies, df k - 1 (as the
    twin's analysis.compare.checks.calibration_spreads). Empty with fewer than two calibrations."""
    if len(calibrated) < 2:
        return {}
    out = {}
    for metric in ROWS:
        variances = []
        for policy in policies:
            means = [m for m in (_mean(_values(r, "sim", policy, metric)) for r in calibrated) if not math.isnan(m)]
            if len(means) >= 2:
                variances.append(float(np.var(means, ddof=1)))
        if variances:
            out[metric] = Spread(math.sqrt(sum(variances) / len(variances)), len(calibrated) - 1)
    return out


def engine_table(runs: pd.DataFrame, repeat_runs: pd.DataFrame | None, policies: Sequence[str],
                 tol: FidelityTolerances | None = None, kind: str = ENGINE,
                 requests: float = math.nan, common: Mapping[str, Spread] | None = None) -> pd.DataFrame | None:
    """One row per policy and quantity of :data:`ROWS` (module docstring): sim, testbed and repeat
    means, diff = testbed - sim, repeatability = testbed - repeat over the repeated seeds, the
    deviation's interval (dev_low, dev_high, n_seeds), its prior (prior_sigma, prior_df), the margin,
    the verdict, why it decides nothing where it does not, the repeat's verdict and the seeds at which
    it would decide with 80% probability; ``common``: the calibration's spread per quantity
    (:func:`engine_common`), in the interval and the seeds needed. None where no run has an engine
    killed by a fault (engine_down_s NaN in every run)."""
    if M.ENGINE_DOWN_S not in runs.columns or runs[M.ENGINE_DOWN_S].isna().all():
        return None
    tol = tol or FidelityTolerances()
    margin = margins(tol)
    both = pd.concat([runs[runs["world"] == TESTBED], repeat_runs], ignore_index=True) \
        if repeat_runs is not None else None
    shares = {p: max((x for x in (_mean(_values(runs, w, p, M.ENGINE_CORE_SHARE)) for w in ("sim", "testbed"))
                      if not math.isnan(x)), default=math.nan) for p in policies}

    def prior_of(metric: str, share: float) -> Prior:
        return notice_prior(share) if metric == M.ENGINE_DOWN_S else shipped_prior(metric, kind, requests)

    repeated: dict[str, str] = {}  # the testbed against its repeat, per quantity, pooled over policies
    if both is not None:
        widest = max((x for x in shares.values() if not math.isnan(x)), default=math.nan)
        for metric in ROWS:
            d = pd.concat([(_values(both, "testbed", p, metric) - _values(both, "repeat", p, metric)).dropna()
                           for p in policies])
            prior = prior_of(metric, widest)
            repeated[metric] = repeat_verdict(d.to_numpy(), margin[metric], prior.times(2) if prior.known else prior)[0]
    rows = []
    for policy in policies:
        for metric in ROWS:
            sim, tb = _values(runs, "sim", policy, metric), _values(runs, "testbed", policy, metric)
            rep = _values(repeat_runs, "repeat", policy, metric) if repeat_runs is not None else pd.Series(dtype=float)
            prior = prior_of(metric, shares[policy])
            seeds = tb.index.intersection(sim.index)
            shared = (common or {}).get(metric, NO_SPREAD)
            iv = interval((tb[seeds] - sim[seeds]).to_numpy(), prior, shared)
            again = tb.index.intersection(rep.index)
            verdict, why = inside(iv, -margin[metric], margin[metric]), iv.why_not
            if verdict == PASS and repeated.get(metric, PASS) != PASS:
                verdict, why = UNDECIDED, "the testbed does not repeat itself within the margin"
            needed = seeds_for_power(iv.sd, -margin[metric], margin[metric], iv.mean, prior, shared, either=True) \
                if iv.n and not math.isnan(iv.sd) else None
            rows.append({"policy": policy, "metric": metric, "sim": _mean(sim), "testbed": _mean(tb),
                         "repeat": _mean(rep), "diff": _mean(tb) - _mean(sim),
                         "repeatability": _mean(tb[again] - rep[again]) if len(again) else math.nan,
                         "deviation": iv.mean, "dev_low": iv.low, "dev_high": iv.high, "n_seeds": iv.n,
                         "prior_sigma": prior.sigma, "prior_df": prior.df, "cal_sigma": shared.sigma,
                         "margin": margin[metric],
                         "verdict": verdict, "why": why, "repeat_verdict": repeated.get(metric, "not run"),
                         "seeds_needed": math.nan if needed is None else needed, "rule": RULE_VERSION})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- the fitted notice, judged


def core_death_notices(run: RunData) -> list[float]:
    """The notices of one run: for each engine core a fault killed (a ``faults`` apply row of kind
    engine whose target ends in ``/core``) while a call was on it (a request routed before the kill
    that ended ``error`` in the stage of :data:`CALL_STAGE` for the engine's role, on its pod, and had
    not ended before the kill: a failed request keeps no ``end_s``, docs/records.md), the time from the
    kill to the router's first down record of that pod and role after it."""
    faults, engines, req = run.faults, run.engines, run.requests
    if faults.empty or engines.empty or req.empty:
        return []
    kills = faults[(faults["kind"] == FAULT_ENGINE) & (faults["event"] == "apply")
                   & faults["target"].astype(str).str.endswith("/core")]
    out = []
    for k in kills.itertuples():
        for role, stage in CALL_STAGE.items():
            if f"-{role}/" not in str(k.target):
                continue
            pod_col = "prefill_pod" if role == ROLE_PREFILL else "decode_pod"
            on_it = req[(req[pod_col] == k.pod) & (req["routed_s"] < k.time_s) & (~(req["end_s"] < k.time_s))
                        & (req["outcome"] == ERROR) & (req["failed_stage"] == stage)]
            down = engines[(engines["pod"] == k.pod) & (engines["role"] == role) & (engines["state"] == "down")
                           & (engines["time_s"] >= k.time_s)]
            if len(on_it) and len(down):
                out.append(float(down["time_s"].min()) - float(k.time_s))
    return out


def notice_table(run_dirs: Iterable[Path | str]) -> pd.DataFrame | None:
    """Each dead core's notice in the given testbed runs against the fitted notice's prediction
    interval at the rule's level (analysis.rule.verdict.prediction_interval of core/defaults/fits.yaml's
    samples): run_dir, notice_s, low, high, coverage, verdict (pass inside, fail outside; undecided
    where the fit has too few samples for the rule's level). None where the runs hold none."""
    f = fit(NOTICE)
    low, high, coverage = prediction_interval(f.samples)
    rows = []
    for d in run_dirs:
        run = load_run(d)
        for x in core_death_notices(run):
            rows.append({"run_dir": str(d), "notice_s": x, "fitted_median_s": f.value, "low": low, "high": high,
                         "coverage": coverage, "rule": RULE_VERSION,
                         "verdict": UNDECIDED if coverage < CONFIDENCE else PASS if low <= x <= high else FAIL})
    return pd.DataFrame(rows) if rows else None


# --------------------------------------------------------------------------- the fitted heal disconnect, judged

HEAL = "kv_heal_disconnect_s"  # the fit's name in core/defaults/fits.yaml
HEAL_FILE = "heal_disconnect.csv"


def heal_brackets(run: RunData) -> list[dict[str, Any]]:
    """Per link down that healed in one run (a link fault applied at severity 0 and cleared): the KV
    pulls across the pod's link (its prefill or decode pod the fault's) started after the heal, those
    that failed (``error`` in kv_transfer) and those that ended ok. The simulator's model
    (``engine.kv_heal_disconnect_s`` = d) fails every pull started within d of the heal and lets
    every later one through, so the run brackets d: after the last failed start, up to the first ok
    start (times from the heal)."""
    faults, req = run.faults, run.requests
    if faults.empty or req.empty or "kv_start_s" not in req.columns:
        return []
    out = []
    downs = faults[(faults["kind"] == FAULT_LINK) & (faults["event"] == "apply") & (faults["severity"] == 0)]
    # one row per target the fault shaped (a pod's egress and ingress): one link down per fault and pod
    for f in downs.drop_duplicates(["fault_id", "pod"]).itertuples():
        clears = faults[(faults["fault_id"] == f.fault_id) & (faults["event"] == "clear")]
        if clears.empty:
            continue
        heal = float(clears["time_s"].min())
        across = req[((req["prefill_pod"] == f.pod) | (req["decode_pod"] == f.pod)) & (req["kv_start_s"] >= heal)]
        failed = across[(across["outcome"] == ERROR) & (across["failed_stage"] == KV_TRANSFER)]
        ok = across[across["outcome"] == OK]
        out.append({"pod": int(f.pod), "heal_s": heal, "failed_starts_s": (failed["kv_start_s"] - heal).tolist(),
                    "ok_starts_s": (ok["kv_start_s"] - heal).tolist()})
    return out


def heal_table(run_dirs: Iterable[Path | str]) -> pd.DataFrame | None:
    """Each healed link down of the given testbed runs against the fitted disconnect d
    (core/defaults/fits.yaml ``kv_heal_disconnect_s``, fitted on the runs it names, none of these):
    run_dir, pod, heal_s, the bracket the run gives (low: the last failed start after the
    heal, 0 without; high: the first ok start, inf without), the pulls the model with d would end
    otherwise (``mispredicted``), and the verdict: pass where none is, fail where one is, undecided
    where no pull started after the heal. None where the runs hold no healed link down."""
    d = fit(HEAL).value
    rows = []
    for run_dir in run_dirs:
        for b in heal_brackets(load_run(run_dir)):
            failed, ok = b["failed_starts_s"], b["ok_starts_s"]
            wrong = sum(x > d for x in failed) + sum(x < d for x in ok)
            verdict = UNDECIDED if not (failed or ok) else FAIL if wrong else PASS
            rows.append({"run_dir": str(run_dir), "pod": b["pod"], "heal_s": b["heal_s"],
                         "low_s": max(failed, default=0.0), "high_s": min(ok, default=math.inf), "fitted_s": d,
                         "pulls": len(failed) + len(ok), "mispredicted": wrong, "verdict": verdict,
                         "rule": RULE_VERSION})
    return pd.DataFrame(rows) if rows else None


# --------------------------------------------------------------------------- output


def write_engine_table(table: pd.DataFrame, scenario: str, out_dir: Path, notices: pd.DataFrame | None = None) -> list[Path]:
    paths = []
    for df, name in ((table, FILE), (notices, NOTICE_FILE)):
        if df is None:
            continue
        df = df.copy()
        df.insert(0, "scenario", scenario)
        df.to_csv(Path(out_dir) / name, index=False)
        paths.append(Path(out_dir) / name)
    return paths


def _fmt(v: float) -> str:
    return "–" if isinstance(v, float) and math.isnan(v) else f"{v:.3g}"


def print_engine_table(table: pd.DataFrame, console: Console, notices: pd.DataFrame | None = None) -> None:
    t = Table(title="engine death: sim vs testbed (deviation = testbed - sim per seed, 90% CI, the seeds pooled "
                    f"with their prior; rule {RULE_VERSION})")
    for col in ("policy", "metric", "sim", "testbed", "repeat", "deviation [CI]", "margin", "verdict"):
        t.add_column(col)
    colour = {"pass": "green", "fail": "red", "undecided": "yellow"}
    for r in table.itertuples():
        seeds = "" if r.verdict != "undecided" else " (over 100 seeds)" if math.isnan(r.seeds_needed) \
            else f" ({r.seeds_needed:.0f} seeds)"
        t.add_row(r.policy, r.metric, *(_fmt(v) for v in (r.sim, r.testbed, r.repeat)),
                  f"{_fmt(r.deviation)} [{_fmt(r.dev_low)}, {_fmt(r.dev_high)}]", f"±{_fmt(r.margin)}",
                  f"[{colour[r.verdict]}]{r.verdict}[/]{seeds}")
    console.print(t)
    if notices is not None:
        n = notices.iloc[0]
        listed = ", ".join(f"{x:.3f} ({v})" for x, v in zip(notices["notice_s"], notices["verdict"]))
        console.print(f"dead core's notice: fitted {n['fitted_median_s']:.3f} s on named runs "
                      f"(core/defaults/fits.yaml), {100 * n['coverage']:.0f}% prediction interval "
                      f"[{n['low']:.3f}, {n['high']:.3f}]; these testbed runs: {listed}")
