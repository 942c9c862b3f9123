"""The statistics of the paired report (analysis/compare/paired.py): per-request relative errors, their
quantiles with a bootstrap interval, and the summary statistics of a latency sample.

Percentiles are numpy's linear interpolation, as everywhere in analysis/run/metrics.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

NAN = math.nan
CONFIDENCE = 0.95
# scipy.stats.bootstrap's own default number of resamples.
N_RESAMPLES = 9999
# The percentile method, not scipy's default BCa: BCa's acceleration comes from the jackknife, which
# is inconsistent for a quantile such as the median (Efron & Tibshirani, An Introduction to the
# Bootstrap, 1993, section 11.6), and it is undefined when every value is equal.
METHOD = "percentile"
SEED = 0  # a fixed seed: the same runs give the same intervals
QUANTILES = (50, 90)  # of the per-request errors: the median and the tail
SUMMARY_STATS = ("mean", "p50", "p90", "p99")  # of a latency sample (the MAPE's statistics)


def rel_errors(testbed: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per-request relative error (other - testbed) / testbed, relative to the testbed's (measured)
    value; only the pairs where both values are finite and the testbed's is not 0."""
    t = np.asarray(testbed, dtype=float)
    o = np.asarray(other, dtype=float)
    keep = np.isfinite(t) & np.isfinite(o) & (t != 0)
    return (o[keep] - t[keep]) / t[keep]


# The quantiles error_summary reports: (name, take the absolute value first, percentile).
ERROR_QUANTILES = tuple((f"{kind}_p{q}", kind == "abs", q) for kind in ("signed", "abs") for q in QUANTILES)


def _quantiles(x: np.ndarray, which: tuple[tuple[str, bool, float], ...], axis: int = -1) -> np.ndarray:
    return np.stack([np.percentile(np.abs(x) if absolute else x, q, axis=axis) for _, absolute, q in which])


def quantiles_ci(x: np.ndarray, which: tuple[tuple[str, bool, float], ...]) -> dict[str, float]:
    """Percentiles of x (or of |x|) with their 95% bootstrap intervals: for each (name, absolute, q) of
    ``which`` the keys name, name_lo, name_hi. scipy.stats.bootstrap with the percentile method, 9,999
    resamples and seed 0, the same resamples for every percentile. A percentile is NaN without values,
    an interval NaN with fewer than 2."""
    x = np.asarray(x, dtype=float)
    out: dict[str, float] = {}
    point = _quantiles(x, which) if x.size else np.full(len(which), NAN)
    lo = hi = np.full(len(which), NAN)
    if x.size >= 2:
        res = stats.bootstrap((x,), lambda s, axis: _quantiles(s, which, axis), vectorized=True,
                              confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method=METHOD,
                              random_state=np.random.default_rng(SEED))
        lo, hi = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    for i, (name, _, _) in enumerate(which):
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = float(point[i]), float(lo[i]), float(hi[i])
    return out


def quantile_ci(x: np.ndarray, q: float) -> tuple[float, float, float]:
    """(the q-th percentile of x, the low and high ends of its 95% bootstrap interval), as
    :func:`quantiles_ci` computes them."""
    r = quantiles_ci(x, (("q", False, q),))
    return r["q"], r["q_lo"], r["q_hi"]


def error_summary(rel: np.ndarray) -> dict[str, Any]:
    """Of per-request relative errors: n, and for the signed and the absolute errors the median (p50)
    and p90 with their bootstrap intervals (:func:`quantiles_ci`): keys signed_p50, signed_p50_lo,
    signed_p50_hi, signed_p90, ..., abs_p90_hi."""
    rel = np.asarray(rel, dtype=float)
    return {"n": int(rel.size), **quantiles_ci(rel, ERROR_QUANTILES)}


def summary_stat(x: np.ndarray, stat: str) -> float:
    """"mean" or "p<q>" of the finite values of x; NaN without any."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN
    if stat == "mean":
        return float(x.mean())
    if not stat.startswith("p"):
        raise ValueError(f"unknown statistic {stat!r} (known: {', '.join(SUMMARY_STATS)})")
    return float(np.percentile(x, float(stat[1:])))


def ape(testbed: float, other: float) -> float:
    """Absolute percentage error |other - testbed| / testbed (a fraction); NaN where testbed is 0 or
    either is NaN."""
    if not (math.isfinite(testbed) and math.isfinite(other)) or testbed == 0:
        return NAN
    return abs(other - testbed) / abs(testbed)
