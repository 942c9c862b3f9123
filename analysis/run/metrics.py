"""Reliability and serving metrics of one run.

Every metric is a pure function of record tables (pandas DataFrames with the
columns of ``core.records``) and its parameters; the docstrings hold the
exact definitions (docs/records.md "Metrics" repeats them word for word).
Reading a run directory is analysis/run/data.py's; all metrics of one run together, analysis/run/scalars.py's.

Conventions: times are seconds since run start; a request *failed* when its
``outcome`` is not ``"ok"``; a metric that has nothing to measure is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.run.names import LATENCIES, UNKNOWN_STAGE, gap, latency, percentile_name
from core.limits import give_up_s
from core.stages import FAILURE_STAGES
from vocab import Outcome

NAN = math.nan
ORACLE = "OracleAvoidance"


def ok_mask(requests: pd.DataFrame) -> np.ndarray:
    return requests["outcome"].eq(Outcome.OK).to_numpy(dtype=bool, na_value=False)


def _arrivals(requests: pd.DataFrame) -> np.ndarray:
    return requests["arrival_s"].to_numpy(dtype=float)


# --------------------------------------------------------------------------- failures


def failure_rate(requests: pd.DataFrame) -> float:
    """failure rate = failed requests / all requests (failed: outcome != "ok"); NaN with no requests."""
    n = len(requests)
    return float((~ok_mask(requests)).sum() / n) if n else NAN


def timeout_share(requests: pd.DataFrame) -> float:
    """timeout share = requests with outcome "timeout" / failed requests; NaN with no failures."""
    failed = int((~ok_mask(requests)).sum())
    if failed == 0:
        return NAN
    return float(requests["outcome"].eq(Outcome.TIMEOUT).to_numpy(dtype=bool, na_value=False).sum() / failed)


def peak_in_flight(requests: pd.DataFrame, first_token_limit_s: float, deadline_s: float) -> int:
    """peak in flight = the most requests routed and not yet ended at any one time, rebuilt from the
    records: each routed request counts from routed_s to end_s; a failure has no end_s and counts to
    its limit at the latest (arrival_s + the first-token limit without a first token, else + the
    deadline), so where errors ended earlier this bounds the router's count from above. Rejected
    requests were never routed. At a tie an end comes before a start."""
    routed = requests[requests["outcome"] != Outcome.REJECTED]
    if routed.empty:
        return 0
    ends = routed["end_s"].to_numpy(dtype=float)
    ends = np.where(np.isnan(ends), give_up_s(routed["arrival_s"], routed["first_token_s"].notna(),
                                               first_token_limit_s, deadline_s), ends)
    t = np.concatenate([routed["routed_s"].to_numpy(dtype=float), ends])
    step = np.concatenate([np.ones(len(routed)), -np.ones(len(routed))])
    order = np.lexsort((step, t))
    return int(np.cumsum(step[order]).max())


def failure_composition(requests: pd.DataFrame) -> dict[str, float]:
    """failure composition = for admission (requests the router's admission limit rejected) and each stage
    of core.stages (prefill_queue, prefill, decode_queue, kv_transfer, decode), failed requests whose
    failed_stage is that one / failed requests; failures with no or an unknown stage count as "unknown", so
    the shares sum to 1. All NaN with no failures."""
    failed = ~ok_mask(requests)
    n = int(failed.sum())
    stage = requests["failed_stage"].to_numpy(dtype=object)[failed]
    out: dict[str, float] = {}
    known = np.zeros(n, dtype=bool)
    for s in FAILURE_STAGES:
        hit = stage == s
        known |= hit
        out[s] = float(hit.sum() / n) if n else NAN
    out[UNKNOWN_STAGE] = float((~known).sum() / n) if n else NAN
    return out


# --------------------------------------------------------------------------- time series


def success_series(requests: pd.DataFrame, bin_s: float) -> pd.DataFrame:
    """Success-ratio time series: requests binned by arrival_s into bins [k*bin_s, (k+1)*bin_s),
    k = 0 .. last arrival's bin; per bin success_ratio = ok requests / all requests, NaN for bins with no
    requests. Columns: bin_start_s, n, n_ok, success_ratio."""
    arr = _arrivals(requests)
    if arr.size == 0:
        return pd.DataFrame({"bin_start_s": [], "n": [], "n_ok": [], "success_ratio": []}).astype(
            {"n": np.int64, "n_ok": np.int64}
        )
    idx = np.maximum(np.floor(arr / bin_s).astype(np.int64), 0)
    nb = int(idx.max()) + 1
    n = np.bincount(idx, minlength=nb)
    n_ok = np.bincount(idx, weights=ok_mask(requests), minlength=nb).round().astype(np.int64)
    ratio = np.full(nb, NAN)
    np.divide(n_ok, n, out=ratio, where=n > 0)
    return pd.DataFrame({"bin_start_s": np.arange(nb) * bin_s, "n": n, "n_ok": n_ok, "success_ratio": ratio})


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """When faults were active and which pods they hit."""

    onset_s: float  # first "apply"
    end_s: float  # last "clear"; the last request's arrival if some fault was never cleared
    cleared: bool  # every applied fault was cleared
    pods: tuple[int, ...]  # degraded pods: the pod values of the fault rows


def fault_window(faults: pd.DataFrame, requests: pd.DataFrame) -> FaultWindow | None:
    """Fault window = [first "apply" time, last "clear" time) of the faults table; if a fault (fault_id) was
    applied but never cleared, the window ends at the last request's arrival. Degraded pods = the pod values
    of the fault rows (ids < 0 ignored). None when no fault was applied."""
    ev = faults["event"].to_numpy(dtype=object)
    t = faults["time_s"].to_numpy(dtype=float)
    applied = ev == "apply"
    if not applied.any():
        return None
    cleared_ids = set(faults["fault_id"].to_numpy()[ev == "clear"].tolist())
    applied_ids = set(faults["fault_id"].to_numpy()[applied].tolist())
    onset = float(t[applied].min())
    cleared = applied_ids <= cleared_ids
    if cleared:
        end = float(t[ev == "clear"].max())
    else:
        arr = _arrivals(requests)
        end = float(arr.max()) if arr.size else onset
    pods = tuple(sorted({int(p) for p in faults["pod"].to_numpy() if p >= 0}))
    return FaultWindow(onset, end, cleared, pods)


def bins_within(start: np.ndarray, bin_s: float, lo: float, hi: float) -> np.ndarray:
    """The bins [start, start + bin_s) at least half inside [lo, hi). By half, not by their start: the
    testbed applies a fault a few milliseconds after its scheduled time (measured: 10.08 s for 10 s),
    and a bin counted by its start would then leave out the fault's first bin, which the simulator's
    exact onset keeps."""
    overlap = np.minimum(start + bin_s, hi) - np.maximum(start, lo)
    return overlap >= bin_s / 2


def degraded_availability(requests: pd.DataFrame, window: FaultWindow | None, bin_s: float, target: float) -> float:
    """degraded availability = among the bins of the success-ratio series at least half inside the fault
    window [onset, end) (:func:`bins_within`) and that hold at least one request, the fraction whose success
    ratio >= target (availability_target). NaN without a fault or without such bins."""
    if window is None:
        return NAN
    s = success_series(requests, bin_s)
    start = s["bin_start_s"].to_numpy()
    sel = bins_within(start, bin_s, window.onset_s, window.end_s) & (s["n"].to_numpy() > 0)
    if not sel.any():
        return NAN
    return float((s["success_ratio"].to_numpy()[sel] >= target).mean())


def _pre_fault_success(requests: pd.DataFrame, window: FaultWindow) -> float:
    """S_0: the success ratio of the requests arriving before the fault's onset; NaN without any."""
    pre = _arrivals(requests) < window.onset_s
    return float(ok_mask(requests)[pre].mean()) if pre.any() else NAN


def resilience_index(
    requests: pd.DataFrame, window: FaultWindow | None, bin_s: float, recovery_horizon_s: float
) -> float:
    """resilience index = mean of min(S_b / S_0, 1) over the non-empty bins at least half inside
    [fault onset, fault window end + recovery_horizon_s) (:func:`bins_within`), where S_b is the bin's success ratio and S_0 the
    success ratio of all requests arriving before onset. 1.0 = no dip. NaN without a fault, without requests
    before onset, with S_0 = 0, or without such bins."""
    if window is None:
        return NAN
    s0 = _pre_fault_success(requests, window)
    if not s0 > 0.0:  # NaN (no request before onset) or 0
        return NAN
    s = success_series(requests, bin_s)
    start = s["bin_start_s"].to_numpy()
    sel = bins_within(start, bin_s, window.onset_s, window.end_s + recovery_horizon_s) & (s["n"].to_numpy() > 0)
    if not sel.any():
        return NAN
    return float(np.minimum(s["success_ratio"].to_numpy()[sel] / s0, 1.0).mean())


def recovery_s(requests: pd.DataFrame, window: FaultWindow | None, bin_s: float) -> float:
    """time to recover = from the fault window's end to the end of the last bin (success_series, bins
    by arrival from onset on) whose success ratio is below S_0, the success ratio of the requests
    arriving before onset; 0 if none is below it after the window ends. NaN without a fault, without
    requests before onset, or with a fault never cleared."""
    if window is None or not window.cleared:
        return NAN
    s0 = _pre_fault_success(requests, window)
    if math.isnan(s0):
        return NAN
    s = success_series(requests, bin_s)
    start = s["bin_start_s"].to_numpy()
    below = (start + bin_s > window.onset_s) & (s["success_ratio"].to_numpy() < s0)  # NaN (empty) is not below
    if not below.any():
        return 0.0
    return float(max(0.0, start[below].max() + bin_s - window.end_s))


def degraded_pod_shares(requests: pd.DataFrame, window: FaultWindow | None) -> tuple[float, float]:
    """(s_pre, s_during): among routed requests (prefill_pod or decode_pod >= 0) arriving before onset, resp.
    inside the fault window [onset, end), the share whose prefill_pod or decode_pod is a degraded pod.
    Requests never routed (rejected before a choice) are left out: they went nowhere. NaN where a group
    is empty or there is no fault."""
    if window is None:
        return NAN, NAN
    pp = requests["prefill_pod"].to_numpy()
    dp = requests["decode_pod"].to_numpy()
    routed = (pp >= 0) | (dp >= 0)
    pods = np.asarray(window.pods, dtype=np.int64)
    touched = np.isin(pp, pods) | np.isin(dp, pods)
    arr = _arrivals(requests)
    pre = routed & (arr < window.onset_s)
    during = routed & (arr >= window.onset_s) & (arr < window.end_s)
    s_pre = float(touched[pre].mean()) if pre.any() else NAN
    s_during = float(touched[during].mean()) if during.any() else NAN
    return s_pre, s_during


def traffic_deflection_ratio(requests: pd.DataFrame, window: FaultWindow | None) -> float:
    """traffic deflection ratio = (s_pre - s_during) / s_pre, with s_pre and s_during the shares of routed
    requests touching a degraded pod (as prefill or decode pod) before onset and inside the fault window.
    1 = all such traffic moved away, 0 = none moved, negative = more traffic went there; NaN if s_pre = 0."""
    s_pre, s_during = degraded_pod_shares(requests, window)
    if not s_pre > 0:  # also catches NaN
        return NAN
    return float((s_pre - s_during) / s_pre)


# Reaction is judged over a count of routing decisions, not a time span: a share over k decisions
# resolves 1/k at any arrival rate, where a span of seconds holds a handful of decisions at the
# testbed's one request a second and thousands at the simulator's study scale.
REACTION_K = 5
REACTION_FRACTION = 0.5  # "most" of the degraded pods' traffic moved away: their share at most half of s_pre


def reaction_s(requests: pd.DataFrame, window: FaultWindow | None, *, k: int = REACTION_K,
               fraction: float = REACTION_FRACTION, s_pre: float | None = None) -> float:
    """reaction time = routed_s of the first request R routed inside the fault window [onset, end) such
    that among R and the next k - 1 requests routed after it (routing order: routed_s), the share whose
    prefill_pod or decode_pod is a degraded pod is at most fraction * s_pre, minus the onset; s_pre is
    the degraded pods' share of routed requests arriving before onset (as for the traffic deflection
    ratio), k = 5 and fraction = 0.5 unless given. R itself may touch a degraded pod: the k requests
    are judged together, so one stray request neither ends the reaction early nor holds it back. NaN
    without a fault, if s_pre is NaN (no routed request before onset) or 0, or if no such k requests
    are all routed inside the window."""
    if k < 1 or not 0.0 <= fraction:
        raise ValueError(f"reaction_s needs k >= 1 and fraction >= 0, got k={k} fraction={fraction}")
    if window is None:
        return NAN
    if s_pre is None:  # run_metrics has it already (degraded_pod_shares)
        s_pre, _ = degraded_pod_shares(requests, window)
    if not s_pre > 0:  # also catches NaN
        return NAN
    pp = requests["prefill_pod"].to_numpy()
    dp = requests["decode_pod"].to_numpy()
    t = requests["routed_s"].to_numpy(dtype=float)
    inside = ((pp >= 0) | (dp >= 0)) & (t >= window.onset_s) & (t < window.end_s)  # NaN routed_s: never routed
    pods = np.asarray(window.pods, dtype=np.int64)
    order = np.argsort(t[inside], kind="stable")
    t_in = t[inside][order]
    touched = (np.isin(pp, pods) | np.isin(dp, pods))[inside][order]
    if t_in.size < k:
        return NAN
    c = np.concatenate(([0], np.cumsum(touched)))
    share = (c[k:] - c[:-k]) / k  # share of the k requests starting at each position
    # a share equal to the threshold by hand must not miss it by a rounding error of s_pre
    met = np.flatnonzero(share <= fraction * s_pre + 1e-12)
    return float(t_in[met[0]] - window.onset_s) if met.size else NAN


EXPOSURE_COLUMNS = ("pod", "n_routed_pre", "n_touch_pre", "n_fail_pre", "n_routed_during", "n_touch_during",
                    "n_fail_during")


def pod_exposure(requests: pd.DataFrame, window: FaultWindow | None) -> pd.DataFrame:
    """Per degraded pod d of the fault window, the traffic that touched d before and during the fault.
    Columns: pod; n_routed_pre / n_routed_during = routed requests (prefill_pod or decode_pod >= 0) arriving
    before onset / inside the fault window [onset, end) (the same for every pod); n_touch_pre /
    n_touch_during = those among them whose prefill_pod or decode_pod is d; n_fail_pre / n_fail_during =
    those touching d that failed (outcome != "ok"). No rows without a fault."""
    if window is None:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in EXPOSURE_COLUMNS})
    pp = requests["prefill_pod"].to_numpy()
    dp = requests["decode_pod"].to_numpy()
    arr = _arrivals(requests)
    failed = ~ok_mask(requests)
    routed = (pp >= 0) | (dp >= 0)
    pre = routed & (arr < window.onset_s)
    during = routed & (arr >= window.onset_s) & (arr < window.end_s)
    rows = []
    for d in window.pods:
        touch = (pp == d) | (dp == d)
        rows.append((d, int(pre.sum()), int((touch & pre).sum()), int((touch & pre & failed).sum()),
                     int(during.sum()), int((touch & during).sum()), int((touch & during & failed).sum())))
    return pd.DataFrame(rows, columns=list(EXPOSURE_COLUMNS), dtype=np.int64)


