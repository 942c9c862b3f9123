"""A study directory (the grid of cells `testbed study` runs) -> one table of per-cell metrics.

The study directory (written by the grid runner)::

    STUDY_DIR/study.json   {"name", "axes": [axis names in spec order],
                            "cells": [{"cell", "point", "sweep", "axes": {axis: value}, "policy", "seed",
                                       "run", "run_dir": "cells/<point>/<policy>/seed-<seed>"}, ...]}
    STUDY_DIR/cells/<point>/<policy>/seed-<seed>/   a run directory + cell.json (the run finished)
                                                     + metrics.json (:func:`cell_metrics`' cache)

Cells whose records cannot differ share a run (study/grid.py): the same ``run`` id and ``run_dir``, which is
the first such cell's place; the others are rows of their own in the cells table, with the run's metrics.

A cell lists only the axes its sweep varies; the others are at the base spec's value. A cell without
cell.json has not finished and is left out (and counted). Per-cell metrics are computed once, right after
the run, so that the report never has to load millions of request rows again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.run.names import gap
from analysis.run.names import Metric as M
from analysis.run.metrics import (
    EXPOSURE_COLUMNS,
    ORACLE,
    fault_window,
    gap_to_oracle,
    needless_deflection,
    pod_exposure,
)
from analysis.run.data import load_run
from analysis.run.scalars import run_metrics
from analysis.run.plots import run_curves
from analysis.run.summary import GAP_METRICS, mean_ci
from core.util.files import write_json_atomic
from core.records import read_meta
from study.grid import CELL_FILE, STUDY_FILE

METRICS_FILE = "metrics.json"
# Bump when the content of metrics.json changes: an older cache is then recomputed, not misread.
METRICS_SCHEMA = 3  # 3: the run's commit (analysis.run.scalars.commit_label)
LC = "LC"
# Columns of the cells table that identify a cell rather than measure it.
ID_COLUMNS = ("cell", "point", "sweep", "policy", "seed")
# Identity columns that run_metrics adds (strings) and that are not metrics either.
RUN_COLUMNS = ("world", "scenario", "status", "commit", "run_dir")
SERIES_COLUMNS = ("bin_start_s", "n", "success_ratio", "degraded_price", "other_price")


class StudyError(ValueError):
    """A path given as a study is not one, or its study.json is malformed (one-line message)."""


# --------------------------------------------------------------------------- study.json


@dataclass(frozen=True)
class Study:
    """study.json as read: the grid's cells, whether or not they have run."""

    path: Path
    name: str
    axes: tuple[str, ...]  # spec order, then any axis a cell names that the list lacks
    cells: tuple[dict[str, Any], ...] = field(repr=False)


def is_study(path: Path | str) -> bool:
    """True when ``path`` is a directory holding study.json."""
    return (Path(path) / STUDY_FILE).is_file()


_CELL_KEYS = {"cell": str, "point": str, "sweep": str, "axes": dict, "policy": str, "seed": int, "run_dir": str}


def _check_cell(c: Any, where: str) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise StudyError(f"{where}: a cell must be an object, got {type(c).__name__}")
    for k, t in _CELL_KEYS.items():
        if k not in c:
            raise StudyError(f"{where}: missing key {k!r}")
        if not isinstance(c[k], t) or (t is int and isinstance(c[k], bool)):
            raise StudyError(f"{where}: {k} must be {t.__name__}, got {c[k]!r}")
    if not isinstance(c.setdefault("run", c["cell"]), str):  # a study without shared runs may omit it
        raise StudyError(f"{where}: run must be str, got {c['run']!r}")
    return c


