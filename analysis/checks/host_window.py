"""The host inside and outside a run's fault window: what the testbed's machine was busy with.

A calibration under the run's conditions holds the host's share of the cores as the calibration
load found it (docs/twin.md "A calibration under the run's conditions"), and the simulator then
shares no cores (``conditions: run``). A fault can change that share: pulls stalled on a degraded
link keep their engines working (vLLM steps an engine whose scheduler holds a request every
millisecond, simulator/host.py), and the engines computing beside them get less of the cores.
This table measures it from the host samples of the testbed's runs (host.parquet, every 0.5 s:
testbed/engines/hoststats.py), so a latency gap inside the fault window can be told from one
outside it:

* per run, over the intervals between two samples that lie wholly inside the fault window
  (:func:`analysis.run.metrics.fault_window`) and those wholly outside it, the mean of the machine's
  busy cores (``busy_s``) and of every engine's CPU together (``cpu_s``, each engine's processes),
  and of the engines on a degraded pod and on the others apart;
* per policy, the mean over its runs (seeds).

Only for runs with host samples and a fault that was applied (the simulator's runs have none).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.run.metrics import fault_window
from analysis.run.data import load_run
from core.host_model import sample_intervals

CSV_NAME = "host_window.csv"
WINDOWS = ("inside", "outside")
COLUMNS = ("policy", "seed", "window", "intervals", "busy_cores", "engine_cores", "degraded_pod_cores",
           "other_pod_cores")


def run_host_window(host: pd.DataFrame, onset: float, end: float, degraded_pods: Sequence[int]) -> list[dict[str, Any]]:
    """One row per window ("inside": intervals wholly in [onset, end); "outside": wholly before onset
    or after end) of one run's host samples: intervals (of the machine's, counted once), the mean
    busy cores of the machine, and the mean CPU cores of all engines, of those on a degraded pod and
    of the others (the sum over engines of each one's mean)."""
    rows = {w: {"window": w, "intervals": 0, "busy_cores": np.nan, "engine_cores": 0.0,
                "degraded_pod_cores": 0.0, "other_pod_cores": 0.0} for w in WINDOWS}
    machine_counted = False  # the machine's busy counter is in every engine's samples: read it once
    for _, g in host.sort_values("time_s").groupby("worker", sort=True):
        t = g["time_s"].to_numpy(float)
        if len(t) < 2:
            continue
        t0, t1, cpu = sample_intervals(t, g["cpu_s"].to_numpy(float))
        _, _, busy = sample_intervals(t, g["busy_s"].to_numpy(float))
        masks = {"inside": (t0 >= onset) & (t1 <= end), "outside": (t1 <= onset) | (t0 >= end)}
        on_degraded = int(g["pod"].iloc[0]) in set(degraded_pods)
        for w, m in masks.items():
            if not m.any():
                continue
            r = rows[w]
            c = float(cpu[m].mean())
            r["engine_cores"] += c
            r["degraded_pod_cores" if on_degraded else "other_pod_cores"] += c
            if not machine_counted:
                r["intervals"], r["busy_cores"] = int(m.sum()), float(busy[m].mean())
        machine_counted = True
    return [r for r in rows.values() if r["intervals"]]


def host_window_table(testbed_dirs: Sequence[Path | str]) -> pd.DataFrame:
    """:func:`run_host_window` of every run with host samples and an applied fault, one row per
    (policy, seed, window); empty (with COLUMNS) where none has both."""
    rows = []
    for d in testbed_dirs:
        run = load_run(d)
        window = fault_window(run.faults, run.requests)
        if run.host.empty or window is None:
            continue
        for r in run_host_window(run.host, window.onset_s, window.end_s, window.pods):
            rows.append({"policy": run.policy, "seed": run.seed, **r})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def write_host_window(table: pd.DataFrame, out_dir: Path | str) -> Path:
    path = Path(out_dir) / CSV_NAME
    table.to_csv(path, index=False)
    return path


def print_host_window(table: pd.DataFrame, policies: Sequence[str], console: Console) -> None:
    """Per policy, the mean over its runs inside and outside the fault window."""
    if table.empty:
        return
    t = Table(title=escape("The testbed's host inside / outside the fault window (cores, mean over seeds): what "
                           "the machine was busy with while the fault lasted, which a calibration under the run's "
                           "conditions leaves out"))
    for h in ("policy", "machine busy", "all engines", "engines on degraded pods", "engines on the others"):
        t.add_column(h, justify="left" if h == "policy" else "right")
    means = table.groupby(["policy", "window"]).mean(numeric_only=True)
    for p in policies:
        if (p, "inside") not in means.index or (p, "outside") not in means.index:
            continue
        i, o = means.loc[(p, "inside")], means.loc[(p, "outside")]
        t.add_row(escape(p), *(f"{i[c]:.2f} / {o[c]:.2f}" for c in
                               ("busy_cores", "engine_cores", "degraded_pod_cores", "other_pod_cores")))
    console.print(t)
