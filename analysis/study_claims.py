"""A study run in both worlds -> one number per claim, world and seed, the verdict per claim
(analysis/claims.py), its table, one figure per claim, and reaction and cost side by side.

Input: each world's cells table (:func:`analysis.study.load_study` of ``STUDY/sim``, ``STUDY/testbed``
and, where the testbed ran seeds twice, ``STUDY/repeat``) and the claims resolved to points
(:func:`core.study.claim_sides`). A claim's value in a world and seed is ``metric`` of its (point,
policy) cell, minus that of its ``vs`` cell on the same seed where it has one; a seed with either cell
missing or NaN gives no value (the claim's ``n`` says how many did).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.claims import COLUMNS, WORLDS, claim_table, effect_ci
from analysis.metric_names import Metric as M, check_metric
from analysis.plots import _save, _slug
from analysis.study import STUDY_FILE, StudyError, load_study
from core.spec import SpecError
from core.study import ClaimSides, claim_sides
from core.study_spec import StudySpec

# What "reaction and cost" shows per world, point and policy (mean over seeds).
REACTION_COST = (M.FAILURE_RATE, M.REACTION_S, M.TRAFFIC_DEFLECTION_RATIO, M.NEEDLESS_DEFLECTION_RATIO,
                 M.DEGRADED_AVAILABILITY)
WORLD_COLORS = {"sim": "tab:blue", "testbed": "tab:orange", "repeat": "tab:orange"}


def check_claim_metrics(sides: Sequence[ClaimSides]) -> None:
    """A claim naming no metric is refused before any run (one line naming the claim)."""
    for s in sides:
        try:
            check_metric(s.metric)
        except ValueError as e:
            raise ValueError(f"claim {s.name}: {e}") from None


def _values(cells: pd.DataFrame, point: str, policy: str, metric: str) -> pd.Series:
    """metric per seed of one (point, policy); empty when the table lacks the metric or the cells."""
    if cells.empty or metric not in cells.columns:
        return pd.Series(dtype=float)
    sel = cells.loc[(cells["point"] == point) & (cells["policy"] == policy)]
    return sel.drop_duplicates("seed").set_index("seed")[metric].astype(float)


def claim_effects(frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides]) -> pd.DataFrame:
    """The long table analysis.claims reads (claim, world, seed, value), from each world's cells table
    (``frames``: world -> load_study frame; worlds as analysis.claims.WORLDS)."""
    rows = []
    for world, cells in frames.items():
        for s in sides:
            v = _values(cells, s.point, s.policy, s.metric)
            if s.vs is not None:
                v = v - _values(cells, *s.vs, s.metric)  # aligned on seed: a seed missing either side is NaN
            rows += [(s.name, world, int(seed), float(x)) for seed, x in v.dropna().items()]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def claims_frame(frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides],
                 confidence: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(verdict table, effects): :func:`analysis.claims.claim_table` of :func:`claim_effects`, in the
    claims' own order, with what each claim reads (metric, policy, point, vs) and says."""
    effects = claim_effects(frames, sides)
    table = claim_table(effects, confidence).set_index("claim")
    info = pd.DataFrame([{"claim": s.name, "says": s.says, "metric": s.metric, "policy": s.policy,
                          "point": s.point, "vs": "" if s.vs is None else f"{s.vs[1]} @ {s.vs[0]}"} for s in sides])
    out = info.join(table, on="claim")
    out["verdict"] = out["verdict"].fillna("n/a")  # a claim without a value in any world
    return out.reset_index(drop=True), effects


def reaction_cost(frames: Mapping[str, pd.DataFrame], axes: Sequence[str]) -> pd.DataFrame:
    """Reaction and cost per world, point and policy: the mean over seeds of :data:`REACTION_COST`
    (reaction_s over the seeds where it is defined) and how many seeds ran, the point's axes beside."""
    parts = []
    for world, cells in frames.items():
        if cells.empty:
            continue
        cols = [m for m in REACTION_COST if m in cells.columns]
        g = cells.groupby(["sweep", "point", "policy"], sort=True)
        agg = g[cols].mean().join(g["seed"].nunique().rename("n_seeds"))
        keys = cells.drop_duplicates("point").set_index("point")[[a for a in axes if a in cells.columns]]
        parts.append(agg.reset_index().join(keys, on="point").assign(world=world))
    if not parts:
        return pd.DataFrame(columns=["world", "sweep", "point", "policy", *REACTION_COST, "n_seeds"])
    df = pd.concat(parts, ignore_index=True)
    front = ["world", "sweep", "point", *[a for a in axes if a in df.columns], "policy", "n_seeds"]
    return df[front + [c for c in df.columns if c not in front]]


