"""A study run in both worlds -> one number per claim, world and seed, the verdict per claim
(study/verdicts.py, by the rule of analysis/rule/verdict.py), its table, one figure per claim, and
reaction and cost side by side.

Input: each world's cells table (:func:`study.table.load_study` of ``STUDY/sim``, ``STUDY/testbed``
and, where the testbed ran seeds twice, ``STUDY/repeat``) and the claims resolved to points
(:func:`study.grid.claim_sides`). A claim's value in a world and seed is ``metric`` of its (point,
policy) cell, minus that of its ``vs`` cell on the same seed where it has one; a seed with either cell
missing or NaN gives no value (the claim's ``n`` says how many did). Each claim's kind of fault and
the size of its runs come from its cells' run.json (:func:`point_conditions`), and with them its prior
(core/defaults/priors.yaml). The testbed's spread of a metric (:func:`testbed_spreads`) comes from
every cell the repeat holds, whatever claim it serves, and describes the instrument; the repeat is
judged per metric and kind of fault (:func:`repeat_verdicts`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from study.verdicts import COLUMNS, WORLDS, ClaimRule, claim_table, effect_prior
from study.looks import look_seeds
from analysis.run.names import Metric as M, check_metric
from analysis.run.plots import _save, _slug
from analysis.run.scalars import code_note
from study.table import STUDY_FILE, StudyError, load_study
from analysis.rule.verdict import (ALPHA, CARRIES, CONFIDENCE, DOES_NOT, FINDING, RULE_VERSION, UNDECIDED_CLAIM, Interval, Prior,
                              Spread, interval, repeat_verdict, shipped_prior, with_repeat, wrong_to_expect)
from analysis.compare.engine_death import HEAL_FILE, heal_table
from analysis.rule.priors import LINK_DOWN, NONE, fault_kind, widest
from core.records import read_meta
from core.spec.sizes import workload_requests
from core.spec.model import SpecError
from study.grid import ClaimSides, claim_cells, claim_points, claim_reads, claim_sides
from core.spec.study import StudySpec
from vocab import SIM, TESTBED

# What "reaction and cost" shows per world, point and policy (mean over seeds).
REACTION_COST = (M.FAILURE_RATE, M.REACTION_S, M.TRAFFIC_DEFLECTION_RATIO, M.NEEDLESS_DEFLECTION_RATIO,
                 M.DEGRADED_AVAILABILITY, M.RESILIENCE_INDEX)
WORLD_COLORS = {"sim": "tab:blue", "testbed": "tab:orange", "repeat": "tab:orange"}
VERDICT_STYLE = {CARRIES: "green", DOES_NOT: "red"}
CLAIMS_FIXED = "claims_fixed"  # study.json's record of the claims the runs began with


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
    """The long table study.verdicts reads (claim, world, seed, value, a, b), from each world's cells
    table (``frames``: world -> load_study frame; worlds as study.verdicts.WORLDS): a row per seed
    whose every cell the claim reads has finished, its value NaN where the metric is undefined there
    (so a look of a group-sequential design knows its seeds ran: study/looks.py)."""
    rows = []
    for world, cells in frames.items():
        for s in sides:
            both = _sides_values(cells, s)
            value = both["value"]
            if s.minus is not None:  # a difference of two claims' effects, seed by seed
                value = value - _sides_values(cells, s.minus)["value"]
            ran = _finished_seeds(cells, s)
            rows += [(s.name, world, int(seed), float(v), float(both.at[seed, "a"]), float(both.at[seed, "b"]))
                     for seed, v in value.items() if seed in ran]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _finished_seeds(cells: pd.DataFrame, s: ClaimSides) -> set[int]:
    """The seeds at which every cell ``s`` reads (study.grid.claim_reads) has a row: has finished."""
    if cells.empty:
        return set()
    out = None
    for point, policy in claim_reads(s):
        mine = set(cells.loc[(cells["point"] == point) & (cells["policy"] == policy), "seed"].astype(int))
        out = mine if out is None else out & mine
    return out or set()


def _sides_values(cells: pd.DataFrame, s: ClaimSides) -> pd.DataFrame:
    """Per seed: a (the claim's cell), b (its vs cell; NaN without) and value = a - b (a without vs);
    aligned on seed, so a seed missing either side has a NaN value."""
    a = _values(cells, s.point, s.policy, s.metric)
    if s.vs is None:
        return pd.DataFrame({"a": a, "b": math.nan, "value": a})
    b = _values(cells, *s.vs, s.metric)
    both = pd.DataFrame({"a": a, "b": b})
    return both.assign(value=both["a"] - both["b"])


Conditions = Mapping[str, tuple[str, float]]  # point -> (kind of fault, requests a run holds)


def point_conditions(cells: pd.DataFrame) -> dict[str, tuple[str, float]]:
    """Per point of a world's cells table: the kind of fault of its spec (analysis.rule.priors.fault_kind) and
    the requests a run holds, read from the run.json of one of its runs."""
    out: dict[str, tuple[str, float]] = {}
    if cells.empty or "run_dir" not in cells.columns:
        return out
    for point, run_dir in cells.drop_duplicates("point")[["point", "run_dir"]].itertuples(index=False):
        spec = read_meta(run_dir).get("spec") or {}
        requests = workload_requests(spec.get("workload") or {})
        out[str(point)] = (fault_kind(spec.get("faults") or []), math.nan if requests is None else requests)
    return out


def claim_rules(sides: Sequence[ClaimSides], conditions: Conditions | None = None) -> dict[str, ClaimRule]:
    """Each claim's judging rule as its spec fixed it, in the claims' order: its kind of fault is the
    widest of its points' (analysis.rule.priors.widest) and its prior that kind's for its metric, at the
    fewest requests of its points' runs."""
    conditions = conditions or {}
    rules = {}
    for s in sides:
        known = [conditions[p] for p in claim_points(s) if p in conditions]
        kind = widest(k for k, _ in known) if known else NONE
        requests = min((n for _, n in known if not math.isnan(n)), default=math.nan)
        rules[s.name] = ClaimRule(s.metric, s.direction, s.margin, s.measure, claim_cells(s), kind,
                                  shipped_prior(s.metric, kind, requests))
    return rules


def repeat_verdicts(testbed: pd.DataFrame, repeat: pd.DataFrame | None, rules: Mapping[str, ClaimRule],
                    conditions: Conditions) -> dict[tuple[str, str], tuple[str, Interval]]:
    """Per (metric, kind of fault) the claims judge: :func:`analysis.rule.verdict.repeat_verdict` of the
    differences first - repeat over every repeated run of a point of that kind (each distinct run
    once), against the smallest margin of the claims it serves, with the prior of a difference of two
    runs; empty without a repeat."""
    if repeat is None or repeat.empty or testbed.empty:
        return {}
    key = ["point", "policy", "seed"]
    a = testbed.drop_duplicates("run_dir") if "run_dir" in testbed.columns else testbed
    m = a.merge(repeat, on=key, suffixes=("", "_rep"))
    kinds = m["point"].map(lambda p: conditions.get(p, (NONE, math.nan))[0])
    judged: dict[tuple[str, str], tuple[float, Prior]] = {}  # the smallest margin a (metric, kind) serves
    for r in rules.values():
        margin = min(r.margin, judged.get((r.metric, r.kind), (math.inf, r.prior))[0])
        judged[(r.metric, r.kind)] = (margin, r.prior)
    out = {}
    for (metric, kind), (margin, prior) in judged.items():
        if metric not in m.columns:
            continue
        sel = m[kinds == kind]
        d = (sel[metric].astype(float) - sel[f"{metric}_rep"].astype(float)).dropna()
        out[(metric, kind)] = repeat_verdict(d.to_numpy(), margin, prior.times(2) if prior.known else prior)
    return out


def testbed_spreads(testbed: pd.DataFrame, repeat: pd.DataFrame | None, metrics: Sequence[str]) -> dict[str, Spread]:
    """The testbed's run-to-run spread of each metric (analysis.rule.verdict.Spread.of), pooled over every
    (point, policy, seed) the repeat holds, each distinct run once (cells that share a run are one
    pair); empty without a repeat."""
    if repeat is None or repeat.empty or testbed.empty:
        return {}
    key = ["point", "policy", "seed"]
    a = testbed.drop_duplicates("run_dir") if "run_dir" in testbed.columns else testbed
    m = a.merge(repeat, on=key, suffixes=("", "_rep"))
    out = {}
    for metric in dict.fromkeys(metrics):
        if metric in m.columns and f"{metric}_rep" in m.columns:
            out[metric] = Spread.of((m[metric].astype(float) - m[f"{metric}_rep"].astype(float)).to_numpy())
    return out


def _run_dirs(cells: pd.DataFrame | None, conditions: Conditions, kind: str) -> list[str]:
    """The distinct run directories of a world's cells whose point is of ``kind``."""
    if cells is None or cells.empty or "run_dir" not in cells.columns:
        return []
    mine = cells[cells["point"].map(lambda p: conditions.get(p, (NONE, math.nan))[0] == kind)]
    return list(dict.fromkeys(mine["run_dir"].astype(str)))


def leave_one_pair_out(table: pd.DataFrame, frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides],
                       conditions: Conditions) -> pd.DataFrame:
    """The same runs judged again with each repeated pair (a distinct run and its repeat) left out in
    turn: per pair, how many claims' verdicts move and which. Under this rule the repeat sets no
    interval's width, only whether the testbed repeats itself, so a pair moves a verdict only through
    its (metric, kind of fault)'s repeat verdict (analysis.rule.verdict.with_repeat); a design whose
    verdicts hang on one pair shows it here. Empty without a repeat."""
    repeat, tb = frames.get("repeat"), frames.get("testbed", pd.DataFrame())
    cols = ["point", "policy", "seed", "moved", "claims"]
    if repeat is None or repeat.empty or tb.empty:
        return pd.DataFrame(columns=cols)
    rules = claim_rules(sides, conditions)
    base = table.set_index("claim")
    first = {c: FINDING[e] for c, e in base["equivalence"].items()}
    rows = []
    # each distinct repeated run once (cells that share a run list it under each of their points)
    runs = repeat.drop_duplicates("run_dir") if "run_dir" in repeat.columns else repeat
    for r in runs.sort_values(["point", "policy", "seed"]).itertuples():
        key = (r.point, r.policy, r.seed)
        keep = repeat["run_dir"] != r.run_dir if "run_dir" in repeat.columns else \
            ~((repeat["point"] == key[0]) & (repeat["policy"] == key[1]) & (repeat["seed"] == key[2]))
        reps = repeat_verdicts(tb, repeat[keep], rules, conditions)
        moved = [name for name, r in rules.items()
                 if with_repeat(first[name], reps[(r.metric, r.kind)][0] if (r.metric, r.kind) in reps else None)
                 != base.loc[name, "verdict"]]
        rows.append({"point": key[0], "policy": key[1], "seed": key[2], "moved": len(moved),
                     "claims": ", ".join(moved)})
    return pd.DataFrame(rows, columns=cols)


