"""Calibration checked against the run (issue 27): each calibrated fit against the run's quiet requests.

`testbed calibrate` fits the simulator's engine and link models on the testbed's engines one at a
time (core/calibration.py). This module asks whether those fits describe what the same engines did
in a run, on the requests nothing else explains:

* **quiet request**: ``ok``, its life ``[arrival_s, end_s]`` overlaps no fault's window (each
  ``fault_id`` from its first ``apply`` to its last ``clear``, open-ended if never cleared; every
  kind of fault counts) and its host mark (analysis/host.py) is not ``host_stalled``. A request
  without a mark (a simulated run, or no host samples over its life) is not marked stalled.
* **prefill**: measured ``prefill_end_s - prefill_start_s``; predicted
  ``prefill_overhead_s + batch tokens / prefill_tokens_per_s``, the batch being every request on
  the same ``prefill_worker`` with the same ``prefill_start_s`` and ``prefill_end_s`` (the
  simulator's batches start and end together; the testbed's start and end times are the router's
  clock plus the engine's offsets, so "the same" is within one engine step, the calibration's
  ``decode_step_base_s``: two allocations closer than the shortest step the engine takes cannot
  have been in different scheduler steps). The batch's tokens are summed over every request in
  it, quiet or not.
* **decode step**: measured TPOT ``(end_s - first_token_s) / (output_tokens - 1)`` (1-token
  outputs have none); predicted from the step model ``decode_step_base_s + decode_step_per_seq_s
  x n + decode_step_per_kv_token_s x kv`` with ``n`` and ``kv`` rebuilt from the records: every
  request on the same ``decode_worker`` is in the batch from its ``kv_end_s`` (its KV in, it joins
  the running batch and its first token comes a step later, in vLLM as in the simulator;
  ``first_token_s`` where no pull end was recorded) to its ``end_s`` (a timeout without an end to
  when the router gave it up, core/limits.py; an error without an end not at all), holding its
  prompt plus half its output as KV (the mean over its decode, as calibration counts a batch's KV;
  the simulator counts the prompt alone, a difference of ``per_kv_token x output / 2`` per
  sequence, well under a millisecond for the twin's 20-token outputs). Between two consecutive
  edges of those windows ``n`` and ``kv`` are constant (a piecewise-constant reconstruction: what
  the engine does beside its batch, such as pulls, is not modelled); over the request's own window
  ``[first_token_s, end_s]`` the prediction is its tokens' mean step, ``sum(d_i) / sum(d_i /
  step_i)`` over the pieces ``d_i`` (time spent at a step of ``step_i`` makes ``d_i / step_i``
  tokens).
* **KV pull**: measured ``kv_end_s - kv_start_s``; predicted ``kv_transfer_latency_s + kv_bytes /
  (unshaped_gbps x GBPS)``, the unshaped-pull model (a quiet request crossed no shaped link). The
  fit is of lone pulls, so only quiet pulls that overlapped no other pull on their prefill or
  decode worker are checked: pulls that share a NIC take longer by how they share it, which is
  the network model's business (simulator/network.py), not this fit's. A pull without a recorded
  end (given up in ``kv_transfer``) lasts to its end in ``dead_pulls``, else to when the router
  gave it up.

Residuals are relative to the measured value, ``(predicted - measured) / measured``, as the paired
report's errors are (relative to the testbed's). Per run (policy, seed) and pooled over runs, per
stage: ``n_ok`` (ok requests that measured the stage), ``n_quiet`` (of them, those checked), the medians of measured and predicted, the median relative residual, the p90
of its absolute value, and ``flag``: the median misses by more than :data:`CALIBRATION_MISS`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.host import timed_out_at
from analysis.metrics import ok_mask
from analysis.run_data import RunData, load_run
from analysis.summary import discover_runs
from core.calibration import EngineCalibration, NetworkCalibration
from core.topology import GBPS

# Issue 27 ("Calibration checked against the run"): a fit whose median misses the run's quiet
# requests by more than 15% is flagged.
CALIBRATION_MISS = 0.15
STAGES = ("prefill", "decode_step", "kv_pull")
CSV_NAME = "calibration_check.csv"
POOLED = "all"  # the policy column of the rows pooled over every run
COLUMNS = ("policy", "seed", "stage", "n_ok", "n_quiet", "measured_p50_s", "predicted_p50_s",
           "rel_residual_p50", "abs_rel_residual_p90", "flag")


def _models(calibration: Mapping[str, Any] | BaseModel) -> tuple[EngineCalibration, NetworkCalibration]:
    """The engine and network blocks of a calibration, a :class:`core.calibration.Calibration` or
    its ``model_dump()`` (what `testbed compare` holds); only those two blocks are read."""
    cal = calibration.model_dump() if isinstance(calibration, BaseModel) else calibration
    try:
        return EngineCalibration.model_validate(cal["engine"]), NetworkCalibration.model_validate(cal["network"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"calibration check: not a calibration (engine and network blocks): {e}") from None


# --------------------------------------------------------------------------- quiet requests


def fault_intervals(faults: pd.DataFrame) -> list[tuple[float, float]]:
    """Each fault's window, ``[first apply, last clear]`` per ``fault_id`` (+inf if never cleared)."""
    out = []
    for _, rows in faults.groupby("fault_id"):
        on = rows.loc[rows["event"] == "apply", "time_s"]
        if on.empty:
            continue
        off = rows.loc[rows["event"] == "clear", "time_s"]
        out.append((float(on.min()), float(off.max()) if not off.empty else math.inf))
    return out


