"""`testbed study SPEC`: run a spec's grid (study/grid.py) as Ray tasks, resumably.

Each cell is one simulator run, executed as a Ray task with one CPU: on a local
Ray started for the study (``address="local"``: never a cluster that happens to
run on this machine), or on any Ray cluster given its address, whose nodes have
this package installed (``cluster.yaml``'s setup does that). A task simulates
(in a child interpreter the Ray worker keeps for its cells: study/clean_process.py says
why) into a scratch directory on its node, computes the cell's metrics there
(``study.table.cell_metrics``, so the report does not reload every run), and
returns the run directory's files; the driver writes them under
``STUDY/.partial/<run>`` and renames that into place with ``cell.json`` in it.
So a run directory exists complete or not at all, whichever node ran it and
however the driver stopped, and:

* a run whose ``cell.json`` carries its run id is finished and is skipped;
* anything else (an interrupted run, a run of an older version of the spec
  at the same place) is removed and run again.

Cells whose records cannot differ (study/grid.py: a point repeated by another
sweep; LC, which ignores the risk price, at another telemetry mode) share one
run, so the grid runs each distinct simulation once.

Cells are deterministic: a run's records depend only on its spec, policy and
seed (the simulator draws every random number from ``seed_streams(seed)``), so
a cell rerun anywhere writes the same records; only wall-clock fields differ
(run.json's timestamps, decisions' ``latency_s``).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from core.spec.sizes import DEFAULT_MAX_HOURS, check_study_fits
from study.grid import Cell, choose_sweeps, distinct_runs, expand_study
from study.cells import cell_is_done, write_cell, write_index

__all__ = ["StudyResult", "run_cell", "run_cell_in_clean_process", "run_study"]


@dataclass(frozen=True)
class StudyResult:
    study_dir: Path
    cells: int  # in the grid (the chosen sweeps)
    runs: int  # distinct runs behind those cells (cells with the same records share one)
    skipped: int  # runs finished before this call
    ran: int  # runs finished by this call
    failed: list[str]  # "point policy seed: error" of runs whose task raised (not finished)
    wall_s: float
    cpu_s: float  # summed over the cells this call ran


def run_cell(spec_json: str, policy: str, seed: int, base_dir: str | None = None,
             scratch: str | None = None) -> dict[str, Any]:
    """Simulate one cell into a scratch directory (under ``scratch``, default the node's temp dir);
    returns its files (path relative to the run directory -> bytes) and what it cost. Plain function:
    the Ray task wraps it, tests call it."""
    from study.table import cell_metrics
    from core.spec.model import ExperimentSpec
    from simulator.run import run_sim

    spec = ExperimentSpec.model_validate_json(spec_json)
    if scratch:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="testbed-cell-", dir=scratch) as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        run_dir = run_sim(spec, policy, seed, Path(tmp), base_dir=Path(base_dir) if base_dir else None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        cell_metrics(run_dir)  # cached in the run directory as metrics.json
        files = {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    return {"files": files, "wall_s": wall, "cpu_s": cpu, "node": socket.gethostname()}


def run_cell_in_clean_process(spec_json: str, policy: str, seed: int, base_dir: str | None = None,
                              scratch: str | None = None) -> dict[str, Any]:
    """:func:`run_cell` in this process's clean child (study/clean_process.py): the Ray task of a
    cell. A Ray worker simulates 15-20% slower than a fresh interpreter does."""
    from study.clean_process import shared

    child = shared()
    if scratch:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    # The task's own scratch directory, removed here; and by the child if this worker dies first
    # (a stopped study ends its tasks' workers: the child gets SIGTERM and removes it as it exits).
    with tempfile.TemporaryDirectory(prefix="testbed-cell-", dir=scratch) as tmp:
        try:
            return child.call(_run_cell_owning, tmp, spec_json, policy, seed, base_dir)
        except Exception:  # the cell failed in the child (it lives on), or the child died
            if not child.alive():
                child.kill()
            raise
        except BaseException:  # this worker is being stopped: stop the cell (the next starts a new child)
            child.stop()
            raise


def _run_cell_owning(owned: str, spec_json: str, policy: str, seed: int, base_dir: str | None) -> dict[str, Any]:
    """In the child: :func:`run_cell` under ``owned``, which the child removes if it is stopped
    mid-cell (SIGTERM: study/clean_process.py), its worker having died without removing it."""
    try:
        return run_cell(spec_json, policy, seed, base_dir, owned)
    except SystemExit:
        shutil.rmtree(owned, ignore_errors=True)
        raise


def _commit(study_dir: Path, cell: Cell, result: dict[str, Any]) -> None:
    """Write a finished run's files, then move them into place in one rename (``cell``: the run's
    first cell, whose place it takes)."""
    partial = study_dir / ".partial" / cell.run
    shutil.rmtree(partial, ignore_errors=True)
    for rel, data in result["files"].items():
        p = partial / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    write_cell(partial, cell, result["node"], wall_s=result["wall_s"], cpu_s=result["cpu_s"])
    final = study_dir / cell.run_dir
    shutil.rmtree(final, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)


def run_study(spec: Any, out: Path, *, address: str | None = None, workers: int | None = None,
              rerun: bool = False, sweeps: list[str] | None = None, base_dir: Path | None = None,
              source: str = "<spec>", console: Console | None = None,
              max_hours: float = DEFAULT_MAX_HOURS, study_dir: Path | None = None,
              only: set[tuple[str, str, int]] | None = None) -> StudyResult:
    """Run every unfinished cell of ``spec.study`` under ``out/<spec name>``; returns what was done.

    ``address``: a Ray cluster to run on (None: a local Ray with ``workers`` CPUs, default all);
    ``max_hours``: refuse (core/spec/sizes.py) a study whose runs would take longer on this machine;
    ``study_dir``: instead of ``out/<spec name>``;
    ``rerun``: run finished cells again; ``sweeps``: run only these sweeps' cells (the index
    still lists every cell, so a report counts the others as unfinished); ``only``: of those, only the
    cells whose (point, policy, seed) it holds (a look of a group-sequential design: cli/study.py).
    Ctrl-C cancels the cells in flight and keeps every finished one; the same command resumes.
    """
    import ray

    console = console or Console()
    cells = expand_study(spec, source)  # every point validated before anything runs
    chosen = choose_sweeps(spec, cells, sweeps, source)
    if only is not None:
        chosen = [c for c in chosen if (c.point, c.policy, c.seed) in only]
    study_dir = Path(study_dir) if study_dir is not None else Path(out) / spec.name
    runs = distinct_runs(cells, chosen)
    todo = [c for c in runs if rerun or not cell_is_done(study_dir, c)]
    if not address:  # a cluster's nodes are not this machine's to estimate
        check_study_fits([c.spec for c in todo], workers or os.cpu_count() or 1, max_hours)
    study_dir.mkdir(parents=True, exist_ok=True)
    partial = study_dir / ".partial"  # runs a stopped driver was writing, scratch space of local tasks
    shutil.rmtree(partial, ignore_errors=True)
    write_index(study_dir, spec, cells)
    skipped = len(runs) - len(todo)
    n_shared = len(chosen) - len(runs)
    console.print(f"[bold]{spec.name}[/]: {len(chosen)} cells ({len({c.point for c in chosen})} points x policies x "
                  f"seeds{'' if sweeps is None else ', sweeps ' + ', '.join(sweeps)}) in {len(runs)} runs"
                  f"{f' ({n_shared} cells share a run: same records)' if n_shared else ''}, {skipped} already "
                  f"finished -> {study_dir}")
    t0 = time.perf_counter()
    failed: list[str] = []
    if not todo:
        return StudyResult(study_dir, len(chosen), len(runs), skipped, 0, [], 0.0, 0.0)

    scratch = _start_ray(address, workers, partial)
    task = ray.remote(num_cpus=1, max_retries=1)(run_cell_in_clean_process)
    # One spec per point, shipped once through the object store rather than once per cell.
    spec_refs = {p: ray.put(s) for p, s in {c.point: c.spec.model_dump_json() for c in todo}.items()}
    pending: dict[Any, Cell] = {}
    for c in todo:
        pending[task.remote(spec_refs[c.point], c.policy, c.seed, str(base_dir) if base_dir else None, scratch)] = c
    # Ctrl-C (or any error) ends the study with ray.shutdown() below and cancels nothing: the job's
    # workers end with the driver, and each one's child removes its cell's scratch directory as it
    # goes (_run_cell_owning). ray.cancel raced Ray 2.60's own bookkeeping: its driver aborted,
    # "Tried to complete task that was not pending" (task_manager.cc), three times in this
    # project's suites, the last with only running tasks left to cancel; Ray's fixes of such
    # races (ray-project/ray pull requests 54116, 54798) show the window is in Ray, not here.
    try:
        ran, cpu = _collect(pending, study_dir, console, len(runs), skipped, failed)
    finally:
        ray.shutdown()
        shutil.rmtree(partial, ignore_errors=True)
    return StudyResult(study_dir, len(chosen), len(runs), skipped, ran, failed, time.perf_counter() - t0, cpu)


def _start_ray(address: str | None, workers: int | None, partial: Path) -> str | None:
    """Ray for the cells: the cluster at ``address``, or a local one of ``workers`` CPUs; returns the
    cells' scratch folder (None on a cluster: the nodes' own temp dirs, the study directory may not
    exist there)."""
    from core.util.ray_start import ray_init

    if address:
        ray_init(address=address, logging_level="ERROR", log_to_driver=False)
        return None
    ray_init(address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)
    return str(partial / "scratch")  # removed by run_study however the tasks end


def _collect(pending: dict[Any, Cell], study_dir: Path, console: Console, total: int, skipped: int,
             failed: list[str]) -> tuple[int, float]:
    """Each cell's result committed as it comes (a broken cell reported in ``failed``, the others go
    on), under a progress bar: (cells run, their CPU seconds)."""
    import ray

    ran, cpu = 0, 0.0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as prog:
        bar = prog.add_task("runs", total=total, completed=skipped)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as e:
                # One broken cell must not cost the others: report it, leave it unfinished.
                msg = str(e.cause if e.cause is not None else e).strip().splitlines()[-1]
                failed.append(f"{cell.point} {cell.policy} seed {cell.seed}: {msg}")
                prog.console.print(f"[red]cell failed[/]: {failed[-1]}")
                prog.update(bar, advance=1)
                continue
            _commit(study_dir, cell, result)
            cpu += result["cpu_s"]
            ran += 1
            prog.update(bar, advance=1, description=f"runs (last: {cell.point} {cell.policy} s{cell.seed})")
    return ran, cpu
