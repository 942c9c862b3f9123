"""Each request's part of host stall, from the engines' host samples (testbed/engines/hoststats.py).

A request's engines are its prefill engine from its routing to its prefill's end, and its decode
engine from there to its end (its deadline when it has none). Over those windows the samples give
``host_pressure``, the engines' nodes' CPU pressure as a share of the request's life (PSI "some": time
in which at least one runnable task waited for a CPU), and, as diagnostics, the engines' own CPU
time and run-queue wait (summed over their threads: a spinning thread is always runnable, so the
wait counts threads, not the request's delay).

A request is marked ``host_stalled`` when its prompt's forward pass took at least ``factor`` (2) times
its engine's calibrated time (``engine.prefill_overhead_s`` + prompt / ``engine.prefill_tokens_per_s``:
at most half of it was its own compute) while its engines' nodes were under CPU pressure half its
life or more, and no compute fault slowed its prefill pod then. Such a stall is the host's, not the
network fault's: on the 2-core testbed vLLM's CPU build keeps engines busy-waiting (docs/reliability.md
"The prefill stall, explained"), and a pull hanging on a throttled link keeps them at it for the whole
hang, which starves engines that have nothing to do with the link; a GPU engine of one device has
no such queue to spin on (not yet tried on a GPU). The factor 2 is a convention;
docs/history/2026-11-23-prefill-stall.md "Fault against control" shows the share marked at 1.5 and 3.
The simulator has no host: its runs have no marks (NaN).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from core.engine_timing import prefill_s
from core.limits import give_up_s, spec_first_token_limit
from vocab import FAULT_COMPUTE, Outcome

COLUMNS = ("host_pressure", "host_cpu_s", "host_wait_s", "host_lost_wakeup_s", "prefill_slowdown", "host_stalled")
PRESSURED = 0.5  # the share of a request's life under CPU pressure that counts as a pressured host
STALL_FACTOR = 2.0


def _at(samples: pd.DataFrame, col: str, t: np.ndarray) -> np.ndarray:
    """Cumulative ``col`` interpolated at times ``t`` (NaN outside the samples)."""
    x, y = samples["time_s"].to_numpy(float), samples[col].to_numpy(float)
    return np.interp(t, x, y, left=np.nan, right=np.nan) if len(x) else np.full(len(t), np.nan)


def request_host_stall(requests: pd.DataFrame, host: pd.DataFrame, deadline_s: float,
                       prefill_s: np.ndarray | None = None, compute_faulted: np.ndarray | None = None,
                       factor: float = STALL_FACTOR, gave_up_s: np.ndarray | None = None) -> pd.DataFrame:
    """Per request (``requests``' index): its engines' nodes' CPU pressure over its windows, its
    engines' CPU seconds, run-queue wait and seconds lost to missed wake-ups there, its prefill's
    slowdown over ``prefill_s`` (its engine's calibrated time per request; NaN: unknown) and whether
    it was ``host_stalled`` (``compute_faulted``: requests whose prefill pod was under a compute
    fault, never marked for pressure). ``gave_up_s``: when the router gave a failed request up
    (NaN: not known; then ``routed_s`` + ``deadline_s`` ends its window); a prefill it gave up
    has a lower bound on its slowdown, its time from its start to then."""
    out = pd.DataFrame(index=requests.index, columns=list(COLUMNS), dtype=float)
    if host.empty or requests.empty:
        out["host_stalled"] = pd.array([pd.NA] * len(out), dtype="boolean")
        return out
    start = requests["routed_s"].to_numpy(float)
    end = requests["end_s"].to_numpy(float)
    gave_up = np.full(len(requests), np.nan) if gave_up_s is None else np.asarray(gave_up_s, float)
    end = np.where(np.isnan(end), np.where(np.isnan(gave_up), start + deadline_s, gave_up), end)
    split = np.fmin(requests["prefill_end_s"].to_numpy(float), end)  # fmin: a NaN prefill end -> end
    lost_col = "lost_wakeup_s" in host.columns  # absent in host tables written before it
    sums = {c: np.zeros(len(requests)) for c in ("pressure_s", "cpu_s", "wait_s", "lost_wakeup_s")
            if c != "lost_wakeup_s" or lost_col}
    covered = np.zeros(len(requests))
    by_worker = {w: g.sort_values("time_s") for w, g in host.groupby("worker")}
    for col_worker, a, b in (("prefill_worker", start, split), ("decode_worker", split, end)):
        workers = requests[col_worker].to_numpy()
        for w, g in by_worker.items():
            m = (workers == w) & (b > a)
            if not m.any():
                continue
            deltas = {c: _at(g, c, b[m]) - _at(g, c, a[m]) for c in sums}
            ok = ~np.isnan(deltas["cpu_s"]) & ~np.isnan(deltas["pressure_s"])
            idx = np.flatnonzero(m)[ok]
            for c in sums:
                sums[c][idx] += deltas[c][ok]
            covered[idx] += (b[m] - a[m])[ok]
    seen = covered > 0
    life = np.where(seen, covered, np.nan)
    pressure = sums["pressure_s"] / life
    out["host_pressure"] = pressure
    out["host_cpu_s"] = np.where(seen, sums["cpu_s"], np.nan)
    out["host_wait_s"] = np.where(seen, sums["wait_s"], np.nan)
    lost = np.where(seen, sums["lost_wakeup_s"], np.nan) if lost_col else np.full(len(requests), np.nan)
    out["host_lost_wakeup_s"] = lost
    pf_end = requests["prefill_end_s"].to_numpy(float)
    pf_end = np.where(np.isnan(pf_end), gave_up, pf_end)  # a prefill given up: a lower bound
    took = pf_end - requests["prefill_start_s"].to_numpy(float)
    expected = np.full(len(requests), np.nan) if prefill_s is None else np.asarray(prefill_s, float)
    slowdown = took / expected
    out["prefill_slowdown"] = slowdown
    faulted = np.zeros(len(requests), bool) if compute_faulted is None else np.asarray(compute_faulted, bool)
    with np.errstate(invalid="ignore"):
        stalled = (slowdown >= factor) & (pressure >= PRESSURED) & ~faulted
        # Missed wake-ups are never the fault's: idle with work in it, the engine lost at least
        # (factor - 1) times the prompt's own time, as much as a slowdown of `factor` would.
        stalled |= lost >= (factor - 1) * expected
    marks = pd.array(stalled, dtype="boolean")
    marks[~seen] = pd.NA  # no samples over its life: no account, no mark
    out["host_stalled"] = marks
    return out


def _compute_faulted(requests: pd.DataFrame, faults: pd.DataFrame) -> np.ndarray:
    """Whether a compute fault was on the request's prefill pod at any time of its prefill."""
    out = np.zeros(len(requests), bool)
    comp = faults[faults["kind"] == FAULT_COMPUTE] if len(faults) else faults
    if comp.empty:
        return out
    a = requests["prefill_start_s"].to_numpy(float)
    b = requests["prefill_end_s"].to_numpy(float)
    pods = requests["prefill_pod"].to_numpy()
    for (fid, pod), rows in comp.groupby(["fault_id", "pod"]):
        on = rows.loc[rows["event"] == "apply", "time_s"].min()
        off = rows.loc[rows["event"] == "clear", "time_s"].max()
        off = np.inf if np.isnan(off) else off
        out |= (pods == pod) & (a < off) & (np.fmax(b, a) > on)
    return out


def run_host_marks(requests: pd.DataFrame, host: pd.DataFrame, meta: dict[str, Any],
                   faults: pd.DataFrame | None = None, factor: float = STALL_FACTOR) -> pd.DataFrame:
    """:func:`request_host_stall` of a run: its deadline and engine speed read from its run.json
    (``meta``), its compute faults from ``faults``. The engine speed is the one calibrated on the
    run's engines where run.json has it (``calibration``: the driver records the calibration it
    measured or was given), else the spec's nominal one. (The twin's spec says 4,100 tokens/s where
    its engines measure about 1,500: against the nominal speed a prefill at its own quiet pace is
    already 2.7x "its" time, and every request under pressure was marked.)"""
    spec = meta.get("spec") or {}
    engine = (meta.get("calibration") or {}).get("engine") or spec.get("engine") or {}
    deadline = float(spec.get("deadline_s", np.nan))
    rate, overhead = engine.get("prefill_tokens_per_s"), engine.get("prefill_overhead_s", 0.0)
    prefill = prefill_s(overhead, rate, requests["prompt_tokens"].to_numpy(float)) if rate else None
    faulted = _compute_faulted(requests, faults) if faults is not None else None
    return request_host_stall(requests, host, deadline, prefill, faulted, factor,
                              gave_up_s=timed_out_at(requests, spec))


def timed_out_at(requests: pd.DataFrame, spec: dict[str, Any]) -> np.ndarray:
    """When the router gave up each request that timed out (NaN for the others): without a first
    token at its first-token limit after arrival, else at its deadline (core/limits.py). Exact with
    retries too: the last attempt runs to the request's limit, not to its per-try one."""
    if not {"outcome", "arrival_s", "first_token_s"} <= set(requests.columns):  # not a run's records
        return np.full(len(requests), np.nan)
    timed_out = (requests["outcome"] == Outcome.TIMEOUT).to_numpy()
    ends = give_up_s(requests["arrival_s"], requests["first_token_s"].notna(), spec_first_token_limit(spec),
                     float(spec.get("deadline_s", np.nan)))
    return np.where(timed_out, ends, np.nan)