def quiet_mask(requests: pd.DataFrame, faults: pd.DataFrame, host_marks: pd.DataFrame | None) -> np.ndarray:
    """Quiet requests (module docstring): ok, their life overlapping no fault window, not host-stalled."""
    a, b = requests["arrival_s"].to_numpy(float), requests["end_s"].to_numpy(float)
    quiet = ok_mask(requests) & np.isfinite(b)
    for on, off in fault_intervals(faults):
        quiet &= ~((a <= off) & (b >= on))
    if host_marks is not None and "host_stalled" in host_marks.columns:
        stalled = host_marks["host_stalled"].reindex(requests.index)
        quiet &= ~stalled.astype("boolean").fillna(False).to_numpy(bool)
    return quiet


# --------------------------------------------------------------------------- the three models


def prefill_batch_tokens(requests: pd.DataFrame, tol_s: float) -> np.ndarray:
    """Per request, the prompt tokens of its prefill batch: the requests on its prefill worker whose
    ``prefill_start_s`` and ``prefill_end_s`` are each within ``tol_s`` of the previous one's, in
    order of start (NaN for a request without both times)."""
    out = np.full(len(requests), np.nan)
    start = requests["prefill_start_s"].to_numpy(float)
    end = requests["prefill_end_s"].to_numpy(float)
    has = np.flatnonzero(np.isfinite(start) & np.isfinite(end))
    if has.size == 0:
        return out
    worker = requests["prefill_worker"].to_numpy()[has]
    order = has[np.lexsort((end[has], start[has], worker))]
    w, s, e = requests["prefill_worker"].to_numpy()[order], start[order], end[order]
    new = np.ones(len(order), bool)
    new[1:] = (w[1:] != w[:-1]) | (np.abs(s[1:] - s[:-1]) > tol_s) | (np.abs(e[1:] - e[:-1]) > tol_s)
    group = np.cumsum(new) - 1
    tokens = np.bincount(group, weights=requests["prompt_tokens"].to_numpy(float)[order])
    out[order] = tokens[group]
    return out


def predicted_prefill_s(batch_tokens: np.ndarray, engine: EngineCalibration) -> np.ndarray:
    return engine.prefill_overhead_s + np.asarray(batch_tokens, float) / engine.prefill_tokens_per_s


