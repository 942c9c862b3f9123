"""`testbed report RUN_DIR...`: metrics of many runs -> console table, CSV files, plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.run.names import Metric as M, check_metric, latency, gap
from analysis.run.metrics import decision_latency
from analysis.run.compute_effect import run_compute_effect
from analysis.run.data import RunData, load_run
from analysis.run.scalars import code_note, run_metrics
from analysis.run.plots import RunCurves, run_curves, write_plots
from analysis.run.summary import discover_runs, runs_frame, summarize

# (summary metric, column header) of the console table, in order.
KEY_METRICS = (
    (M.FAILURE_RATE, "failure rate"),
    (M.TIMEOUT_SHARE, "timeout share"),
    (M.DEGRADED_AVAILABILITY, "degraded avail."),
    (M.RESILIENCE_INDEX, "resilience"),
    (M.TRAFFIC_DEFLECTION_RATIO, "deflection"),
    (gap(M.FAILURE_RATE), "gap to oracle (fail.)"),
    (latency("ttft", 50), "TTFT p50 (s)"),
    (latency("ttft", 99), "TTFT p99 (s)"),
    (M.GOODPUT_RPS, "goodput (req/s)"),
    (M.DECISION_LATENCY_P50_US, "decision p50 (µs)"),
    # testbed only (analysis/run/host_stall.py): requests whose prefill the host stalled, and the failure rate
    # without them, the fault's effect with the host's set apart
    (M.HOST_STALLED_SHARE, "host-stalled"),
    (M.FAILURE_RATE_UNSTALLED, "failure rate, rest"),
    # outputs decoded from KV not their prompt's, over those checked (testbed: canaries)
    (M.CORRUPT_RATE_CHECKED, "corrupt"),
)


def _fmt(mean: float, half: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    s = f"{mean:.3g}"
    if half is not None and abs(half) < 1e-12 * max(abs(mean), 1.0):
        half = 0.0  # rounding noise of identical values
    return s if half is None or math.isnan(half) else f"{s} ± {half:.2g}"


def check_columns(summary: pd.DataFrame, metrics: Sequence[str]) -> None:
    """Every metric the report shows must be a known one (analysis/run/names.py) and in the
    summary: a metric renamed on one side fails here in one line instead of showing "–". A gap to
    the oracle is shown only where OracleAvoidance ran."""
    for m in metrics:
        check_metric(m)
        if f"{m}_mean" not in summary.columns and not m.startswith("gap_"):
            raise ValueError(f"report: metric {str(m)!r} is not in the runs' summary (its columns: "
                             f"{', '.join(c[:-5] for c in summary.columns if c.endswith('_mean'))})")


def _table(summary: pd.DataFrame, scenario: str, world: str) -> Table:
    t = Table(title=escape(f"{scenario} [{world}]  (mean ± 95% CI half-width over seeds)"))
    t.add_column("policy", style="bold")
    t.add_column("runs", justify="right")
    for _, header in KEY_METRICS:
        t.add_column(header, justify="right")
    check_columns(summary, [m for m, _ in KEY_METRICS])
    for _, r in summary.iterrows():
        cells = [_fmt(r[f"{m}_mean"], r[f"{m}_ci"]) if f"{m}_mean" in r else "–" for m, _ in KEY_METRICS]
        t.add_row(escape(str(r["policy"])), str(r["n_runs"]), *cells)
    return t


def report(
    paths: Sequence[Path | str], out_dir: Path | None = None, console: Console | None = None
) -> pd.DataFrame:
    """Analyse every run found in or below ``paths``; print a table of key metrics per policy (one per
    scenario and world), write runs.csv (one row per run), summary.csv (per scenario, world, policy: mean
    and CI half-width of every metric), decision_latency.csv (per run and candidate count) and the PNG plots
    into ``out_dir`` (default: a ``report`` folder next to the first path). Returns the summary."""
    if not paths:
        raise ValueError("report: no run directories given")
    console = console or Console()
    run_dirs = discover_runs(paths)
    out = Path(out_dir) if out_dir is not None else Path(paths[0]).resolve().parent / "report"
    out.mkdir(parents=True, exist_ok=True)

    rows: list[dict] = []
    curves: list[RunCurves] = []
    latency: list[pd.DataFrame] = []
    marks: list[pd.DataFrame] = []
    effects: list[pd.DataFrame] = []  # compute faults as the engines felt them (analysis/run/compute_effect.py)
    for d in run_dirs:
        # One run at a time in memory: sim runs can hold millions of requests.
        run = load_run(d)
        rows.append(run_metrics(run))
        curves.append(run_curves(run))
        lat = decision_latency(run.decisions, (50, 99))
        latency.append(lat.assign(world=run.world, scenario=run.scenario, policy=run.policy, seed=run.seed))
        if not run.host.empty:
            marks.append(_host_marks(run))
        effects.append(run_compute_effect(run).assign(scenario=run.scenario))
    runs = runs_frame(rows)
    summary = summarize(runs)

    runs.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    lat_df = pd.concat(latency, ignore_index=True)
    lead = ["world", "scenario", "policy", "seed"]
    lat_df[lead + [c for c in lat_df.columns if c not in lead]].to_csv(out / "decision_latency.csv", index=False)
    plots = write_plots(curves, runs, out)
    written = "runs.csv, summary.csv, decision_latency.csv"
    if marks:
        pd.concat(marks, ignore_index=True).to_csv(out / "host_marks.csv", index=False)
        written += ", host_marks.csv"
    effect = pd.concat([e for e in effects if not e.empty] or [pd.DataFrame()], ignore_index=True)
    if not effect.empty:
        effect.to_csv(out / "compute_effect.csv", index=False)
        written += ", compute_effect.csv"

    unfinished = runs.loc[runs["status"] != "finished", ["run_dir", "status"]]
    for (scenario, world), g in summary.groupby(["scenario", "world"], sort=True):
        console.print(_table(g, scenario, world))
    if not effect.empty:
        console.print(_effect_table(effect))
    if len(unfinished):
        listed = escape(", ".join(f"{r.run_dir} ({r.status})" for r in unfinished.itertuples()))
        console.print(f"[yellow]note:[/] {len(unfinished)} run(s) did not finish; their rows up to the stop are "
                      f"included: {listed}")
    if (code := code_note(runs)) is not None:
        console.print(f"[yellow]note:[/] {escape(code)}")
    console.print(f"{len(runs)} run(s); wrote {written} and {len(plots)} plot(s) to {escape(str(out))}")
    return summary


def _effect_table(effect: pd.DataFrame) -> Table:
    t = Table(title="Compute faults as the engines felt them (prefill time per token, faulted over baseline)")
    for c in ("world", "scenario", "policy", "seed", "pod", "asked", "agent measured", "engine slow-down", "baseline"):
        t.add_column(c)
    for r in effect.itertuples():
        t.add_row(r.world, r.scenario, r.policy, str(r.seed), str(r.pod), f"{r.asked:g}x", _x(r.measured),
                  _x(r.engine_slowdown), f"{r.baseline} ({r.n_inside} vs {r.n_baseline})")
    return t


def _x(v: float) -> str:
    return "-" if pd.isna(v) else f"{v:.2f}x"


def _host_marks(run: RunData) -> pd.DataFrame:
    """Each request of a testbed run with its engines' CPU and run-queue wait, and its host mark."""
    req = run.requests
    marks = run.host_marks
    cols = ["request_id", "outcome", "failed_stage", "prefill_pod", "decode_pod", "routed_s"]
    return pd.concat([req[cols], marks], axis=1).assign(world=run.world, scenario=run.scenario,
                                                         policy=run.policy, seed=run.seed)
