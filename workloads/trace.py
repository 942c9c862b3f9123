"""Trace files for `arrival: {kind: trace}`.

The native trace is a table with the columns ``arrival_s`` (seconds since run
start, >= 0), ``prompt_tokens`` and ``output_tokens`` (integers >= 1), stored as
CSV (``.csv``), JSON Lines (``.jsonl`` / ``.ndjson``) or Parquet
(``.parquet`` / ``.pq``). Other columns are ignored.

Public traces are read as published (`workloads.formats`): the Azure LLM
inference traces (CSV), BurstGPT (CSV) and Mooncake (JSON Lines). With
``format="auto"`` the format is detected from a CSV's header or a JSON Lines
file's first object: the one whose columns are all present (native first).

Rows need not be sorted: `load_trace` sorts them by arrival time (stably, so
ties keep file order). Anything wrong with the file raises `WorkloadError`
with a one-line message naming the file and the problem. A bad value in a
native file names its data row (1-based, the header not counted) and the
value; in a public format, its line (1-based as an editor shows it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from workloads import formats
from workloads.formats import FORMATS, NATIVE, Format, Rows, first_line, known_formats, record_lines
from workloads.spec import TRACE_FORMATS, WorkloadError

COLUMNS = NATIVE.columns
_FORMATS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True)
class Trace:
    """A validated trace, sorted by arrival time.

    `line` / `row` say where each row came from in the file (for messages:
    `where`); `hash_ids` holds Mooncake's prefix-block ids (object array of
    lists, None for other formats); `dropped` counts rows left out while
    reading (BurstGPT's failed requests: ``{"failed": n}``).
    """

    arrival_s: np.ndarray  # float64, ascending
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    line: np.ndarray | None = None  # int64, 1-based line in the file; None for Parquet
    row: np.ndarray | None = None  # int64, 0-based data row in the file
    hash_ids: np.ndarray | None = None
    format: str = "native"
    path: str = ""
    dropped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def columns(self) -> tuple[str, str, str]:
        """The source's names for the arrival time, prompt and output columns."""
        return FORMATS[self.format].columns

    def where(self, i: int) -> str:
        """Where row i (in arrival order) is in the file: 'line N' or 'data row N'."""
        if self.line is not None:
            return f"line {int(self.line[i])}"
        return f"data row {int(self.row[i]) + 1}" if self.row is not None else f"row {i + 1}"


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
        raise WorkloadError(f"trace {path}: cannot read as {fmt}: {first_line(exc)}") from None


def _check_columns(path: Path, names, hint: bool = False) -> None:
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        has = formats.clip(", ".join(map(str, names)) or "none", 200)
        tail = ""
        if not any(c in names for c in COLUMNS):
            # Nothing native in the file: name the public format it has the columns of,
            # or (when detection found none) list the formats that are read.
            stripped = {str(n).strip() for n in names}
            public = [f.name for f in FORMATS.values() if f is not NATIVE and set(f.columns) <= stripped]
            if public:
                tail = f"; these are the columns of format {public[0]} (arrival.format: {public[0]} or auto)"
            elif hint:
                tail = f"; known formats: {known_formats()} (set arrival.format to choose)"
        raise WorkloadError(
            f"trace {path}: missing column(s) {', '.join(missing)} (has: {has}){tail}"
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


def _native(p: Path, container: str, hint: bool) -> Rows:
    df = _read(p, container)
    _check_columns(p, list(df.columns), hint)
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
    line = None if container == "parquet" else record_lines(p, len(df), header=container == "csv")
    return Rows(arrival, tokens["prompt_tokens"], tokens["output_tokens"], line, np.arange(len(df), dtype=np.int64))


def _detect(p: Path, container: str) -> Format:
    if container == "csv":
        try:
            names = formats.csv_header(p)
        except pd.errors.EmptyDataError:
            raise WorkloadError(f"trace {p}: file is empty") from None
        except Exception as exc:
            raise WorkloadError(f"trace {p}: cannot read as csv: {first_line(exc)}") from None
        return formats.detect(names, "csv")
    if container == "jsonl":
        first = formats.first_json_object(p)
        if first is None or not isinstance(first[1], dict):
            return NATIVE  # empty, or not objects: the native reader says what is wrong
        return formats.detect(first[1].keys(), "jsonl")
    return NATIVE  # Parquet: the native format only


def load_trace(path: str | Path, format: str = "auto") -> Trace:
    """Read and validate a trace file; rows come back sorted by arrival time.

    `format`: ``auto`` (detect from the columns), ``native``, ``azure``,
    ``burstgpt`` or ``mooncake``. A public format reads the file as its
    container (CSV or JSON Lines) whatever the extension; ``auto`` and
    ``native`` go by the extension.
    """
    p = Path(path)
    if format not in TRACE_FORMATS:
        raise WorkloadError(f"trace {p}: unknown format {format!r}; known: {', '.join(TRACE_FORMATS)}")
    if p.is_dir():
        raise WorkloadError(f"trace {p}: a directory, not a file")
    public = FORMATS.get(format) if format not in ("auto", "native") else None
    if public is not None:
        container = public.container
    else:
        container = _FORMATS.get(p.suffix.lower())
        if container is None:
            raise WorkloadError(
                f"trace {p}: unknown extension {p.suffix or '(none)'!r}; "
                f"expected one of {', '.join(_FORMATS)} (or name a public format: arrival.format)"
            )
    if not p.is_file():
        raise WorkloadError(f"trace {p}: file not found")

    fmt = public or (NATIVE if format == "native" else _detect(p, container))
    if fmt is NATIVE:
        # The hint lists the public formats when nothing in the file looked native.
        rows = _native(p, container, hint=format == "auto")
    else:
        rows = formats.READERS[fmt.name](p)

    order = np.argsort(rows.arrival_s, kind="stable")
    take = lambda a: None if a is None else np.ascontiguousarray(a[order])  # noqa: E731
    return Trace(
        arrival_s=take(rows.arrival_s),
        prompt_tokens=take(rows.prompt_tokens),
        output_tokens=take(rows.output_tokens),
        line=take(rows.line),
        row=take(rows.row),
        hash_ids=take(rows.hash_ids),
        format=fmt.name,
        path=str(p),
        dropped=dict(rows.dropped),
    )