def _shares(exposure: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(s0_d, sP_d) per row of an exposure table: touching share before onset and inside the window."""
    def share(touch: str, routed: str) -> np.ndarray:
        n = exposure[routed].to_numpy(dtype=float)
        out = np.full(n.size, NAN)
        np.divide(exposure[touch].to_numpy(dtype=float), n, out=out, where=n > 0)
        return out

    return share("n_touch_pre", "n_routed_pre"), share("n_touch_during", "n_routed_during")


def needless_deflection(exposure: pd.DataFrame, lc_exposure: pd.DataFrame) -> float:
    """needless deflection ratio = sum_d deflected_d * (1 - f_d) / sum_d s0_d over the degraded pods d of
    ``exposure`` (a :func:`pod_exposure` table of the policy's run), where
    s0_d = n_touch_pre / n_routed_pre (the share of routed requests arriving before onset that touched d,
    under the policy itself, as for the traffic deflection ratio), sP_d = n_touch_during / n_routed_during
    (that share inside the fault window), deflected_d = max(0, s0_d - sP_d), and
    f_d = n_fail_during / n_touch_during of pod d in ``lc_exposure`` (LC's run of the same scenario and seed:
    LC avoids nothing, so f_d is the chance that a request sent to d during the fault failed there).
    It is the share of the degraded pods' pre-fault traffic that was moved away although it would not have
    failed there: 0 = nothing moved, or only what would have failed; up to 1 - sP/s0 when LC failed nothing.
    A pod with deflected_d = 0 adds 0 whatever f_d is. NaN when sum_d s0_d is 0 or NaN (no fault, no traffic
    before onset), when sP_d is NaN (no routed request in the window), or when a pod with deflected_d > 0
    has no f_d (LC sent it nothing during the window, or ``lc_exposure`` lacks the pod)."""
    if exposure.empty:
        return NAN
    s0, sp = _shares(exposure)
    if np.isnan(s0).any() or np.isnan(sp).any() or not s0.sum() > 0:
        return NAN
    deflected = np.maximum(0.0, s0 - sp)
    lc = lc_exposure.set_index("pod")
    f = np.full(len(exposure), NAN)
    for i, d in enumerate(exposure["pod"].to_numpy()):
        if d in lc.index and lc.at[d, "n_touch_during"] > 0:
            f[i] = lc.at[d, "n_fail_during"] / lc.at[d, "n_touch_during"]
    moved = deflected > 0
    if np.isnan(f[moved]).any():
        return NAN
    return float((deflected[moved] * (1.0 - f[moved])).sum() / s0.sum())


def needless_deflection_ratio(
    requests: pd.DataFrame, faults: pd.DataFrame, lc_requests: pd.DataFrame, lc_faults: pd.DataFrame
) -> float:
    """:func:`needless_deflection` of a run (requests, faults) against LC's run of the same scenario and
    seed (lc_requests, lc_faults), each with its own :func:`fault_window`."""
    own = pod_exposure(requests, fault_window(faults, requests))
    lc = pod_exposure(lc_requests, fault_window(lc_faults, lc_requests))
    return needless_deflection(own, lc)


# --------------------------------------------------------------------------- overhead, serving


def latency_us(latency_s: np.ndarray, percentiles: Sequence[float]) -> dict[str, Any]:
    x = latency_s[~np.isnan(latency_s)] * 1e6
    r: dict[str, Any] = {"n_decisions": int(x.size)}
    for q in percentiles:
        r[f"latency_{percentile_name(q)}_us"] = float(np.percentile(x, q)) if x.size else NAN
    return r


def decision_latency(decisions: pd.DataFrame, percentiles: Sequence[float] = (50, 99)) -> pd.DataFrame:
    """Scheduler overhead: percentiles (numpy linear interpolation) of decision latency_s, reported in
    microseconds, over all decisions (n_candidates = <NA>) and per n_candidates. Columns: n_candidates,
    n_decisions, latency_p<q>_us for each q."""
    lat = decisions["latency_s"].to_numpy(dtype=float)
    cand = decisions["n_candidates"].to_numpy()
    rows = [latency_us(lat, percentiles)]
    keys: list[Any] = [pd.NA]
    for c in np.unique(cand):
        rows.append(latency_us(lat[cand == c], percentiles))
        keys.append(int(c))
    out = pd.DataFrame(rows)
    out.insert(0, "n_candidates", pd.array(keys, dtype="Int64"))
    return out


def serving_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per ok request: ttft_s = first_token_s - arrival_s; tpot_s = (end_s - first_token_s) /
    (output_tokens - 1), NaN unless output_tokens > 1; e2e_s = end_s - arrival_s."""
    ok = requests.loc[ok_mask(requests)]
    arr = ok["arrival_s"].to_numpy(dtype=float)
    ft = ok["first_token_s"].to_numpy(dtype=float)
    end = ok["end_s"].to_numpy(dtype=float)
    out_tok = ok["output_tokens"].to_numpy(dtype=float)
    tpot = np.full(len(ok), NAN)
    multi = out_tok > 1
    tpot[multi] = (end[multi] - ft[multi]) / (out_tok[multi] - 1)
    return pd.DataFrame(
        {"request_id": ok["request_id"].to_numpy(), "ttft_s": ft - arr, "tpot_s": tpot, "e2e_s": end - arr}
    )


def latency_percentiles(requests: pd.DataFrame, percentiles: Sequence[float]) -> dict[str, float]:
    """TTFT, TPOT and E2E percentiles over ok requests (numpy linear interpolation; missing values left out):
    keys ttft_p<q>_s, tpot_p<q>_s, e2e_p<q>_s (q = 99.9 gives p99_9)."""
    lat = serving_latencies(requests)
    out: dict[str, float] = {}
    for col in LATENCIES:
        x = lat[f"{col}_s"].to_numpy(dtype=float)
        x = x[~np.isnan(x)]
        for q in percentiles:
            out[latency(col, q)] = float(np.percentile(x, q)) if x.size else NAN
    return out


def goodput_rps(requests: pd.DataFrame, ttft_slo_s: float, tpot_slo_s: float) -> float:
    """goodput = number of ok requests with TTFT <= ttft_slo_s and TPOT <= tpot_slo_s (a request with
    output_tokens <= 1 has no TPOT and meets that part) / arrival span (last arrival - first arrival over all
    requests), in requests per second; NaN if the span is 0."""
    arr = _arrivals(requests)
    if arr.size < 2 or not arr.max() > arr.min():
        return NAN
    lat = serving_latencies(requests)
    ttft = lat["ttft_s"].to_numpy()
    tpot = lat["tpot_s"].to_numpy()
    good = (ttft <= ttft_slo_s) & (np.isnan(tpot) | (tpot <= tpot_slo_s))
    return float(good.sum() / (arr.max() - arr.min()))


def price_contrast(prices: pd.DataFrame, pods: Sequence[int], bin_s: float) -> pd.DataFrame:
    """Risk price over time, binned by time_s like the success series: per bin the mean price of the
    degraded pods' rows and the mean price of all other pods' rows. Columns: bin_start_s, degraded_price,
    other_price (NaN where a group has no rows)."""
    t = prices["time_s"].to_numpy(dtype=float)
    if t.size == 0:
        return pd.DataFrame({"bin_start_s": [], "degraded_price": [], "other_price": []})
    idx = np.maximum(np.floor(t / bin_s).astype(np.int64), 0)
    nb = int(idx.max()) + 1
    price = prices["price"].to_numpy(dtype=float)
    bad = np.isin(prices["pod"].to_numpy(), np.asarray(pods, dtype=np.int64))
    cols = {}
    for name, sel in (("degraded_price", bad), ("other_price", ~bad)):
        sel = sel & ~np.isnan(price)
        n = np.bincount(idx[sel], minlength=nb)
        s = np.bincount(idx[sel], weights=price[sel], minlength=nb)
        m = np.full(nb, NAN)
        np.divide(s, n, out=m, where=n > 0)
        cols[name] = m
    return pd.DataFrame({"bin_start_s": np.arange(nb) * bin_s, **cols})


# --------------------------------------------------------------------------- across runs


def gap_to_oracle(runs: pd.DataFrame, metrics: Sequence[str], oracle: str = ORACLE) -> pd.DataFrame:
    """gap to oracle = metric(policy) - metric(OracleAvoidance) on the same world, scenario and seed.
    Returns a copy of ``runs`` (one row per run: world, scenario, policy, seed, metrics) with a column
    gap_<metric> per metric; NaN where that oracle run is missing (0 for the oracle itself)."""
    out = runs.copy()
    key = ["world", "scenario", "seed"]
    ref = runs.loc[runs["policy"] == oracle, key + list(metrics)]
    dup = ref.duplicated(key, keep=False)
    if dup.any():
        r = ref.loc[dup].iloc[0]
        raise ValueError(
            f"two {oracle} runs for world={r['world']} scenario={r['scenario']} seed={r['seed']}: "
            "cannot pair policies with the oracle"
        )
    merged = out[key].merge(ref, on=key, how="left")
    for m in metrics:
        out[gap(m)] = out[m].to_numpy(dtype=float) - merged[m].to_numpy(dtype=float)
    return out


# --------------------------------------------------------------------------- one run from disk



















