"""Demand by state, measured in a run and held against the calibration's (docs/simulator.md "Demand by state").

The simulator's host model gives each engine a demand by what it does (simulator/host.py), and
`testbed calibrate` measures it in a window of a few seconds (HostCalibration.demand). This module
measures the same quantity in a run's own records, as the run loaded the host:

* each engine's CPU over each interval between two of its host samples (host.parquet ``cpu_s``,
  cumulative over all its processes' threads: testbed/engines/hoststats.py);
* its state over that interval, from the requests' stage times: a prefill engine ``compute``s
  where one of its prefills spans the whole interval, and ``hold``s where none overlaps it and KV
  it prefilled waits to be read over all of it (from ``prefill_end_s`` to the pull's end:
  ``kv_end_s``, else the dead pull's end, else when the router gave the request up); a decode
  engine ``decode``s where a request decodes over the whole interval (``kv_end_s`` to ``end_s``,
  or the give-up) and no pull to it overlaps it, and ``pull``s where a pull to it spans the
  interval and nothing decodes. Other intervals (idle, spinning, mixed) are not counted;
* every interval in which a prefill engine computes is a reference: each other engine's interval
  nearest it (midpoints within half a sample period) is rated against it, its CPU over the
  reference's, and ``background`` is the machine's busy CPU over the reference's interval
  (``busy_s``) beyond every engine's, over the reference's CPU (:func:`core.host_model.rate_against`,
  which `testbed calibrate` applies to its own window as well).

A state's demand is the median of its ratios times ``engine.host_engine_cores`` (the computing
engine's demand), per run and pooled over runs; ``residual`` is ``(calibration - run) / run``,
and ``flag`` marks a calibration that misses the run by more than CALIBRATION_MISS, as the
calibrated fits are flagged (analysis/checks/calibration.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.checks.calibration import CALIBRATION_MISS, POOLED, write_table
from analysis.run.host_stall import timed_out_at
from analysis.run.data import RunData, load_run
from analysis.run.summary import discover_runs
from core.host_model import rate_against, sample_intervals
from vocab import MEASURED_DEMANDS, ROLE_PREFILL

STATES = MEASURED_DEMANDS  # HostCalibration.demand's keys
CSV_NAME = "host_demand.csv"
COLUMNS = ("policy", "seed", "state", "n", "run_cores", "calibration_cores", "residual", "flag")


def _whole(start: np.ndarray, end: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per interval [t0, t1]: does one of the spans [start, end] cover all of it?"""
    return ((start[:, None] <= t0[None, :]) & (end[:, None] >= t1[None, :])).any(axis=0)


