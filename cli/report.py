"""`testbed report` and `testbed compare`: run directories of either world into metrics, and the
two worlds side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import out_console


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.run.report import report
    from study.table import is_study
    from study.claims import carryover_report, is_carryover
    from study.report import study_report

    paths = [Path(p) for p in args.paths]
    out = Path(args.out) if args.out else None
    if any(is_carryover(p) for p in paths):
        if len(paths) > 1:
            raise ValueError(f"report: {paths[0]} is a study of both worlds (sim/, testbed/); report it on its own")
        carryover_report(paths[0], out, out_console())
        return 0
    studies = [p for p in paths if is_study(p)]
    if studies:
        if len(paths) > 1:  # a study's figures compare its own cells; mixing in other runs has no meaning
            raise ValueError(f"report: {studies[0]} is a study directory (study.json); report it on its own")
        study_report(paths[0], out, out_console())
        return 0
    report(paths, out, out_console())
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from analysis.compare.console import compare
    from core.calibration.fit import load_calibration

    cal = load_calibration(args.calibration).model_dump() if args.calibration else None  # before any run is read
    compare([Path(args.sim_path)], [Path(args.testbed_path)], Path(args.out) if args.out else None, cal, out_console(),
            repeat_paths=[Path(args.repeat)] if args.repeat else None,
            calibration_sims=[[Path(p)] for p in args.calibration_sims], full=args.full)
    return 0
