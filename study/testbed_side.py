"""`testbed study SPEC --world testbed|both`: a study's grid on the real testbed, resumably, and the
simulator's on the same cells with the testbed's calibration; then the verdict per claim.

The study directory of both worlds (docs/carryover.md "Carrying a claim to the testbed")::

    STUDY/calibration.json     the testbed's engines and links, measured once and fitted under the run's
                               conditions on the calibration load (or the file given)
    STUDY/calibration-isolated.json, STUDY/calibration-load/   the engines alone, and the load's runs
    STUDY/testbed/             a study directory (study/table.py): study.json, cells/<point>/<policy>/seed-<n>/
    STUDY/repeat/              the repeated seeds' runs, on the same engines with the same workloads
    STUDY/sim/                 the simulator's cells, calibrated
    STUDY/claims/              claims.csv, claim_effects.csv, reaction_cost.csv, one figure per claim

Every distinct run of the grid (study/grid.py: cells whose records cannot differ share one) is one
testbed run, all on one set of engines: one job per (point, policy) with its unfinished seeds, so the
engines start once; between runs the driver verifies them quiet (testbed/engines/pool.py,
Engines.quiesce). A run is finished when its directory holds cell.json naming its run id, written
here once run.json says ``finished`` (also after Ctrl-C or an error: the runs done so far count);
the same command skips finished runs and reruns the others from an empty directory.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from study.claims import CLAIMS_FIXED, REPEAT, fixed_record
from vocab import TESTBED
from study.grid import STUDY_FILE, Cell, distinct_runs
from study.cells import write_cell, write_index

CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class TestbedPlan:
    """What the testbed still has to run: each pass's runs (their first cells), finished or not."""

    runs: list[Cell]  # every distinct run of the chosen cells
    todo: list[Cell]  # of those, not finished in STUDY/testbed
    repeat: list[Cell]  # the runs of the repeated seeds
    repeat_todo: list[Cell]  # of those, not finished in STUDY/repeat


def plan(cells: list[Cell], chosen: list[Cell], study_dir: Path, repeat_seeds: list[int],
         rerun: bool = False) -> TestbedPlan:
    from study.table import cell_finished

    runs = distinct_runs(cells, chosen)
    rep = [c for c in runs if c.seed in repeat_seeds]

    def todo(world: str, rs: list[Cell]) -> list[Cell]:
        return [c for c in rs if rerun or not cell_finished(study_dir / world / c.run_dir, c.run)]

    return TestbedPlan(runs, todo(TESTBED, runs), rep, todo(REPEAT, rep))


def jobs_for(todo: list[Cell], out_dir: Path) -> list[Any]:
    """One testbed job per (point, policy) with its unfinished seeds, its runs into ``out_dir`` (the
    point spec's name is the point: run_dir_for then gives each cell's run_dir)."""
    from testbed.runs.jobs import prepare_jobs

    groups: dict[tuple[str, str], list[Cell]] = {}
    for c in todo:
        groups.setdefault((c.point, c.policy), []).append(c)
    jobs = prepare_jobs([(g[0].spec, [g[0].policy], sorted(c.seed for c in g)) for g in groups.values()])
    return [replace(j, out_dir=Path(out_dir).resolve()) for j in jobs]


def mark_finished(world_dir: Path, runs: list[Cell]) -> int:
    """Write cell.json (and the metrics cache) into each run directory whose run.json says finished
    and that has none yet; returns how many are finished now."""
    from study.table import cell_finished, cell_metrics
    from core.records import read_meta

    n = 0
    for c in runs:
        run_dir = world_dir / c.run_dir
        if cell_finished(run_dir, c.run):
            n += 1
            continue
        try:
            meta = read_meta(run_dir)
        except (OSError, ValueError):
            continue
        if meta.get("status") != "finished":
            continue
        cell_metrics(run_dir, recompute=True)
        write_cell(run_dir, c, "testbed", started_at=meta.get("started_at"),
                   finished_at=meta.get("ended_at") or datetime.now(timezone.utc).isoformat())
        n += 1
    return n


