"""The sim-vs-testbed comparison on the console (rich tables) and as CSV files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.metric_names import Metric as M, latency
from core.stages import FAILURE_STAGES

if TYPE_CHECKING:  # only for annotations: analysis.fidelity imports this module
    from analysis.fidelity import Fidelity, Order

COLOR = {"pass": "green", "fail": "red", "n/a": "dim"}


def format_order(order: Order) -> str:
    """Tie groups lowest failure rate first: "OracleAvoidance < LC = OTF-R"."""
    return " < ".join(" = ".join(g) for g in order) if order else "–"


def _nan(x: float) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _pct(mean: float, half: float = math.nan) -> str:
    if _nan(mean):
        return "–"
    return f"{100 * mean:.1f}%" + ("" if _nan(half) else f" ± {100 * half:.1f}")


def _num(x: float, fmt: str = ".3g") -> str:
    return "–" if _nan(x) else format(x, fmt)


def _mark(text: str, v: str) -> str:
    return f"[{COLOR[v]}]{escape(text)}[/]"


def _checks(fid: Fidelity) -> dict[tuple[str, str], pd.Series]:
    return {(r["policy"], r["metric"]): r for _, r in fid.table.iterrows()}


def _pair(r: pd.Series, fmt: str, dev: str) -> str:
    """"sim / testbed (deviation)", coloured by the check's verdict: one cell per metric keeps the
    table readable in an 120-column terminal."""
    d = _num(100 * r["rel_error"], "+.0f") + "%" if dev == "rel" else _num(r["diff"], "+.2f")
    return _mark(f"{_num(r['sim'], fmt)} / {_num(r['testbed'], fmt)} ({d})", r["verdict"])


def _policy_table(fid: Fidelity) -> Table:
    t = Table(title=escape(f"Fidelity: {fid.scenario}, sim vs testbed (mean ± 95% CI half-width over seeds)"))
    t.add_column("policy", no_wrap=True)  # the other columns give way first
    for h in ("seeds sim/tb", "fail. rate sim", "fail. rate testbed", "diff (pp)", "verdict",
              "TTFT p50 (s) sim / tb (rel. err)", "E2E p50 (s) sim / tb (rel. err)", "deflection sim / tb (diff)"):
        t.add_column(h, justify="right", no_wrap=h.startswith("fail."))  # keep "mean ± CI" on one line
    c = _checks(fid)
    for p in fid.policies:
        fr = c[(p, M.FAILURE_RATE)]
        t.add_row(escape(p), f"{fr['sim_n']}/{fr['testbed_n']}", _pct(fr["sim"], fr["sim_ci"]),
                  _pct(fr["testbed"], fr["testbed_ci"]), _num(100 * fr["diff"], "+.1f"),
                  _mark(fr["verdict"], fr["verdict"]), _pair(c[(p, latency("ttft", 50))], ".3g", "rel"),
                  _pair(c[(p, latency("e2e", 50))], ".3g", "rel"), _pair(c[(p, M.TRAFFIC_DEFLECTION_RATIO)], ".2f", "abs"))
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
            t.add_row(escape(p) if world == "sim" else "", world,
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


def print_fidelity(fid: Fidelity, console: Console) -> None:
    """The comparison's tables, rank, noise floor and overall verdict."""
    console.print(_policy_table(fid))
    console.print(_tail_table(fid))
    console.print(_composition_table(fid))
    rk = fid.rank
    console.print(
        f"Kendall tau = {_num(rk.kendall_tau, '.2f')} ({len(rk.policies)} policies; needs >= {rk.tau_min:g}): "
        + _mark(rk.tau_verdict, rk.tau_verdict)
    )
    same = {"pass": "same", "fail": "different", "n/a": "n/a (fewer than two present)"}[rk.order_verdict]
    console.print(
        f"order of {escape(', '.join(fid.tolerances.rank_policies))} by failure rate: "
        f"sim [{escape(format_order(rk.order_sim))}] testbed [{escape(format_order(rk.order_testbed))}]: "
        + _mark(same, rk.order_verdict)
    )
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
    n = fid.counts()
    # a failed failure rate says how much of its gap the testbed's host noise could account for
    explained = dict(zip(fid.noise["policy"], fid.noise["noise_explained_fraction"]))
    failed = [f"{p} {m}" + (f" (host noise could explain {100 * explained[p]:.0f}%)"
                            if m == M.FAILURE_RATE and not _nan(explained.get(p, math.nan)) else "")
              for p, m, v in fid.verdicts() if v == "fail"]
    tail = "the simulation carries over" if not failed and n["pass"] else (
        "mismatch: " + ", ".join(failed) if failed else "nothing could be checked")
    console.print(f"[bold]verdict:[/] {n['pass']} pass, {n['fail']} fail, {n['n/a']} n/a: {escape(tail)}")
    if fid.out_dir is not None:
        console.print(f"wrote {len(fid.files)} file(s) to {escape(str(fid.out_dir))}")


def write_fidelity(fid: Fidelity, out_dir: Path) -> list[Path]:
    """fidelity.csv (per policy and metric), fidelity_composition.csv, fidelity_noise.csv and
    fidelity_rank.csv (one row) into ``out_dir``; returns the paths."""
    rk = fid.rank
    rank = pd.DataFrame([{
        "n_policies": len(rk.policies), "policies": ",".join(rk.policies), "kendall_tau": rk.kendall_tau,
        "kendall_tau_min": rk.tau_min, "kendall_tau_verdict": rk.tau_verdict, "rank_policies": ",".join(rk.named),
        "order_sim": format_order(rk.order_sim), "order_testbed": format_order(rk.order_testbed),
        "order_verdict": rk.order_verdict,
    }])
    frames = {"fidelity.csv": fid.table, "fidelity_composition.csv": fid.composition,
              "fidelity_noise.csv": fid.noise, "fidelity_rank.csv": rank}
    paths = []
    for name, df in frames.items():
        path = out_dir / name
        df = df.copy()  # the Fidelity's own tables stay as they are
        df.insert(0, "scenario", fid.scenario)
        df.to_csv(path, index=False)
        paths.append(path)
    return paths
