"""The testbed against another set of runs of one scenario, request by request: the paired report of
``testbed compare`` (docs/twin.md "The paired report").

Requests are matched by (policy, seed, request_id). The reference is always the testbed run (the
measured one); the other side is the simulator's run of the same policy and seed, or a second testbed
run of it (repeatability, analysis/compare/repeatability.py). A retried request keeps its id and the requests
table holds its end result (the last attempt's timestamps beside the first arrival): rows are compared
as they are. Percentiles are numpy's linear interpolation (analysis/compare/paired_stats.py).

* outcome class (:func:`outcome_class`): "ok"; "given_up:<failed_stage>" for a timeout
  ("given_up:unknown" without a stage); "rejected"; "error"; "corrupt". Confusion matrix: per policy,
  pooled over seeds, the matched requests counted by (testbed class, other class). Outcome agreement
  = matched requests of the same class / matched requests. A request of one side only (an
  interrupted run, a seed run on one side only) is counted (only_testbed, only_other), never matched.
* spans of an ok request, from the requests table (seconds): routing (arrival_s -> routed_s: the
  decision, and a retried request's earlier attempts), prefill_queue (routed_s -> prefill_start_s),
  prefill (-> prefill_end_s), decode_queue (-> kv_start_s), kv_transfer (-> kv_end_s), first_token
  (-> first_token_s), decode (-> end_s): the stages of core.stages with its decode split at the first
  token, and routing before them, so that the spans sum to E2E. TTFT, TPOT and E2E as
  analysis.run.metrics.serving_latencies defines them (TPOT NaN for a single output token).
* per-request relative error, over the requests ok on both sides: (other - testbed) / testbed,
  relative to the testbed's (measured) value, as simulator-accuracy studies define it (Vidur,
  Agrawal et al., MLSys 2024); left out where the testbed's value is 0 or a value is missing. Per
  policy and metric (the spans, TTFT, TPOT, E2E): the median (p50) and p90 of the signed and of the
  absolute error, each with a 95% bootstrap interval (analysis.compare.paired_stats.quantile_ci), window
  "all"; for TTFT and E2E also windows "inside" and "outside".
* window: an ok request is "inside" when its life [arrival_s, end_s] on the testbed overlaps the testbed
  run's fault window [onset, end) (analysis.run.metrics.fault_window), else "outside" (so is every
  request of a run without a fault).
* stage gaps (which stage the E2E gap comes from): per policy, window ("inside", "outside", "all") and
  span, over the requests ok on both sides: each side's mean span, gap_mean_s = the mean of (other -
  testbed), and share = gap_mean_s / the mean E2E gap. The spans sum to E2E, so the shares sum to 1
  where every span is recorded.
* MAPE: per (policy, seed) present on both sides and statistic (mean, p50, p90; p99 only where each
  side pools at least 200 ok requests for the policy) of TTFT, TPOT and E2E over each side's
  ok requests, the absolute percentage error APE = |stat_other - stat_testbed| / stat_testbed; MAPE =
  the mean of the APEs over seeds per policy, and the mean of the policies' MAPEs ("all"). It is the
  measure published simulator-accuracy studies report (Vidur, Agrawal et al., MLSys 2024), so our
  figures sit beside theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.run.names import LATENCIES, UNKNOWN_STAGE
from analysis.run.metrics import fault_window, ok_mask, serving_latencies
from analysis.compare.paired_stats import NAN, SUMMARY_STATS, ape, error_summary, rel_errors, summary_stat
from analysis.run.data import RunData, load_run
from analysis.run.summary import discover_runs
from core.stages import STAGE_START
from vocab import DECODE, DECODE_QUEUE, KV_TRANSFER, PREFILL, PREFILL_QUEUE, Outcome

KEY = ["policy", "seed", "request_id"]
GIVEN_UP = "given_up"
ROUTING = "routing"  # arrival_s -> routed_s
FIRST_TOKEN = "first_token"  # kv_end_s -> first_token_s: core.stages' decode up to the first token
# (span, start column, end column), in the order a request passes through them.
SPANS: tuple[tuple[str, str, str], ...] = (
    (ROUTING, "arrival_s", STAGE_START[PREFILL_QUEUE]),
    (PREFILL_QUEUE, STAGE_START[PREFILL_QUEUE], STAGE_START[PREFILL]),
    (PREFILL, STAGE_START[PREFILL], STAGE_START[DECODE_QUEUE]),
    (DECODE_QUEUE, STAGE_START[DECODE_QUEUE], STAGE_START[KV_TRANSFER]),
    (KV_TRANSFER, STAGE_START[KV_TRANSFER], STAGE_START[DECODE]),
    (FIRST_TOKEN, STAGE_START[DECODE], "first_token_s"),
    (DECODE, "first_token_s", "end_s"),
)
SPAN_NAMES: tuple[str, ...] = tuple(s for s, _, _ in SPANS)
ERROR_METRICS: tuple[str, ...] = (*LATENCIES, *SPAN_NAMES)  # ttft, tpot, e2e, then the spans
WINDOWED = ("ttft", "e2e")  # split inside / outside the fault window
WINDOWS = ("inside", "outside", "all")
P99_MIN_POOLED = 200  # p99 only where at least 200 requests are pooled: fewer put it on one or two requests
ALL = "all"
OUTCOME_AGREEMENT = "outcome_agreement"  # the fidelity check's name (analysis/compare/fidelity.py)


def outcome_class(outcome: str, failed_stage: str | None) -> str:
    """"ok", "given_up:<failed_stage>" for a timeout ("given_up:unknown" without a stage), else the
    outcome itself ("rejected", "error", "corrupt")."""
    if outcome == Outcome.TIMEOUT:
        stage = failed_stage if isinstance(failed_stage, str) and failed_stage else UNKNOWN_STAGE
        return f"{GIVEN_UP}:{stage}"
    return str(outcome)


def _col(name: str) -> str:
    return f"{name}_s"


def request_frame(run: RunData) -> pd.DataFrame:
    """One row per request of a run: policy, seed, request_id, cls (:func:`outcome_class`), and for ok
    requests each span, ttft_s, tpot_s and e2e_s (NaN otherwise) and inside (its life overlaps the run's
    fault window; False for a failed request). A request_id twice in one run raises a one-line
    ValueError: it could not be matched."""
    req = run.requests
    ids = req["request_id"].to_numpy(dtype=np.int64)
    dup = pd.Index(ids).duplicated()
    if dup.any():
        raise ValueError(f"{run.path}: request_id {ids[dup][0]} appears more than once; requests cannot be matched")
    ok = ok_mask(req)
    out = pd.DataFrame({"policy": run.policy, "seed": run.seed, "request_id": ids,
                        "cls": [outcome_class(o, s) for o, s in zip(req["outcome"], req["failed_stage"])]})
    for name, start, end in SPANS:
        out[_col(name)] = np.where(ok, req[end].to_numpy(dtype=float) - req[start].to_numpy(dtype=float), NAN)
    lat = serving_latencies(req).set_index("request_id")
    for m in LATENCIES:
        out[_col(m)] = out["request_id"].map(lat[_col(m)]).to_numpy(dtype=float)
    window = fault_window(run.faults, req)
    inside = np.zeros(len(req), dtype=bool)
    if window is not None:
        arr, end = req["arrival_s"].to_numpy(dtype=float), req["end_s"].to_numpy(dtype=float)
        inside = ok & (arr < window.end_s) & (end >= window.onset_s)
    out["inside"] = inside
    return out


def load_frames(dirs: Iterable[Path | str], world: str) -> pd.DataFrame:
    """:func:`request_frame` of every run in or below ``dirs``, one run in memory at a time; a run of
    another world than ``world`` raises a one-line ValueError."""
    frames = []
    for d in discover_runs(list(dirs)):
        run = load_run(d)
        if run.world != world:
            raise ValueError(f"paired report: {d} is a {run.world!r} run, but was given as a {world} run")
        frames.append(request_frame(run))
    return concat_frames(frames)


def concat_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Request frames of several runs as one; two runs of one policy and seed raise a one-line ValueError."""
    seen: set[tuple[str, int]] = set()
    for f in frames:
        for key in set(zip(f["policy"], f["seed"])):
            if key in seen:
                raise ValueError(f"paired report: two runs of policy {key[0]} seed {key[1]} on one side")
            seen.add(key)
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({"policy": pd.Series(dtype=object), "seed": pd.Series(dtype=np.int64),
                             "request_id": pd.Series(dtype=np.int64), "cls": pd.Series(dtype=object),
                             **{_col(m): pd.Series(dtype=float) for m in ERROR_METRICS},
                             "inside": pd.Series(dtype=bool)})
    return pd.concat(frames, ignore_index=True)


