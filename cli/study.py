"""`testbed study`: a spec's study grid in the simulator (as Ray tasks), on the testbed, or in both
with a verdict per claim; resumably."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import console, csv, out_console
from vocab import SIM, TESTBED


def cmd_study(args: argparse.Namespace) -> int:
    from core.spec.model import load_spec

    spec = load_spec(args.spec)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    sweeps = csv(args.sweeps) if args.sweeps else None
    if args.plan:
        return _plan(spec, args, sweeps)
    if args.world == SIM and args.calibration:
        return _resimulate(spec, args, sweeps)
    if args.world == SIM:
        return _sim(spec, args, sweeps, Path(args.out), study_dir=None, calibration=None)
    return _both(spec, args, sweeps)


def _repeat_seeds(args: argparse.Namespace, seeds: list[int]) -> list[int]:
    """The seeds the testbed runs twice: --repeat-seeds, default the first; one not in the study refused."""
    asked = [str(seeds[0])] if args.repeat_seeds is None else csv(args.repeat_seeds)
    wrong = [s for s in asked if s not in {str(x) for x in seeds}]
    if wrong:
        raise ValueError(f"--repeat-seeds: {wrong[0]} is not a seed of the study's cells ({', '.join(map(str, seeds))})")
    return [int(s) for s in asked]


def _plan(spec, args: argparse.Namespace, sweeps: list[str] | None) -> int:
    """`--plan`: the seeds each claim needs for 80% power, and the runs and wall time of the spec as it
    stands and of the seeds the claims need (study/plan.py); nothing runs."""
    from study.plan import plan_console_table, plan_table, study_cost
    from study.claims import check_claim_metrics
    from core.spec.sizes import ENGINE_START_S, duration_text
    from study.grid import choose_sweeps, claim_sides, distinct_runs, expand_study

    cells = expand_study(spec, args.spec)
    if args.address and (rc := _fits_cluster(cells[0].spec, args)) is not None:
        return rc
    sides = claim_sides(spec, cells, args.spec)
    if not sides:
        raise ValueError(f"{args.spec}: --plan sizes a study's claims, and its study has none")
    check_claim_metrics(sides)
    chosen = choose_sweeps(spec, cells, sweeps, args.spec)
    seeds = sorted({c.seed for c in chosen})
    runs_per_seed = len(distinct_runs(cells, chosen)) // len(seeds)
    repeats = len(_repeat_seeds(args, seeds))
    looks = spec.study.looks
    plan = plan_table(sides, {c.point: c.spec for c in cells}, len(seeds), looks)
    out_console().print(plan_console_table(plan, len(seeds), looks))
    run_spec = cells[0].spec
    runs, wall = study_cost(runs_per_seed, repeats, len(seeds), run_spec)
    power = plan["power_with_looks" if looks else "power_at_spec_seeds"]
    reached = int((power >= 0.8).sum())
    if looks:
        first, first_wall = study_cost(runs_per_seed, repeats, looks[0], run_spec)
        wall += (len(looks) - 1) * ENGINE_START_S  # the engines start again for each later look
        console.print(f"as the spec stands (looks at {', '.join(map(str, looks))} of {len(seeds)} seeds, {repeats} "
                      f"repeated): {first} to {runs} testbed runs, about {duration_text(first_wall)} to "
                      f"{duration_text(wall)} on the testbed; {reached} of {len(plan)} claims at 80% power or more "
                      "over the looks")
    else:
        console.print(f"as the spec stands ({len(seeds)} seeds, {repeats} repeated): {runs} testbed runs, about "
                      f"{duration_text(wall)} on the testbed; {reached} of {len(plan)} claims at 80% power or more")
    needed = plan["seeds_needed"].dropna()
    if len(needed):
        most = int(needed.max())
        runs, wall = study_cost(runs_per_seed, repeats, most, run_spec)
        console.print(f"for every claim with a finite need ({len(needed)} of {len(plan)}) at 80% power: {most} seeds, "
                      f"{runs} testbed runs, about {duration_text(wall)}")
    left = plan.loc[plan["seeds_needed"].isna(), "claim"].tolist()
    if left:
        console.print(f"more than 100 seeds (or no prior): {', '.join(left)}")
    return 0


def _fits_cluster(run_spec, args: argparse.Namespace) -> int | None:
    """`--plan --address`: the cluster has the pods, and each pod's node the GPUs, that the study's
    runs need (testbed/runs/pods.py discover_pods: every cell has the spec's topology), else one
    line before anything else is planned. On an emulated cluster the plan runs again in its head's
    namespace (its exit status returned); else None: it fits, go on planning here."""
    from cli.cluster import in_cluster
    from testbed.runs.pods import discover_pods

    argv = ["study", args.spec, "--plan", "--address", args.address, *(["--sweeps", args.sweeps] if args.sweeps else []),
            *(["--repeat-seeds", args.repeat_seeds] if args.repeat_seeds is not None else [])]
    if (rc := in_cluster(args.address, argv)) is not None:
        return rc
    try:
        discover_pods(run_spec)
    except ValueError as e:
        raise ValueError(f"{args.spec}: its runs do not fit the cluster at {args.address}: {e}") from None
    return None


def _resimulate(spec, args: argparse.Namespace, sweeps: list[str] | None) -> int:
    """The simulator's side of a carry-over study again, under another calibration of the same engines
    (a calibration fitted on the study's own runs, say), into STUDY/sim; where STUDY/testbed holds the
    testbed's runs, the claims are judged again on them (docs/verdicts.md "A carry-over study judged
    again under another calibration"). No engine starts."""
    from study.claims import CLAIMS, carryover_report
    from study.table import STUDY_FILE
    from core.calibration.fit import load_calibration

    root = Path(args.out) / spec.name
    cal = load_calibration(args.calibration)  # a bad file: one line, before anything is written
    rc = _sim(spec, args, sweeps, Path(args.out), root / SIM, cal)
    if rc != 0:
        return rc
    if (root / TESTBED / STUDY_FILE).is_file():
        carryover_report(root, root / CLAIMS, out_console())
    else:
        console.print(f"no testbed runs in {root / TESTBED}: the simulator's side alone, calibrated")
    return 0


def _sim(spec, args: argparse.Namespace, sweeps: list[str] | None, out: Path, study_dir: Path | None,
         calibration, only: set[tuple[str, str, int]] | None = None) -> int:
    from study.runner import run_study  # first: without Ray, its one-line refusal (tests/test_cli.py)

    if calibration is not None:
        from core.calibration.fit import apply_calibration

        spec = apply_calibration(spec, calibration)
    where = study_dir or Path(out) / spec.name
    try:
        res = run_study(spec, out, address=None if calibration is not None else args.address, workers=args.workers,
                        rerun=args.rerun, sweeps=sweeps, base_dir=Path(args.spec).resolve().parent,
                        source=args.spec, console=console, max_hours=args.max_hours, study_dir=study_dir,
                        only=only)
    except KeyboardInterrupt:
        from study.grid import CELL_FILE

        done = sum(1 for _ in where.rglob(CELL_FILE))
        console.print(f"interrupted: the {done} finished run(s) are kept; the same command runs the rest")
        return 130
    console.print(f"{res.ran} run(s) done in {res.wall_s:.0f} s ({res.cpu_s:.0f} CPU-s), {res.skipped} were "
                  f"already finished, {len(res.failed)} failed; {res.cells} cells in {res.runs} runs")
    if res.failed:
        console.print("[red]failed cells[/] (rerun the same command to retry them):\n  " + "\n  ".join(res.failed))
        return 1
    if calibration is None:
        console.print(f"report: testbed report {res.study_dir}")
    return 0


def _both(spec, args: argparse.Namespace, sweeps: list[str] | None) -> int:
    """The testbed's runs of the grid (study/testbed_side.py), then, with ``--world both``, the calibrated
    simulator's and the verdict per claim (study/claims.py). A study with looks
    (study/looks.py) does this look by look: look 1's seeds for every claim, then each further
    look's seeds only for the cells of the claims still undecided."""
    from study.claims import CLAIMS, carryover_report, check_claim_metrics
    from study.testbed_side import run_testbed_side
    from core.calibration.fit import load_calibration
    from core.spec.sizes import check_fits
    from study.grid import choose_sweeps, claim_reads, claim_sides, distinct_runs, expand_study

    cells = expand_study(spec, args.spec)  # every point validated, every claim resolved, before any engine starts
    sides = claim_sides(spec, cells, args.spec)
    check_claim_metrics(sides)
    chosen = choose_sweeps(spec, cells, sweeps, args.spec)
    seeds = sorted({c.seed for c in chosen})
    repeat_seeds = _repeat_seeds(args, seeds)
    runs = distinct_runs(cells, chosen)
    check_fits(runs[0].spec, "testbed", len(runs) + sum(c.seed in repeat_seeds for c in runs),
               max_hours=args.max_hours)
    calibration = Path(args.calibration) if args.calibration else None
    if calibration is not None:
        load_calibration(calibration)  # a bad file is refused before minutes of engine start-up
    root = Path(args.out) / spec.name
    looks = spec.study.looks or [len(seeds)]
    order = spec.study.seeds if spec.study.looks else seeds
    open_claims = list(sides)
    for k, n in enumerate(looks, start=1):
        reads = {cell for s in open_claims for cell in claim_reads(s)}
        mine = [c for c in chosen if c.seed in order[:n] and (k == 1 or (c.point, c.policy) in reads)]
        if len(looks) > 1:
            console.print(f"look {k} of {len(looks)}: seeds {', '.join(map(str, order[:n]))} for "
                          f"{len(open_claims)} claim(s), {len(distinct_runs(cells, mine))} runs")
        try:
            cal_path, _ = run_testbed_side(spec, cells, mine, root, address=args.address, calibration=calibration,
                                           repeat_seeds=repeat_seeds, rerun=args.rerun, console=console,
                                           keep_engines=args.keep_engines)
        except KeyboardInterrupt:
            console.print("interrupted: the finished runs are kept (cell.json); the same command runs the rest")
            return 130
        if args.world == TESTBED:
            later = "; looks after the first are judged with --world both" if len(looks) > 1 else ""
            console.print(f"report: testbed report {root / TESTBED}{later}")
            return 0
        rc = _sim(spec, args, sweeps, Path(args.out), root / SIM, load_calibration(cal_path),
                  only={(c.point, c.policy, c.seed) for c in mine})
        if rc != 0:
            return rc
        last = k == len(looks)
        held = _held()  # a look's report, shown only if it is the study's last
        table = carryover_report(root, root / CLAIMS, out_console() if last else held)
        if last:
            break
        mine_rows = table[table["claim"].isin({s.name for s in open_claims})]
        short = mine_rows.loc[mine_rows["look"] < k, "claim"].tolist()
        if short:  # a run of this look did not finish: judging on would read another design
            console.print(f"[red]look {k} not reached[/] by {', '.join(short)}: a run of its seeds is missing; "
                          "the same command runs it")
            return 1
        going_on = set(mine_rows.loc[mine_rows["equivalence"] == "undecided", "claim"])
        console.print(f"look {k}: {len(open_claims) - len(going_on)} of {len(open_claims)} claim(s) decided; "
                      f"{len(going_on)} go on to look {k + 1}")
        open_claims = [s for s in open_claims if s.name in going_on]
        if not open_claims:  # every claim decided at this look: its report, written once, is the study's
            from rich.text import Text

            out_console().print(Text.from_ansi(held.export_text(styles=True)), end="")
            break
    console.print(f"report again: testbed report {root}")
    return 0


def _held():
    """A console that keeps what is printed to it, to show later (rich's record)."""
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), record=True, width=out_console().width)
