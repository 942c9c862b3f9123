"""Run directories -> reliability metrics, summaries over seeds, plots, sim-vs-real comparison.

Four sub-packages, each importing only those listed before it (tests/test_architecture.py holds it):

* ``analysis.rule``: the verdict rule (verdict.py) and its priors (priors.py);
* ``analysis.run``: one run's metrics (metrics.py defines every metric; docs/records.md "Metrics"),
  a run directory read (data.py), its scalar metrics (scalars.py), summaries over seeds, report, plots;
* ``analysis.checks``: the calibration and the host checked against a run;
* ``analysis.compare``: two sets of runs compared (`testbed compare`, `testbed twin`: fidelity.py),
  the paired report and the engine-death comparison.

A study's cells, claims and figures live with the study (``study/``). Metric parameters
(``MetricsSpec``) live in the core (``core.spec.metrics``): the experiment spec holds them, and the
core imports no world and no analysis.
"""


from core.spec.metrics import FidelityTolerances, MetricsSpec, parse_metrics_spec

from analysis.run.metrics import (
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
from analysis.run.data import RunData, load_run
from analysis.run.scalars import run_metrics
from analysis.compare.fidelity import Fidelity, check_same_scenario, clean_failures, fingerprint_difference, measure, scenario_fingerprint
from analysis.compare.checks import Rank, composition_table, fidelity_table, noise_table, policy_order, rank_agreement
from analysis.run.plots import RunCurves, run_curves, write_plots
from analysis.run.report import report
from analysis.run.summary import RunDiscoveryError, collect_runs, compare_worlds, discover_runs, mean_ci, runs_frame, summarize

__all__ = [
    "FaultWindow", "Fidelity", "FidelityTolerances", "MetricsSpec", "ORACLE", "Rank", "RunCurves", "RunData",
    "RunDiscoveryError", "check_same_scenario", "clean_failures", "collect_runs", "measure",
    "compare_worlds", "composition_table", "decision_latency", "degraded_availability", "degraded_pod_shares",
    "discover_runs", "failure_composition", "failure_rate", "fault_window", "fidelity_table",
    "fingerprint_difference", "gap_to_oracle", "goodput_rps", "latency_percentiles", "load_run", "mean_ci",
    "noise_table", "needless_deflection", "needless_deflection_ratio", "pod_exposure", "parse_metrics_spec",
    "policy_order", "price_contrast", "rank_agreement", "reaction_s", "report", "resilience_index", "run_curves",
    "run_metrics", "runs_frame", "scenario_fingerprint", "serving_latencies", "success_series", "summarize",
    "timeout_share", "traffic_deflection_ratio", "write_plots",
]