def _some(start: np.ndarray, end: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per interval [t0, t1]: does one of the spans overlap it?"""
    return ((start[:, None] < t1[None, :]) & (end[:, None] > t0[None, :])).any(axis=0)


def engine_intervals(run: RunData) -> pd.DataFrame:
    """One row per engine and interval between two of its host samples: worker, role, t0, t1, cpu
    (cores), busy (the machine's busy cores) and state (``compute``, ``hold``, ``pull``, ``decode``,
    or None where the engine did none of them all along)."""
    req, host = run.requests, run.host
    cols = ["worker", "role", "t0", "t1", "cpu", "busy", "state"]
    if host.empty or req.empty:
        return pd.DataFrame(columns=cols)
    spec = run.meta.get("spec") or {}
    gave = pd.Series(timed_out_at(req, spec), index=req.index)
    dead_end = (req["request_id"].map(run.dead_pulls.groupby("request_id")["end_s"].max())
                if len(run.dead_pulls) else pd.Series(np.nan, index=req.index))
    kv_end = req["kv_end_s"].fillna(dead_end).fillna(gave).to_numpy(float)
    end = req["end_s"].fillna(gave).to_numpy(float)
    out = []
    for w, g in host.sort_values(["worker", "time_s"]).groupby("worker"):
        if len(g) < 2:
            continue
        t0, t1, cpu = sample_intervals(g["time_s"], g["cpu_s"])
        busy = sample_intervals(g["time_s"], g["busy_s"])[2]
        role = str(g["role"].iloc[0])
        state = np.full(len(t0), None, dtype=object)
        if role == ROLE_PREFILL:
            m = (req["prefill_worker"] == w).to_numpy()
            ps, pe = (req.loc[m, c].to_numpy(float) for c in ("prefill_start_s", "prefill_end_s"))
            state[_whole(ps, pe, t0, t1)] = "compute"
            state[~_some(ps, pe, t0, t1) & _whole(pe, kv_end[m], t0, t1)] = "hold"
        else:
            m = (req["decode_worker"] == w).to_numpy()
            ks = req.loc[m, "kv_start_s"].to_numpy(float)
            pulling, decoding = _some(ks, kv_end[m], t0, t1), _some(kv_end[m], end[m], t0, t1)
            state[_whole(kv_end[m], end[m], t0, t1) & ~pulling] = "decode"
            state[_whole(ks, kv_end[m], t0, t1) & ~decoding] = "pull"
        out.append(pd.DataFrame({"worker": w, "role": role, "t0": t0, "t1": t1, "cpu": cpu, "busy": busy,
                                 "state": state}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def demand_ratios(run: RunData) -> pd.DataFrame:
    """Each engine interval in a counted state against a computing prefill engine's beside it, and
    the background (module docstring; core.host_model.rate_against): columns state, ratio."""
    iv = engine_intervals(run)
    if iv.empty:
        return pd.DataFrame(columns=["state", "ratio"])
    iv["mid"] = (iv["t0"] + iv["t1"]) / 2
    half = float(np.median(iv["t1"] - iv["t0"])) / 2
    by_worker = {w: g.sort_values("mid") for w, g in iv.groupby("worker")}
    rows: list[tuple[str, float]] = []
    for w, g in by_worker.items():
        ref = g[g["state"] == "compute"]
        others = [(o["mid"].to_numpy(float), o["cpu"].to_numpy(float), o["state"].to_numpy(object))
                  for v, o in by_worker.items() if v != w]
        rows += rate_against(ref["mid"].to_numpy(float), ref["cpu"].to_numpy(float), ref["busy"].to_numpy(float),
                             others, half)
    return pd.DataFrame(rows, columns=["state", "ratio"])


def _rows(ratios: pd.DataFrame, per: float, calibrated: Mapping[str, float]) -> list[dict[str, Any]]:
    out = []
    for state in STATES:
        r = ratios.loc[ratios["state"] == state, "ratio"].to_numpy(float)
        run_cores = float(np.median(r)) * per if r.size else math.nan
        cal = calibrated.get(state, math.nan)
        res = (cal - run_cores) / run_cores if r.size and run_cores > 0 and math.isfinite(cal) else math.nan
        out.append({"state": state, "n": int(r.size), "run_cores": run_cores, "calibration_cores": cal,
                    "residual": res, "flag": bool(abs(res) > CALIBRATION_MISS) if math.isfinite(res) else False})
    return out


def host_demand_check(testbed_dirs: Sequence[Path | str], calibrated: Mapping[str, float]) -> pd.DataFrame:
    """The table (module docstring) for the testbed runs in or below ``testbed_dirs`` against the
    calibration's demand by state (``HostCalibration.demand``; empty: nothing to hold it against):
    per run (policy, seed) and state, then pooled over the runs (policy ``"all"``)."""
    rows: list[dict[str, Any]] = []
    pooled: list[pd.DataFrame] = []
    per = 1.0
    for d in discover_runs(testbed_dirs):
        run = load_run(d)
        per = float(((run.meta.get("spec") or {}).get("engine") or {}).get("host_engine_cores", 1.0))
        ratios = demand_ratios(run)
        pooled.append(ratios)
        rows += [{"policy": run.policy, "seed": run.seed, **r} for r in _rows(ratios, per, calibrated)]
    every = pd.concat(pooled, ignore_index=True) if pooled else pd.DataFrame(columns=["state", "ratio"])
    rows += [{"policy": POOLED, "seed": pd.NA, **r} for r in _rows(every, per, calibrated)]
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    return table


def write_host_demand(table: pd.DataFrame, out_dir: Path | str) -> Path:
    """The table as ``out_dir``/host_demand.csv."""
    return write_table(table, out_dir, CSV_NAME)


def print_host_demand(table: pd.DataFrame, console: Console) -> None:
    """The pooled rows on the console (the per-run ones are in host_demand.csv); a calibration
    that misses the run by more than CALIBRATION_MISS marked MISS."""
    t = Table(title=escape(f"Host demand by state, cores: the run's against the calibration's "
                           f"(flag: |residual| > {CALIBRATION_MISS:.0%})"))
    for h in ("state", "intervals", "run", "calibration", "residual", "flag"):
        t.add_column(h)
    for _, r in table[table["policy"] == POOLED].iterrows():
        fmt = (lambda x, s: "–" if pd.isna(x) else format(x, s))
        flag = "[bold red]MISS[/]" if r["flag"] else ("–" if pd.isna(r["residual"]) else "[green]ok[/]")
        t.add_row(r["state"], str(r["n"]), fmt(r["run_cores"], ".2f"), fmt(r["calibration_cores"], ".2f"),
                  fmt(100 * r["residual"], "+.0f") + "%" * pd.notna(r["residual"]), flag)
    console.print(t)
    console.print("run: each engine's CPU against a computing prefill engine's beside it, x its demand "
                  "(docs/simulator.md \"Demand by state\"); residual = (calibration - run) / run")
    pooled = table[table["policy"] == POOLED]
    unseen = pooled.loc[pooled["n"] == 0, "state"].tolist()
    if unseen:
        console.print(f"[yellow]not checked: no interval of the run measures {', '.join(unseen)}[/]: a state is "
                      "counted only over host samples (every 0.5 s) that a computing prefill covers whole, and "
                      "these runs' prefills are shorter; the calibrated demand the simulator is given for "
                      "them is not held against the run")
