"""The comparison's verdict in at most 100 columns: what `testbed compare` and `testbed twin` print at
their end unless --full asks for every table (analysis/compare/console.py ``print_fidelity``). One row
per policy (failure rate in each world, outcome agreement, TTFT and E2E p50 error, the checks' counts),
the rank's two lines, and the verdict with the checks it leaves open or failed: named when few,
counted by check when many (every check, its interval and the seeds it would need: fidelity.csv).
Also the few pieces both views print alike: the cell formats and the rank's lines."""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from analysis.run.names import Metric as M, latency
from analysis.run.scalars import code_note
from analysis.compare.paired import OUTCOME_AGREEMENT
from analysis.rule.verdict import RULE_VERSION, wrong_to_expect

if TYPE_CHECKING:
    from analysis.compare.fidelity import Fidelity
    from analysis.compare.checks import Order

COMPACT_WIDTH = 100  # an ordinary terminal; the full tables need about 200
NAMED_MAX = 5  # a verdict names up to this many failed (or undecided) checks, else counts them by check
COLOR = {"pass": "green", "fail": "red", "undecided": "yellow", "n/a": "dim"}
VERDICTS = ("pass", "fail", "undecided")


def is_nan(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x: float, fmt: str = ".3g") -> str:
    return "–" if is_nan(x) else format(x, fmt)


def mark(text: str, v: str) -> str:
    """``text`` coloured by the verdict ``v`` (markup, ``text`` escaped)."""
    return f"[{COLOR[v]}]{escape(text)}[/]"


def format_order(order: Order) -> str:
    """Tie groups lowest failure rate first: "OracleAvoidance < LC = OTF-R"."""
    return " < ".join(" = ".join(g) for g in order) if order else "–"


def rank_lines(fid: Fidelity) -> list[str]:
    """The Kendall tau check and the order check, a line each (markup), as both views print them."""
    rk = fid.rank
    # three digits: a tau of 0.598 printed as 0.60 read as a fail against "needs >= 0.6"
    tau = (f"Kendall tau = {num(rk.kendall_tau, '.3f')} of the means ({len(rk.policies)} policies); over the pairs "
           f"ordered alike, between {num(rk.tau_low, '.3f')} and {num(rk.tau_high, '.3f')} (needs >= "
           f"{rk.tau_min:g}): " + mark(rk.tau_verdict, rk.tau_verdict))
    same = {"pass": "every pair ordered alike", "fail": "a pair ordered otherwise",
            "undecided": "not every pair decided" if len(rk.named) > 1 else "fewer than two present"}[rk.order_verdict]
    order = (f"order of {escape(', '.join(fid.tolerances.rank_policies))} by failure rate: "
             f"sim [{escape(format_order(rk.order_sim))}] testbed [{escape(format_order(rk.order_testbed))}]: "
             + mark(f"{rk.order_verdict}, {same}", rk.order_verdict))
    return [tau, order]


# --------------------------------------------------------------------------- the table


def _seeds(fid: Fidelity) -> str:
    fr = fid.table[fid.table["metric"] == M.FAILURE_RATE]
    ns = sorted({int(n) for n in (*fr["sim_n"], *fr["testbed_n"]) if not is_nan(n)})
    if not ns:
        return "seeds"
    return f"{ns[0]} seed{'s' if ns[0] != 1 else ''}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} seeds"


def _rel(r) -> str:
    """A latency check's mean relative error and its 90% interval, coloured by its verdict: "-15% [-30, +1]"."""
    if r is None:
        return "–"
    ci = "" if is_nan(r["dev_low"]) else f" [{100 * r['dev_low']:+.0f}, {100 * r['dev_high']:+.0f}]"
    return mark(num(100 * r["deviation"], "+.0f") + ("" if is_nan(r["deviation"]) else "%") + ci, r["verdict"])


def _share(x: float) -> str:
    return "–" if is_nan(x) else f"{100 * x:.1f}%"


