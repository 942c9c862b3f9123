"""Run directories -> reliability metrics, summaries over seeds, plots, sim-vs-real comparison.

Definitions of every metric: analysis/metrics.py docstrings (and the README's "Metrics" section).
Their parameters (``MetricsSpec``) live in the core (``core.metrics_spec``): the experiment spec
holds them, and the core imports no world and no analysis.
"""

from core.metrics_spec import MetricsSpec, parse_metrics_spec

from analysis.metrics import (
    ORACLE,
    FaultWindow,
    RunData,
    decision_latency,
    degraded_availability,
    degraded_pod_shares,
    failure_composition,
    failure_rate,
    fault_window,
    gap_to_oracle,
    goodput_rps,
    latency_percentiles,
    load_run,
    price_contrast,
    resilience_index,
    run_metrics,
    serving_latencies,
    success_series,
    timeout_share,
    traffic_deflection_ratio,
)
from analysis.plots import RunCurves, run_curves, write_plots
from analysis.report import report
from analysis.summary import RunDiscoveryError, collect_runs, compare_worlds, discover_runs, mean_ci, runs_frame, summarize

__all__ = [
    "ORACLE", "FaultWindow", "MetricsSpec", "RunCurves", "RunData", "RunDiscoveryError", "collect_runs",
    "compare_worlds", "decision_latency", "degraded_availability", "degraded_pod_shares", "discover_runs",
    "failure_composition", "failure_rate", "fault_window", "gap_to_oracle", "goodput_rps", "latency_percentiles",
    "load_run", "mean_ci", "parse_metrics_spec", "price_contrast", "report", "resilience_index", "run_curves",
    "run_metrics", "runs_frame", "serving_latencies", "success_series", "summarize", "timeout_share",
    "traffic_deflection_ratio", "write_plots",
]