def read_study(study_dir: Path | str) -> Study:
    """Read and check study.json; anything missing or malformed raises a one-line :class:`StudyError`."""
    path = Path(study_dir)
    f = path / STUDY_FILE
    if not f.is_file():
        raise StudyError(f"{path}: not a study directory (no {STUDY_FILE})")
    try:
        raw = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StudyError(f"{f}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise StudyError(f"{f}: must hold an object with name, axes and cells")
    for k, t in (("name", str), ("axes", list), ("cells", list)):
        if not isinstance(raw.get(k), t):
            raise StudyError(f"{f}: {k} must be a {t.__name__}, got {raw.get(k)!r:.60}")
    cells = tuple(_check_cell(c, f"{f}: cells[{i}]") for i, c in enumerate(raw["cells"]))
    axes = [str(a) for a in raw["axes"]]
    for c in cells:
        axes += [a for a in c["axes"] if a not in axes]
    return Study(path, raw["name"], tuple(axes), cells)


# --------------------------------------------------------------------------- one cell


def _json_safe(x: Any) -> Any:
    """NaN and infinities -> None, numpy scalars -> Python ones (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _series(run) -> dict[str, Any]:
    """Success ratio and risk price (degraded vs other pods) per bin around the fault: the bins that overlap
    [onset - (end - onset), end + recovery_horizon_s), as many baseline bins before as the fault lasts.
    Empty without a fault."""
    curves = run_curves(run)
    w = curves.window
    if w is None:
        return {"bin_s": curves.bin_s, "onset_s": None, "end_s": None, **{c: [] for c in SERIES_COLUMNS}}
    s = curves.success[["bin_start_s", "n", "success_ratio"]].merge(curves.prices, on="bin_start_s", how="outer")
    lo = w.onset_s - (w.end_s - w.onset_s)
    hi = w.end_s + run.spec.recovery_horizon_s
    start = s["bin_start_s"].to_numpy(dtype=float)
    s = s.loc[(start + curves.bin_s > lo) & (start < hi)].sort_values("bin_start_s")
    s["n"] = s["n"].fillna(0)
    return {"bin_s": curves.bin_s, "onset_s": w.onset_s, "end_s": w.end_s,
            **{c: s[c].tolist() for c in SERIES_COLUMNS}}


def _compute(run_dir: Path) -> dict[str, Any]:
    run = load_run(run_dir)
    exposure = pod_exposure(run.requests, fault_window(run.faults, run.requests))
    return {
        "schema": METRICS_SCHEMA,
        "run_started_at": run.meta.get("started_at"),
        "run_status": run.meta.get("status"),
        "metrics": run_metrics(run),
        "exposure": exposure.to_dict("records"),
        "series": _series(run),
    }


def _fresh(cached: dict[str, Any], run_dir: Path) -> bool:
    """A cache belongs to the run now in the directory: same schema, same start time and status."""
    meta = read_meta(run_dir)
    return (cached.get("schema") == METRICS_SCHEMA and cached.get("run_started_at") == meta.get("started_at")
            and cached.get("run_status") == meta.get("status"))


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    # Cells finish in parallel tasks and a report may read meanwhile: never expose half a file.
    write_json_atomic(path, _json_safe(data), allow_nan=False)


def _nan(x: Any) -> Any:
    return math.nan if x is None else x


def cell_metrics(run_dir: Path | str, recompute: bool = False) -> dict[str, Any]:
    """Everything the study needs from one run, cached as metrics.json in the run directory.

    Keys: ``metrics`` (:func:`analysis.run.scalars.run_metrics`), ``exposure`` (one dict per degraded pod,
    :func:`analysis.run.metrics.pod_exposure`), ``series`` (bin_s, onset_s, end_s and per bin around the fault:
    bin_start_s, n, success_ratio, degraded_price, other_price; :func:`_series`), plus ``schema``,
    ``run_started_at``, ``run_status``. The cache is used when it belongs to the run in the directory (same
    schema, run.json start time and status) and ``recompute`` is false; otherwise it is rewritten. Missing
    values (NaN) are null in the file and NaN in the returned metrics."""
    path = Path(run_dir)
    cache = path / METRICS_FILE
    data = None
    if cache.is_file() and not recompute:
        try:
            data = json.loads(cache.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None  # a damaged cache is recomputed, not trusted
        if data is not None and not _fresh(data, path):
            data = None
    if data is None:
        data = _json_safe(_compute(path))
        _write_atomic(cache, data)
    data["metrics"] = {k: _nan(v) for k, v in data["metrics"].items()}
    return data


def exposure_frame(data: dict[str, Any]) -> pd.DataFrame:
    """The per-pod exposure table of a :func:`cell_metrics` result."""
    return pd.DataFrame(data.get("exposure") or [], columns=list(EXPOSURE_COLUMNS))


def series_frame(data: dict[str, Any]) -> pd.DataFrame:
    """The time series of a :func:`cell_metrics` result, with t_rel_s = bin centre - fault onset (s)."""
    s = data.get("series") or {}
    df = pd.DataFrame({c: pd.to_numeric(pd.Series(s.get(c, []), dtype=object), errors="coerce")
                       for c in SERIES_COLUMNS}).astype(float)
    onset = _nan(s.get("onset_s"))
    df["t_rel_s"] = df["bin_start_s"] + float(s.get("bin_s") or 0.0) / 2 - onset
    return df


# --------------------------------------------------------------------------- the cells table


def _row(cell: dict[str, Any], axes: Sequence[str], metrics: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {k: cell[k] for k in ID_COLUMNS}
    row.update({a: cell["axes"].get(a, math.nan) for a in axes})
    row.update({k: v for k, v in metrics.items() if k not in ("policy", "seed")})
    row["run_dir"] = str(run_dir)  # where it is now, not where it was when the cache was written
    return row


def _check_cache(cell: dict[str, Any], metrics: dict[str, Any], run_dir: Path) -> None:
    if (metrics.get("policy"), metrics.get("seed")) != (cell["policy"], cell["seed"]):
        raise StudyError(f"{run_dir}: holds policy {metrics.get('policy')} seed {metrics.get('seed')}, "
                         f"study.json says {cell['policy']} seed {cell['seed']}")


def cell_finished(run_dir: Path, run_id: str) -> bool:
    """A cell has finished when its run directory holds cell.json, a JSON object (the runner writes it
    last), that names the cell's run id, or names another id but holds a run whose inputs are this
    cell's under the code of today (:func:`recorded_run_id`: a spec field added since, at its
    default, changes every id but no record). A run of other inputs at the same place is not this
    cell's. The runner (study/runner.py) and the testbed's side skip runs by this same check."""
    try:
        marker = json.loads((run_dir / CELL_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict):
        return False
    return marker.get("run", marker.get("cell")) == run_id or recorded_run_id(run_dir, marker) == run_id


def recorded_run_id(run_dir: Path, marker: dict[str, Any]) -> str | None:
    """The id the run recorded in ``run_dir`` has under the code of today: its run.json's spec parsed
    again, a field added since taking its default, a field whose value was recorded keeping it (a
    default changed since is then a difference), with cell.json's policy and seed. None where the
    record no longer parses (a field renamed or removed since: the cell runs again)."""
    from core.spec.model import parse_spec
    from study.grid import run_digest

    try:
        spec = read_meta(run_dir).get("spec")
        return run_digest(parse_spec(spec, str(run_dir)), str(marker["policy"]), int(marker["seed"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def load_study(study_dir: Path | str) -> pd.DataFrame:
    """One row per finished cell (:func:`cell_finished`): cell, point, sweep, policy, seed, one column per axis
    (NaN where the cell's sweep does not vary it), every :func:`analysis.run.scalars.run_metrics` value,
    needless_deflection_ratio (:func:`add_needless_deflection`) and gap_<metric> (:func:`add_gaps`).
    Sorted by sweep, point, policy, seed. ``attrs`` holds name, axes, n_cells and skipped (run_dir of every
    cell left out as unfinished). A missing or malformed study.json raises a one-line :class:`StudyError`."""
    study = read_study(study_dir)
    rows: list[dict[str, Any]] = []
    exposures: dict[str, pd.DataFrame] = {}
    skipped: list[str] = []
    for c in study.cells:
        run_dir = study.path / c["run_dir"]
        if not cell_finished(run_dir, c["run"]):
            skipped.append(c["run_dir"])
            continue
        data = cell_metrics(run_dir)
        _check_cache(c, data["metrics"], run_dir)
        rows.append(_row(c, study.axes, data["metrics"], run_dir))
        exposures[c["cell"]] = exposure_frame(data)
    frame = pd.DataFrame(rows, columns=None if rows else [*ID_COLUMNS, *study.axes])
    if rows:
        frame = frame.sort_values(["sweep", "point", "policy", "seed"], kind="stable").reset_index(drop=True)
        frame = add_gaps(add_needless_deflection(frame, exposures))
    frame.attrs.update(name=study.name, axes=list(study.axes), n_cells=len(study.cells), skipped=skipped)
    return frame


def add_needless_deflection(frame: pd.DataFrame, exposures: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Add needless_deflection_ratio per cell: :func:`analysis.run.metrics.needless_deflection` of the cell's
    exposure table against that of the LC cell with the same point and seed; NaN without such a cell.
    ``exposures`` maps cell id -> exposure table."""
    lc = {(r.point, r.seed): exposures[r.cell] for r in frame.itertuples() if r.policy == LC}
    values = [needless_deflection(exposures[r.cell], lc[(r.point, r.seed)]) if (r.point, r.seed) in lc
              else math.nan for r in frame.itertuples()]
    return frame.assign(needless_deflection_ratio=values)


def add_gaps(frame: pd.DataFrame, oracle: str = ORACLE) -> pd.DataFrame:
    """Add gap_<metric> = metric - OracleAvoidance's metric on the same point and seed
    (:func:`analysis.run.metrics.gap_to_oracle`) for the summary's GAP_METRICS; NaN without that oracle cell."""
    metrics = [m for m in GAP_METRICS if m in frame.columns]
    # gap_to_oracle pairs on world, scenario, seed; a study pairs on its point (= the run's scenario).
    paired = gap_to_oracle(frame.assign(scenario=frame["point"], world="study"), metrics, oracle)
    return frame.assign(**{gap(m): paired[gap(m)] for m in metrics})


# --------------------------------------------------------------------------- selections and summaries


def present_axes(row: pd.Series, axes: Sequence[str]) -> set[str]:
    """The axes a cell (a row of the cells table) varies: those with a value."""
    return {a for a in axes if a in row.index and not _missing(row[a])}


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def select_cells(frame: pd.DataFrame, axes: Sequence[str], required: Sequence[str],
                 optional: Sequence[str] = ()) -> pd.DataFrame:
    """The cells that vary every axis in ``required`` and no axis outside ``required`` and ``optional``
    (so a figure of failure rate vs severity never mixes in cells swept over load)."""
    if frame.empty:
        return frame
    allowed = set(required) | set(optional)
    present = frame.apply(lambda r: frozenset(present_axes(r, axes)), axis=1)
    keep = present.map(lambda p: set(required) <= p and p <= allowed)
    return frame.loc[keep.to_numpy(dtype=bool)]


def metric_columns(frame: pd.DataFrame, axes: Sequence[str]) -> list[str]:
    """The numeric, measured columns of the cells table (not ids, axes or run identity)."""
    skip = {*ID_COLUMNS, *RUN_COLUMNS, *axes}
    return [c for c in frame.columns if c not in skip and pd.api.types.is_numeric_dtype(frame[c])]


def study_summary(frame: pd.DataFrame, axes: Sequence[str], confidence: float = 0.95) -> pd.DataFrame:
    """Per point x policy: sweep, the point's axis values, n_seeds, seeds, and for every metric m m_mean and
    m_ci, the mean and confidence-interval half-width over seeds (:func:`analysis.run.summary.mean_ci`). Gap and
    needless-deflection columns are per seed first, so their intervals are the paired ones."""
    if frame.empty:
        return pd.DataFrame(columns=["point", "policy", "sweep", *axes, "n_seeds"])
    metrics = metric_columns(frame, axes)
    rows = []
    for (point, policy), g in frame.groupby(["point", "policy"], sort=True):
        row: dict[str, Any] = {"point": point, "policy": policy, "sweep": g["sweep"].iloc[0]}
        row.update({a: g[a].iloc[0] for a in axes})
        row["n_seeds"] = len(g)
        row["seeds"] = ",".join(str(s) for s in sorted(g["seed"]))
        for m in metrics:
            mean, half, _ = mean_ci(g[m].to_numpy(dtype=float), confidence)
            row[f"{m}_mean"], row[f"{m}_ci"] = mean, half
        rows.append(row)
    return pd.DataFrame(rows)


# Separation of LC from OTF-R in the sensitivity map: LC must fail at least this many times as often.
SEPARATION_FACTOR = 3.0


def separation(lc: tuple[float, float, int], otf: tuple[float, float, int],
               factor: float = SEPARATION_FACTOR) -> str:
    """Whether LC's failure rate stands clear of OTF-R's at one grid point, from (mean, CI half-width, n)
    of each over seeds: "holds" when lc_mean > 0, lc_mean >= factor * otf_mean and the intervals do not
    overlap (lc_mean - lc_ci > otf_mean + otf_ci); "unknown" when the first two hold but a half-width is
    NaN (fewer than 2 seeds); "vanishes" otherwise (a NaN mean included)."""
    (lm, lh, _), (om, oh, _) = lc, otf
    if not (lm > 0 and lm >= factor * om):  # NaN compares false: vanishes
        return "vanishes"
    if math.isnan(lh) or math.isnan(oh):
        return "unknown"
    return "holds" if lm - lh > om + oh else "vanishes"


def grouped_ci(frame: pd.DataFrame, keys: Sequence[str], metric: str, confidence: float = 0.95) -> pd.DataFrame:
    """Per group of ``keys``: mean, ci (half-width) and n of ``metric`` over the group's cells
    (:func:`analysis.run.summary.mean_ci`, NaN values left out). Columns: keys..., mean, ci, n."""
    rows = []
    for key, g in frame.groupby(list(keys), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        mean, half, n = mean_ci(g[metric].to_numpy(dtype=float), confidence)
        rows.append({**dict(zip(keys, key)), "mean": mean, "ci": half, "n": n})
    return pd.DataFrame(rows, columns=[*keys, "mean", "ci", "n"])


def failure_reduction(frame: pd.DataFrame, keys: Sequence[str], policy: str = "FaultAwareOTF-R",
                      baseline: str = "FaultAwareLC", confidence: float = 0.95) -> pd.DataFrame:
    """Failure reduction of ``policy`` against ``baseline``, paired by seed: per (point, seed) with both cells
    and baseline failure rate > 0, reduction = 1 - failure_rate(policy) / failure_rate(baseline); then per
    group of ``keys`` (columns of the cells table, e.g. severity) mean, ci (half-width over those seeds,
    :func:`analysis.run.summary.mean_ci`) and n (seeds used). 1 = the policy removes every failure of the
    baseline, 0 = none, negative = it fails more. Columns: keys..., mean, ci, n."""
    pair = frame.loc[frame["policy"].isin([policy, baseline])]
    idx = ["point", "seed"]
    wide = pair.pivot_table(index=idx, columns="policy", values=M.FAILURE_RATE, aggfunc="first")
    if policy not in wide.columns or baseline not in wide.columns:
        return pd.DataFrame(columns=[*keys, "mean", "ci", "n"])
    base = wide[baseline].to_numpy(dtype=float)
    red = np.where(base > 0, 1.0 - wide[policy].to_numpy(dtype=float) / np.where(base > 0, base, 1.0), math.nan)
    at = pair.drop_duplicates(idx).set_index(idx)[list(keys)]
    per_seed = at.join(pd.Series(red, index=wide.index, name="reduction"), how="inner").reset_index()
    return grouped_ci(per_seed, keys, "reduction", confidence)