def compact_table(fid: Fidelity) -> Table:
    """One row per policy: failure rate sim / testbed, outcome agreement, TTFT and E2E p50 relative error
    [90% CI], each coloured by its check's verdict, and the policy's pass/fail/undecided counts (its
    engine checks included). About 95 columns with the shipped policies' names."""
    t = Table(title=escape(f"Fidelity: {fid.scenario}, sim vs testbed, mean over {_seeds(fid)} (colour: the "
                           "check's verdict)"),
              caption=escape("rel. err = (sim - testbed) / testbed, mean over seeds [its 90% CI]"),
              caption_justify="left")
    t.add_column("policy", no_wrap=True)
    for head in ("failure rate\nsim / testbed", "outcome\nagreement", "TTFT p50\nrel. err", "E2E p50\nrel. err",
                 "pass/fail/\nundecided"):
        t.add_column(head, justify="right")
    checks = {(r["policy"], r["metric"]): r for _, r in fid.table.iterrows()}
    verdicts = fid.verdicts()
    for p in fid.policies:
        fr, agree = checks[(p, M.FAILURE_RATE)], checks.get((p, OUTCOME_AGREEMENT))
        mine = [v for q, _, v in verdicts if q == p]
        t.add_row(escape(p), mark(f"{_share(fr['sim'])} / {_share(fr['testbed'])}", fr["verdict"]),
                  "–" if agree is None or is_nan(agree["sim"]) else mark(_share(agree["sim"]), agree["verdict"]),
                  _rel(checks.get((p, latency("ttft", 50)))), _rel(checks.get((p, latency("e2e", 50)))),
                  "/".join(str(mine.count(v)) for v in VERDICTS))
    return t


# --------------------------------------------------------------------------- the verdict


def _named(fid: Fidelity, verdict: str) -> list[str]:
    """The checks of ``verdict`` by name, as the full view names them: a failed failure rate with the
    share of its gap host noise could explain, an undecided check with the seeds it would need."""
    explained = dict(zip(fid.noise["policy"], fid.noise["noise_explained_fraction"]))
    needed = {(r.policy, r.metric): r.seeds_needed for r in fid.table.itertuples()}
    out = []
    for p, m, v in fid.verdicts():
        if v != verdict:
            continue
        more = ""
        if verdict == "fail" and m == M.FAILURE_RATE and not is_nan(explained.get(p, math.nan)):
            more = f" (host noise could explain {100 * explained[p]:.0f}%)"
        elif verdict == "undecided" and (p, m) in needed:
            more = " (over 100 seeds)" if is_nan(needed[(p, m)]) else f" ({needed[(p, m)]:.0f} seeds)"
        out.append(f"{p} {m}{more}")
    return out


def _by_check(fid: Fidelity, verdict: str) -> list[str]:
    """The checks of ``verdict`` counted by check, most first: ["ttft_p90_s ×5", "kendall_tau ×1"]."""
    n = Counter(m for _, m, v in fid.verdicts() if v == verdict)
    return [f"{m} ×{k}" for m, k in n.most_common()]


def verdict_lines(fid: Fidelity) -> list[tuple[str, list[str]]]:
    """The overall verdict, then a line each for the failed and the undecided checks, as (head
    (markup), items (plain text)): the checks named up to NAMED_MAX, counted by check beyond."""
    n = fid.counts()
    head = f"[bold]verdict:[/] {n['pass']} pass, {n['fail']} fail, {n['undecided']} undecided (rule {RULE_VERSION})"
    if not n["fail"] and not n["undecided"]:
        return [(head + (": the simulation carries over" if n["pass"] else ": nothing could be checked"), [])]
    lines = [(head, [])]
    for verdict, word in (("fail", "mismatch"), ("undecided", "undecided")):
        if n[verdict] and n[verdict] <= NAMED_MAX:
            lines.append((mark(word, verdict) + ":", _named(fid, verdict)))
        elif n[verdict]:
            lines.append((mark(word, verdict) + ", by check:", _by_check(fid, verdict)))
    if max(n["fail"], n["undecided"]) > NAMED_MAX:
        lines.append(("each check with its interval and the seeds it would need: fidelity.csv (the rank's: "
                      "fidelity_rank.csv)", []))
    if n["pass"] + n["fail"]:
        lines.append((wrong_to_expect(n["pass"] + n["fail"], "checks"), []))
    return lines


