"""PNG figures of a study, from the cells table of :func:`study.table.load_study`.

Each figure picks its cells by the axes they vary (:func:`study.table.select_cells`), never by sweep
name, and is skipped with a one-line reason when those cells are absent. When the cells a figure needs come
from several sweeps (say the same axes under two health models), each sweep gets its own file, so points
that differ in what a sweep held fixed are never averaged together. Built with ``matplotlib.figure.Figure``
and the Agg canvas, as analysis/run/plots.py: no pyplot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from analysis.run.names import Metric as M, fail_share, gap
from analysis.run.plots import _save, _slug
from study.table import (
    LC,
    SEPARATION_FACTOR,
    cell_metrics,
    failure_reduction,
    grouped_ci,
    select_cells,
    separation,
    series_frame,
)
from vocab import KV_TRANSFER

POLICY_ORDER = ("LC", "FaultAwareLC", "OTF-R", "FaultAwareOTF-R", "OracleAvoidance")
FALC, FAOTF, OTF = "FaultAwareLC", "FaultAwareOTF-R", "OTF-R"
RISK_PRICE_POLICIES = (OTF, FAOTF)
BASE = "spec"  # label of a panel value for cells that do not vary the panel's axis


class FigureSkipped(Exception):
    """The cells a figure needs are not in the study (the message says which)."""


# --------------------------------------------------------------------------- helpers


def _policies(df: pd.DataFrame) -> list[str]:
    present = set(df["policy"])
    return [p for p in POLICY_ORDER if p in present] + sorted(present - set(POLICY_ORDER))


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _sort_key(key: tuple) -> tuple:
    return tuple((0, "") if _missing(v) else (1, v) if isinstance(v, (int, float)) else (2, str(v)) for v in key)


def _fmt_value(v: Any) -> str:
    return BASE if _missing(v) else f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _panels(df: pd.DataFrame, panel_axes: Sequence[str]) -> list[tuple[str, pd.DataFrame]]:
    """(label, cells) per combination of the panel axes' values, in value order; one unlabelled panel
    when there are no panel axes."""
    if not panel_axes:
        return [("", df)]
    groups = {(k if isinstance(k, tuple) else (k,)): g for k, g in df.groupby(list(panel_axes), dropna=False)}
    return [(", ".join(f"{a} = {_fmt_value(v)}" for a, v in zip(panel_axes, k)), groups[k])
            for k in sorted(groups, key=_sort_key)]


def _varied(df: pd.DataFrame, candidates: Sequence[str]) -> list[str]:
    """The candidate axes that some cell of ``df`` varies."""
    return [a for a in candidates if a in df.columns and df[a].notna().any()]


def _by_sweep(sel: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(file-name suffix, cells) per sweep: no suffix when there is one."""
    sweeps = sorted(sel["sweep"].unique())
    return [("" if len(sweeps) == 1 else f"_{_slug(s)}", sel.loc[sel["sweep"] == s]) for s in sweeps]