def decode_windows(requests: pd.DataFrame, spec: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, when it was in its decode worker's batch: ``kv_end_s`` (``first_token_s``
    without it) to ``end_s``, a timeout without an end to when the router gave it up; NaN where
    unknown (module docstring)."""
    a = np.fmin(requests["kv_end_s"].to_numpy(float), requests["first_token_s"].to_numpy(float))
    b = requests["end_s"].to_numpy(float)
    b = np.where(np.isnan(b), timed_out_at(requests, dict(spec)), b)
    return a, b


def predicted_tpot_s(requests: pd.DataFrame, engine: EngineCalibration, spec: Mapping[str, Any],
                     which: np.ndarray) -> np.ndarray:
    """The step model's mean step over each ``which`` request's ``[first_token_s, end_s]``, with the
    batch and its KV rebuilt piecewise-constant from every request's time in that decode worker's
    batch (module docstring). NaN for requests not in ``which`` or without a window."""
    out = np.full(len(requests), np.nan)
    a, b = decode_windows(requests, spec)
    first = requests["first_token_s"].to_numpy(float)
    valid = np.isfinite(a) & np.isfinite(b) & (b > a)
    which = np.asarray(which, bool) & valid & np.isfinite(first) & (b > first)
    kv = requests["prompt_tokens"].to_numpy(float) + requests["output_tokens"].to_numpy(float) / 2
    workers = requests["decode_worker"].to_numpy()
    for w in np.unique(workers[which]):
        on = valid & (workers == w)
        mine = np.flatnonzero(which & (workers == w))
        edges = np.unique(np.r_[a[on], b[on], first[mine]])
        # batch and KV on each piece [edges[i], edges[i+1]): windows opened minus windows closed
        opened = np.searchsorted(edges, a[on])
        closed = np.searchsorted(edges, b[on])
        dn = np.bincount(opened, minlength=len(edges)) - np.bincount(closed, minlength=len(edges))
        dkv = (np.bincount(opened, weights=kv[on], minlength=len(edges))
               - np.bincount(closed, weights=kv[on], minlength=len(edges)))
        n, k = np.cumsum(dn)[:-1], np.cumsum(dkv)[:-1]
        step = engine.decode_step_base_s + engine.decode_step_per_seq_s * n + engine.decode_step_per_kv_token_s * k
        tokens = np.r_[0.0, np.cumsum(np.diff(edges) / step)]  # steps made from the first edge on
        i, j = np.searchsorted(edges, first[mine]), np.searchsorted(edges, b[mine])
        out[mine] = (b[mine] - first[mine]) / (tokens[j] - tokens[i])
    return out


def lone_pulls(requests: pd.DataFrame, dead_pulls: pd.DataFrame, spec: Mapping[str, Any]) -> np.ndarray:
    """Requests whose KV pull overlapped no other pull on its prefill worker or its decode worker;
    a pull without a recorded end lasts to its ``dead_pulls`` end, else to its give-up time."""
    a = requests["kv_start_s"].to_numpy(float)
    b = requests["kv_end_s"].to_numpy(float)
    if len(dead_pulls):
        ends = dead_pulls.groupby("request_id")["end_s"].max()
        b = np.where(np.isnan(b), requests["request_id"].map(ends).to_numpy(float), b)
    b = np.where(np.isnan(b), timed_out_at(requests, dict(spec)), b)
    b = np.where(np.isnan(b), np.inf, b)  # never seen to end: overlaps all after it
    pulled = np.isfinite(a)
    lone = pulled.copy()
    for col in ("prefill_worker", "decode_worker"):
        workers = requests[col].to_numpy()
        for w in np.unique(workers[pulled]):
            idx = np.flatnonzero(pulled & (workers == w))
            idx = idx[np.argsort(a[idx], kind="stable")]
            s, e = a[idx], b[idx]
            before = np.r_[-np.inf, np.maximum.accumulate(e)[:-1]]  # latest end among earlier starts
            after = np.r_[s[1:], np.inf]  # the next start
            lone[idx] &= (before <= s) & (after >= e)
    return lone


def predicted_pull_s(kv_bytes: np.ndarray, engine: EngineCalibration, network: NetworkCalibration) -> np.ndarray:
    return engine.kv_transfer_latency_s + np.asarray(kv_bytes, float) / (network.unshaped_gbps * GBPS)


# --------------------------------------------------------------------------- per run, then the table


def quiet_residuals(run: RunData, calibration: Mapping[str, Any] | BaseModel) -> pd.DataFrame:
    """Per quiet request and stage of one run: ``request_id``, ``stage``, ``measured_s``,
    ``predicted_s``, ``rel_residual`` ((predicted - measured) / measured); plus, per stage, how
    many ok requests measured it (``attrs["n_ok"]``)."""
    engine, network = _models(calibration)
    req = run.requests.reset_index(drop=True)
    marks = run.host_marks.reset_index(drop=True) if len(run.host_marks.columns) else None
    quiet = quiet_mask(req, run.faults, marks)
    ok = ok_mask(req)
    out_tokens = req["output_tokens"].to_numpy(float)
    measured = {
        "prefill": (req["prefill_end_s"] - req["prefill_start_s"]).to_numpy(float),
        "decode_step": np.where(out_tokens > 1, (req["end_s"] - req["first_token_s"]).to_numpy(float)
                                / np.maximum(out_tokens - 1, 1), np.nan),
        "kv_pull": (req["kv_end_s"] - req["kv_start_s"]).to_numpy(float),
    }
    spec = run.meta.get("spec") or {}
    predicted = {
        "prefill": predicted_prefill_s(prefill_batch_tokens(req, engine.decode_step_base_s), engine),
        "decode_step": predicted_tpot_s(req, engine, spec, quiet & (out_tokens > 1)),
        "kv_pull": np.where(lone_pulls(req, run.dead_pulls, spec),
                            predicted_pull_s(req["kv_bytes"].to_numpy(float), engine, network), np.nan),
    }
    frames, n_ok = [], {}
    for stage in STAGES:
        m, p = measured[stage], predicted[stage]
        n_ok[stage] = int((ok & np.isfinite(m)).sum())
        sel = quiet & np.isfinite(m) & (m > 0) & np.isfinite(p)
        frames.append(pd.DataFrame({"request_id": req["request_id"].to_numpy()[sel], "stage": stage,
                                    "measured_s": m[sel], "predicted_s": p[sel],
                                    "rel_residual": (p[sel] - m[sel]) / m[sel]}))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["n_ok"] = n_ok
    return out


def _summary(rows: pd.DataFrame, n_ok: int) -> dict[str, Any]:
    rel = rows["rel_residual"].to_numpy(float)
    if rel.size == 0:
        return {"n_ok": n_ok, "n_quiet": 0, "measured_p50_s": math.nan, "predicted_p50_s": math.nan,
                "rel_residual_p50": math.nan, "abs_rel_residual_p90": math.nan, "flag": False}
    p50 = float(np.median(rel))
    return {"n_ok": n_ok, "n_quiet": int(rel.size), "measured_p50_s": float(rows["measured_s"].median()),
            "predicted_p50_s": float(rows["predicted_s"].median()), "rel_residual_p50": p50,
            "abs_rel_residual_p90": float(np.percentile(np.abs(rel), 90)), "flag": abs(p50) > CALIBRATION_MISS}


def calibration_check(testbed_dirs: Sequence[Path | str], calibration: Mapping[str, Any] | BaseModel) -> pd.DataFrame:
    """The check's table (module docstring) for the runs in or below ``testbed_dirs``: one row per
    run (policy, seed) and stage, then one per stage pooled over every run (policy ``"all"``, seed
    NA); columns :data:`COLUMNS`."""
    _models(calibration)  # a bad calibration fails before any run is read
    rows: list[dict[str, Any]] = []
    pooled: list[pd.DataFrame] = []
    pooled_ok = dict.fromkeys(STAGES, 0)
    for d in discover_runs(testbed_dirs):
        run = load_run(d)
        res = quiet_residuals(run, calibration)
        pooled.append(res)
        for stage in STAGES:
            n_ok = res.attrs["n_ok"][stage]
            pooled_ok[stage] += n_ok
            rows.append({"policy": run.policy, "seed": run.seed, "stage": stage,
                         **_summary(res[res["stage"] == stage], n_ok)})
    every = pd.concat(pooled, ignore_index=True) if pooled else pd.DataFrame(columns=["stage", "rel_residual"])
    for stage in STAGES:
        rows.append({"policy": POOLED, "seed": pd.NA, "stage": stage,
                     **_summary(every[every["stage"] == stage], pooled_ok[stage])})
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    table["flag"] = table["flag"].astype(bool)
    return table


def write_table(table: pd.DataFrame, out_dir: Path | str, name: str) -> Path:
    """The table as ``out_dir``/``name`` (CSV), the folder made if need be."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    table.to_csv(path, index=False)
    return path


