"""The name of every per-run metric, defined once: :func:`analysis.run.scalars.run_metrics` writes
these keys, and the report, the summaries, the fidelity check and the study read them through
:class:`Metric` and the name builders here, never as retyped strings. A name that is not one of
them is refused by :func:`check_metric` (a renamed metric fails loudly instead of showing "–")."""

from __future__ import annotations

import re
from enum import StrEnum

from core.stages import FAILURE_STAGES


class Metric(StrEnum):
    """Scalar metrics of one run (definitions: analysis/run/metrics.py and analysis/run/scalars.py)."""

    N_REQUESTS = "n_requests"
    N_FAILED = "n_failed"
    FAILURE_RATE = "failure_rate"
    TIMEOUT_SHARE = "timeout_share"
    FAULT_ONSET_S = "fault_onset_s"
    FAULT_END_S = "fault_end_s"
    N_DEGRADED_PODS = "n_degraded_pods"
    DEGRADED_AVAILABILITY = "degraded_availability"
    RESILIENCE_INDEX = "resilience_index"
    RECOVERY_S = "recovery_s"
    DEGRADED_SHARE_PRE = "degraded_share_pre"
    DEGRADED_SHARE_DURING = "degraded_share_during"
    TRAFFIC_DEFLECTION_RATIO = "traffic_deflection_ratio"
    REACTION_S = "reaction_s"
    GOODPUT_RPS = "goodput_rps"
    N_DEAD_PULLS = "n_dead_pulls"
    DEAD_KV_BYTES = "dead_kv_bytes"
    N_DEAD_PULLS_UNKNOWN_BYTES = "n_dead_pulls_unknown_bytes"
    RETRIES = "retries"
    RETRIED_SHARE = "retried_share"
    RETRY_RESCUED = "retry_rescued"
    RETRY_EXTRA_PREFILL_SHARE = "retry_extra_prefill_share"
    RETRY_KV_BYTES = "retry_kv_bytes"
    ENGINES_DOWN = "engines_down"
    ENGINE_DOWN_S = "engine_down_s"
    ENGINE_UP_S = "engine_up_s"
    ENGINE_CORE_SHARE = "engine_core_share"
    HOST_STALLED_SHARE = "host_stalled_share"
    FAILURE_RATE_UNSTALLED = "failure_rate_unstalled"
    KV_LEASES_EXPIRED = "kv_leases_expired"
    KV_READS_AFTER_EXPIRY = "kv_reads_after_expiry"
    N_CORRUPT = "n_corrupt"
    OUTPUTS_CHECKED = "outputs_checked"
    CORRUPT_RATE_CHECKED = "corrupt_rate_checked"
    BREAKER_OPENS = "breaker_opens"
    BREAKER_OPEN_POD_S = "breaker_open_pod_s"
    N_DECISIONS = "n_decisions"
    DECISION_LATENCY_P50_US = "decision_latency_p50_us"
    DECISION_LATENCY_P99_US = "decision_latency_p99_us"
    # added per cell of a study (study/table.py) and per run of a comparison (analysis/compare/fidelity.py)
    NEEDLESS_DEFLECTION_RATIO = "needless_deflection_ratio"
    NOISE_FLOOR = "noise_floor"
    CLEAN_SHARE = "clean_share"
    CLEAN_FAILURE_SHARE = "clean_failure_share"


# Columns of a run's row that identify or describe it rather than measure it.
RUN_IDENTITY = ("world", "scenario", "policy", "seed", "status", "commit", "run_dir")
LATENCIES = ("ttft", "tpot", "e2e")  # analysis.run.metrics.serving_latencies
UNKNOWN_STAGE = "unknown"  # a failure's composition share with no or an unknown stage


def percentile_name(q: float) -> str:
    """Column-safe percentile name: 50 -> p50, 99.9 -> p99_9."""
    return "p" + f"{float(q):g}".replace(".", "_")


def latency(kind: str, q: float) -> str:
    """The TTFT, TPOT or E2E percentile metric: latency("ttft", 50) -> "ttft_p50_s"."""
    if kind not in LATENCIES:
        raise ValueError(f"unknown latency {kind!r} (known: {', '.join(LATENCIES)})")
    return f"{kind}_{percentile_name(q)}_s"


def fail_share(stage: str) -> str:
    """A failure composition share: fail_share("kv_transfer") -> "fail_share_kv_transfer"."""
    if stage not in (*FAILURE_STAGES, UNKNOWN_STAGE):
        raise ValueError(f"unknown stage {stage!r} (known: {', '.join((*FAILURE_STAGES, UNKNOWN_STAGE))})")
    return f"fail_share_{stage}"


def gap(metric: str) -> str:
    """The gap-to-oracle column of a metric (analysis.run.metrics.gap_to_oracle)."""
    return f"gap_{check_metric(metric)}"


_PATTERNS = (re.compile(rf"({'|'.join(LATENCIES)})_p\d+(_\d+)?_s"), re.compile(r"fail_share_\w+"),
             re.compile(r"gap_\w+"))


def check_metric(name: str) -> str:
    """``name`` if it names a metric (a :class:`Metric`, a latency percentile, a failure share or a
    gap); else a one-line ValueError."""
    try:
        if name in Metric.__members__.values() or any(p.fullmatch(name) for p in _PATTERNS):
            if name.startswith("gap_"):
                check_metric(name[4:])
            elif name.startswith("fail_share_"):
                fail_share(name[len("fail_share_"):])
            return name
    except ValueError:
        pass
    raise ValueError(f"unknown metric {str(name)!r} (analysis/run/names.py lists every metric)")
