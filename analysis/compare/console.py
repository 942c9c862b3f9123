"""The sim-vs-testbed comparison on the console (rich tables) and as CSV files and figures: the
per-policy checks, the paired report (analysis/compare/paired.py), the testbed's repeatability
(analysis/compare/repeatability.py); `testbed compare` itself (:func:`compare`: what analysis/compare/fidelity.py
measures, written and printed: every table with ``full``, else the verdict in 100 columns that
analysis/compare/compact.py draws)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.checks.calibration import print_calibration_check, write_calibration_check
from analysis.compare.engine_death import print_engine_table, write_engine_table
from analysis.compare.fidelity import Fidelity, measure
from analysis.compare.compact import (format_order, is_nan as _nan, mark as _mark, num as _num, print_compact,
                                       rank_lines, repeat_line)
from analysis.compare.plots import plot_latency_overlay, plot_price_overlay, plot_success_overlay
from analysis.checks.host_demand import print_host_demand, write_host_demand
from analysis.checks.host_window import print_host_window, write_host_window
from analysis.run.names import LATENCIES, Metric as M, latency
from analysis.run.scalars import code_note
from analysis.compare.paired import ALL, OUTCOME_AGREEMENT, SPAN_NAMES, PairedReport
from analysis.compare.paired_stats import SUMMARY_STATS
from analysis.rule.verdict import NO_PRIOR, RULE_VERSION
from core.stages import FAILURE_STAGES
from vocab import SIM

LABEL = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def _pct(mean: float, half: float = math.nan) -> str:
    if _nan(mean):
        return "–"
    return f"{100 * mean:.1f}%" + ("" if _nan(half) else f" ± {100 * half:.1f}")


def _checks(fid: Fidelity) -> dict[tuple[str, str], pd.Series]:
    return {(r["policy"], r["metric"]): r for _, r in fid.table.iterrows()}


def _dev_ci(r: pd.Series, dev: str) -> str:
    """The judged deviation and its interval: "-6% [-10, -2]" (relative) or "+0.05 [-0.01, 0.11]"."""
    if dev == "rel":
        ci = "" if _nan(r["dev_low"]) else f" [{100 * r['dev_low']:+.0f}, {100 * r['dev_high']:+.0f}]"
        return _num(100 * r["deviation"], "+.0f") + "%" + ci
    ci = "" if _nan(r["dev_low"]) else f" [{r['dev_low']:+.2f}, {r['dev_high']:+.2f}]"
    return _num(r["deviation"], "+.2f") + ci


def _pair(r: pd.Series, fmt: str, dev: str) -> str:
    """"sim / testbed (deviation [90% CI])", coloured by the check's verdict: one cell per metric keeps
    the table readable in an 120-column terminal."""
    return _mark(f"{_num(r['sim'], fmt)} / {_num(r['testbed'], fmt)} ({_dev_ci(r, dev)})", r["verdict"])


def _policy_table(fid: Fidelity) -> Table:
    t = Table(title=escape(f"Fidelity: {fid.scenario}, sim vs testbed (mean over seeds; in brackets the deviation "
                           "judged, per seed: rel. err = (sim - testbed) / testbed, diff = testbed - sim, and its 90% "
                           "CI; colour: the verdict)"))
    t.add_column("policy", no_wrap=True)  # the other columns give way first
    for h in ("seeds sim/tb", "fail. rate sim", "fail. rate testbed", "diff (pp) [CI]", "outcome agreement",
              "TTFT p50 (s) sim / tb (rel. err)", "E2E p50 (s) sim / tb (rel. err)", "deflection sim / tb (diff)",
              "pass/fail/undec."):
        t.add_column(h, justify="right", no_wrap=h.startswith("fail."))  # keep "mean ± CI" on one line
    c = _checks(fid)
    for p in fid.policies:
        fr = c[(p, M.FAILURE_RATE)]
        mine = [v for q, _, v in fid.verdicts() if q == p]  # the policy's checks, its engine checks included
        ci = "" if _nan(fr["dev_low"]) else f" [{100 * fr['dev_low']:+.1f}, {100 * fr['dev_high']:+.1f}]"
        t.add_row(escape(p), f"{fr['sim_n']}/{fr['testbed_n']}", _pct(fr["sim"], fr["sim_ci"]),
                  _pct(fr["testbed"], fr["testbed_ci"]), _mark(_num(100 * fr["deviation"], "+.1f") + ci, fr["verdict"]),
                  _agreement(c.get((p, OUTCOME_AGREEMENT))),
                  _pair(c[(p, latency("ttft", 50))], ".3g", "rel"),
                  _pair(c[(p, latency("e2e", 50))], ".3g", "rel"), _pair(c[(p, M.TRAFFIC_DEFLECTION_RATIO)], ".2f", "abs"),
                  "/".join(str(mine.count(v)) for v in ("pass", "fail", "undecided")))
    return t


def _agreement(r: pd.Series | None) -> str:
    """"94.4% of 18", coloured by the outcome-agreement check."""
    if r is None or _nan(r["sim"]):
        return "–"
    return _mark(f"{_pct(r['sim'])} of {int(r['sim_n'])}", r["verdict"])


def _rank_pairs(fid: Fidelity) -> Table:
    t = Table(title="Policy pairs: failure rate a - b (pp, mean [90% CI]) and its order in each world (=: within "
                    "the failure-rate tolerance), the worlds' deviation in it; agree when the deviation is within the "
                    "tolerance or both worlds order the pair alike")
    for h in ("a", "b", "sim a - b", "testbed a - b", "tb - sim", ""):
        t.add_column(h, justify="left" if h in ("a", "b", "") else "right")
    colour = {"agree": "green", "disagree": "red", "open": "yellow"}

    def cell(r: Any, w: str) -> str:
        lo, hi = getattr(r, f"{w}_low"), getattr(r, f"{w}_high")
        ci = "" if _nan(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        return f"{_num(100 * getattr(r, f'{w}_diff'), '+.1f')}{ci} {getattr(r, f'{w}_order')}"

    for r in fid.rank.pairs.itertuples():
        dev = "" if _nan(r.dev_low) else f" [{100 * r.dev_low:+.1f}, {100 * r.dev_high:+.1f}]"
        t.add_row(escape(r.a), escape(r.b), cell(r, "sim"), cell(r, "testbed"),
                  _num(100 * r.deviation, "+.1f") + dev, f"[{colour[r.agreement]}]{r.agreement}[/]")
    return t


def _tail_table(fid: Fidelity) -> Table:
    t = Table(title="Tail latency on ok requests (p90, mean over seeds)")
    t.add_column("policy", no_wrap=True)
    t.add_column("TTFT p90 (s) sim / tb (rel. err)", justify="right")
    t.add_column("E2E p90 (s) sim / tb (rel. err)", justify="right")
    c = _checks(fid)
    for p in fid.policies:
        t.add_row(escape(p), _pair(c[(p, latency("ttft", 90))], ".3g", "rel"), _pair(c[(p, latency("e2e", 90))], ".3g", "rel"))
    return t


def _composition_table(fid: Fidelity) -> Table:
    t = Table(title="Failure composition by stage (share of failures, mean over seeds)")
    stages = [*FAILURE_STAGES, "unknown"]
    t.add_column("policy")
    t.add_column("world")
    for s in stages:
        t.add_column(s, justify="right")
    comp = fid.composition.set_index(["policy", "stage"])
    for p in fid.policies:
        for world in ("sim", "testbed"):
            t.add_row(escape(p) if world == SIM else "", world,
                      *(_pct(comp.loc[(p, s), f"{world}_share"]) for s in stages))
    return t


def _noise_lines(fid: Fidelity) -> list[str]:
    out = []
    for r in fid.noise.itertuples():
        diff, expl, frac = r.failure_rate_diff, r.noise_explained, r.noise_explained_fraction
        share = "" if _nan(frac) else f" ({100 * frac:.0f}% of it)"
        out.append(
            f"  {escape(r.policy)}: sim {_pct(r.noise_floor_sim)} ({_pct(r.clean_share_sim)} of requests), testbed "
            f"{_pct(r.noise_floor_testbed)} ({_pct(r.clean_share_testbed)}); of the {_num(100 * diff, '+.1f')} pp "
            f"failure-rate difference, host noise could explain {_num(100 * expl, '+.1f')} pp{share}"
        )
    return out


# --------------------------------------------------------------------------- the paired report


def _rel(x: float, sign: str = "+") -> str:
    return "–" if _nan(x) else f"{100 * x:{sign}.0f}%"


def _ci(row: pd.Series, key: str) -> str:
    """"-76% [-81, -63]": a quantile of relative errors with its bootstrap interval (no sign on |err|)."""
    lo, hi = row[f"{key}_lo"], row[f"{key}_hi"]
    sign = "" if key.startswith("abs") else "+"
    ci = "" if _nan(lo) else f" [{100 * lo:{sign}.0f}, {100 * hi:{sign}.0f}]"
    return _rel(row[key], sign) + ci


def _classes(cells: pd.DataFrame, col: str) -> list[str]:
    return sorted(set(cells[col]), key=lambda c: (c != "ok", c))


def _confusion_table(rep: PairedReport, checks: dict[tuple[str, str], pd.Series]) -> Table:
    who = rep.versus
    t = Table(title=escape(f"Outcomes request by request: testbed (rows) vs {who} (columns), pooled over seeds"))
    t.add_column("policy", no_wrap=True)
    t.add_column("testbed")
    others = _classes(rep.confusion, "other")
    for c in others:
        t.add_column(escape(c), justify="right")
    t.add_column("agreement", justify="right")
    t.add_column(f"one side only (tb/{who})", justify="right")
    agree = rep.agreement.set_index("policy")
    for p in rep.policies:
        cells = rep.confusion[rep.confusion["policy"] == p]
        a = agree.loc[p]
        first = True
        for tc in _classes(cells, "testbed") or ["–"]:
            row = cells[cells["testbed"] == tc].set_index("other")["n"]
            verdict = checks.get((p, OUTCOME_AGREEMENT), pd.Series({"verdict": "n/a"}))["verdict"]
            share = f"{_pct(a['agreement'])} ({int(a['agree'])}/{int(a['matched'])})"
            t.add_row(escape(p) if first else "", escape(tc),
                      *(str(int(row[o])) if o in row.index else "" for o in others),
                      _mark(share, verdict) if first else "",
                      f"{int(a['only_testbed'])}/{int(a['only_other'])}" if first else "")
            first = False
    return t


def _error_table(rep: PairedReport) -> Table:
    t = Table(title=escape(f"Per-request latency error ({rep.versus} - testbed) / testbed, requests ok in both: "
                           "quantile [95% bootstrap CI]"))
    t.add_column("policy", no_wrap=True)
    t.add_column("", no_wrap=True)
    for h in ("n", "median", "p90", "|err| median", "|err| p90", "median inside / outside fault"):
        t.add_column(h, justify="right")
    e = rep.errors.set_index(["policy", "window", "metric"])
    for p in rep.policies:
        for i, m in enumerate(LATENCIES):
            r = e.loc[(p, ALL, m)]
            split = " / ".join(_rel(e.loc[(p, w, m), "signed_p50"]) if (p, w, m) in e.index else "–"
                               for w in ("inside", "outside"))
            t.add_row(escape(p) if i == 0 else "", LABEL[m], str(int(r["n"])), _ci(r, "signed_p50"), _ci(r, "signed_p90"),
                      _ci(r, "abs_p50"), _ci(r, "abs_p90"), split if m != "tpot" else "")
    return t


def _stage_table(rep: PairedReport) -> Table:
    t = Table(title=escape(f"Where the E2E gap comes from: mean ({rep.versus} - testbed) per stage, s "
                           "(share of the E2E gap), requests ok in both"))
    t.add_column("policy", no_wrap=True)
    t.add_column("fault window")
    t.add_column("n", justify="right")
    for s in (*SPAN_NAMES, "e2e"):
        t.add_column(escape(s.replace("_", " ") if s != "e2e" else "E2E"), justify="right")
    g = rep.stages.set_index(["policy", "window", "stage"])
    for p in rep.policies:
        for i, w in enumerate(("inside", "outside")):
            cells = []
            for s in (*SPAN_NAMES, "e2e"):
                r = g.loc[(p, w, s)]
                share = "" if _nan(r["share"]) or s == "e2e" else f" ({100 * r['share']:.0f}%)"
                cells.append(_num(r["gap_mean_s"], "+.2f") + share)
            t.add_row(escape(p) if i == 0 else "", w, str(int(g.loc[(p, w, "e2e"), "n"])), *cells)
    return t


def _mape_table(rep: PairedReport) -> Table:
    t = Table(title=escape(f"MAPE of the {rep.versus} against the testbed: mean over seeds of "
                           f"|stat {rep.versus} - stat testbed| / stat testbed, ok requests"))
    t.add_column("policy", no_wrap=True)
    t.add_column("seeds", justify="right")
    for m in LATENCIES:
        t.add_column(LABEL[m], justify="right")
    mp = rep.mape.set_index(["policy", "metric", "stat"])
    for p in (*rep.policies, ALL):
        if (p, "ttft", "mean") not in mp.index:
            continue
        cells = []
        for m in LATENCIES:
            parts = [f"{st} {100 * mp.loc[(p, m, st), 'mape']:.0f}%" for st in SUMMARY_STATS
                     if not _nan(mp.loc[(p, m, st), "mape"])]
            cells.append(" · ".join(parts) or "–")
        t.add_row(escape(p), str(int(mp.loc[(p, "ttft", "mean"), "n_seeds"])), *cells)
    return t


def print_paired(rep: PairedReport, console: Console, checks: dict[tuple[str, str], pd.Series] | None = None) -> None:
    """The paired report's tables: outcomes, per-request errors, stage gaps, MAPE."""
    console.print(_confusion_table(rep, checks or {}))
    console.print(_error_table(rep))
    console.print(_stage_table(rep))
    console.print(_mape_table(rep))


