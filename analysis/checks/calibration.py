"""Calibration checked against the run: each calibrated fit against the run's quiet requests.

`testbed calibrate` fits the simulator's engine and link models on the testbed's engines one at a
time (core/calibration/fit.py). This module asks whether those fits describe what the same engines did
in a run, on the requests nothing else explains:

* **quiet request**: ``ok``, its life ``[arrival_s, end_s]`` overlaps no fault's window (each
  ``fault_id`` from its first ``apply`` to its last ``clear``, open-ended if never cleared; every
  kind of fault counts) and its host mark (analysis/run/host_stall.py) is not ``host_stalled``. A request
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

* **the control path's legs** (core/spec/model.py EngineSpec; fitted under the run's conditions by
  analysis/checks/refit.py, 0 in an engines-alone calibration): ``prefill_call`` measured
  ``prefill_start_s - arrival_s`` of requests that found their prefill worker idle (none that
  arrived before them still in prefill) against ``prefill_call_s``; ``decode_call`` measured
  ``kv_start_s - prefill_end_s`` against ``decode_call_s``; ``first_token`` measured
  ``first_token_s - kv_end_s`` against ``decode_join_s`` plus one step at the batch the request
  joined (every request on its decode worker in the batch at its ``kv_end_s``, itself included).

Residuals are relative to the measured value, ``(predicted - measured) / measured``, as the paired
report's errors are (relative to the testbed's). Per run (policy, seed) and pooled over runs, per
stage: ``n_ok`` (ok requests that measured the stage), ``n_quiet`` (of them, those checked), the medians of measured and predicted, the median relative residual, the p90
of its absolute value, and ``flag``: the median misses by more than :data:`CALIBRATION_MISS`.

**Fitting apart from judging.** A calibration under the run's conditions names the runs it was
fitted on (``source.conditions.runs``); on them its median residual is 0 by construction, so such a
run is marked (``fitted_on``), never flagged and left out of the pooled row. The pooled row is judged
with the run as the unit, by the rule of analysis/rule/verdict.py: each judged run's median residual
is one value, and ``verdict`` says whether their interval lies inside +-:data:`CALIBRATION_MISS`
(pass), wholly outside (fail: ``flag``) or neither (undecided); the median over the requests of
every run (``rel_residual_p50``) is shown beside it as a description.
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

from analysis.run.host_stall import timed_out_at
from analysis.run.metrics import ok_mask
from analysis.run.data import RunData, load_run
from analysis.run.summary import discover_runs
from analysis.rule.verdict import FAIL, inside, interval
from core.calibration.fit import EngineCalibration, NetworkCalibration
from core.engine_timing import decode_step_s, lone_pull_s, prefill_s
from core.topology import GBPS
from vocab import PREFILL

# A fit whose median misses the run's quiet requests by more than 15% is flagged.
CALIBRATION_MISS = 0.15
# The fitted engine models checked (core/calibration/fit.py's fits of the same names): not the request's
# stages (vocab.STAGES), though the first shares a name with one.
FITS = ("prefill", "decode_step", "kv_pull")
# The control path's legs (core/spec/model.py EngineSpec prefill_call_s, decode_call_s, decode_join_s),
# checked like the stages: what the engine models leave out of a request's life.
LEGS = ("prefill_call", "decode_call", "first_token")
CHECKED = (*FITS, *LEGS)
CSV_NAME = "calibration_check.csv"
POOLED = "all"  # the policy column of the rows pooled over every run
COLUMNS = ("policy", "seed", "stage", "n_ok", "n_quiet", "measured_p50_s", "predicted_p50_s",
           "rel_residual_p50", "abs_rel_residual_p90", "fitted_on", "n_runs", "verdict", "flag")


def _models(calibration: Mapping[str, Any] | BaseModel) -> tuple[EngineCalibration, NetworkCalibration]:
    """The engine and network blocks of a calibration, a :class:`core.calibration.fit.Calibration` or
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
    return prefill_s(engine.prefill_overhead_s, engine.prefill_tokens_per_s, np.asarray(batch_tokens, float))