def run_testbed_side(spec: Any, cells: list[Cell], chosen: list[Cell], study_root: Path, *, address: str | None,
                     calibration: Path | None, repeat_seeds: list[int], rerun: bool,
                     console: Console, keep_engines: bool = False) -> tuple[Path, TestbedPlan]:
    """The testbed's runs of the chosen cells that are not finished (then the repeated seeds'), on one
    set of engines (``keep_engines``: testbed/engines/kept.py); returns the calibration file and
    the plan it ran."""
    from analysis.checks.refit import fit_under_run
    from core.calibration.fit import LOAD_DIR, calibration_load, isolated_of
    from testbed.runs.jobs import prepare_jobs
    from testbed.runs.launch import launch_jobs

    p = plan(cells, chosen, study_root, repeat_seeds, rerun)
    for world in (TESTBED, REPEAT):
        (study_root / world).mkdir(parents=True, exist_ok=True)
    # How each claim is judged is fixed before the first run; a later call keeps that record and notes
    # a change, which the verdicts then carry (study/claims.py fixed_note).
    index = study_root / TESTBED / STUDY_FILE
    try:
        previous = json.loads(index.read_text()).get(CLAIMS_FIXED) if index.is_file() else None
    except (OSError, ValueError):  # a torn index: the runs' cell.json files still say what is finished
        previous = None
    # the looks, where the study has them, are fixed with the claims (a design changed after its first
    # look is not the design its level split was made for)
    judged = [*spec.study.claims, *([{"looks": spec.study.looks}] if spec.study.looks else [])]
    fixed = fixed_record(previous, judged, datetime.now(timezone.utc).isoformat())
    write_index(study_root / TESTBED, spec, cells, {CLAIMS_FIXED: fixed})
    write_index(study_root / REPEAT, spec, [c for c in cells if c.seed in repeat_seeds])
    cal_path = calibration or study_root / CALIBRATION_FILE
    measure = calibration is None and not cal_path.is_file()
    console.print(f"testbed: {len(p.runs)} runs, {len(p.runs) - len(p.todo)} finished before; "
                  f"repeat of seed(s) {', '.join(map(str, repeat_seeds)) or 'none'}: {len(p.repeat)} runs, "
                  f"{len(p.repeat) - len(p.repeat_todo)} finished before"
                  + (f"; calibrating first -> {cal_path}" if measure and (p.todo or p.repeat_todo) else ""))
    if not (p.todo or p.repeat_todo):
        return cal_path, p
    for world, rs in ((TESTBED, p.todo), (REPEAT, p.repeat_todo)):
        for c in rs:  # an interrupted run's rows would mix with the new one's
            shutil.rmtree(study_root / world / c.run_dir, ignore_errors=True)
    # The repeat pass runs last, with the same workloads (generated from the point's spec and the seed
    # alone: testbed/runs/jobs.py), so what differs between the passes is the testbed's own doing.
    jobs = jobs_for(p.todo, study_root / TESTBED / "cells") + jobs_for(p.repeat_todo, study_root / REPEAT / "cells")
    # Measured here, as the twin measures it: the engines alone (the file each run records), then the
    # calibration load, the scenario's workload without its faults, whose quiet requests the
    # simulator's levels and legs are fitted on (docs/twin.md "A calibration under the run's
    # conditions"); the simulator's side then runs under the run's conditions.
    isolated = isolated_of(cal_path)
    if measure:
        load, = prepare_jobs([calibration_load(chosen[0].spec)])
        jobs.insert(0, replace(load, out_dir=(study_root / LOAD_DIR).resolve()))
    t0 = time.monotonic()
    try:
        launch_jobs(jobs, study_root / TESTBED / "cells", address=address,
                    calibrate_to=isolated if measure else None, calibration=None if measure else cal_path,
                    keep_engines=keep_engines)
    finally:
        done = mark_finished(study_root / TESTBED, p.runs) + mark_finished(study_root / REPEAT, p.repeat)
        console.print(f"testbed: {done} of {len(p.runs) + len(p.repeat)} runs finished "
                      f"({time.monotonic() - t0:.0f} s this call)")
    if measure:
        fit_under_run(isolated, study_root / LOAD_DIR, cal_path, console)
    return cal_path, p