# --------------------------------------------------------------------------- repeatability

REPEAT_COLUMNS = ((M.FAILURE_RATE, "fail. rate (pp)"), (OUTCOME_AGREEMENT, "outcomes differ"),
                  (latency("ttft", 50), "TTFT p50"), (latency("ttft", 90), "TTFT p90"),
                  (latency("e2e", 50), "E2E p50"), (latency("e2e", 90), "E2E p90"))


def _dev(x: float, kind: str) -> str:
    if _nan(x):
        return "–"
    return _rel(x) if kind == "rel" else f"{100 * x:+.1f}" if kind == "abs" else f"{100 * x:.1f}%"


def _repeat_table(fid: Fidelity) -> Table:
    t = Table(title=escape("Repeatability: the testbed against its repeat, beside the sim against the testbed "
                           "(repeat / sim, mean deviations; colour: the sim's verdict)"))
    t.add_column("policy", no_wrap=True)
    t.add_column("seeds", justify="right")
    for _, h in REPEAT_COLUMNS:
        t.add_column(h, justify="right")
    t.add_column("per request |err| median TTFT / E2E, repeat (sim)", justify="right")
    c = _checks(fid)
    rep_t = fid.repeatability.set_index(["policy", "metric"]) if fid.repeatability is not None else None
    errs = {v.versus: v.errors.set_index(["policy", "window", "metric"]) for v in (fid.paired, fid.repeat) if v}
    for p in fid.policies:
        cells = []
        for m, _ in REPEAT_COLUMNS:
            r = c[(p, m)]
            kind = r["tolerance_kind"]
            sim_dev = r["deviation"]
            cells.append(_mark(f"{_dev(r['repeatability'], kind)} / {_dev(sim_dev, kind)}", r["verdict"]))
        med = []
        for m in ("ttft", "e2e"):
            rp, sm = (errs[v].loc[(p, ALL, m), "abs_p50"] if v in errs else math.nan for v in ("repeat", "sim"))
            med.append(f"{_rel(rp, '')} ({_rel(sm, '')})")
        seeds = int(rep_t.loc[(p, M.FAILURE_RATE), "repeat_n"]) if rep_t is not None else 0
        t.add_row(escape(p), str(seeds), *cells, " / ".join(med))
    return t


