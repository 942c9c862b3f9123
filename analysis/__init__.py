"""Run directories -> reliability metrics, summaries over seeds, plots, sim-vs-real comparison.

Definitions of every metric: analysis/metrics.py docstrings (and the README's "Metrics" section).
Names are imported lazily, so ``from analysis.spec import MetricsSpec`` (used by the experiment spec)
does not pull in pandas, scipy or matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "ORACLE": "analysis.metrics",
    "FaultWindow": "analysis.metrics",
    "RunData": "analysis.metrics",
    "decision_latency": "analysis.metrics",
    "degraded_availability": "analysis.metrics",
    "degraded_pod_shares": "analysis.metrics",
    "failure_composition": "analysis.metrics",
    "failure_rate": "analysis.metrics",
    "fault_window": "analysis.metrics",
    "gap_to_oracle": "analysis.metrics",
    "goodput_rps": "analysis.metrics",
    "latency_percentiles": "analysis.metrics",
    "load_run": "analysis.metrics",
    "price_contrast": "analysis.metrics",
    "resilience_index": "analysis.metrics",
    "run_metrics": "analysis.metrics",
    "serving_latencies": "analysis.metrics",
    "success_series": "analysis.metrics",
    "timeout_share": "analysis.metrics",
    "traffic_deflection_ratio": "analysis.metrics",
    "report": "analysis.report",
    "MetricsSpec": "analysis.spec",
    "parse_metrics_spec": "analysis.spec",
    "RunDiscoveryError": "analysis.summary",
    "collect_runs": "analysis.summary",
    "compare_worlds": "analysis.summary",
    "discover_runs": "analysis.summary",
    "mean_ci": "analysis.summary",
    "runs_frame": "analysis.summary",
    "summarize": "analysis.summary",
    "RunCurves": "analysis.plots",
    "run_curves": "analysis.plots",
    "write_plots": "analysis.plots",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    try:
        module = _HOME[name]
    except KeyError:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
