"""`testbed study`: a spec's study grid in the simulator (as Ray tasks), on the testbed, or in both
with a verdict per claim; resumably."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import console, csv, out_console


def cmd_study(args: argparse.Namespace) -> int:
    from core.spec import load_spec

    spec = load_spec(args.spec)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    sweeps = csv(args.sweeps) if args.sweeps else None
    if args.plan:
        return _plan(spec, args, sweeps)
    if args.world == "sim" and args.calibration:
        return _resimulate(spec, args, sweeps)
    if args.world == "sim":
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
    stands and of the seeds the claims need (analysis/study_plan.py); nothing runs."""
    from analysis.study_plan import plan_console_table, plan_table, study_cost
    from analysis.study_claims import check_claim_metrics
    from core.sizes import duration_text
    from core.study import choose_sweeps, claim_sides, distinct_runs, expand_study

    cells = expand_study(spec, args.spec)
    sides = claim_sides(spec, cells, args.spec)
    if not sides:
        raise ValueError(f"{args.spec}: --plan sizes a study's claims, and its study has none")
    check_claim_metrics(sides)
    chosen = choose_sweeps(spec, cells, sweeps, args.spec)
    seeds = sorted({c.seed for c in chosen})
    runs_per_seed = len(distinct_runs(cells, chosen)) // len(seeds)
    repeats = len(_repeat_seeds(args, seeds))
    plan = plan_table(sides, {c.point: c.spec for c in cells}, len(seeds))
    out_console().print(plan_console_table(plan, len(seeds)))
    run_spec = cells[0].spec
    runs, wall = study_cost(runs_per_seed, repeats, len(seeds), run_spec)
    reached = int((plan["power_at_spec_seeds"] >= 0.8).sum())
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


def _resimulate(spec, args: argparse.Namespace, sweeps: list[str] | None) -> int:
    """The simulator's side of a carry-over study again, under another calibration of the same engines
    (a calibration fitted on the study's own runs, say), into STUDY/sim; where STUDY/testbed holds the
    testbed's runs, the claims are judged again on them (docs/study.md "Another calibration, the same
    testbed runs"). No engine starts."""
    from analysis.study_claims import CLAIMS, SIM, TESTBED, carryover_report
    from analysis.study import STUDY_FILE
    from core.calibration import load_calibration

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
         calibration) -> int:
    from study.runner import run_study

    if calibration is not None:
        from core.calibration import apply_calibration

        spec = apply_calibration(spec, calibration)
    where = study_dir or Path(out) / spec.name
    try:
        res = run_study(spec, out, address=None if calibration is not None else args.address, workers=args.workers,
                        rerun=args.rerun, sweeps=sweeps, base_dir=Path(args.spec).resolve().parent,
                        source=args.spec, console=console, max_hours=args.max_hours, study_dir=study_dir)
    except KeyboardInterrupt:
        done = sum(1 for _ in where.rglob("cell.json"))
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
    simulator's and the verdict per claim (analysis/study_claims.py)."""
    from analysis.study_claims import CLAIMS, SIM, TESTBED, carryover_report, check_claim_metrics
    from study.testbed_side import run_testbed_side
    from core.calibration import load_calibration
    from core.sizes import check_fits
    from core.study import choose_sweeps, claim_sides, distinct_runs, expand_study

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
    try:
        cal_path, _ = run_testbed_side(spec, cells, chosen, root, address=args.address, calibration=calibration,
                                       repeat_seeds=repeat_seeds, rerun=args.rerun, console=console,
                                       keep_engines=args.keep_engines)
    except KeyboardInterrupt:
        console.print("interrupted: the finished runs are kept (cell.json); the same command runs the rest")
        return 130
    if args.world == "testbed":
        console.print(f"report: testbed report {root / TESTBED}")
        return 0
    rc = _sim(spec, args, sweeps, Path(args.out), root / SIM, load_calibration(cal_path))
    if rc != 0:
        return rc
    carryover_report(root, root / CLAIMS, out_console())
    console.print(f"report again: testbed report {root}")
    return 0