def claims_frame(frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides],
                 conditions: Conditions | None = None, looks: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(verdict table, effects): :func:`study.verdicts.claim_table` of :func:`claim_effects`, in the
    claims' own order, with what each claim reads (metric, policy, point, vs) and says. ``conditions``
    (each point's kind of fault and run size) default to :func:`point_conditions` of the testbed's
    cells (else the simulator's); the repeat, where there is one, is judged by :func:`repeat_verdicts`;
    ``looks`` over the study's ``seeds``: a group-sequential design (study/looks.py)."""
    effects = claim_effects(frames, sides)
    tb = frames.get("testbed", pd.DataFrame())
    if conditions is None:
        conditions = point_conditions(tb if not tb.empty else frames.get("sim", pd.DataFrame()))
    rules = claim_rules(sides, conditions)
    repeats = repeat_verdicts(tb, frames.get("repeat"), rules, conditions)
    table = claim_table(effects, rules, repeats, looks, seeds).set_index("claim")
    info = pd.DataFrame([{"claim": s.name, "says": s.says, "metric": s.metric, "policy": s.policy,
                          "point": s.point, "vs": "" if s.vs is None else f"{s.vs[1]} @ {s.vs[0]}",
                          "minus": "" if s.minus is None else s.minus.name} for s in sides])
    return info.join(table, on="claim").reset_index(drop=True), effects


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


def _span(mean: float, low: float, high: float) -> str:
    return f"{_num(mean)} [{_num(low)}, {_num(high)}]"


def _claimed(r: Any) -> str:
    arrow = {"increase": "> 0", "decrease": "< 0", "none": "= 0"}[r.direction]
    return f"{arrow} ±{_num(r.margin)}" if r.direction == "none" else f"{arrow}, ±{_num(r.margin)}"


def claims_console_table(table: pd.DataFrame) -> Table:
    alphas = sorted(set(table["alpha"].dropna())) if "alpha" in table.columns else []
    pct = f"{100 * (1 - 2 * alphas[0]):.0f}%" if len(alphas) == 1 else f"{100 * CONFIDENCE:.0f}%"
    looked = bool(len(table)) and "look" in table.columns and len(alphas) == 1 and alphas[0] < ALPHA - 1e-12
    t = Table(title=f"claims: simulator vs testbed (mean [{pct} CI] over seeds, the seeds' variance pooled with "
                    f"its prior{', at the look that decided' if looked else ''}; rule {RULE_VERSION})")
    for c in ("claim", "claimed, margin", "simulator", "testbed", "tb - sim paired", "verdict", "seeds",
              *(("look",) if looked else ())):
        t.add_column(c, justify="left" if c in ("claim", "verdict") else "right")
    for r in table.itertuples():
        style = VERDICT_STYLE.get(r.verdict, "yellow")
        seeds = "–" if not (r.sim_n and r.tb_n) else "> 100" if math.isnan(r.seeds_needed) else f"{r.seeds_needed:.0f}"
        ratio = ""
        if r.measure == "ratio":
            ratio = f"\nratio sim {_span(r.ratio_sim, r.ratio_sim_low, r.ratio_sim_high)}, " \
                    f"tb {_span(r.ratio_tb, r.ratio_tb_low, r.ratio_tb_high)}"
        t.add_row(escape(r.claim), _claimed(r),
                  f"{_span(r.sim_mean, r.sim_low, r.sim_high)} n={r.sim_n:.0f}\n{r.sim_status}",
                  f"{_span(r.tb_mean, r.tb_low, r.tb_high)} n={r.tb_n:.0f}\n{r.tb_status}",
                  f"{_span(r.paired_mean, r.paired_low, r.paired_high)}\n{r.equivalence}",
                  f"[{style}]{escape(r.verdict)}[/]: {escape(r.reason)}{escape(ratio)}", seeds,
                  *((f"{r.look:.0f}",) if looked else ()))
    return t


def claim_figure(row: pd.Series, effects: pd.DataFrame, prior: Prior, path: Path,
                 seeds_read: Sequence[int] | None = None) -> Path:
    """One claim, the two worlds and their paired difference side by side: each seed's value (the
    testbed's repeat hollow), the mean and its interval, the claimed side of 0 shaded (for a null claim
    the band +-margin), the +-margin band around the paired difference; verdict and reason in the
    title. ``prior``: the prior of the claim's effect (study/verdicts.py effect_prior); ``seeds_read``:
    the seeds of the look that judged it (all without looks), intervals at that look's level."""
    fig = Figure(figsize=(5.6, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    mine = effects.loc[effects["claim"] == row["claim"]]
    if seeds_read is not None:
        mine = mine.loc[mine["seed"].isin(seeds_read)]
    alpha = float(row["alpha"]) if "alpha" in row and not pd.isna(row["alpha"]) else ALPHA
    m = float(row["margin"])
    per_world = {}
    for x, world in enumerate(("sim", "testbed")):
        w = mine.loc[mine["world"] == world].set_index("seed")["value"].astype(float)
        per_world[world] = w
        jitter = np.linspace(-0.12, 0.12, len(w)) if len(w) > 1 else np.zeros(len(w))
        ax.scatter(x + jitter, w.to_numpy(), color=WORLD_COLORS[world], zorder=3, label=f"{world} (per seed)")
        if world == TESTBED:
            rep = mine.loc[mine["world"] == "repeat", "value"].to_numpy(dtype=float)
            if len(rep):
                ax.scatter(np.full(len(rep), x + 0.18), rep, facecolors="none", edgecolors=WORLD_COLORS[world],
                           zorder=3, label="testbed repeat")
        _mean_and_interval(ax, x, interval(w.to_numpy(), prior, alpha=alpha))
    both = per_world["testbed"].index.intersection(per_world["sim"].index)
    paired = (per_world["testbed"][both] - per_world["sim"][both]).to_numpy()
    ax.scatter(2 + (np.linspace(-0.12, 0.12, len(paired)) if len(paired) > 1 else np.zeros(len(paired))), paired,
               color="tab:gray", zorder=3, label="testbed − sim (per seed)")
    _mean_and_interval(ax, 2, interval(paired, prior, alpha=alpha))
    ax.fill_between([1.6, 2.4], -m, m, color="tab:green", alpha=0.15, lw=0, label=f"±margin {m:g}")
    lo, hi = ax.get_ylim()
    claimed = {"increase": (0, max(hi, m)), "decrease": (min(lo, -m), 0), "none": (-m, m)}[row["direction"]]
    ax.fill_between([-0.6, 1.5], *claimed, color="tab:blue", alpha=0.07, lw=0, label="claimed")
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.set_xticks([0, 1, 2], ["simulator", "testbed", "tb − sim"])
    ax.set_xlim(-0.6, 2.6)
    what = row["metric"] + (f" − {row['vs']}" if row["vs"] else "")
    ax.set_ylabel(what if len(what) < 40 else row["metric"] + " (difference)", fontsize=8)
    ax.set_title(f"{row['claim']}: {row['verdict']}\n{row['reason']}", fontsize=8)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def _mean_and_interval(ax: Any, x: float, iv: Any) -> None:
    if iv.n:
        ax.hlines(iv.mean, x - 0.25, x + 0.25, color="black", lw=2, zorder=4)
    if iv.defined:
        ax.vlines(x + 0.3, iv.low, iv.high, color="black", lw=1.2)


def claims_report(frames: Mapping[str, pd.DataFrame], sides: Sequence[ClaimSides], axes: Sequence[str],
                  out_dir: Path, console: Console | None = None, fixed: Mapping[str, Any] | None = None,
                  looks: Sequence[int] | None = None, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """Write claims.csv (one row per claim: its rule, both worlds' intervals, the paired difference,
    the verdict and its reason), claim_effects.csv (the values behind it), claim_spreads.csv (the
    testbed's spread per metric), reaction_cost.csv, claims_leave_one_out.csv (:func:`leave_one_pair_out`),
    heal_disconnect.csv (the fitted heal disconnect judged on the link-down runs:
    analysis.compare.engine_death.heal_table) and one figure per claim into ``out_dir``; print
    the table. ``fixed``: the claims record the runs began with (study.json), compared with the claims
    judged now; ``looks`` over ``seeds``: the study's group-sequential design. Returns the claims table."""
    unknown = sorted(set(frames) - set(WORLDS))
    if unknown:
        raise ValueError(f"unknown world(s) {', '.join(unknown)} (known: {', '.join(WORLDS)})")
    console = console or Console()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tb = frames.get("testbed", pd.DataFrame())
    spreads = testbed_spreads(tb, frames.get("repeat"), [s.metric for s in sides])
    conditions = point_conditions(tb if not tb.empty else frames.get("sim", pd.DataFrame()))
    table, effects = claims_frame(frames, sides, conditions, looks, seeds)
    note = fixed_note(fixed)
    table["claims_as_fixed"] = note is None
    table.to_csv(out / "claims.csv", index=False)
    effects.to_csv(out / "claim_effects.csv", index=False)
    pd.DataFrame([{"metric": k, "sigma": v.sigma, "pairs": v.pairs} for k, v in spreads.items()],
                 columns=["metric", "sigma", "pairs"]).to_csv(out / "claim_spreads.csv", index=False)
    rc = reaction_cost(frames, axes)
    rc.to_csv(out / "reaction_cost.csv", index=False)
    loo = leave_one_pair_out(table, frames, sides, conditions)
    loo.to_csv(out / "claims_leave_one_out.csv", index=False)
    heal = heal_table([rd for w in ("testbed", "repeat") for rd in _run_dirs(frames.get(w), conditions, LINK_DOWN)])
    if heal is not None:
        heal.to_csv(out / HEAL_FILE, index=False)
    rules = claim_rules(sides, conditions)
    per_look = look_seeds(looks, seeds or []) if looks else None
    figures = [claim_figure(r, effects, effect_prior(rules[r["claim"]]), out / f"claim_{_slug(r['claim'])}.png",
                            per_look[int(r["look"]) - 1] if per_look and r["look"] >= 1 else None)
               for _, r in table.iterrows()]
    console.print(claims_console_table(table))
    counts = table["verdict"].value_counts().to_dict()
    console.print(wrong_to_expect(int((table["verdict"] != UNDECIDED_CLAIM).sum()), "claims"))
    if looks:
        at = table.loc[table["equivalence"] != "undecided", "look"].value_counts().to_dict()
        console.print(f"looks at {', '.join(map(str, looks))} seeds, each test at {ALPHA / len(looks):g}: "
                      + (", ".join(f"{at.get(k, 0)} decided at look {k}" for k in range(1, len(looks) + 1))))
    if heal is not None:
        n = heal["verdict"].value_counts().to_dict()
        console.print(f"the fitted heal disconnect ({heal['fitted_s'].iloc[0]:g} s, core/defaults/fits.yaml) on the "
                      f"{len(heal)} link down(s) of these runs: " + ", ".join(f"{k} {v}" for k, v in n.items())
                      + f" ({HEAL_FILE})")
    if len(loo):
        console.print(f"each of the {len(loo)} repeated pairs left out in turn: verdicts move with "
                      f"{int((loo['moved'] > 0).sum())} of them (at most {int(loo['moved'].max())} claims; "
                      "claims_leave_one_out.csv)")
    console.print(f"{len(table)} claim(s): " + ", ".join(f"{n} {v}" for v, n in counts.items())
                  + f"; wrote claims.csv, claim_effects.csv, claim_spreads.csv, reaction_cost.csv, "
                    f"claims_leave_one_out.csv and "
                    f"{len(figures)} figure(s) to {out}")
    if note:
        console.print(f"[yellow]note:[/] {escape(note)}")
    # the runs by the world they stand for here (the testbed's repeat apart), each counted once
    judged = [f.assign(world=w) for w, f in frames.items() if not f.empty and "commit" in f]
    if judged and (code := code_note(pd.concat(judged, ignore_index=True))) is not None:
        console.print(f"[yellow]note:[/] {escape(code)}")
    return table


# --------------------------------------------------------------------------- fixed before the run


def claims_digest(sides_or_claims: Any) -> str:
    """A hash of how the claims are judged (each claim's spec as written), order included."""
    raw = [c.model_dump(mode="json") if hasattr(c, "model_dump") else c for c in sides_or_claims]
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def fixed_record(previous: Mapping[str, Any] | None, claims: Sequence[Any], now: str) -> dict[str, Any]:
    """study.json's ``claims_fixed``: the claims' digest and the rule when the first run began; kept as
    it was on later calls, with the digest of the claims now beside it when they changed since."""
    digest = claims_digest(claims)
    if not previous:
        return {"digest": digest, "rule": RULE_VERSION, "at": now}
    rec = dict(previous)
    if rec.get("digest") != digest:
        rec["changed_to"], rec["changed_at"] = digest, now
    else:
        rec.pop("changed_to", None), rec.pop("changed_at", None)
    return rec


def fixed_note(fixed: Mapping[str, Any] | None) -> str | None:
    """None when the claims and the rule judging them now are those the runs began with; else a line
    saying what changed after the runs began."""
    if not fixed:
        return None
    what = []
    if fixed.get("changed_to"):
        what.append(f"the claims changed at {fixed.get('changed_at')} (digest {fixed['digest']} -> "
                    f"{fixed['changed_to']})")
    if fixed.get("rule") != RULE_VERSION:
        what.append(f"the runs began under rule {fixed.get('rule')}, judged now by {RULE_VERSION}")
    if not what:
        return None
    return ("claims or rule changed after the runs began (" + "; ".join(what) + "): these verdicts were not "
            "fixed before the runs; run the study again to judge by rules fixed in advance")


# --------------------------------------------------------------------------- a carry-over study directory

# The worlds' study directories in a carry-over study's directory (study/testbed_side.py writes them):
# each world's (vocab's SIM, TESTBED), the testbed's repeat and the claims.
REPEAT, CLAIMS = "repeat", "claims"


def is_carryover(path: Path | str) -> bool:
    """True when ``path`` holds a study of both worlds: sim/ and testbed/, each with study.json."""
    return all((Path(path) / w / STUDY_FILE).is_file() for w in (SIM, TESTBED))


def _index(root: Path | str) -> tuple[Path, dict[str, Any]]:
    f = Path(root) / TESTBED / STUDY_FILE
    try:
        return f, json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise StudyError(f"{f}: not a carry-over study's index ({str(e).splitlines()[0]})") from None


def carryover_sides(root: Path | str) -> list[ClaimSides]:
    """The claims of a carry-over study, resolved against its testbed side's cells as study.json lists
    them; a malformed file or a claim that selects no single point is a one-line StudyError."""
    f, raw = _index(root)
    try:
        study = StudySpec.model_validate(raw["study"])
        cells = [SimpleNamespace(**c) for c in raw["cells"]]
        return claim_sides(SimpleNamespace(study=study), cells, str(f))
    except (ValueError, KeyError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        msg = str(e).splitlines()[0] if not isinstance(e, SpecError) else str(e)
        raise StudyError(f"{f}: not a carry-over study's index ({msg})") from None


def carryover_report(root: Path | str, out_dir: Path | str | None = None,
                     console: Console | None = None) -> pd.DataFrame:
    """The claims of a carry-over study directory (sim/, testbed/ and, where the testbed repeated
    seeds, repeat/): :func:`claims_report` into ``out_dir`` (default ROOT/claims)."""
    root = Path(root)
    sides = carryover_sides(root)
    fixed = _index(root)[1].get(CLAIMS_FIXED)
    frames = {w: load_study(root / w) for w in (SIM, TESTBED, REPEAT) if (root / w / STUDY_FILE).is_file()}
    axes = list(frames[TESTBED].attrs["axes"])
    looks, seeds = carryover_looks(root)
    return claims_report(frames, sides, axes, Path(out_dir) if out_dir is not None else root / CLAIMS, console,
                         fixed, looks, seeds)


def carryover_looks(root: Path | str) -> tuple[list[int] | None, list[int] | None]:
    """(looks, the study's seeds in order) of a carry-over study's index; (None, None) without looks."""
    f, raw = _index(root)
    study = StudySpec.model_validate(raw["study"])
    return (study.looks, study.seeds) if study.looks else (None, None)