def _severity_cells(cells: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """Cells that vary the severity r, and at most the telemetry mode besides."""
    sel = select_cells(cells, axes, ["severity"], ["telemetry"])
    if sel.empty:
        raise FigureSkipped("needs cells that vary severity (and at most telemetry besides)")
    return sel


def _log_r_axis(ax, values: Sequence[float]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(sorted(values))
    ax.set_xticklabels([f"{v:g}" for v in sorted(values)])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("residual bandwidth factor r (log)")


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize="small", color="gray")


# --------------------------------------------------------------------------- a, c, d: metrics vs r


def _draw_vs_r(ax, cells: pd.DataFrame, metric: str, label: str) -> None:
    """One line per policy: mean of ``metric`` over seeds vs r, 95% CI error bars."""
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    _log_r_axis(ax, cells["severity"].unique())
    if metric not in cells.columns or cells[metric].isna().all():
        _no_data(ax, "no data" + (" (needs OracleAvoidance cells)" if metric.startswith("gap_") else
                                  " (needs LC cells)" if metric == M.NEEDLESS_DEFLECTION_RATIO else ""))
        return
    policies = _policies(cells)
    for k, policy in enumerate(policies):
        st = grouped_ci(cells.loc[cells["policy"] == policy], ["severity"], metric).dropna(subset=["mean"])
        if st.empty:
            continue
        # A small per-policy offset on the log axis keeps equal values and their error bars apart.
        x = st["severity"].to_numpy(dtype=float) * 10 ** (0.012 * (k - (len(policies) - 1) / 2))
        ax.errorbar(x, st["mean"], yerr=st["ci"].fillna(0.0), marker="o", ms=4, capsize=3,
                    label=f"{policy} (n={int(st['n'].max())})")
    ax.legend(fontsize="x-small")


def _vs_r_figure(sel: pd.DataFrame, metrics: Sequence[tuple[str, str]], title: str, path: Path) -> Path:
    """Rows: telemetry modes (when varied); columns: metrics; each panel one line per policy vs r."""
    panels = _panels(sel, _varied(sel, ["telemetry"]))
    fig = Figure(figsize=(4.6 * len(metrics) + 0.5, 3.6 * len(panels)), layout="constrained")
    axs = fig.subplots(len(panels), len(metrics), squeeze=False)
    for i, (plabel, g) in enumerate(panels):
        for j, (metric, label) in enumerate(metrics):
            _draw_vs_r(axs[i, j], g, metric, label)
            if plabel:
                axs[i, j].set_title(plabel, fontsize="medium")
    fig.suptitle(f"{title} (mean ± 95% CI over seeds)")
    return _save(fig, path)


def _vs_r(cells: pd.DataFrame, axes: Sequence[str], out: Path, name: str, title: str,
          metrics: Sequence[tuple[str, str]]) -> list[Path]:
    sel = _severity_cells(cells, axes)
    return [_vs_r_figure(g, metrics, title, out / f"{name}{suffix}.png") for suffix, g in _by_sweep(sel)]


def fig_failure_vs_severity(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(a) failure rate vs r per policy, 95% CI error bars, log x; one panel per telemetry mode."""
    return _vs_r(cells, axes, out, "study_a_failure_vs_r", "Failure rate vs link severity",
                 [(M.FAILURE_RATE, "failure rate (failed / all)")])


def fig_availability_vs_severity(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(c) degraded availability and resilience index vs r per policy."""
    return _vs_r(cells, axes, out, "study_c_availability_vs_r", "Availability during the fault vs severity",
                 [(M.DEGRADED_AVAILABILITY, "degraded availability"), (M.RESILIENCE_INDEX, "resilience index")])


def fig_deflection_vs_severity(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(d) traffic deflection ratio, gap to oracle (failure rate) and needless deflection ratio vs r."""
    return _vs_r(cells, axes, out, "study_d_deflection_vs_r", "Deflection and gap to oracle vs severity",
                 [(M.TRAFFIC_DEFLECTION_RATIO, "traffic deflection ratio"),
                  (gap(M.FAILURE_RATE), "gap to oracle (failure rate)"),
                  (M.NEEDLESS_DEFLECTION_RATIO, "needless deflection ratio")])


# --------------------------------------------------------------------------- b: paired reduction


def fig_reduction(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(b) 1 - fail(FaultAwareOTF-R) / fail(FaultAwareLC) per r (groups) and telemetry mode (bars), mean and
    95% CI over seeds paired by point and seed (:func:`study.table.failure_reduction`)."""
    sel = _severity_cells(cells, axes)
    if not {FALC, FAOTF} <= set(sel["policy"]):
        raise FigureSkipped(f"needs {FALC} and {FAOTF} cells that vary severity")
    return [_reduction_figure(g, out / f"study_b_reduction{suffix}.png") for suffix, g in _by_sweep(sel)]


def _reduction_figure(sel: pd.DataFrame, path: Path) -> Path:
    panels = _panels(sel, _varied(sel, ["telemetry"]))
    rs = sorted(sel["severity"].unique(), reverse=True)  # mild to severe
    fig = Figure(figsize=(max(6.0, 0.8 * len(rs) * len(panels) + 3), 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(panels)
    for k, (plabel, g) in enumerate(panels):
        st = failure_reduction(g, ["severity"]).set_index("severity").reindex(rs)
        x = np.arange(len(rs)) - 0.4 + width * (k + 0.5)
        ax.bar(x, st["mean"].fillna(0.0), width, yerr=st["ci"].fillna(0.0), capsize=3, label=plabel or "all")
        for xi, (m, n) in zip(x, zip(st["mean"], st["n"].fillna(0))):
            ax.text(xi, 0, "n/a" if _missing(m) else f"n={int(n)}", ha="center", va="bottom", fontsize="x-small")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(rs)))
    ax.set_xticklabels([f"r = {r:g}" for r in rs])
    ax.set_ylabel(f"1 - fail({FAOTF}) / fail({FALC})")
    ax.set_title(f"Failure reduction of {FAOTF} vs {FALC} (mean ± 95% CI, paired seeds)")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


# --------------------------------------------------------------------------- e: series around the fault


def _mean_series(cells: pd.DataFrame) -> pd.DataFrame:
    """Mean over cells (seeds) of each series column per t_rel_s, NaN bins left out."""
    frames = [series_frame(cell_metrics(d)) for d in cells["run_dir"]]
    cat = pd.concat(frames, ignore_index=True)
    return cat.groupby("t_rel_s", sort=True)[["success_ratio", "degraded_price", "other_price"]].mean()


def fig_fault_series(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(e) per telemetry mode: risk price of the degraded pods (solid) and of the healthy ones (dashed), and
    the success ratio, per time bin around the fault onset, one line per r (mean over seeds), for the
    risk-price policies (OTF-R, FaultAwareOTF-R)."""
    sel = _severity_cells(cells, axes)
    sel = sel.loc[sel["policy"].isin(RISK_PRICE_POLICIES)]
    if sel.empty:
        raise FigureSkipped(f"needs {' or '.join(RISK_PRICE_POLICIES)} cells that vary severity")
    paths = []
    for suffix, g in _by_sweep(sel):
        for plabel, gp in _panels(g, _varied(g, ["telemetry"])):
            tag = f"_{_slug(plabel)}" if plabel else ""
            paths.append(_series_figure(gp, plabel, out / f"study_e_fault_series{suffix}{tag}.png"))
    return paths


def _series_figure(sel: pd.DataFrame, plabel: str, path: Path) -> Path:
    policies = _policies(sel)
    rs = sorted(sel["severity"].unique(), reverse=True)
    colors = {r: c for r, c in zip(rs, _colors(len(rs)))}
    fig = Figure(figsize=(11, 3.4 * len(policies)), layout="constrained")
    axs = fig.subplots(len(policies), 2, squeeze=False, sharex=True)
    duration = float(np.nanmean(sel[M.FAULT_END_S] - sel[M.FAULT_ONSET_S]))
    for i, policy in enumerate(policies):
        price_ax, ok_ax = axs[i]
        for r in rs:
            s = _mean_series(sel.loc[(sel["policy"] == policy) & (sel["severity"] == r)])
            t = s.index.to_numpy()
            price_ax.plot(t, s["degraded_price"], "-", color=colors[r], label=f"r = {r:g} degraded")
            price_ax.plot(t, s["other_price"], "--", color=colors[r], alpha=0.7)
            ok_ax.plot(t, s["success_ratio"], "-", marker=".", color=colors[r], label=f"r = {r:g}")
        for ax in (price_ax, ok_ax):
            if not math.isnan(duration):
                ax.axvspan(0.0, duration, color="tab:red", alpha=0.1)
            ax.grid(alpha=0.3)
        price_ax.set_ylabel("risk price")
        price_ax.set_title(f"{policy}: risk price (solid degraded, dashed healthy)", fontsize="medium")
        ok_ax.set_ylabel("success ratio")
        ok_ax.set_ylim(-0.02, 1.02)
        ok_ax.set_title(f"{policy}: success ratio", fontsize="medium")
        price_ax.legend(fontsize="x-small")
        ok_ax.legend(fontsize="x-small", loc="lower left")
    for ax in axs[-1]:
        ax.set_xlabel("time since fault onset (s), bin centres; fault shaded")
    fig.suptitle("Around the fault (mean over seeds)" + (f": {plabel}" if plabel else ""))
    return _save(fig, path)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.0, 0.85, max(n, 1))]


# --------------------------------------------------------------------------- f: label heat map


def _matrix(st: pd.DataFrame, rows: str, cols: str, row_vals: Sequence, col_vals: Sequence,
            value: str = "mean") -> np.ndarray:
    m = st.pivot_table(index=rows, columns=cols, values=value, aggfunc="first", dropna=False)
    return m.reindex(index=list(row_vals), columns=list(col_vals)).to_numpy(dtype=float)


def _heat(ax, m: np.ndarray, row_vals: Sequence, col_vals: Sequence, vmax: float, fmt: Callable[[float], str]):
    im = ax.imshow(m, origin="lower", cmap="Reds", vmin=0.0, vmax=vmax, aspect="auto")
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, fmt(v), ha="center", va="center", fontsize="x-small",
                color="white" if not math.isnan(v) and v > 0.6 * vmax else "black")
    ax.set_xticks(range(len(col_vals)))
    ax.set_xticklabels([f"{v:g}" for v in col_vals])
    ax.set_yticks(range(len(row_vals)))
    ax.set_yticklabels([f"{v:g}" for v in row_vals])
    return im


def _pct(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:.2f}%"


def fig_label_heatmap(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(f) failure rate (mean over seeds) over label_delay_s x label_noise, one panel per policy present."""
    sel = select_cells(cells, axes, ["label_delay_s", "label_noise"])
    if sel.empty:
        raise FigureSkipped("needs cells that vary label_delay_s and label_noise (and nothing else)")
    return [_label_figure(g, out / f"study_f_label_heatmap{suffix}.png") for suffix, g in _by_sweep(sel)]


def _label_figure(sel: pd.DataFrame, path: Path) -> Path:
    policies = _policies(sel)
    delays = sorted(sel["label_delay_s"].unique())
    noises = sorted(sel["label_noise"].unique())
    st = grouped_ci(sel, ["policy", "label_noise", "label_delay_s"], M.FAILURE_RATE)
    vmax = max(float(np.nanmax(st["mean"].to_numpy(dtype=float), initial=0.0)), 1e-9)
    fig = Figure(figsize=(4.2 * len(policies) + 1.2, 3.8), layout="constrained")
    axs = fig.subplots(1, len(policies), squeeze=False)[0]
    im = None
    for ax, policy in zip(axs, policies):
        m = _matrix(st.loc[st["policy"] == policy], "label_noise", "label_delay_s", noises, delays)
        im = _heat(ax, m, noises, delays, vmax, _pct)
        ax.set_title(policy, fontsize="medium")
        ax.set_xlabel("label detection delay (s)")
        ax.set_ylabel("label noise (fraction of time wrong)")
    fig.colorbar(im, ax=list(axs), label="failure rate (mean over seeds)")
    fig.suptitle("Failure rate over health-label delay x noise")
    return _save(fig, path)


# --------------------------------------------------------------------------- g: sensitivity map

SEP_CODES = {"vanishes": 0, "unknown": 1, "holds": 2}
SEP_CMAP = ListedColormap(["#dddddd", "#f3d27a", "#8fd18f"])


def fig_sensitivity(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(g) failure rate of LC and of OTF-R over r x load, one column per ttft_timeout_s / deadline_s value,
    and a row with the ratio LC / OTF-R coloured by :func:`study.table.separation` (green: holds,
    LC >= 3x OTF-R with non-overlapping 95% CIs; yellow: fewer than 2 seeds; grey: vanishes)."""
    sel = select_cells(cells, axes, ["severity", "load"], ["ttft_timeout_s", "deadline_s"])
    if sel.empty or not {LC, OTF} <= set(sel["policy"]):
        raise FigureSkipped(f"needs {LC} and {OTF} cells that vary severity and load "
                            "(and at most ttft_timeout_s, deadline_s besides)")
    return [_sensitivity_figure(g, out / f"study_g_sensitivity{suffix}.png") for suffix, g in _by_sweep(sel)]


def _ratio_text(lc: float, otf: float) -> str:
    if math.isnan(lc) or math.isnan(otf) or (lc == 0 and otf == 0):
        return "–"
    return "∞" if otf == 0 else f"{lc / otf:.1f}x"


def _sensitivity_figure(sel: pd.DataFrame, path: Path) -> Path:
    panels = _panels(sel, _varied(sel, ["ttft_timeout_s", "deadline_s"]))
    rs = sorted(sel["severity"].unique(), reverse=True)
    loads = sorted(sel["load"].unique())
    st = grouped_ci(sel.loc[sel["policy"].isin([LC, OTF])],
                    ["point", "policy"], M.FAILURE_RATE)  # a point fixes r, load and the panel's axes
    vmax = max(float(np.nanmax(st["mean"].to_numpy(dtype=float), initial=0.0)), 1e-9)
    fig = Figure(figsize=(4.4 * len(panels) + 1.2, 10.5), layout="constrained")
    axs = fig.subplots(3, len(panels), squeeze=False)
    im = None
    for j, (plabel, g) in enumerate(panels):
        s = {p: grouped_ci(g.loc[g["policy"] == p], ["severity", "load"], M.FAILURE_RATE) for p in (LC, OTF)}
        mats = {p: {v: _matrix(s[p], "severity", "load", rs, loads, v) for v in ("mean", "ci")}
                for p in (LC, OTF)}
        for i, p in enumerate((LC, OTF)):
            im = _heat(axs[i, j], mats[p]["mean"], rs, loads, vmax, _pct)
            axs[i, j].set_title(f"{p}" + (f", {plabel}" if plabel else ""), fontsize="medium")
        _separation_panel(axs[2, j], mats, rs, loads)
        axs[2, j].set_title(f"{LC} / {OTF}" + (f", {plabel}" if plabel else ""), fontsize="medium")
    for ax in axs.flat:
        ax.set_xlabel("load (x base arrival rate)")
        ax.set_ylabel("residual bandwidth factor r")
    fig.colorbar(im, ax=list(axs[:2].flat), label="failure rate (mean over seeds)")
    fig.suptitle(f"Where LC and OTF-R separate: green = LC >= {SEPARATION_FACTOR:g}x OTF-R with disjoint "
                 "95% CIs, grey = vanishes, yellow = < 2 seeds", fontsize="medium")
    return _save(fig, path)


def _separation_panel(ax, mats: dict, rs: Sequence[float], loads: Sequence[float]) -> None:
    lc, otf = mats[LC], mats[OTF]
    codes = np.zeros((len(rs), len(loads)))
    for (i, j), _ in np.ndenumerate(codes):
        verdict = separation((lc["mean"][i, j], lc["ci"][i, j], 0), (otf["mean"][i, j], otf["ci"][i, j], 0))
        codes[i, j] = SEP_CODES[verdict]
        ax.text(j, i, f"{_ratio_text(lc['mean'][i, j], otf['mean'][i, j])}\n{verdict}", ha="center",
                va="center", fontsize="x-small")
    ax.imshow(codes, origin="lower", cmap=SEP_CMAP, vmin=-0.5, vmax=2.5, aspect="auto")
    ax.set_xticks(range(len(loads)))
    ax.set_xticklabels([f"{v:g}" for v in loads])
    ax.set_yticks(range(len(rs)))
    ax.set_yticklabels([f"{v:g}" for v in rs])


# --------------------------------------------------------------------------- h: the map of the headline figures

# The conditions the map moves one at a time around the flagship (experiments/headline_map.yaml), in
# the order of its columns, with how each is labelled.
MAP_AXES = (("load", "load (x the flagship's arrival rate)"), ("degraded_pods", "pods degraded (of 32)"),
            ("kv_bytes_per_token", "KV bytes a prompt token"), ("ttft_timeout_s", "first-token limit (s)"),
            ("fault_s", "fault length (s)"), ("in_flight", "in-flight evidence (0 off, 1 on)"))
# (metric, label, scale, whether it is a share: drawn on [0, 1] so that noise never fills the panel)
MAP_ROWS = ((M.FAILURE_RATE, "failure rate (%)", 100.0, False),
            (M.DEGRADED_AVAILABILITY, "degraded availability", 1.0, True),
            (fail_share(KV_TRANSFER), "failures in kv_transfer (share)", 1.0, True))


def _value_panel(ax, values: Sequence, share: bool):
    """A panel whose x axis is a condition's values, evenly spaced; a share is drawn on [0, 1] so that noise
    never fills the panel."""
    ax.grid(alpha=0.3)
    if share:
        ax.set_ylim(-0.03, 1.03)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels([f"{v:g}" for v in values])
    ax.set_xlim(-0.3, len(values) - 0.7)  # every value's place, whether or not it has data
    return ax


def fig_map(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(h) the headline figures as one condition moves: a column per condition the cells vary with r and
    nothing else (:data:`MAP_AXES`), rows failure rate, degraded availability and the share of failures
    in kv_transfer; a line per policy and r (solid: the smallest r), 95% CIs over seeds."""
    cols = []  # a column per condition and sweep: what two sweeps held fixed differently is never averaged
    for a, label in MAP_AXES:
        sel = select_cells(cells, axes, ["severity", a])
        if not sel.empty:
            split = sel["sweep"].nunique() > 1
            cols += [(a, f"{label} [{g['sweep'].iloc[0]}]" if split else label, g) for _, g in _by_sweep(sel)]
    if not cols:
        raise FigureSkipped("needs cells that vary severity and one of " + ", ".join(a for a, _ in MAP_AXES))
    fig = Figure(figsize=(3.6 * len(cols) + 0.8, 9.0), layout="constrained")
    axs = fig.subplots(len(MAP_ROWS), len(cols), squeeze=False)
    from matplotlib import colormaps

    colors = dict(zip(POLICY_ORDER, colormaps["tab10"].colors))  # policies told apart, not ordered
    for j, (axis, label, sel) in enumerate(cols):
        values = sorted(sel[axis].dropna().unique())
        rs = sorted(sel["severity"].unique())
        for i, (metric, ylabel, scale, share) in enumerate(MAP_ROWS):
            ax = _value_panel(axs[i, j], values, share)
            if metric not in sel.columns:
                _no_data(ax, "no data")
                continue
            for policy in _policies(sel):
                for r in rs:
                    st = grouped_ci(sel.loc[(sel["policy"] == policy) & (sel["severity"] == r)], [axis], metric)
                    st = st.dropna(subset=["mean"])
                    if st.empty:
                        continue
                    x = [values.index(v) for v in st[axis]]
                    ax.errorbar(x, st["mean"] * scale, yerr=st["ci"].fillna(0.0) * scale, marker="o", ms=3,
                                capsize=2, color=colors.get(policy), ls="-" if r == rs[0] else "--",
                                label=f"{policy}, r = {r:g}")
            if i == len(MAP_ROWS) - 1:
                ax.set_xlabel(label)
            if j == 0:
                ax.set_ylabel(ylabel)
    axs[0, 0].legend(fontsize="x-small")
    fig.suptitle("The flagship moved one condition at a time (mean, 95% CI over seeds; dashed: the larger r)",
                 fontsize="medium")
    return [_save(fig, out / "study_h_map.png")]


# --------------------------------------------------------------------------- i: conditions at one r

# Conditions swept at one severity (experiments/study.yaml's label_misses and lengths), each with the
# axis a sweep may cross it with (a line per value), and how each is labelled.
CONDITION_AXES = (("label_miss", None, "labels never raised (probability)"),
                  ("prompt_scale", "kv_bytes_per_token", "prompt length (x the spec's, same tokens/s)"))


def fig_conditions(cells: pd.DataFrame, axes: Sequence[str], out: Path) -> list[Path]:
    """(i) failure rate and degraded availability as a condition moves at one r (:data:`CONDITION_AXES`):
    a column per condition and sweep, a line per policy (and value of the axis it is crossed with), 95%
    CIs over seeds."""
    cols = []
    for a, by, label in CONDITION_AXES:
        for _, g in _by_sweep(select_cells(cells, axes, [a], [by] if by else [])):
            cols.append((a, by, f"{label} [{g['sweep'].iloc[0]}]", g))
    if not cols:
        raise FigureSkipped("needs cells that vary " + " or ".join(a for a, _, _ in CONDITION_AXES)
                            + " (and nothing else)")
    rows = MAP_ROWS[:2]
    fig = Figure(figsize=(4.2 * len(cols) + 0.8, 6.2), layout="constrained")
    axs = fig.subplots(len(rows), len(cols), squeeze=False)
    for j, (axis, by, label, sel) in enumerate(cols):
        values = sorted(sel[axis].dropna().unique())
        lines = sorted(sel[by].dropna().unique()) if by else [None]
        for i, (metric, ylabel, scale, share) in enumerate(rows):
            ax = _value_panel(axs[i, j], values, share)
            for policy in _policies(sel):
                for k, v in enumerate(lines):
                    g = sel.loc[sel["policy"] == policy]
                    g = g if by is None else g.loc[g[by] == v]
                    st = grouped_ci(g, [axis], metric).dropna(subset=["mean"])
                    if st.empty:
                        continue
                    ax.errorbar([values.index(x) for x in st[axis]], st["mean"] * scale,
                                yerr=st["ci"].fillna(0.0) * scale, marker="o", ms=3, capsize=2,
                                ls=("-", "--", ":", "-.")[k % 4],
                                label=policy if by is None else f"{policy}, {by} = {v:g}")
            if i == len(rows) - 1:
                ax.set_xlabel(label)
            if j == 0:
                ax.set_ylabel(ylabel)
        axs[0, j].legend(fontsize="x-small")
    # The severity is the sweep's `set`, which the cells table does not hold: the spec says it.
    fig.suptitle("Conditions moved at one severity (the sweep's): mean, 95% CI over seeds", fontsize="medium")
    return [_save(fig, out / "study_i_conditions.png")]


# --------------------------------------------------------------------------- all


FIGURES: tuple[tuple[str, Callable[[pd.DataFrame, Sequence[str], Path], list[Path]]], ...] = (
    ("a: failure rate vs r", fig_failure_vs_severity),
    ("b: FaultAwareOTF-R vs FaultAwareLC reduction", fig_reduction),
    ("c: degraded availability and resilience vs r", fig_availability_vs_severity),
    ("d: deflection, gap to oracle, needless deflection vs r", fig_deflection_vs_severity),
    ("e: risk price and success ratio around the fault", fig_fault_series),
    ("f: label delay x noise heat map", fig_label_heatmap),
    ("g: sensitivity map r x load", fig_sensitivity),
    ("h: the headline figures, one condition at a time", fig_map),
    ("i: conditions at one r", fig_conditions),
)


def write_study_plots(cells: pd.DataFrame, axes: Sequence[str], out_dir: Path) -> tuple[list[Path], list[str]]:
    """Every figure whose cells exist into ``out_dir`` (created). Returns (written paths, one note per
    skipped figure: "<figure>: skipped, <reason>")."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    notes: list[str] = []
    for name, draw in FIGURES:
        if cells.empty:
            notes.append(f"{name}: skipped, no finished cells")
            continue
        try:
            paths += draw(cells, axes, out)
        except FigureSkipped as e:
            notes.append(f"{name}: skipped, {e}")
    return paths, notes
