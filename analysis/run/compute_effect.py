"""A compute fault's effect as the engine felt it, read from the requests of either world.

The fault agent's ``measured`` factor (faults.parquet) is, on the CPU, what it set up: the quota
its cgroup gives a probe that saturates it, and a CPU engine that was not using all of its cores
slows by less than its quota says (on a GPU it is the engines' own probe requests' slow-down,
testbed/faults/felt.py, the clock ratio beside it). This table reads the slow-down from the
requests themselves: the prefill time per prompt token of the faulted pod's requests that
prefilled wholly inside the fault's window, over a baseline measured in the same run:

* ``outside``: the same pod's prefills wholly outside every compute fault on it (the same engine,
  other times), where the run has at least OUTSIDE_MIN of them;
* else ``others``: the prefills inside the window on the pods no compute fault touched (the same
  time and host, other engines).

Medians, so one host stall does not decide where there are several; the counts stand beside the
figure. A run that never prefilled on the faulted pod inside its window, or has no baseline,
gets NaN.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.run.data import RunData
from vocab import FAULT_COMPUTE

MIN_REQUESTS = 1  # prefills on either side for a figure at all (the counts are in the table)
OUTSIDE_MIN = 3  # the same engine at other times, preferred as the baseline from this many prefills
COLUMNS = ("policy", "seed", "world", "pod", "start_s", "end_s", "asked", "measured", "engine_slowdown",
           "baseline", "n_inside", "n_baseline")


def _windows(faults: pd.DataFrame) -> pd.DataFrame:
    """Each compute fault's applied span per pod: start_s, end_s (the run's end where never
    cleared), its asked factor and what the agent measured as it applied it."""
    c = faults[faults.kind == FAULT_COMPUTE].sort_values("time_s")
    rows = []
    for (fid, pod), g in c.groupby(["fault_id", "pod"], sort=False):
        applied = g[g.event == "apply"]
        if applied.empty:
            continue
        cleared = g[(g.event == "clear") & (g.time_s >= applied.time_s.iloc[0])]
        rows.append({"pod": int(pod), "start_s": float(applied.time_s.iloc[0]),
                     "end_s": float(cleared.time_s.iloc[0]) if len(cleared) else np.inf,
                     "asked": float(applied.severity.iloc[0]), "measured": float(applied.measured.iloc[0])})
    return pd.DataFrame(rows, columns=["pod", "start_s", "end_s", "asked", "measured"])


def run_compute_effect(run: RunData) -> pd.DataFrame:
    """One row per compute fault window and pod of ``run`` (COLUMNS); empty without one."""
    windows = _windows(run.faults)
    req = run.requests.dropna(subset=["prefill_start_s", "prefill_end_s"])
    req = req[req.prompt_tokens > 0]
    per_token = (req.prefill_end_s - req.prefill_start_s) / req.prompt_tokens
    faulted_pods = set(windows.pod)
    rows = []
    for w in windows.itertuples():
        inside = (req.prefill_start_s >= w.start_s) & (req.prefill_end_s <= w.end_s)
        mine = req.prefill_pod == w.pod
        spans = windows[windows.pod == w.pod]
        touched = np.zeros(len(req), bool)
        for s in spans.itertuples():  # overlapping any compute fault on this pod
            touched |= ((req.prefill_end_s > s.start_s) & (req.prefill_start_s < s.end_s)).to_numpy()
        n_in = int((inside & mine).sum())
        outside = mine & ~touched
        if int(outside.sum()) >= OUTSIDE_MIN:
            base, kind = per_token[outside], "outside"
        else:
            base, kind = per_token[inside & ~req.prefill_pod.isin(faulted_pods)], "others"
        slow = (float(per_token[inside & mine].median() / base.median())
                if n_in >= MIN_REQUESTS and len(base) >= MIN_REQUESTS else np.nan)
        rows.append({"policy": run.policy, "seed": run.seed, "world": run.world,
                     "pod": w.pod, "start_s": w.start_s, "end_s": w.end_s, "asked": w.asked, "measured": w.measured,
                     "engine_slowdown": slow, "baseline": kind, "n_inside": n_in, "n_baseline": int(len(base))})
    return pd.DataFrame(rows, columns=list(COLUMNS))