def pair_frames(testbed: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """The two sides' request frames matched on (policy, seed, request_id): every request of either
    side, columns suffixed _tb and _ot, and side in {"both", "testbed", "other"}."""
    m = testbed.merge(other, on=KEY, how="outer", suffixes=("_tb", "_ot"), indicator="side")
    m["side"] = m["side"].map({"both": "both", "left_only": "testbed", "right_only": "other"}).astype(object)
    return m


# --------------------------------------------------------------------------- the tables


def agreement_table(pairs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy: seeds (with a matched request), matched, agree (same class), agreement = agree /
    matched (NaN without matched requests), only_testbed, only_other."""
    rows = []
    for p in policies:
        sel = pairs[pairs["policy"] == p]
        both = sel[sel["side"] == "both"]
        agree = int((both["cls_tb"] == both["cls_ot"]).sum())
        rows.append({"policy": p, "seeds": int(both["seed"].nunique()), "matched": len(both), "agree": agree,
                     "agreement": agree / len(both) if len(both) else NAN,
                     "only_testbed": int((sel["side"] == "testbed").sum()),
                     "only_other": int((sel["side"] == "other").sum())})
    return pd.DataFrame(rows, columns=["policy", "seeds", "matched", "agree", "agreement", "only_testbed",
                                       "only_other"])


def agreement_by_seed(pairs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy and seed with a matched request: matched, agree, agreement = agree / matched (the
    outcome agreement a verdict judges seed by seed, analysis/compare/fidelity.py)."""
    both = pairs[(pairs["side"] == "both") & pairs["policy"].isin(list(policies))]
    if both.empty:
        return pd.DataFrame(columns=["policy", "seed", "matched", "agree", "agreement"])
    same = (both["cls_tb"] == both["cls_ot"]).rename("agree")
    g = pd.concat([both[["policy", "seed"]], same], axis=1).groupby(["policy", "seed"], sort=True)["agree"]
    out = pd.DataFrame({"matched": g.size(), "agree": g.sum().astype(int)}).reset_index()
    out["agreement"] = out["agree"] / out["matched"]
    return out


def _class_order(c: str) -> tuple[int, str]:
    return (0 if c == Outcome.OK else 1, c)


def confusion_table(pairs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy, the matched requests counted by (testbed class, other class): columns policy,
    testbed, other, n; only the cells that hold requests, "ok" first, then by name."""
    both = pairs[pairs["side"] == "both"]
    rows = []
    for p in policies:
        counts = both[both["policy"] == p].groupby(["cls_tb", "cls_ot"]).size()
        for (t, o), n in sorted(counts.items(), key=lambda kv: (_class_order(kv[0][0]), _class_order(kv[0][1]))):
            rows.append({"policy": p, "testbed": t, "other": o, "n": int(n)})
    return pd.DataFrame(rows, columns=["policy", "testbed", "other", "n"])


def _both_ok(pairs: pd.DataFrame) -> pd.DataFrame:
    return pairs[(pairs["side"] == "both") & (pairs["cls_tb"] == Outcome.OK) & (pairs["cls_ot"] == Outcome.OK)]


def _window(rows: pd.DataFrame, window: str) -> pd.DataFrame:
    if window == ALL:
        return rows
    inside = rows["inside_tb"].to_numpy(dtype=bool)
    return rows[inside if window == "inside" else ~inside]


def error_table(pairs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy, window and metric, over the requests ok on both sides: the per-request relative
    error's :func:`analysis.compare.paired_stats.error_summary` (n, signed/abs p50/p90 with intervals). Window
    "all" for every metric, "inside" and "outside" for TTFT and E2E."""
    ok = _both_ok(pairs)
    rows = []
    for p in policies:
        sel = ok[ok["policy"] == p]
        for window in (ALL, "inside", "outside"):
            part = _window(sel, window)
            for m in ERROR_METRICS if window == ALL else WINDOWED:
                rel = rel_errors(part[f"{_col(m)}_tb"].to_numpy(), part[f"{_col(m)}_ot"].to_numpy())
                rows.append({"policy": p, "window": window, "metric": m, **error_summary(rel)})
    return pd.DataFrame(rows)


def stage_gap_table(pairs: pd.DataFrame, policies: Sequence[str]) -> pd.DataFrame:
    """Per policy, window and span (and "e2e"), over the requests ok on both sides: n (requests with the
    span on both sides), testbed_mean_s, other_mean_s, gap_mean_s = mean of (other - testbed), and
    share = gap_mean_s / the E2E row's gap_mean_s (NaN where that is 0 or NaN)."""
    ok = _both_ok(pairs)
    rows = []
    for p in policies:
        sel = ok[ok["policy"] == p]
        for window in WINDOWS:
            part = _window(sel, window)
            block = []
            for m in (*SPAN_NAMES, "e2e"):
                t = part[f"{_col(m)}_tb"].to_numpy(dtype=float)
                o = part[f"{_col(m)}_ot"].to_numpy(dtype=float)
                keep = np.isfinite(t) & np.isfinite(o)
                n = int(keep.sum())
                block.append({"policy": p, "window": window, "stage": m, "n": n,
                              "testbed_mean_s": float(t[keep].mean()) if n else NAN,
                              "other_mean_s": float(o[keep].mean()) if n else NAN,
                              "gap_mean_s": float((o[keep] - t[keep]).mean()) if n else NAN})
            e2e = block[-1]["gap_mean_s"]
            for r in block:
                r["share"] = r["gap_mean_s"] / e2e if np.isfinite(e2e) and e2e != 0 else NAN
            rows.extend(block)
    return pd.DataFrame(rows)


def _run_stats(frame: pd.DataFrame) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (policy, seed): n_ok and each (metric, stat) of TTFT, TPOT, E2E over the ok requests."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    ok = frame[frame["cls"] == Outcome.OK]
    for (p, s), g in ok.groupby(["policy", "seed"]):
        row: dict[str, Any] = {"n_ok": len(g)}
        for m in LATENCIES:
            x = g[_col(m)].to_numpy(dtype=float)
            for stat in SUMMARY_STATS:
                row[(m, stat)] = summary_stat(x, stat)
        out[(str(p), int(s))] = row
    # a run without ok requests still counts as a run of the pair, with NaN statistics
    for p, s in set(zip(frame["policy"], frame["seed"])) - set(out):
        out[(str(p), int(s))] = {"n_ok": 0, **{(m, st): NAN for m in LATENCIES for st in SUMMARY_STATS}}
    return out


def mape_tables(testbed: pd.DataFrame, other: pd.DataFrame,
                policies: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ape, mape). ape: per policy, seed (present on both sides), metric and stat: testbed, other
    and ape. mape: per policy (and "all"), metric and stat: n_seeds (seeds with an APE), n_ok_testbed and
    n_ok_other (ok requests pooled over the seeds), testbed and other (their means over the seeds;
    NaN in "all") and mape; p99 NaN where a side pools fewer than 200 ok requests."""
    st_tb, st_ot = _run_stats(testbed), _run_stats(other)
    ape_rows, mape_rows = [], []
    for p in policies:
        seeds = sorted(s for q, s in st_tb if q == p and (q, s) in st_ot)
        n_tb = sum(st_tb[(p, s)]["n_ok"] for s in seeds)
        n_ot = sum(st_ot[(p, s)]["n_ok"] for s in seeds)
        for m in LATENCIES:
            for stat in SUMMARY_STATS:
                pooled = stat != "p99" or min(n_tb, n_ot) >= P99_MIN_POOLED
                vals = []
                for s in seeds:
                    t, o = st_tb[(p, s)][(m, stat)], st_ot[(p, s)][(m, stat)]
                    e = ape(t, o) if pooled else NAN
                    vals.append((t, o, e))
                    ape_rows.append({"policy": p, "seed": s, "metric": m, "stat": stat, "testbed": t, "other": o,
                                     "ape": e})
                errs = np.array([e for _, _, e in vals], dtype=float)
                have = errs[np.isfinite(errs)]
                mape_rows.append({"policy": p, "metric": m, "stat": stat, "n_seeds": int(have.size),
                                  "n_ok_testbed": n_tb, "n_ok_other": n_ot,
                                  "testbed": _mean([t for t, _, _ in vals]), "other": _mean([o for _, o, _ in vals]),
                                  "mape": float(have.mean()) if have.size else NAN})
    mape = pd.DataFrame(mape_rows)
    if len(mape):
        for m in LATENCIES:
            for stat in SUMMARY_STATS:
                sel = mape[(mape["metric"] == m) & (mape["stat"] == stat)]
                have = sel["mape"].to_numpy(dtype=float)
                have = have[np.isfinite(have)]
                mape_rows.append({"policy": ALL, "metric": m, "stat": stat, "n_seeds": int(sel["n_seeds"].sum()),
                                  "n_ok_testbed": int(sel["n_ok_testbed"].sum()),
                                  "n_ok_other": int(sel["n_ok_other"].sum()), "testbed": NAN, "other": NAN,
                                  "mape": float(have.mean()) if have.size else NAN})
    cols = ["policy", "metric", "stat", "n_seeds", "n_ok_testbed", "n_ok_other", "testbed", "other", "mape"]
    return (pd.DataFrame(ape_rows, columns=["policy", "seed", "metric", "stat", "testbed", "other", "ape"]),
            pd.DataFrame(mape_rows, columns=cols))


def _mean(xs: Sequence[float]) -> float:
    x = np.asarray(xs, dtype=float)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else NAN


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class PairedReport:
    """The paired report of the testbed against ``versus`` ("sim", or "repeat": a second testbed run of
    each seed). Every table has a policy column; see the module docstring for the definitions."""

    versus: str
    policies: tuple[str, ...]
    agreement: pd.DataFrame  # agreement_table
    agreement_seeds: pd.DataFrame  # agreement_by_seed
    confusion: pd.DataFrame  # confusion_table
    errors: pd.DataFrame  # error_table
    stages: pd.DataFrame  # stage_gap_table
    mape: pd.DataFrame  # mape_tables' mape
    ape: pd.DataFrame  # mape_tables' ape (per seed)

    def agreement_of(self, policy: str) -> tuple[float, int]:
        """(outcome agreement, matched requests) of a policy; (NaN, 0) when it has none."""
        row = self.agreement[self.agreement["policy"] == policy]
        return (float(row["agreement"].iloc[0]), int(row["matched"].iloc[0])) if len(row) else (NAN, 0)


def paired_from_frames(testbed: pd.DataFrame, other: pd.DataFrame, versus: str = "sim",
                       policies: Sequence[str] | None = None) -> PairedReport:
    """The paired report of two sides' request frames (:func:`request_frame`, :func:`concat_frames`);
    ``policies`` default to the testbed's that the other side also holds, in the testbed's order."""
    if policies is None:
        theirs = set(other["policy"])
        policies = [p for p in dict.fromkeys(testbed["policy"]) if p in theirs]
    policies = tuple(policies)
    pairs = pair_frames(testbed, other)
    ape_t, mape_t = mape_tables(testbed, other, policies)
    return PairedReport(versus=versus, policies=policies, agreement=agreement_table(pairs, policies),
                        agreement_seeds=agreement_by_seed(pairs, policies), confusion=confusion_table(pairs, policies), errors=error_table(pairs, policies),
                        stages=stage_gap_table(pairs, policies), mape=mape_t, ape=ape_t)


def paired_report(testbed_dirs: Iterable[Path | str], other_dirs: Iterable[Path | str],
                  versus: str = "sim", policies: Sequence[str] | None = None) -> PairedReport:
    """The paired report of the testbed runs in or below ``testbed_dirs`` against the runs in or below
    ``other_dirs``: simulator runs (``versus="sim"``) or a second set of testbed runs (``"repeat"``).
    A run of the wrong world on either side raises a one-line ValueError."""
    tb = load_frames(testbed_dirs, "testbed")
    ot = load_frames(other_dirs, "testbed" if versus == "repeat" else "sim")
    return paired_from_frames(tb, ot, versus, policies)
