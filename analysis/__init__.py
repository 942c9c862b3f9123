"""Run directories -> reliability metrics, summaries over seeds, plots, sim-vs-real comparison.

Definitions of every metric: analysis/metrics.py docstrings (and docs/records.md "Metrics"); the
sim-vs-testbed fidelity check (`testbed compare`, does a simulated result carry over): analysis/fidelity.py;
a study's grid of cells (`testbed report STUDY_DIR`): analysis/study.py, study_plots.py, study_report.py;
whether a claim's effect carries over from the simulator to the testbed: analysis/claims.py.
Their parameters (``MetricsSpec``) live in the core (``core.metrics_spec``): the experiment spec
holds them, and the core imports no world and no analysis.
"""

from core.metrics_spec import FidelityTolerances, MetricsSpec, parse_metrics_spec

from analysis.metrics import (
    ORACLE,
    FaultWindow,
    decision_latency,
    degraded_availability,
    degraded_pod_shares,
    failure_composition,
    failure_rate,
    fault_window,
    gap_to_oracle,
    goodput_rps,
    latency_percentiles,
    needless_deflection,
    needless_deflection_ratio,
    pod_exposure,
    price_contrast,
    reaction_s,
    resilience_index,
    serving_latencies,
    success_series,
    timeout_share,
    traffic_deflection_ratio,
)
from analysis.run_data import RunData, load_run
from analysis.run_metrics import run_metrics
from analysis.fidelity import Fidelity, check_same_scenario, clean_failures, fingerprint_difference, measure, scenario_fingerprint
from analysis.fidelity_console import compare
from analysis.fidelity_checks import Rank, composition_table, fidelity_table, noise_table, policy_order, rank_agreement
from analysis.plots import RunCurves, run_curves, write_plots
from analysis.report import report
from analysis.claims import claim_table
from analysis.summary import RunDiscoveryError, collect_runs, compare_worlds, discover_runs, mean_ci, runs_frame, summarize
from analysis.study import StudyError, cell_metrics, is_study, load_study, study_summary
from analysis.study_report import study_report

__all__ = [
    "FaultWindow", "Fidelity", "FidelityTolerances", "MetricsSpec", "ORACLE", "Rank", "RunCurves", "RunData",
    "RunDiscoveryError", "check_same_scenario", "claim_table", "clean_failures", "collect_runs", "compare", "measure",
    "compare_worlds", "composition_table", "decision_latency", "degraded_availability", "degraded_pod_shares",
    "discover_runs", "failure_composition", "failure_rate", "fault_window", "fidelity_table",
    "fingerprint_difference", "gap_to_oracle", "goodput_rps", "latency_percentiles", "load_run", "mean_ci",
    "noise_table", "needless_deflection", "needless_deflection_ratio", "pod_exposure", "StudyError",
    "cell_metrics", "is_study", "load_study", "study_summary", "study_report", "parse_metrics_spec",
    "policy_order", "price_contrast", "rank_agreement", "reaction_s", "report", "resilience_index", "run_curves",
    "run_metrics", "runs_frame", "scenario_fingerprint", "serving_latencies", "success_series", "summarize",
    "timeout_share", "traffic_deflection_ratio", "write_plots",
]