def write_calibration_check(table: pd.DataFrame, out_dir: Path | str) -> Path:
    """The table as ``out_dir``/calibration_check.csv."""
    return write_table(table, out_dir, CSV_NAME)


def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None or pd.isna(x) else format(x, spec)


def print_calibration_check(table: pd.DataFrame, console: Console) -> None:
    """The table on the console; a flagged row (the fit misses the quiet requests' median by more
    than CALIBRATION_MISS) in red and marked MISS, the pooled rows in bold."""
    t = Table(title=escape(f"Calibration checked against the run's quiet requests "
                           f"(flag: |median residual| > {CALIBRATION_MISS:.0%})"))
    for h in ("policy", "seed", "stage", "quiet / ok", "measured p50", "predicted p50", "residual p50",
              "|residual| p90", "flag"):
        t.add_column(h, no_wrap=h in ("policy", "stage"))
    for _, r in table.iterrows():
        flag = "[bold red]MISS[/]" if r["flag"] else ("–" if r["n_quiet"] == 0 else "[green]ok[/]")
        cells = [escape(str(r["policy"])), _fmt(r["seed"], "d"), r["stage"], f"{r['n_quiet']} / {r['n_ok']}",
                 _fmt(r["measured_p50_s"], ".4f") + " s" * pd.notna(r["measured_p50_s"]),
                 _fmt(r["predicted_p50_s"], ".4f") + " s" * pd.notna(r["predicted_p50_s"]),
                 _fmt(100 * r["rel_residual_p50"], "+.0f") + "%" * pd.notna(r["rel_residual_p50"]),
                 _fmt(100 * r["abs_rel_residual_p90"], ".0f") + "%" * pd.notna(r["abs_rel_residual_p90"]), flag]
        style = "red" if r["flag"] else None
        if r["policy"] == POOLED:
            style = "bold red" if r["flag"] else "bold"
        t.add_row(*cells, style=style)
    console.print(t)
    console.print("residual = (predicted - measured) / measured; quiet: ok, outside every fault window, "
                  "not host-stalled (docs/twin.md \"Calibration checked against the run\")")
