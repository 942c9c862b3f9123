"""Trace files for `arrival: {kind: trace}`.

A trace is a table with the columns ``arrival_s`` (seconds since run start,
>= 0), ``prompt_tokens`` and ``output_tokens`` (integers >= 1), stored as
CSV (``.csv``), JSON Lines (``.jsonl`` / ``.ndjson``) or Parquet
(``.parquet`` / ``.pq``). Other columns are ignored. Rows need not be sorted:
`load_trace` sorts them by arrival time (stably, so ties keep file order).

Anything wrong with the file raises `WorkloadError` with a one-line message
naming the file and the problem; a bad value also names its data row
(1-based, the header not counted) and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.spec import WorkloadError

COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True)
class Trace:
    """A validated trace, sorted by arrival time."""

    arrival_s: np.ndarray  # float64, ascending
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _read(path: Path, fmt: str) -> pd.DataFrame:
    try:
        if fmt == "csv":
            return pd.read_csv(path)
        if fmt == "jsonl":
            return pd.read_json(path, lines=True)
        import pyarrow.parquet as pq

        # Check the schema first so a missing column gets our message, and read
        # only the needed columns (traces can be large).
        names = pq.read_schema(path).names
        _check_columns(path, names)
        return pd.read_parquet(path, columns=list(COLUMNS))
    except WorkloadError:
        raise
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"trace {path}: file is empty") from None
    except Exception as exc:  # parser errors differ per format and library
        raise WorkloadError(f"trace {path}: cannot read as {fmt}: {_one_line(exc)}") from None


def _check_columns(path: Path, names) -> None:
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        has = ", ".join(map(str, names)) or "none"
        raise WorkloadError(
            f"trace {path}: missing column(s) {', '.join(missing)} (has: {has})"
        )


def _numeric(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    raw = df[col]
    # Booleans would silently become 0/1; a trace never means that.
    if pd.api.types.is_bool_dtype(raw):
        raise WorkloadError(f"trace {path}: column {col} holds booleans, expected numbers")
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        v = raw.iloc[i]
        what = "missing value" if pd.isna(v) else f"non-numeric value {v!r}"
        raise WorkloadError(f"trace {path}: {what} in column {col} at data row {i + 1}")
    return values


def _first_bad(path: Path, col: str, values: np.ndarray, mask: np.ndarray, problem: str) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        raise WorkloadError(
            f"trace {path}: {col} {problem}, got {values[i]:g} at data row {i + 1}"
        )


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; rows come back sorted by arrival_s."""
    p = Path(path)
    fmt = _FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise WorkloadError(
            f"trace {p}: unknown extension {p.suffix or '(none)'!r}; "
            f"expected one of {', '.join(_FORMATS)}"
        )
    if not p.is_file():
        raise WorkloadError(f"trace {p}: file not found")
    df = _read(p, fmt)
    _check_columns(p, list(df.columns))
    if len(df) == 0:
        raise WorkloadError(f"trace {p}: no rows")

    arrival = _numeric(p, df, "arrival_s")
    _first_bad(p, "arrival_s", arrival, arrival < 0, "must be >= 0")
    tokens = {}
    for col in ("prompt_tokens", "output_tokens"):
        v = _numeric(p, df, col)
        _first_bad(p, col, v, v != np.floor(v), "must be an integer")
        _first_bad(p, col, v, v < 1, "must be >= 1")
        tokens[col] = v.astype(np.int64)

    order = np.argsort(arrival, kind="stable")
    return Trace(
        arrival_s=np.ascontiguousarray(arrival[order]),
        prompt_tokens=np.ascontiguousarray(tokens["prompt_tokens"][order]),
        output_tokens=np.ascontiguousarray(tokens["output_tokens"][order]),
    )
