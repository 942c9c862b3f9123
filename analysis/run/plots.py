"""PNG plots of a set of runs: success ratio over time, risk price over time, failure composition.

Figures are built with ``matplotlib.figure.Figure`` and saved through the Agg
canvas directly: no pyplot, so no global backend switch and no open-figure
state leaking into the caller's process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.run.names import UNKNOWN_STAGE, fail_share
from analysis.run.names import Metric as M
from analysis.run.metrics import FaultWindow, fault_window, price_contrast, success_series
from analysis.run.data import RunData
from core.stages import ADMISSION, FAILURE_STAGES


@dataclass(frozen=True)
class RunCurves:
    """The time series of one run that the plots need (small: one row per bin)."""

    scenario: str
    world: str
    policy: str
    seed: int
    bin_s: float
    success: pd.DataFrame  # success_series columns
    prices: pd.DataFrame  # price_contrast columns
    window: FaultWindow | None


def run_curves(run: RunData) -> RunCurves:
    """Success-ratio and price series of one loaded run, binned with its spec's bin_s."""
    window = fault_window(run.faults, run.requests)
    pods = window.pods if window else ()
    return RunCurves(
        scenario=run.scenario,
        world=run.world,
        policy=run.policy,
        seed=run.seed,
        bin_s=run.spec.bin_s,
        success=success_series(run.requests, run.spec.bin_s),
        prices=price_contrast(run.prices, pods, run.spec.bin_s),
        window=window,
    )


def _slug(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p).strip("-") or "x" for p in parts)


def _groups(curves: Sequence[RunCurves]) -> dict[tuple[str, str], list[RunCurves]]:
    out: dict[tuple[str, str], list[RunCurves]] = {}
    for c in curves:
        out.setdefault((c.scenario, c.world), []).append(c)
    return dict(sorted(out.items()))


def _shade(ax, group: Sequence[RunCurves]) -> None:
    """Shade the fault window: earliest onset to latest end over the runs of the group."""
    ws = [c.window for c in group if c.window is not None]
    if ws:
        ax.axvspan(min(w.onset_s for w in ws), max(w.end_s for w in ws), color="tab:red", alpha=0.12,
                   label="fault window")


def _mean_over_seeds(frames: list[pd.DataFrame], col: str) -> pd.Series:
    """Mean of ``col`` per bin_start_s over runs, NaN (empty bins) left out."""
    cat = pd.concat([f[["bin_start_s", col]] for f in frames], ignore_index=True)
    return cat.groupby("bin_start_s", sort=True)[col].mean()


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_success_ratio(curves: Sequence[RunCurves], out_dir: Path) -> list[Path]:
    """One PNG per (scenario, world): success ratio per time bin, one line per policy (mean over seeds),
    fault window shaded."""
    paths = []
    for (scenario, world), group in _groups(curves).items():
        fig = Figure(figsize=(8, 4))
        ax = fig.add_subplot()
        _shade(ax, group)
        by_policy: dict[str, list[RunCurves]] = {}
        for c in group:
            by_policy.setdefault(c.policy, []).append(c)
        for policy, cs in sorted(by_policy.items()):
            s = _mean_over_seeds([c.success for c in cs], "success_ratio")
            ax.plot(s.index.to_numpy() + cs[0].bin_s / 2, s.to_numpy(), marker=".", label=f"{policy} (n={len(cs)})")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("time since run start (s), bin centres")
        ax.set_ylabel("success ratio (ok / all)")
        ax.set_title(f"Success ratio over time: {scenario} [{world}]")
        ax.legend(fontsize="small", loc="lower left")
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir / f"success_ratio_{_slug(scenario, world)}.png"))
    return paths


def plot_risk_price(curves: Sequence[RunCurves], out_dir: Path) -> list[Path]:
    """One PNG per (scenario, world) with price records: per policy a panel with the mean risk price of the
    degraded pods and of the other pods per time bin (mean over seeds), fault window shaded. Policies that
    recorded no prices get no panel; a group with none gets no file."""
    paths = []
    for (scenario, world), group in _groups(curves).items():
        by_policy: dict[str, list[RunCurves]] = {}
        for c in group:
            if len(c.prices):
                by_policy.setdefault(c.policy, []).append(c)
        if not by_policy:
            continue
        n = len(by_policy)
        fig = Figure(figsize=(8, 2.6 * n))
        axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
        for ax, (policy, cs) in zip(axes, sorted(by_policy.items())):
            _shade(ax, cs)
            half = cs[0].bin_s / 2
            lines = (("degraded_price", "degraded pods", "-"), ("other_price", "other pods (mean)", "--"))
            for col, label, style in lines:
                s = _mean_over_seeds([c.prices for c in cs], col)
                ax.plot(s.index.to_numpy() + half, s.to_numpy(), style, label=label)
            ax.set_ylabel("risk price")
            ax.set_title(f"{policy} (n={len(cs)})", fontsize="medium")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        axes[-1].set_xlabel("time since run start (s), bin centres")
        fig.suptitle(f"Risk price: {scenario} [{world}]")
        paths.append(_save(fig, out_dir / f"risk_price_{_slug(scenario, world)}.png"))
    return paths


def plot_failure_composition(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One PNG per (scenario, world): a stacked bar per policy; each segment is the mean over seeds of
    failure_rate * fail_share_<stage> (failures in that stage / all requests), so a bar's height is the
    mean failure rate."""
    paths = []
    if runs.empty:
        return paths
    stages = [*FAILURE_STAGES, UNKNOWN_STAGE]
    colors = ["tab:purple", "tab:gray", "tab:blue", "tab:orange", "tab:red", "tab:green", "k"]
    for (scenario, world), g in runs.groupby(["scenario", "world"], sort=True):
        policies = sorted(g["policy"].unique())
        fr = g[M.FAILURE_RATE].to_numpy(dtype=float)
        fig = Figure(figsize=(max(5.0, 1.1 * len(policies) + 2), 4))
        ax = fig.add_subplot()
        bottom = np.zeros(len(policies))
        for stage, color in zip(stages, colors):
            # A run without failures has NaN shares but contributes 0 to every stage.
            part = np.where(fr > 0, fr * g[fail_share(stage)].to_numpy(dtype=float), 0.0)
            h = pd.Series(part, index=g.index).groupby(g["policy"]).mean().reindex(policies).fillna(0.0).to_numpy()
            if stage in (ADMISSION, UNKNOWN_STAGE) and not h.any():  # only where there are any
                continue
            ax.bar(policies, h, bottom=bottom, color=color, label=stage)
            bottom += h
        ax.set_ylabel("failure rate (failed / all), by stage")
        ax.set_title(f"Failure composition: {scenario} [{world}]")
        ax.legend(fontsize="small")
        ax.tick_params(axis="x", labelrotation=30)
        ax.grid(axis="y", alpha=0.3)
        paths.append(_save(fig, out_dir / f"failure_composition_{_slug(scenario, world)}.png"))
    return paths


def write_plots(curves: Sequence[RunCurves], runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """All plots into ``out_dir`` (created); returns the written paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        *plot_success_ratio(curves, out_dir),
        *plot_risk_price(curves, out_dir),
        *plot_failure_composition(runs, out_dir),
    ]