def fill(console: Console, head: str, items: Sequence[str], width: int, indent: int = 0) -> list[Text]:
    """``head`` (markup) wrapped by word, then ``items`` after it, comma-separated, in lines of at most
    ``width`` columns, each ``indent`` in; an item that does not fit starts a line two further in and
    is never split (one wider than the line is left whole). No line ends in a space."""
    lines = list(Text.from_markup(head).wrap(console, width - indent))
    for i, line in enumerate(lines):
        line.rstrip()
        lines[i] = Text(" " * indent) + line
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if lines[-1].cell_len + 1 + len(piece) > width and lines[-1].cell_len > indent + 2:
            lines.append(Text(" " * (indent + 2) + piece))
        else:
            lines[-1].append(" " + piece)
    return lines


def command_lines(argv: Sequence[str], width: int) -> list[str]:
    """A command as shell lines of at most ``width`` columns where its words allow, continued with " \\"."""
    lines, line = [], ""
    for word in map(shlex.quote, argv):
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def repeat_line(fid: Fidelity) -> str:
    """The testbed judged against its repeat, in one line: which checks it repeated within their
    tolerance, and which cannot pass because it did not."""
    bad = [m for m, (v, _) in (fid.repeats or {}).items() if v != "pass"]
    return "the testbed against its repeat: " + (
        "every check within its tolerance" if not bad else
        f"not shown within the tolerance in {', '.join(bad)}: those checks cannot pass")


def print_compact(fid: Fidelity, console: Console, full_command: Sequence[str] | None = None) -> None:
    """The verdict in at most COMPACT_WIDTH columns (fewer on a narrower console): the table, the rank's
    lines, the notes on missing policies and unfinished runs, the priors the intervals pool with, the verdict,
    and where the rest is: the files written, and ``full_command``, the command that prints every
    table (default: the same command with --full)."""
    width = min(console.width, COMPACT_WIDTH)

    def say(head: str, items: Sequence[str] = (), indent: int = 0) -> None:
        for line in fill(console, head, items, width, indent):
            console.print(line, width=width)

    console.print(compact_table(fid), width=width)
    for line in rank_lines(fid):
        say(line)
    if fid.only_sim or fid.only_testbed:
        say(f"[yellow]note:[/] compared only policies in both worlds; sim only: "
            f"{escape(', '.join(fid.only_sim) or '–')}; testbed only: {escape(', '.join(fid.only_testbed) or '–')}")
    unfinished = fid.runs.loc[fid.runs["status"] != "finished"]
    if len(unfinished):
        say(f"[yellow]note:[/] {len(unfinished)} run(s) did not finish; their rows up to the stop are included")
    if (code := code_note(fid.runs)) is not None:
        say(f"[yellow]note:[/] {escape(code)}")
    cals = (f"; widened by the simulator's spread over {fid.calibrations} calibrations" if fid.calibrations > 1
            else "")
    say(f"priors: {escape(fid.prior_source)}{cals}")
    if fid.repeats:
        say(repeat_line(fid))
    (head, _), *rest = verdict_lines(fid)
    say(head)
    for head, items in rest:
        say(head, items, indent=2)
    if fid.out_dir is not None:
        say(f"wrote {len(fid.files)} file(s) to {escape(str(fid.out_dir))}")
    if not full_command:
        say("every table: the same command with --full")
        return
    say("every table, from these runs (no engine starts):")
    for line in command_lines(full_command, width - 2):  # a word longer than the width is left whole
        console.print(Text(f"  {line}", no_wrap=True, overflow="ignore"), crop=False)
