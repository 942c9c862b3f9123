"""What a study writes beside its runs: the one writer of ``cell.json``, which marks a run finished
(study/table.py defines the file and reads it: a cell is finished when its run directory holds
one naming its run id), and the index ``study.json``."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.util.files import write_json_atomic
from study.grid import STUDY_FILE, Cell


def write_cell(run_dir: Path, cell: Cell, node: str, **fields: Any) -> None:
    """Mark ``run_dir`` finished as ``cell``'s run: the cell's index row, the node that ran it, when
    it finished (now, unless ``finished_at`` is given) and ``fields`` (the simulator's wall and CPU
    seconds, the testbed's start)."""
    from study.table import CELL_FILE  # (the analysis and its scipy, only when a cell is written)

    fields.setdefault("finished_at", datetime.now(timezone.utc).isoformat())
    write_json_atomic(run_dir / CELL_FILE, {**cell.index_row(), "node": node, **fields}, indent=1, default=str)


def cell_is_done(study_dir: Path, cell: Cell) -> bool:
    """Finished: its run directory holds a cell.json naming the cell's run id (the report's own check)."""
    from study.table import cell_finished

    return cell_finished(study_dir / cell.run_dir, cell.run)


def write_index(study_dir: Path, spec: Any, cells: list[Cell], extra: dict[str, Any] | None = None) -> None:
    """study.json (study/table.py reads it) of ``cells``, with ``extra`` fields."""
    axes: list[str] = []
    for sw in spec.study.sweeps:
        axes += [a for a in sw.axes if a not in axes]
    write_json_atomic(study_dir / STUDY_FILE, {
        "name": spec.name, "axes": axes, "study": spec.study.model_dump(mode="json"),
        "cells": [c.index_row() for c in cells], **(extra or {})}, indent=1, default=str)
