"""The commands that run the real testbed: `testbed run`, `testbed calibrate` and `testbed twin`
(one spec in both worlds)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import check_sizes, console, out_console, selection
from cli.sim import simulate


def fit_under_run(isolated: Path, load_dir: Path, out: Path) -> Path:
    """analysis.checks.refit.fit_under_run, shown on the command's console."""
    from analysis.checks.refit import fit_under_run as fit

    return fit(isolated, load_dir, out, out_console())

def cmd_run(args: argparse.Namespace) -> int:
    from testbed.runs.launch import run_testbed
    from core.spec.model import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = selection(args, spec)
    if args.serve and (len(policies), len(seeds)) != (1, 1):
        raise ValueError(f"--serve: one router serves, so one policy and one seed (got {len(policies)} policies "
                         f"and {len(seeds)} seeds; choose with --policies and --seeds)")
    check_sizes(spec, "testbed", len(policies) * len(seeds), args)
    run_testbed(spec, Path(args.out), policies, seeds, address=args.address, serve=args.serve,
                keep_engines=args.keep_engines)
    console.print(f"report: testbed report {Path(args.out) / spec.name}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from core.calibration.fit import LOAD_DIR, isolated_of
    from testbed.runs.launch import run_testbed
    from core.spec.model import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    out = Path(args.out) if args.out else Path("runs") / spec.name / "calibration.json"
    if args.fit_runs:  # no engines: the levels fitted on runs made before
        if not args.calibration:
            raise ValueError("--fit-runs: name the isolated calibration to start from (--calibration FILE)")
        fit_under_run(Path(args.calibration), Path(args.fit_runs), out)
        console.print(f"calibration: {out}  (use: testbed sim SPEC --calibration {out})")
        return 0
    if args.times < 1:
        raise ValueError(f"--times: at least 1 (got {args.times})")
    if args.times > 1 and args.keep_engines:
        raise ValueError("--times: each calibration on engines started anew, which --keep-engines would not do")
    # Each time on engines started anew (an emulated cluster up and down per calibration), so the
    # spread includes what an engine's start-up varies, as a twin's calibration does.
    paths = [out] if args.times == 1 else [out.with_name(f"{out.stem}-{i}{out.suffix}")
                                            for i in range(1, args.times + 1)]
    for path in paths:
        if args.isolated:
            run_testbed(spec, path.parent, [], [], calibrate_to=path, address=args.address,
                        keep_engines=args.keep_engines)
        else:
            isolated = isolated_of(path)
            load_dir = path.parent / f"{LOAD_DIR}{path.stem.removeprefix(out.stem)}"
            run_testbed(spec, path.parent, [], [], calibrate_to=isolated, load_to=load_dir, address=args.address,
                        keep_engines=args.keep_engines)
            fit_under_run(isolated, load_dir, path)
        console.print(f"calibration: {path}  (use: testbed sim SPEC --calibration {path})")
    if len(paths) > 1:
        from analysis.checks.refit import calibration_spread, print_spread
        from core.calibration.fit import load_calibration

        table = calibration_spread([load_calibration(p) for p in paths])
        print_spread(table, out_console())
        table.to_csv(out.with_name(f"{out.stem}-spread.csv"), index=False)
        console.print(f"spread: {out.with_name(f'{out.stem}-spread.csv')}")
    return 0


def cmd_twin(args: argparse.Namespace) -> int:
    """One spec in both worlds: the testbed (calibrated on its own engines first, unless a
    calibration is given), then the simulator with that calibration and under each of
    ``--calibrations``, then the comparison, judged with the simulator's spread over them."""
    from analysis.compare.console import compare
    from analysis.run.report import report
    from core.calibration.fit import LOAD_DIR, isolated_of, load_calibration
    from core.spec.model import load_spec
    from testbed.runs.launch import run_testbed

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = selection(args, spec)
    out = Path(args.out)
    cal_path = Path(args.calibration) if args.calibration else out / "calibration.json"
    if args.calibration:
        load_calibration(cal_path)  # a bad file is refused before minutes of engine start-up
    spread_cals = [Path(p) for p in (args.calibrations or "").split(",") if p.strip()]
    others = [load_calibration(p) for p in spread_cals]  # refused before the engines start, too
    # A spread over calibrations of one kind: engines alone and under the run differ by what the
    # run adds (docs/twin.md "A calibration under the run's conditions"), not by a calibration's noise.
    conditions = (load_calibration(cal_path).conditions if args.calibration
                  else "isolated" if args.isolated_calibration else "run")
    for path, other in zip(spread_cals, others):
        if other.conditions != conditions:
            raise ValueError(f"--calibrations: {path} was measured with conditions {other.conditions!r}, the twin's "
                             f"calibration with {conditions!r}; give calibrations of one kind")
    # The testbed's repeatability is measured where confidence is asked for (several seeds), not in
    # the one-seed main job, which would take twice as long.
    repeat = len(seeds) > 1 if args.repeat is None else args.repeat
    repeat_to = out / "testbed-repeat" if repeat else None
    check_sizes(spec, "testbed", len(policies) * len(seeds) * (2 if repeat else 1), args)
    check_sizes(spec, "sim", len(policies) * len(seeds), args)
    # Measured here: the engines alone first (the file the runs record), then the calibration load,
    # whose quiet requests the levels and legs are fitted on (docs/twin.md "A calibration under
    # the run's conditions"); --isolated-calibration keeps the engines-alone fits.
    under_run = not args.calibration and not args.isolated_calibration
    measured = isolated_of(cal_path) if under_run else cal_path
    run_testbed(spec, out / "testbed", policies, seeds, calibrate_to=None if args.calibration else measured,
                repeat_to=repeat_to, calibration=cal_path if args.calibration else None,
                load_to=out / LOAD_DIR if under_run else None, address=args.address, keep_engines=args.keep_engines)
    if under_run:
        fit_under_run(measured, out / LOAD_DIR, cal_path)
    cal = load_calibration(cal_path)
    base_dir = Path(args.spec).resolve().parent if args.spec else None
    simulate(spec, policies, seeds, out / "sim", base_dir, cal)
    # The simulator under each further calibration: the spread a calibration's own measurement brings
    # (docs/twin.md "The simulator over several calibrations").
    for i, other in enumerate(others, 1):
        simulate(spec, policies, seeds, out / f"sim-calibration-{i}", base_dir, other)
    shown = out_console()
    report([out / "testbed" / spec.name, out / "sim" / spec.name], out / "report", shown)
    sims = [out / f"sim-calibration-{i}" / spec.name for i in range(1, len(others) + 1)]
    # the comparison alone, every table printed: what the compact verdict points to, no engine started
    again = ["testbed", "compare", str(out / "sim" / spec.name), str(out / "testbed" / spec.name),
             "--out", str(out / "fidelity"), "--calibration", str(cal_path),
             *(["--repeat", str(repeat_to / spec.name)] if repeat_to else []),
             *(["--calibration-sims", *map(str, sims)] if sims else []), "--full"]
    compare([out / "sim" / spec.name], [out / "testbed" / spec.name], out / "fidelity", cal.model_dump(), shown,
            repeat_paths=[repeat_to / spec.name] if repeat_to else None, calibration_sims=[[s] for s in sims],
            full=args.full, full_command=again)
    return 0