def decode_windows(requests: pd.DataFrame, spec: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, when it was in its decode worker's batch: ``kv_end_s`` (``first_token_s``
    without it) to ``end_s``, a timeout without an end to when the router gave it up; NaN where
    unknown (module docstring)."""
    a = np.fmin(requests["kv_end_s"].to_numpy(float), requests["first_token_s"].to_numpy(float))
    b = requests["end_s"].to_numpy(float)
    b = np.where(np.isnan(b), timed_out_at(requests, dict(spec)), b)
    return a, b


def decode_pieces(requests: pd.DataFrame, spec: Mapping[str, Any], which: np.ndarray) -> pd.DataFrame:
    """The pieces of each ``which`` request's ``[first_token_s, end_s]`` over which its decode
    worker's batch and KV were constant, rebuilt from every request's time in that batch (module
    docstring): one row per piece, ``row`` (the request's position in ``requests``), ``d`` (its
    seconds), ``n`` (sequences in the batch) and ``kv`` (their KV tokens). Requests without a
    window have none. The pieces depend on the records alone, so a fit can price them at any step
    model (analysis/checks/refit.py) and the check at the calibration's."""
    a, b = decode_windows(requests, spec)
    first = requests["first_token_s"].to_numpy(float)
    valid = np.isfinite(a) & np.isfinite(b) & (b > a)
    which = np.asarray(which, bool) & valid & np.isfinite(first) & (b > first)
    kv = requests["prompt_tokens"].to_numpy(float) + requests["output_tokens"].to_numpy(float) / 2
    workers = requests["decode_worker"].to_numpy()
    parts: list[pd.DataFrame] = []
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
        n, k, d = np.cumsum(dn)[:-1], np.cumsum(dkv)[:-1], np.diff(edges)
        i, j = np.searchsorted(edges, first[mine]), np.searchsorted(edges, b[mine])
        for row, lo, hi in zip(mine, i, j):
            parts.append(pd.DataFrame({"row": row, "d": d[lo:hi], "n": n[lo:hi], "kv": k[lo:hi]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in ("row", "d", "n", "kv")})


def tpot_of_pieces(pieces: pd.DataFrame, size: int, base_s: float, per_seq_s: float, per_kv_token_s: float) -> np.ndarray:
    """Each request's mean step over its pieces at the step model ``base + per_seq x n + per_kv x
    kv``: ``sum(d_i) / sum(d_i / step_i)`` (time spent at a step of ``step_i`` makes ``d_i /
    step_i`` tokens); NaN for the rows (of ``size``) without pieces."""
    rows = pieces["row"].to_numpy(int)
    d = pieces["d"].to_numpy(float)
    step = decode_step_s(base_s, per_seq_s, per_kv_token_s, pieces["n"].to_numpy(float), pieces["kv"].to_numpy(float))
    time = np.bincount(rows, weights=d, minlength=size)
    tokens = np.bincount(rows, weights=d / step, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, time / tokens, np.nan)


def predicted_tpot_s(requests: pd.DataFrame, engine: EngineCalibration, spec: Mapping[str, Any],
                     which: np.ndarray) -> np.ndarray:
    """The step model's mean step over each ``which`` request's ``[first_token_s, end_s]``, with the
    batch and its KV rebuilt piecewise-constant from every request's time in that decode worker's
    batch (module docstring). NaN for requests not in ``which`` or without a window."""
    return tpot_of_pieces(decode_pieces(requests, spec, which), len(requests), engine.decode_step_base_s,
                          engine.decode_step_per_seq_s, engine.decode_step_per_kv_token_s)


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
    return lone_pull_s(engine.kv_transfer_latency_s, np.asarray(kv_bytes, float), network.unshaped_gbps * GBPS)


# --------------------------------------------------------------------------- per run, then the table


def quiet_samples(run: RunData, step_tol_s: float) -> dict[str, pd.DataFrame]:
    """Per stage and leg, what one run's quiet requests measured and what a model needs to predict
    it (module docstring): ``request_id``, ``measured_s`` and, for ``prefill``, ``batch_tokens``; for
    ``decode_step``, ``row`` (the request's position, whose pieces ``attrs["pieces"]`` holds); for
    ``kv_pull`` (lone pulls only), ``kv_bytes``; for ``prefill_call`` (requests that found their
    prefill worker idle), ``idle``; for ``first_token``, the ``batch`` and ``kv_tokens`` it joined. ``step_tol_s``: how close two prefills' times are
    to be one batch (one engine step). ``attrs["n_ok"]``: per stage, the ok requests that measured it."""
    req = run.requests.reset_index(drop=True)
    marks = run.host_marks.reset_index(drop=True) if len(run.host_marks.columns) else None
    quiet = quiet_mask(req, run.faults, marks)
    ok = ok_mask(req)
    out_tokens = req["output_tokens"].to_numpy(float)
    spec = run.meta.get("spec") or {}
    measured = {
        "prefill": (req["prefill_end_s"] - req["prefill_start_s"]).to_numpy(float),
        "decode_step": np.where(out_tokens > 1, (req["end_s"] - req["first_token_s"]).to_numpy(float)
                                / np.maximum(out_tokens - 1, 1), np.nan),
        "kv_pull": (req["kv_end_s"] - req["kv_start_s"]).to_numpy(float),
        "prefill_call": (req["prefill_start_s"] - req["arrival_s"]).to_numpy(float),
        "decode_call": (req["kv_start_s"] - req["prefill_end_s"]).to_numpy(float),
        "first_token": (req["first_token_s"] - req["kv_end_s"]).to_numpy(float),
    }
    pieces = decode_pieces(req, spec, quiet & (out_tokens > 1))
    has_pieces = np.zeros(len(req), bool)
    has_pieces[pieces["row"].to_numpy(int)] = True
    n_at, kv_at = batch_at_join(req, spec)
    # what each model is given; a NaN (or a negative) leaves the request out of that stage
    features = {
        "prefill": {"batch_tokens": prefill_batch_tokens(req, step_tol_s)},
        "decode_step": {"row": np.where(has_pieces, np.arange(len(req)), -1)},
        "kv_pull": {"kv_bytes": np.where(lone_pulls(req, run.dead_pulls, spec), req["kv_bytes"].to_numpy(float), np.nan)},
        "prefill_call": {"idle": np.where(found_idle(req), 0.0, np.nan)},
        "decode_call": {"none": np.zeros(len(req))},
        "first_token": {"batch": n_at, "kv_tokens": kv_at},
    }
    out: dict[str, pd.DataFrame] = {}
    for stage in CHECKED:
        m = measured[stage]
        cols = features[stage]
        x = np.column_stack(list(cols.values()))
        sel = quiet & np.isfinite(m) & (m > 0) & np.isfinite(x).all(axis=1) & (x >= 0).all(axis=1)
        frame = pd.DataFrame({"request_id": req["request_id"].to_numpy()[sel], "measured_s": m[sel],
                              **{k: v[sel] for k, v in cols.items()}})
        frame.attrs["n_ok"] = int((ok & np.isfinite(m)).sum())
        if stage == "decode_step":
            frame.attrs["pieces"], frame.attrs["size"] = pieces, len(req)
        out[stage] = frame
    return out


def found_idle(requests: pd.DataFrame) -> np.ndarray:
    """Requests whose prefill worker had no other request in hand when they arrived (none arrived
    before them whose prefill had not ended): their ``prefill_start_s - arrival_s`` is the call's
    path alone, no queue."""
    a = requests["arrival_s"].to_numpy(float)
    end = requests["prefill_end_s"].to_numpy(float)
    end = np.where(np.isnan(end), np.inf, end)  # never ended: busy from its arrival on
    workers = requests["prefill_worker"].to_numpy()
    idle = np.zeros(len(requests), bool)
    for w in pd.unique(workers):
        idx = np.flatnonzero(workers == w)
        idx = idx[np.argsort(a[idx], kind="stable")]
        busy_until = np.r_[-np.inf, np.maximum.accumulate(end[idx])[:-1]]  # latest end among earlier arrivals
        idle[idx] = busy_until <= a[idx]
    return idle


def batch_at_join(requests: pd.DataFrame, spec: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the sequences and KV tokens in its decode worker's batch as its pull ended
    (``kv_end_s``), itself included: the batch whose step makes its first token (NaN without a
    pull end)."""
    a, b = decode_windows(requests, spec)
    t = requests["kv_end_s"].to_numpy(float)
    kv = requests["prompt_tokens"].to_numpy(float) + requests["output_tokens"].to_numpy(float) / 2
    workers = requests["decode_worker"].to_numpy()
    n_at, kv_at = np.full(len(requests), np.nan), np.full(len(requests), np.nan)
    valid = np.isfinite(a) & np.isfinite(b)
    for w in pd.unique(workers[np.isfinite(t)]):
        on = np.flatnonzero(valid & (workers == w))
        mine = np.flatnonzero(np.isfinite(t) & (workers == w))
        inside = (a[on][None, :] <= t[mine][:, None]) & (t[mine][:, None] < b[on][None, :])
        n_at[mine] = inside.sum(axis=1)
        kv_at[mine] = inside @ kv[on]
    return n_at, kv_at


def predict(stage: str, samples: pd.DataFrame, engine: EngineCalibration, network: NetworkCalibration) -> np.ndarray:
    """The calibration's prediction for each of a stage's :func:`quiet_samples`."""
    if stage == PREFILL:
        return predicted_prefill_s(samples["batch_tokens"].to_numpy(float), engine)
    if stage == "kv_pull":
        return predicted_pull_s(samples["kv_bytes"].to_numpy(float), engine, network)
    if stage == "prefill_call":
        return np.full(len(samples), engine.prefill_call_s)
    if stage == "decode_call":
        return np.full(len(samples), engine.decode_call_s)
    if stage == "first_token":
        return engine.decode_join_s + decode_step_s(engine.decode_step_base_s, engine.decode_step_per_seq_s,
                                                    engine.decode_step_per_kv_token_s, samples["batch"].to_numpy(float),
                                                    samples["kv_tokens"].to_numpy(float))
    tpot = tpot_of_pieces(samples.attrs["pieces"], samples.attrs["size"], engine.decode_step_base_s,
                          engine.decode_step_per_seq_s, engine.decode_step_per_kv_token_s)
    return tpot[samples["row"].to_numpy(int)]


def quiet_residuals(run: RunData, calibration: Mapping[str, Any] | BaseModel) -> pd.DataFrame:
    """Per quiet request and stage of one run: ``request_id``, ``stage``, ``measured_s``,
    ``predicted_s``, ``rel_residual`` ((predicted - measured) / measured); plus, per stage, how
    many ok requests measured it (``attrs["n_ok"]``)."""
    engine, network = _models(calibration)
    frames, n_ok = [], {}
    for stage, smp in quiet_samples(run, engine.decode_step_base_s).items():
        n_ok[stage] = smp.attrs["n_ok"]
        m, p = smp["measured_s"].to_numpy(float), predict(stage, smp, engine, network)
        frames.append(pd.DataFrame({"request_id": smp["request_id"].to_numpy(), "stage": stage,
                                    "measured_s": m, "predicted_s": p, "rel_residual": (p - m) / m}))
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


def fitted_runs(calibration: Mapping[str, Any] | BaseModel) -> set[Path]:
    """The run directories a calibration under the run's conditions was fitted on
    (``source.conditions.runs``), resolved; empty for an engines-alone calibration."""
    source = calibration.get("source") if isinstance(calibration, Mapping) else getattr(calibration, "source", None)
    conditions = (source or {}).get("conditions") if isinstance(source, Mapping) else None
    runs = conditions.get("runs") if isinstance(conditions, Mapping) else None
    return {Path(r).resolve() for r in runs or ()}


def calibration_check(testbed_dirs: Sequence[Path | str], calibration: Mapping[str, Any] | BaseModel) -> pd.DataFrame:
    """The check's table (module docstring) for the runs in or below ``testbed_dirs``: one row per
    run (policy, seed) and stage, then one per stage pooled over every run the calibration was not
    fitted on (policy ``"all"``, seed NA); columns :data:`COLUMNS`."""
    _models(calibration)  # a bad calibration fails before any run is read
    fitted = fitted_runs(calibration)
    rows: list[dict[str, Any]] = []
    pooled: list[pd.DataFrame] = []
    pooled_ok = dict.fromkeys(CHECKED, 0)
    medians: dict[str, list[float]] = {stage: [] for stage in CHECKED}
    for d in discover_runs(testbed_dirs):
        run = load_run(d)
        res = quiet_residuals(run, calibration)
        mine = Path(d).resolve() in fitted
        if not mine:
            pooled.append(res)
        for stage in CHECKED:
            n_ok = res.attrs["n_ok"][stage]
            row = _summary(res[res["stage"] == stage], n_ok)
            if mine:  # fitted on it: a residual of 0 by construction, not judged
                row.update(flag=False)
            else:
                pooled_ok[stage] += n_ok
                if row["n_quiet"]:
                    medians[stage].append(row["rel_residual_p50"])
            rows.append({"policy": run.policy, "seed": run.seed, "stage": stage, **row, "fitted_on": mine,
                         "n_runs": 1, "verdict": "fitted on" if mine else ""})
    every = pd.concat(pooled, ignore_index=True) if pooled else pd.DataFrame(columns=["stage", "rel_residual"])
    for stage in CHECKED:
        verdict = inside(interval(medians[stage]), -CALIBRATION_MISS, CALIBRATION_MISS)
        rows.append({"policy": POOLED, "seed": pd.NA, "stage": stage,
                     **_summary(every[every["stage"] == stage], pooled_ok[stage]), "fitted_on": False,
                     "n_runs": len(medians[stage]), "verdict": verdict, "flag": verdict == FAIL})
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    table["flag"] = table["flag"].astype(bool)
    table["fitted_on"] = table["fitted_on"].astype(bool)
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
    t = Table(title=escape(f"Calibration checked against the run's quiet requests (flag: |median residual| > "
                           f"{CALIBRATION_MISS:.0%}; over runs: the rule, the run as the unit)"))
    for h in ("policy", "seed", "stage", "quiet / ok", "measured p50", "predicted p50", "residual p50",
              "|residual| p90", "flag"):
        t.add_column(h, no_wrap=h in ("policy", "stage"))
    for _, r in table.iterrows():
        flag = "[bold red]MISS[/]" if r["flag"] else ("–" if r["n_quiet"] == 0 else "[green]ok[/]")
        if r["fitted_on"]:
            flag = "fitted on"
        elif r["policy"] == POOLED:
            flag = f"{flag} ({r['verdict']}, {r['n_runs']} runs)"
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
