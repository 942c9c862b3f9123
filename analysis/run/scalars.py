"""All scalar metrics of one run (:func:`run_metrics`), and the per-run accounts that only a whole
run directory gives: the host's part, KV leases, silent corruption, circuit breakers, dead work and
retries. The per-table metric definitions are in analysis/run/metrics.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.run.names import Metric as M, fail_share
from analysis.run.metrics import (
    NAN,
    latency_us,
    ok_mask,
    reaction_s,
    degraded_availability,
    degraded_pod_shares,
    failure_composition,
    failure_rate,
    fault_window,
    goodput_rps,
    latency_percentiles,
    resilience_index,
    recovery_s,
    timeout_share,
    traffic_deflection_ratio,
)
from analysis.run.data import RunData, load_run
from core.stages import AFTER_PREFILL
from core.records import NIXL_KV_EXPIRED, NIXL_READS_AFTER_EXPIRY
from vocab import FAULT_ENGINE, TESTBED, Outcome


def host_stall(run: RunData) -> dict[str, float]:
    """The host's part in a testbed run (analysis/run/host_stall.py): the share of requests whose prefill the
    host stalled, and the failure rate of the others, the fault's effect with the host's set apart.
    NaN where there are no host samples (the simulator, runs before them)."""
    if run.host.empty:
        return {M.HOST_STALLED_SHARE: NAN, M.FAILURE_RATE_UNSTALLED: NAN}
    req = run.requests
    stalled = run.host_marks["host_stalled"].fillna(False).to_numpy(bool)
    rest = req[~stalled]
    return {M.HOST_STALLED_SHARE: float(stalled.mean()) if len(req) else NAN,
            M.FAILURE_RATE_UNSTALLED: failure_rate(rest) if len(rest) else NAN}


def kv_leases(meta: dict[str, Any]) -> dict[str, float]:
    """A testbed run's expired KV leases, from its engines' counters over the run (run.json
    ``engines``): a prefill engine that freed KV a decoder had not finished reading, and the reads
    that finished after that (their KV may be another request's: docs/verified.md "The KV lease and
    silent corruption"). The lease is the deadline plus a margin unless engine.kv_lease_s sets it, and vLLM's decoder renews it while it
    holds the request (testbed/engines/engine.py), so an expiry belongs to a request the decoder
    dropped; canaries check the rest by the tokens. Runs on the same engines share the counters' timeline: an
    expiry or a read that lands just after a run's end counts in the next run. NaN in the
    simulator's runs (no engines)."""
    engines = meta.get("engines")
    if not isinstance(engines, dict) or not engines:
        return {M.KV_LEASES_EXPIRED: NAN, M.KV_READS_AFTER_EXPIRY: NAN}
    total = {M.KV_LEASES_EXPIRED: 0.0, M.KV_READS_AFTER_EXPIRY: 0.0}
    for counters in engines.values():
        if isinstance(counters, dict):
            total[M.KV_LEASES_EXPIRED] += float(counters.get(NIXL_KV_EXPIRED, 0.0))
            total[M.KV_READS_AFTER_EXPIRY] += float(counters.get(NIXL_READS_AFTER_EXPIRY, 0.0))
    return total


def corruption(requests: pd.DataFrame, meta: dict[str, Any], world: str) -> dict[str, float]:
    """Silent corruption: requests that decoded to their end from KV that was not their prompt's
    (outcome "corrupt"), over the requests whose output was checked. On the testbed those are the
    canaries that got a verdict (run.json ``canaries.checked``; core/canary.py); the simulator knows
    every pull's end against its lease (engine.kv_lease_s), so every request that decoded to its
    end was checked. NaN with none checked."""
    corrupt = int(requests["outcome"].eq(Outcome.CORRUPT).sum())
    if world == TESTBED:
        c = meta.get("canaries")
        checked = int(c.get("checked", 0)) if isinstance(c, dict) else 0
    else:
        checked = int(requests["outcome"].isin([Outcome.OK, Outcome.CORRUPT]).sum())
    return {M.N_CORRUPT: corrupt, M.OUTPUTS_CHECKED: checked,
            M.CORRUPT_RATE_CHECKED: corrupt / checked if checked else NAN}


def breaker_time(breaker: pd.DataFrame, end_s: float) -> dict[str, float]:
    """How often pods' circuit breakers opened, and the pod-seconds they were open (an open
    breaker with no later change counts until ``end_s``)."""
    opens, open_s = 0, 0.0
    for _, rows in breaker.sort_values("time_s", kind="stable").groupby("pod"):
        t, s = rows["time_s"].to_numpy(), rows["state"].to_numpy()
        nxt = np.append(t[1:], max(end_s, t[-1]))
        opened = s == "open"
        opens += int(opened.sum())
        open_s += float((nxt - t)[opened].sum())
    return {M.BREAKER_OPENS: opens, M.BREAKER_OPEN_POD_S: open_s}


def dead_work(dead_pulls: pd.DataFrame) -> dict[str, float]:
    """Dead work: pulls of requests given up in kv_transfer that went on after it (ended later,
    or not seen to end), and the KV bytes they moved after it (as far as known: the testbed
    estimates a finished pull's share at its mean rate and cannot know a failed one's)."""
    d = dead_pulls
    going = d["end_s"].isna() | (d["end_s"] > d["given_up_s"])
    return {M.N_DEAD_PULLS: int(going.sum()), M.DEAD_KV_BYTES: float(d.loc[going, "bytes_after"].sum()),
            M.N_DEAD_PULLS_UNKNOWN_BYTES: int((going & d["bytes_after"].isna()).sum())}


def retry_work(requests: pd.DataFrame, attempts: pd.DataFrame) -> dict[str, float]:
    """What retries (router.retry) did: the attempts given up and retried, the share of routed requests
    retried at least once, those of them that ended ok (rescued), and the extra load: the prompt tokens
    of the given-up attempts that had passed prefill over the routed requests' prompt tokens, and the
    KV bytes their transfers moved or began to move (one attempt's kv_bytes each)."""
    routed = requests["attempts"].to_numpy(dtype=float) > 0
    retried = requests["attempts"].to_numpy(dtype=float) > 1
    n = int(routed.sum())
    prompt = requests.set_index("request_id")["prompt_tokens"]
    past_prefill = attempts["failed_stage"].isin(sorted(AFTER_PREFILL)).to_numpy()
    wasted = float(prompt.reindex(attempts["request_id"].to_numpy()).to_numpy(dtype=float)[past_prefill].sum())
    total = float(requests["prompt_tokens"].to_numpy(dtype=float)[routed].sum())
    return {M.RETRIES: len(attempts), M.RETRIED_SHARE: float(retried.sum() / n) if n else NAN,
            M.RETRY_RESCUED: int((retried & ok_mask(requests)).sum()),
            M.RETRY_EXTRA_PREFILL_SHARE: wasted / total if total else NAN,
            M.RETRY_KV_BYTES: float(attempts["kv_bytes"].sum())}


def _engine_lags(engines: pd.DataFrame, faults: pd.DataFrame, state: str) -> list[tuple[float, int]]:
    """(lag, fault_id) of each ``state`` record on a pod an engine fault acted on: the time from the
    pod's last engine ``apply`` (``clear`` for "up") row at or before the record to the record."""
    acts = faults[(faults["kind"] == FAULT_ENGINE) & (faults["event"] == ("apply" if state == "down" else "clear"))]
    lags = []
    for row in engines[engines["state"] == state].itertuples():
        at = acts[(acts["pod"] == row.pod) & (acts["time_s"] <= row.time_s)]
        if len(at):
            last = at.loc[at["time_s"].idxmax()]
            lags.append((row.time_s - float(last["time_s"]), int(last["fault_id"])))
    return lags


def commit_label(meta: dict[str, Any]) -> str:
    """The project's commit that wrote a run (run.json ``source``, core/util/source.py): its hash's first
    10 digits, with ``+dirty`` where tracked files differed from it; ``unknown`` for a run written outside a
    git checkout of the project, or before run.json recorded it."""
    source = meta.get("source")
    if not isinstance(source, dict) or not source.get("commit"):
        return "unknown"
    return str(source["commit"])[:10] + ("+dirty" if source.get("dirty") else "")


def code_note(runs: pd.DataFrame) -> str | None:
    """One line when the runs (a frame of :func:`run_metrics` rows) were not all written by one clean
    commit: which commits, and how many runs of each world each wrote (a run counted once where several
    rows share its ``run_dir``, as a study's cells do); None when they were. A difference between runs of
    two commits may be the code's, not the runs'."""
    if "run_dir" in runs:
        runs = runs.drop_duplicates("run_dir")
    if runs.empty:
        return None
    labels = runs["commit"].fillna("unknown") if "commit" in runs else pd.Series("unknown", index=runs.index)
    if labels.nunique() == 1 and not labels.iloc[0].endswith("+dirty") and labels.iloc[0] != "unknown":
        return None
    counts = runs.assign(commit=labels).groupby(["commit", "world"], sort=True).size()
    held = "; ".join(f"{c}: " + ", ".join(f"{n} {w}" for (_, w), n in g.items())
                     for c, g in counts.groupby(level=0, sort=True))
    return (f"the runs do not all come from one clean commit ({held}); a difference between them may be "
            "the code's (+dirty: uncommitted changes; unknown: no commit recorded)")


def engine_lag_s(engines: pd.DataFrame, faults: pd.DataFrame, state: str = "down",
                 lags: list[tuple[float, int]] | None = None) -> float:
    """engine_down_s = over the engines found down on pods an engine fault killed, the mean time from
    the kill (the pod's last engine ``apply`` row at or before the record) to the router's down
    record; NaN without. How long the router went on choosing a dead engine, in either world.
    ``state="up"``: engine_up_s, the same from a restart (the fault's ``clear`` row) to the router's
    up record, how long a restarted engine took to serve again and be seen to. ``lags``: those of
    :func:`_engine_lags` for ``state``, where the caller has them."""
    lags = _engine_lags(engines, faults, state) if lags is None else lags
    return float(np.mean([lag for lag, _ in lags])) if lags else NAN


def engine_core_share(down_lags: list[tuple[float, int]], spec_faults: list[dict]) -> float:
    """Of the down records engine_down_s averages (``down_lags``, :func:`_engine_lags`), the share
    whose fault killed an engine core (``process: core`` in the run's spec) rather than an engine
    actor; NaN without any. Only a dead core's lag can hold vLLM's notice of the death, whose spread
    the comparison of the two worlds allows for (analysis/compare/engine_death.py)."""
    if not down_lags:
        return NAN
    process = [(spec_faults[i].get("process", "core") if 0 <= i < len(spec_faults) else "core") for _, i in down_lags]
    return float(np.mean([p == "core" for p in process]))


def run_metrics(run: RunData | Path | str) -> dict[str, Any]:
    """All scalar metrics of one run, keyed by column name, plus its world, scenario, policy, seed, status.

    Latency percentiles are the spec's plus 50 and 99; decision latency is reported as p50/p99 in
    microseconds over all decisions (the per-candidate-count table is :func:`decision_latency`).
    """
    if not isinstance(run, RunData):
        run = load_run(run)
    req, spec = run.requests, run.spec
    window = fault_window(run.faults, req)
    s_pre, s_during = degraded_pod_shares(req, window)
    out: dict[str, Any] = {
        "world": run.world,
        "scenario": run.scenario,
        "policy": run.policy,
        "seed": run.seed,
        "status": str(run.meta.get("status", "unknown")),
        "commit": commit_label(run.meta),
        "run_dir": str(run.path),
        M.N_REQUESTS: len(req),
        M.N_FAILED: int((~ok_mask(req)).sum()),
        M.FAILURE_RATE: failure_rate(req),
        M.TIMEOUT_SHARE: timeout_share(req),
    }
    out.update({fail_share(k): v for k, v in failure_composition(req).items()})
    out.update(
        {
            M.FAULT_ONSET_S: window.onset_s if window else NAN,
            M.FAULT_END_S: window.end_s if window else NAN,
            M.N_DEGRADED_PODS: len(window.pods) if window else 0,
            M.DEGRADED_AVAILABILITY: degraded_availability(req, window, spec.bin_s, spec.availability_target),
            M.RESILIENCE_INDEX: resilience_index(req, window, spec.bin_s, spec.recovery_horizon_s),
            M.RECOVERY_S: recovery_s(req, window, spec.bin_s),
            M.DEGRADED_SHARE_PRE: s_pre,
            M.DEGRADED_SHARE_DURING: s_during,
            M.TRAFFIC_DEFLECTION_RATIO: traffic_deflection_ratio(req, window),
            M.REACTION_S: reaction_s(req, window, s_pre=s_pre),
        }
    )
    out.update(latency_percentiles(req, sorted(set(spec.percentiles) | {50.0, 99.0})))
    out[M.GOODPUT_RPS] = goodput_rps(req, spec.ttft_slo_s, spec.tpot_slo_s)
    dl = latency_us(run.decisions["latency_s"].to_numpy(dtype=float), (50, 99))
    out.update(dead_work(run.dead_pulls))
    out.update(retry_work(req, run.attempts))
    out[M.ENGINES_DOWN] = int(run.engines["worker"].nunique())
    down_lags = _engine_lags(run.engines, run.faults, "down")
    out[M.ENGINE_DOWN_S] = engine_lag_s(run.engines, run.faults, lags=down_lags)
    out[M.ENGINE_UP_S] = engine_lag_s(run.engines, run.faults, "up")
    spec_faults = list((run.meta.get("spec") or {}).get("faults") or [])
    out[M.ENGINE_CORE_SHARE] = engine_core_share(down_lags, spec_faults)
    out.update(host_stall(run))
    out.update(kv_leases(run.meta))
    out.update(corruption(req, run.meta, run.world))
    end_s = float(np.nanmax(run.decisions["time_s"].to_numpy(dtype=float), initial=0.0))
    out.update(breaker_time(run.breaker, end_s))
    out[M.N_DECISIONS] = dl[M.N_DECISIONS]
    out[M.DECISION_LATENCY_P50_US] = dl["latency_p50_us"]
    out[M.DECISION_LATENCY_P99_US] = dl["latency_p99_us"]
    return {str(k): v for k, v in out.items()}  # plain names in every table written from it
