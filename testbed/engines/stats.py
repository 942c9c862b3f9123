"""One engine's counters and latest scheduler snapshot, fed by vLLM's stat loggers.

vLLM's Prometheus logger unregisters every `vllm:` collector of the process when an engine
starts (testbed/engines/engine.py, "Process model"), so an engine keeps its own counters here,
named like vLLM's series, rather than reading the registry. vLLM is imported only when a
logger factory is made (`EngineStats.logger_factory`, at engine start).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from core.records import NIXL_KV_EXPIRED, NIXL_READS_AFTER_EXPIRY


class EngineStats:
    """Per-engine counters and the latest scheduler snapshot, fed by vLLM's stat loggers."""

    _NIXL_SUMS = {
        "transfer_duration": "vllm:nixl_xfer_time_seconds",
        "post_duration": "vllm:nixl_post_time_seconds",
        "bytes_transferred": "vllm:nixl_bytes_transferred",
        "num_descriptors": "vllm:nixl_num_descriptors",
    }
    _NIXL_COUNTS = {
        "num_failed_transfers": "vllm:nixl_num_failed_transfers_total",
        "num_failed_handshakes": "vllm:nixl_num_failed_transfers_total",
        "num_failed_notifications": "vllm:nixl_num_failed_notifications_total",
        "num_kv_expired_reqs": NIXL_KV_EXPIRED,
        "num_notifications_after_expiry": NIXL_READS_AFTER_EXPIRY,
    }

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.counters: dict[str, float] = {
            "vllm:prefix_cache_queries_total": 0,
            "vllm:prefix_cache_hits_total": 0,
            "vllm:external_prefix_cache_queries_total": 0,
            "vllm:external_prefix_cache_hits_total": 0,
            "vllm:prompt_tokens_total": 0,
            "vllm:generation_tokens_total": 0,
        }
        for metric in self._NIXL_SUMS.values():
            self.counters[metric + "_sum"] = 0
            self.counters[metric + "_count"] = 0
        for metric in self._NIXL_COUNTS.values():
            self.counters[metric] = 0
        self.last_xfer_time_s: float | None = None
        self.max_xfer_time_s = 0.0
        self.snapshot: dict[str, Any] = {}
        self.snapshot_s: float | None = None

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        c = self.counters
        if iteration_stats is not None:
            c["vllm:prompt_tokens_total"] += iteration_stats.num_prompt_tokens
            c["vllm:generation_tokens_total"] += iteration_stats.num_generation_tokens
        if scheduler_stats is None:
            return
        s = scheduler_stats
        self.snapshot = {
            "running": s.num_running_reqs,
            "waiting": s.num_waiting_reqs + s.num_skipped_waiting_reqs,
            "kv_usage": float(s.kv_cache_usage),
            "kv_fetching": dict(s.num_kv_fetch_reqs_by_stage),
        }
        self.snapshot_s = self._clock()
        c["vllm:prefix_cache_queries_total"] += s.prefix_cache_stats.queries
        c["vllm:prefix_cache_hits_total"] += s.prefix_cache_stats.hits
        if s.connector_prefix_cache_stats is not None:
            c["vllm:external_prefix_cache_queries_total"] += s.connector_prefix_cache_stats.queries
            c["vllm:external_prefix_cache_hits_total"] += s.connector_prefix_cache_stats.hits
        data = s.kv_connector_stats or {}
        for key, metric in self._NIXL_SUMS.items():
            values = data.get(key) or []
            c[metric + "_sum"] += float(sum(values))
            c[metric + "_count"] += len(values)
        for key, metric in self._NIXL_COUNTS.items():
            c[metric] += float(sum(data.get(key) or []))
        for seconds in data.get("transfer_duration") or []:
            self.last_xfer_time_s = float(seconds)
            self.max_xfer_time_s = max(self.max_xfer_time_s, float(seconds))

    def logger_factory(self) -> Callable[..., Any]:
        """A vLLM `StatLoggerFactory` whose loggers feed this object."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        stats = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any,
                       mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
                stats.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger
