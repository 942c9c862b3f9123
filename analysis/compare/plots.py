"""Overlay plots of the sim-vs-testbed comparison: both worlds on one axis, one panel per policy.

Built like analysis/run/plots.py: ``matplotlib.figure.Figure`` saved through the Agg canvas, no pyplot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.run.plots import RunCurves, _mean_over_seeds, _save, _shade, _slug

# Line style per world: the simulator solid, the testbed dashed.
STYLE = {"sim": "-", "testbed": "--"}


def _by_policy_world(curves: Sequence[RunCurves]) -> dict[tuple[str, str], list[RunCurves]]:
    out: dict[tuple[str, str], list[RunCurves]] = {}
    for c in curves:
        out.setdefault((c.policy, c.world), []).append(c)
    return out


def _panels(n: int, title: str) -> tuple[Figure, list]:
    fig = Figure(figsize=(8, 2.6 * n))
    axes = list(fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0])
    fig.suptitle(title)
    return fig, axes


def plot_success_overlay(curves: Sequence[RunCurves], policies: Sequence[str], scenario: str,
                         out_dir: Path) -> Path | None:
    """fidelity_success_ratio_<scenario>.png: a panel per policy, success ratio per time bin (mean over
    seeds) of the sim (solid) and the testbed (dashed), fault window of both worlds shaded. None without
    policies."""
    if not policies:
        return None
    groups = _by_policy_world(curves)
    fig, axes = _panels(len(policies), f"Success ratio over time, sim (solid) vs testbed (dashed): {scenario}")
    for ax, policy in zip(axes, policies):
        _shade(ax, [c for w in STYLE for c in groups.get((policy, w), [])])
        for world, style in STYLE.items():
            cs = groups.get((policy, world), [])
            if cs:
                s = _mean_over_seeds([c.success for c in cs], "success_ratio")
                ax.plot(s.index.to_numpy() + cs[0].bin_s / 2, s.to_numpy(), style, marker=".",
                        label=f"{world} (n={len(cs)})")
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("success ratio")
        ax.set_title(policy, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower left")
    axes[-1].set_xlabel("time since run start (s), bin centres")
    return _save(fig, out_dir / f"fidelity_success_ratio_{_slug(scenario)}.png")


def plot_price_overlay(curves: Sequence[RunCurves], policies: Sequence[str], scenario: str,
                       out_dir: Path) -> Path | None:
    """fidelity_risk_price_<scenario>.png: a panel per policy that recorded prices in either world, the
    mean risk price of the degraded pods (blue) and of the other pods (grey) per time bin, sim solid and
    testbed dashed. None when no policy recorded prices."""
    groups = _by_policy_world(curves)
    priced = [p for p in policies if any(len(c.prices) for w in STYLE for c in groups.get((p, w), []))]
    if not priced:
        return None
    fig, axes = _panels(len(priced), f"Risk price, sim (solid) vs testbed (dashed): {scenario}")
    for ax, policy in zip(axes, priced):
        _shade(ax, [c for w in STYLE for c in groups.get((policy, w), [])])
        for world, style in STYLE.items():
            cs = [c for c in groups.get((policy, world), []) if len(c.prices)]
            if not cs:
                continue
            for col, label, color in (("degraded_price", "degraded pods", "tab:blue"),
                                      ("other_price", "other pods", "tab:gray")):
                s = _mean_over_seeds([c.prices for c in cs], col)
                ax.plot(s.index.to_numpy() + cs[0].bin_s / 2, s.to_numpy(), style, color=color,
                        label=f"{label}, {world}")
        ax.set_ylabel("risk price")
        ax.set_title(policy, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("time since run start (s), bin centres")
    return _save(fig, out_dir / f"fidelity_risk_price_{_slug(scenario)}.png")


# The latency plot's worlds, in drawing order: the repeat dotted, beside the testbed it repeats.
LATENCY_STYLE = {"sim": "-", "testbed": "--", "repeat": ":"}


def plot_latency_overlay(frames: dict[str, pd.DataFrame], policies: Sequence[str], scenario: str,
                         out_dir: Path) -> Path | None:
    """fidelity_latency_<scenario>.png: per policy (a row), the empirical distribution of TTFT and of
    E2E (a column each) over the ok requests of every seed, the sim (solid), the testbed (dashed)
    and, where given, its repeat (dotted) on one log-scaled axis, so a shift between the worlds
    shows beside the testbed's own. ``frames``: world -> :func:`analysis.compare.paired.request_frame` rows.
    None without policies."""
    if not policies:
        return None
    fig = Figure(figsize=(10, 2.6 * len(policies)))
    axes = fig.subplots(len(policies), 2, squeeze=False)
    fig.suptitle(f"Latency of ok requests, sim (solid), testbed (dashed), repeat (dotted): {scenario}")
    for row, policy in zip(axes, policies):
        for ax, metric in zip(row, ("ttft", "e2e")):
            for world, style in LATENCY_STYLE.items():
                f = frames.get(world)
                if f is None or f.empty:
                    continue
                x = np.sort(f.loc[f["policy"] == policy, f"{metric}_s"].dropna().to_numpy(float))
                if x.size:
                    ax.step(x, np.arange(1, x.size + 1) / x.size, style, where="post",
                            label=f"{world} (n={x.size}, p50 {np.median(x):.3g} s)")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{policy}: {metric.upper()}", fontsize="medium")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="x-small", loc="lower right")
        row[0].set_ylabel("share of ok requests")
    for ax in axes[-1]:
        ax.set_xlabel("seconds (log scale)")
    fig.tight_layout()
    return _save(fig, out_dir / f"fidelity_latency_{_slug(scenario)}.png")