def _calibrations_table(fid: Fidelity) -> Table:
    """The simulator's figures over its calibrations: under its own, and the range over all."""
    t = Table(title=escape(f"The simulator over {fid.calibrations} calibrations (mean over seeds under the twin's "
                           "own calibration [least, greatest over all]); its spread over them, sigma of each "
                           "deviation, widens every check's interval"))
    t.add_column("policy", no_wrap=True)
    metrics = [(M.FAILURE_RATE, "fail. rate", 100, ".1f"),
               *((latency(k, q), f"{LABEL[k]} p{q} (s)", 1, ".3g") for k in ("ttft", "e2e") for q in (50, 90))]
    for _, head, _, _ in metrics:
        t.add_column(head, justify="right")
    c = _checks(fid)
    for p in fid.policies:
        cells = []
        for m, _, scale, fmt in metrics:
            r = c[(p, m)]
            cells.append(f"{_num(scale * r['sim'], fmt)} [{_num(scale * r['sim_cal_low'], fmt)}, "
                         f"{_num(scale * r['sim_cal_high'], fmt)}]")
        t.add_row(escape(p), *cells)
    sig = fid.calibration_spreads or {}
    t.add_row("sigma", *(("–" if m not in sig or not sig[m].known else
                          f"{100 * sig[m].sigma:.1f}" + ("pp" if m == M.FAILURE_RATE else "%"))
                         for m, _, _, _ in metrics), style="dim")
    return t