def _num(x: float, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def claims_console_table(table: pd.DataFrame) -> Table:
    t = Table(title="claims: simulator vs testbed (mean [95% CI] over seeds; repeatability = mean |testbed - "
                    "repeat|)")
    for c in ("claim", "sim", "testbed", "diff", "repeatability", "verdict"):
        t.add_column(c, justify="left" if c in ("claim", "verdict") else "right")
    for r in table.itertuples():
        sim = f"{_num(r.sim_mean)} [{_num(r.sim_low)}, {_num(r.sim_high)}] n={r.sim_n:.0f}"
        tb = f"{_num(r.tb_mean)} [{_num(r.tb_low)}, {_num(r.tb_high)}] n={r.tb_n:.0f}"
        style = {"carries over": "green", "does not carry over": "red"}.get(r.verdict, "yellow")
        t.add_row(escape(r.claim), sim, tb, _num(r.diff), f"{_num(r.repeatability)} (n={r.n_repeat:.0f})",
                  f"[{style}]{r.verdict}[/]")
    return t


def claim_figure(row: pd.Series, effects: pd.DataFrame, path: Path, confidence: float = 0.95) -> Path:
    """One claim, the two worlds side by side: each seed's value (the testbed's repeat hollow),
    the mean and its interval, 0 marked; the verdict in the title."""
    fig = Figure(figsize=(4.8, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    mine = effects.loc[effects["claim"] == row["claim"]]
    for x, world in enumerate(("sim", "testbed")):
        vals = mine.loc[mine["world"] == world, "value"].to_numpy(dtype=float)
        jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
        ax.scatter(x + jitter, vals, color=WORLD_COLORS[world], zorder=3, label=f"{world} (per seed)")
        mean, low, high, n = effect_ci(vals, confidence)
        if n:
            ax.hlines(mean, x - 0.25, x + 0.25, color="black", lw=2, zorder=4)
        if n > 1:
            ax.vlines(x + 0.3, low, high, color="black", lw=1.2)
        if world == "testbed":
            rep = mine.loc[mine["world"] == "repeat", "value"].to_numpy(dtype=float)
            if len(rep):
                ax.scatter(np.full(len(rep), x + 0.18), rep, facecolors="none", edgecolors=WORLD_COLORS[world],
                           zorder=3, label="testbed repeat")
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.set_xticks([0, 1], ["simulator", "testbed"])
    ax.set_xlim(-0.6, 1.6)
    what = row["metric"] + (f" − {row['vs']}" if row["vs"] else "")
    ax.set_ylabel(what if len(what) < 40 else row["metric"] + " (difference)", fontsize=8)
    ax.set_title(f"{row['claim']}: {row['verdict']}", fontsize=9)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def claims_report(frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides], axes: Sequence[str],
                  out_dir: Path, console: Console | None = None) -> pd.DataFrame:
    """Write claims.csv (one row per claim: verdict and both worlds' intervals), claim_effects.csv (the
    values behind it), reaction_cost.csv and one figure per claim into ``out_dir``; print the table.
    Returns the claims table."""
    unknown = sorted(set(frames) - set(WORLDS))
    if unknown:
        raise ValueError(f"unknown world(s) {', '.join(unknown)} (known: {', '.join(WORLDS)})")
    console = console or Console()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table, effects = claims_frame(frames, sides)
    table.to_csv(out / "claims.csv", index=False)
    effects.to_csv(out / "claim_effects.csv", index=False)
    rc = reaction_cost(frames, axes)
    rc.to_csv(out / "reaction_cost.csv", index=False)
    figures = [claim_figure(r, effects, out / f"claim_{_slug(r['claim'])}.png") for _, r in table.iterrows()]
    console.print(claims_console_table(table))
    counts = table["verdict"].value_counts().to_dict()
    console.print(f"{len(table)} claim(s): " + ", ".join(f"{n} {v}" for v, n in counts.items())
                  + f"; wrote claims.csv, claim_effects.csv, reaction_cost.csv and {len(figures)} figure(s) to {out}")
    return table


# The worlds' study directories in a carry-over study's directory (cli/study_testbed.py writes them).
SIM, TESTBED, REPEAT, CLAIMS = "sim", "testbed", "repeat", "claims"


def is_carryover(path: Path | str) -> bool:
    """True when ``path`` holds a study of both worlds: sim/ and testbed/, each with study.json."""
    return all((Path(path) / w / STUDY_FILE).is_file() for w in (SIM, TESTBED))


def carryover_sides(root: Path | str) -> list[ClaimSides]:
    """The claims of a carry-over study, resolved against its testbed side's cells as study.json lists
    them; a malformed file or a claim that selects no single point is a one-line StudyError."""
    f = Path(root) / TESTBED / STUDY_FILE
    try:
        raw = json.loads(f.read_text())
        study = StudySpec.model_validate(raw["study"])
        cells = [SimpleNamespace(**c) for c in raw["cells"]]
        return claim_sides(SimpleNamespace(study=study), cells, str(f))
    except (OSError, ValueError, KeyError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        msg = str(e).splitlines()[0] if not isinstance(e, SpecError) else str(e)
        raise StudyError(f"{f}: not a carry-over study's index ({msg})") from None


def carryover_report(root: Path | str, out_dir: Path | str | None = None,
                     console: Console | None = None) -> pd.DataFrame:
    """The claims of a carry-over study directory (sim/, testbed/ and, where the testbed repeated
    seeds, repeat/): :func:`claims_report` into ``out_dir`` (default ROOT/claims)."""
    root = Path(root)
    sides = carryover_sides(root)
    frames = {w: load_study(root / w) for w in (SIM, TESTBED, REPEAT) if (root / w / STUDY_FILE).is_file()}
    axes = list(frames[TESTBED].attrs["axes"])
    return claims_report(frames, sides, axes, Path(out_dir) if out_dir is not None else root / CLAIMS, console)
