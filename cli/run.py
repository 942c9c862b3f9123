"""The commands that run the real testbed: `testbed run`, `testbed calibrate` and `testbed twin`
(one spec in both worlds)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import check_sizes, console, out_console, selection
from cli.sim import simulate


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.runs.launch import run_testbed
    from core.spec import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = selection(args, spec)
    if args.serve and (len(policies), len(seeds)) != (1, 1):
        raise ValueError(f"--serve: one router serves, so one policy and one seed (got {len(policies)} policies "
                         f"and {len(seeds)} seeds; choose with --policies and --seeds)")
    check_sizes(spec, "testbed", len(policies) * len(seeds), args)
    run_testbed(spec, Path(args.out), policies, seeds, address=args.address, serve=args.serve)
    console.print(f"report: testbed report {Path(args.out) / spec.name}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from testbed.runs.launch import run_testbed
    from core.spec import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    out = Path(args.out) if args.out else Path("runs") / spec.name / "calibration.json"
    run_testbed(spec, out.parent, [], [], calibrate_to=out)
    console.print(f"calibration: {out}  (use: testbed sim SPEC --calibration {out})")
    return 0


def cmd_twin(args: argparse.Namespace) -> int:
    """One spec in both worlds: the testbed (calibrated on its own engines first, unless a
    calibration is given), then the simulator with that calibration, then the comparison."""
    from analysis.fidelity import compare
    from analysis.report import report
    from core.calibration import load_calibration
    from core.spec import load_spec
    from testbed.runs.launch import run_testbed

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = selection(args, spec)
    out = Path(args.out)
    cal_path = Path(args.calibration) if args.calibration else out / "calibration.json"
    if args.calibration:
        load_calibration(cal_path)  # a bad file is refused before minutes of engine start-up
    # The testbed's repeatability is measured where confidence is asked for (several seeds), not in
    # the one-seed main job, which would take twice as long (issue 27).
    repeat = len(seeds) > 1 if args.repeat is None else args.repeat
    repeat_to = out / "testbed-repeat" if repeat else None
    check_sizes(spec, "testbed", len(policies) * len(seeds) * (2 if repeat else 1), args)
    check_sizes(spec, "sim", len(policies) * len(seeds), args)
    run_testbed(spec, out / "testbed", policies, seeds, calibrate_to=None if args.calibration else cal_path,
                repeat_to=repeat_to, calibration=cal_path if args.calibration else None)
    cal = load_calibration(cal_path)
    simulate(spec, policies, seeds, out / "sim", Path(args.spec).resolve().parent if args.spec else None, cal)
    shown = out_console()
    report([out / "testbed" / spec.name, out / "sim" / spec.name], out / "report", shown)
    compare([out / "sim" / spec.name], [out / "testbed" / spec.name], out / "fidelity", cal.model_dump(), shown,
            repeat_paths=[repeat_to / spec.name] if repeat_to else None)
    return 0