def print_fidelity(fid: Fidelity, console: Console) -> None:
    """The comparison's tables, rank, noise floor and overall verdict."""
    console.print(_policy_table(fid))
    console.print(_tail_table(fid))
    console.print(_composition_table(fid))
    if fid.paired is not None:
        print_paired(fid.paired, console, _checks(fid))
    if fid.repeat is not None:
        console.print(_repeat_table(fid))
    if fid.calibrations > 1:
        console.print(_calibrations_table(fid))
    if len(fid.rank.pairs):
        console.print(_rank_pairs(fid))
    for line in rank_lines(fid):  # the Kendall tau and the order, as the compact view says them
        console.print(line)
    console.print("noise floor: failure rate of the requests that touched no degraded pod (in brackets: their "
                  "share of all requests):")
    for line in _noise_lines(fid):
        console.print(line)
    if fid.calibration_noise:
        noise = ", ".join(f"{escape(k)} = {v:.4g}" for k, v in fid.calibration_noise.items())
        console.print(f"calibration noise: {noise}")
    if fid.only_sim or fid.only_testbed:
        console.print(f"[yellow]note:[/] compared only policies in both worlds; sim only: "
                      f"{escape(', '.join(fid.only_sim) or '–')}; "
                      f"testbed only: {escape(', '.join(fid.only_testbed) or '–')}")
    unfinished = fid.runs.loc[fid.runs["status"] != "finished", ["run_dir", "status"]]
    if len(unfinished):
        listed = escape(", ".join(f"{r.run_dir} ({r.status})" for r in unfinished.itertuples()))
        console.print(f"[yellow]note:[/] {len(unfinished)} run(s) did not finish; their rows up to the stop are "
                      f"included: {listed}")
    if (code := code_note(fid.runs)) is not None:
        console.print(f"[yellow]note:[/] {escape(code)}")
    n = fid.counts()
    # a failed failure rate says how much of its gap the testbed's host noise could account for
    explained = dict(zip(fid.noise["policy"], fid.noise["noise_explained_fraction"]))
    needed = {(r.policy, r.metric): r.seeds_needed for r in fid.table.itertuples()}
    failed = [f"{p} {m}" + (f" (host noise could explain {100 * explained[p]:.0f}%)"
                            if m == M.FAILURE_RATE and not _nan(explained.get(p, math.nan)) else "")
              for p, m, v in fid.verdicts() if v == "fail"]
    def seeds(p: str, m: str) -> str:
        if (p, m) not in needed:  # the rank and the engine rows say their own
            return ""
        return " (over 100 seeds)" if _nan(needed[(p, m)]) else f" ({needed[(p, m)]:.0f} seeds)"

    open_ = [f"{p} {m}{seeds(p, m)}" for p, m, v in fid.verdicts() if v == "undecided"]
    tail = "the simulation carries over" if not failed and not open_ and n["pass"] else (
        "; ".join(x for x in ("mismatch: " + ", ".join(failed) if failed else "",
                              "undecided: " + ", ".join(open_) if open_ else "") if x)
        or "nothing could be checked")
    console.print(f"priors (pooled with every interval's seeds): {escape(fid.prior_source)}")
    if fid.repeats:
        console.print(repeat_line(fid))
    if fid.calibrations > 1:
        console.print(f"the simulator's spread over {fid.calibrations} calibrations widens every interval "
                      "(analysis/rule/verdict.py, common spread; cal_sigma in fidelity.csv)")
    console.print(f"[bold]verdict:[/] {n['pass']} pass, {n['fail']} fail, {n['undecided']} undecided "
                  f"(rule {RULE_VERSION}): {escape(tail)}")
    if fid.out_dir is not None:
        console.print(f"wrote {len(fid.files)} file(s) to {escape(str(fid.out_dir))}")


