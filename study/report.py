"""`testbed report STUDY_DIR`: a study's cells -> CSV tables, figures and a console summary."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.run.names import Metric as M, latency, gap, check_metric
from analysis.run.report import _fmt
from analysis.run.scalars import code_note
from study.table import load_study, study_summary
from study.plots import write_study_plots

# (summary metric, column header) of the console tables, in order.
STUDY_METRICS = (
    (M.FAILURE_RATE, "failure rate"),
    (M.TRAFFIC_DEFLECTION_RATIO, "deflection"),
    (M.NEEDLESS_DEFLECTION_RATIO, "needless defl."),
    (gap(M.FAILURE_RATE), "gap to oracle (fail.)"),
    (M.DEGRADED_AVAILABILITY, "degraded avail."),
    (M.RESILIENCE_INDEX, "resilience"),
    (latency("ttft", 99), "TTFT p99 (s)"),
)
for _m, _ in STUDY_METRICS:  # a renamed metric fails at import, not as a column of "–"
    check_metric(_m)


def _axis_text(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _sweep_table(sweep: str, g: pd.DataFrame, axes: list[str]) -> Table:
    varied = [a for a in axes if a in g.columns and g[a].notna().any()]
    t = Table(title=escape(f"sweep {sweep}  (mean ± 95% CI half-width over seeds)"))
    for a in varied:
        t.add_column(escape(a), justify="right")
    t.add_column("policy", style="bold")
    t.add_column("seeds", justify="right")
    for _, header in STUDY_METRICS:
        t.add_column(header, justify="right")
    for _, r in g.sort_values([*varied, "policy"], kind="stable").iterrows():
        cells = [_fmt(r.get(f"{m}_mean", math.nan), r.get(f"{m}_ci", math.nan)) for m, _ in STUDY_METRICS]
        t.add_row(*(escape(_axis_text(r[a])) for a in varied), escape(str(r["policy"])), str(r["n_seeds"]), *cells)
    return t


def study_report(study_dir: Path | str, out_dir: Path | str | None = None,
                 console: Console | None = None) -> pd.DataFrame:
    """Analyse every finished cell of a study (:func:`study.table.load_study`); write study_cells.csv (one
    row per cell), study_summary.csv (per point x policy: mean and 95% CI half-width over seeds,
    :func:`study.table.study_summary`) and the figures (:mod:`study.plots`) into ``out_dir``
    (default: STUDY_DIR/report); print one table per sweep, a note per skipped figure and the number of
    unfinished cells left out. Returns the summary."""
    console = console or Console()
    cells = load_study(study_dir)
    axes = list(cells.attrs["axes"])
    skipped = list(cells.attrs["skipped"])
    out = Path(out_dir) if out_dir is not None else Path(study_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    summary = study_summary(cells, axes)
    cells.to_csv(out / "study_cells.csv", index=False)
    summary.to_csv(out / "study_summary.csv", index=False)
    plots, notes = write_study_plots(cells, axes, out)

    for sweep, g in summary.groupby("sweep", sort=True):
        console.print(_sweep_table(str(sweep), g, axes))
    for note in notes:
        console.print(f"[yellow]note:[/] figure {escape(note)}")
    if skipped:
        console.print(f"[yellow]note:[/] {len(skipped)} of {cells.attrs['n_cells']} cell(s) not finished "
                      "(no cell.json), left out")
    if (code := code_note(cells)) is not None:
        console.print(f"[yellow]note:[/] {escape(code)}")
    console.print(f"study {escape(cells.attrs['name'])}: {len(cells)} finished cell(s); wrote study_cells.csv, "
                  f"study_summary.csv and {len(plots)} figure(s) to {escape(str(out))}")
    return summary
