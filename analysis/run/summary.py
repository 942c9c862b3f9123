"""Many runs -> per-run metrics table, per-policy summary over seeds, sim-vs-real comparison."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.run.names import RUN_IDENTITY, Metric as M, latency
from analysis.run.metrics import ORACLE, gap_to_oracle
from analysis.run.scalars import run_metrics

GROUP = ["scenario", "world", "policy"]
# Per-run columns that identify or describe a run rather than measure it.
NON_METRICS = set(RUN_IDENTITY)
# Metrics that get a gap_<metric> column when OracleAvoidance runs are present.
GAP_METRICS = (
    M.FAILURE_RATE,
    M.TIMEOUT_SHARE,
    M.DEGRADED_AVAILABILITY,
    M.RESILIENCE_INDEX,
    M.GOODPUT_RPS,
    latency("ttft", 99),
)
# What compare_worlds compares unless told otherwise.
COMPARE_METRICS = (
    M.FAILURE_RATE,
    M.TIMEOUT_SHARE,
    M.DEGRADED_AVAILABILITY,
    M.RESILIENCE_INDEX,
    M.TRAFFIC_DEFLECTION_RATIO,
    latency("ttft", 50),
    latency("ttft", 99),
    M.GOODPUT_RPS,
)


class RunDiscoveryError(ValueError):
    """A path given as a run (or a folder of runs) is neither."""


def discover_runs(paths: Iterable[Path | str]) -> list[Path]:
    """Run directories named by ``paths``: a path holding run.json is a run; any other directory is searched
    recursively for run.json files. Duplicates are dropped; order is the order given, then sorted within a
    searched folder. A path that does not exist or holds no run raises a one-line RunDiscoveryError."""
    found: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if (p / "run.json").is_file():
            runs = [p]
        elif p.is_dir():
            runs = sorted(f.parent for f in p.rglob("run.json") if f.is_file())
            if not runs:
                raise RunDiscoveryError(f"{p}: no run directory (run.json) in or below it")
        elif p.exists():
            raise RunDiscoveryError(f"{p}: not a run directory (a file, and no run.json beside it)")
        else:
            raise RunDiscoveryError(f"{p}: no such file or directory")
        for r in runs:
            key = r.resolve()
            if key not in seen:
                seen.add(key)
                found.append(r)
    return found


def collect_runs(paths: Iterable[Path | str]) -> pd.DataFrame:
    """One row of :func:`analysis.run.scalars.run_metrics` per run found below ``paths``."""
    return runs_frame([run_metrics(r) for r in discover_runs(paths)])


def runs_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """Per-run metric dicts -> DataFrame sorted by world, scenario, policy, seed; two runs with the same
    world, scenario, policy and seed raise a one-line ValueError (a seed must count once)."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    key = ["world", "scenario", "policy", "seed"]
    dup = df.duplicated(key, keep=False)
    if dup.any():
        d = df.loc[dup]
        first = d.iloc[0]
        same = d.loc[(d[key] == first[key]).all(axis=1), "run_dir"].tolist()
        raise ValueError(
            f"duplicate run for world={first['world']} scenario={first['scenario']} policy={first['policy']} "
            f"seed={first['seed']}: {' and '.join(same)}"
        )
    return df.sort_values(key, kind="stable").reset_index(drop=True)


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width, n) of the non-NaN values: half-width = t_{(1+confidence)/2, n-1} * s / sqrt(n),
    s the sample standard deviation (ddof=1), Student t from scipy.stats.t; NaN half-width with n < 2."""
    x = np.asarray(list(values), dtype=float)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, n
    half = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, half, n


def metric_columns(runs: pd.DataFrame) -> list[str]:
    """The numeric, per-run measured columns of a runs table (in table order)."""
    return [c for c in runs.columns if c not in NON_METRICS and pd.api.types.is_numeric_dtype(runs[c])]


def with_gaps(runs: pd.DataFrame, oracle: str = ORACLE) -> pd.DataFrame:
    """Add gap_<metric> columns (see :func:`analysis.run.metrics.gap_to_oracle`) for GAP_METRICS when the table
    holds runs of the oracle policy and no gap columns yet; otherwise return it unchanged."""
    if runs.empty or not (runs["policy"] == oracle).any() or any(c.startswith("gap_") for c in runs.columns):
        return runs
    return gap_to_oracle(runs, [m for m in GAP_METRICS if m in runs.columns], oracle)


def summarize(runs: pd.DataFrame, confidence: float = 0.95, oracle: str = ORACLE) -> pd.DataFrame:
    """Per (scenario, world, policy): n_runs, the seeds, the statuses, the commits that
    wrote the runs (``commits``), and for every metric column m:
    m_mean and m_ci (the confidence-interval half-width over seeds, see :func:`mean_ci`). Gap-to-oracle
    columns are added first when oracle runs are present, so gap_<m>_mean/_ci are paired over seeds."""
    if runs.empty:
        return pd.DataFrame(columns=[*GROUP, "n_runs"])
    runs = with_gaps(runs, oracle)
    cols = metric_columns(runs)
    rows = []
    for key, g in runs.groupby(GROUP, sort=True, dropna=False):
        row: dict = dict(zip(GROUP, key))
        row["n_runs"] = len(g)
        row["seeds"] = ",".join(str(s) for s in sorted(g["seed"]))
        row["statuses"] = ",".join(sorted(set(g["status"].astype(str))))
        if "commit" in g:
            row["commits"] = ",".join(sorted(set(g["commit"].fillna("unknown").astype(str))))
        for c in cols:
            m, h, _ = mean_ci(g[c].to_numpy(dtype=float), confidence)
            row[f"{c}_mean"] = m
            row[f"{c}_ci"] = h
        rows.append(row)
    return pd.DataFrame(rows)


def compare_worlds(
    sim_runs: pd.DataFrame | Iterable[Path | str],
    real_runs: pd.DataFrame | Iterable[Path | str],
    tolerance: float | Mapping[str, float],
    metrics: Sequence[str] = COMPARE_METRICS,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Per (scenario, policy) present in both sets and per metric: sim mean / CI half-width / n, testbed
    mean / CI half-width / n, diff = testbed mean - sim mean, and agree = the two confidence intervals
    overlap (|diff| <= sim_ci + real_ci, a missing half-width counting as 0) or |diff| <= tolerance
    (a number, or a per-metric mapping; metrics missing from it get 0). agree is <NA> where a mean is NaN.
    Each side is a runs table (:func:`collect_runs`) or paths to discover runs in."""
    sim = sim_runs if isinstance(sim_runs, pd.DataFrame) else collect_runs(sim_runs)
    real = real_runs if isinstance(real_runs, pd.DataFrame) else collect_runs(real_runs)
    key = ["scenario", "policy"]
    rows = []
    if sim.empty or real.empty:
        return pd.DataFrame(rows)
    real_groups = {k: g for k, g in real.groupby(key, sort=False)}
    for k, gs in sim.groupby(key, sort=True):
        gr = real_groups.get(k)
        if gr is None:
            continue
        for m in metrics:
            if m not in gs.columns or m not in gr.columns:
                continue
            sm, sh, sn = mean_ci(gs[m].to_numpy(dtype=float), confidence)
            rm, rh, rn = mean_ci(gr[m].to_numpy(dtype=float), confidence)
            tol = tolerance.get(m, 0.0) if isinstance(tolerance, Mapping) else float(tolerance)
            diff = rm - sm
            if math.isnan(diff):
                agree = pd.NA
            else:
                overlap = abs(diff) <= np.nan_to_num(sh) + np.nan_to_num(rh)
                agree = bool(overlap or abs(diff) <= tol)
            rows.append(
                {
                    "scenario": k[0],
                    "policy": k[1],
                    "metric": m,
                    "sim_mean": sm,
                    "sim_ci": sh,
                    "sim_n": sn,
                    "real_mean": rm,
                    "real_ci": rh,
                    "real_n": rn,
                    "diff": diff,
                    "tolerance": tol,
                    "agree": agree,
                }
            )
    out = pd.DataFrame(rows)
    if not out.empty:
        out["agree"] = out["agree"].astype("boolean")
    return out