def _paired_frames(fid: Fidelity) -> dict[str, pd.DataFrame]:
    """The paired report's CSVs, the sim's rows and the repeat's (column versus) in each."""
    reps = [r for r in (fid.paired, fid.repeat) if r is not None]
    if not reps:
        return {}

    def both(get) -> pd.DataFrame:
        return pd.concat([get(r).assign(versus=r.versus) for r in reps], ignore_index=True)

    confusion = both(lambda r: r.confusion.merge(r.agreement, on="policy", how="left"))
    return {"fidelity_paired.csv": both(lambda r: r.errors), "fidelity_confusion.csv": confusion,
            "fidelity_stages.csv": both(lambda r: r.stages), "fidelity_mape.csv": both(lambda r: r.mape)}


def write_fidelity(fid: Fidelity, out_dir: Path) -> list[Path]:
    """fidelity.csv (per policy and metric), fidelity_composition.csv, fidelity_noise.csv,
    fidelity_rank.csv (one row), fidelity_pairs.csv (the policy pairs), the paired report's fidelity_paired.csv (per-request latency errors),
    fidelity_confusion.csv (the confusion matrix beside each policy's agreement), fidelity_stages.csv
    and fidelity_mape.csv (each with a column versus: "sim", or "repeat"), and with a repeat
    fidelity_repeatability.csv and fidelity_spread.csv (the testbed's spread per check from the repeat,
    the check's prior and whether the testbed repeated itself), into ``out_dir``; returns the paths."""
    rk = fid.rank
    rank = pd.DataFrame([{
        "n_policies": len(rk.policies), "policies": ",".join(rk.policies), "kendall_tau": rk.kendall_tau,
        "tau_low": rk.tau_low, "tau_high": rk.tau_high, "kendall_tau_min": rk.tau_min,
        "kendall_tau_verdict": rk.tau_verdict, "rank_policies": ",".join(rk.named),
        "order_sim": format_order(rk.order_sim), "order_testbed": format_order(rk.order_testbed),
        "order_verdict": rk.order_verdict, "rule": RULE_VERSION,
    }])
    frames = {"fidelity.csv": fid.table, "fidelity_composition.csv": fid.composition,
              "fidelity_noise.csv": fid.noise, "fidelity_rank.csv": rank, "fidelity_pairs.csv": rk.pairs,
              **_paired_frames(fid)}
    if fid.repeatability is not None:
        frames["fidelity_repeatability.csv"] = fid.repeatability
    if fid.own_spreads:  # the testbed's spread from this comparison's repeat, a description of the instrument
        frames["fidelity_spread.csv"] = pd.DataFrame(
            [{"metric": m, "sigma": v.sigma, "pairs": v.pairs, "prior_sigma": (fid.priors or {}).get(m, NO_PRIOR).sigma,
              "repeat_verdict": (fid.repeats or {}).get(m, ("not run",))[0]}
             for m, v in fid.own_spreads.items()])
    paths = []
    for name, df in frames.items():
        path = out_dir / name
        df = df.copy()  # the Fidelity's own tables stay as they are
        df.insert(0, "scenario", fid.scenario)
        df.to_csv(path, index=False)
        paths.append(path)
    return paths


def compare(sim_paths: Iterable[Path | str], testbed_paths: Iterable[Path | str], out_dir: Path | str | None = None,
            calibration: Mapping[str, Any] | None = None, console: Console | None = None,
            repeat_paths: Iterable[Path | str] | None = None,
            calibration_sims: Sequence[Iterable[Path | str]] = (), full: bool = False,
            full_command: Sequence[str] | None = None) -> Fidelity:
    """`testbed compare`: :func:`analysis.compare.fidelity.measure` (every argument but ``out_dir``, ``console``,
    ``full`` and ``full_command`` is its), then its verdict printed to ``console`` (default: stdout) in
    at most 100 columns (analysis/compare/compact.py; ``full_command``: the command that prints every
    table, shown beneath), or with ``full`` every table (:func:`print_fidelity`, then the engine,
    calibration and host tables), and written into
    ``out_dir`` (default: a ``fidelity`` folder next to the first testbed path, as `testbed report`
    puts its ``report`` folder next to its first path): fidelity.csv, fidelity_composition.csv,
    fidelity_noise.csv, fidelity_rank.csv, the paired report's CSVs (fidelity_paired.csv,
    fidelity_confusion.csv, fidelity_stages.csv, fidelity_mape.csv), fidelity_repeatability.csv with a
    repeat, the engine, calibration and host tables where there are any, and the overlay PNGs."""
    testbed_paths = list(testbed_paths)
    fid, curves, frames = measure(sim_paths, testbed_paths, calibration, repeat_paths, calibration_sims)
    out = Path(out_dir) if out_dir is not None else Path(testbed_paths[0]).resolve().parent / "fidelity"
    out.mkdir(parents=True, exist_ok=True)
    files = list(write_fidelity(fid, out))
    if fid.engines is not None:
        files += write_engine_table(fid.engines, fid.scenario, out, fid.notices)
    if fid.calibration_check is not None:
        files += [write_calibration_check(fid.calibration_check, out), write_host_demand(fid.host_demand, out)]
    if fid.host_window is not None and not fid.host_window.empty:
        files.append(write_host_window(fid.host_window, out))
    plots = [plot_success_overlay(curves, fid.policies, fid.scenario, out),
             plot_price_overlay(curves, fid.policies, fid.scenario, out),
             plot_latency_overlay(frames, fid.policies, fid.scenario, out)]
    fid = replace(fid, out_dir=out, files=(*files, *(p for p in plots if p is not None)))
    console = console or Console()
    if not full:
        print_compact(fid, console, full_command)
        return fid
    print_fidelity(fid, console)
    if fid.engines is not None:
        print_engine_table(fid.engines, console, fid.notices)
    if fid.calibration_check is not None:
        print_calibration_check(fid.calibration_check, console)
        print_host_demand(fid.host_demand, console)
    print_host_window(fid.host_window, fid.policies, console)
    return fid
