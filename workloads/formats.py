"""Public LLM-serving trace formats, read as they are published (no conversion by hand).

Each format is named by its columns (keys, for JSON Lines); `detect` picks one
from a file's header or first JSON line, and ``arrival.format`` overrides it.

* ``native``: this project's own table, ``arrival_s, prompt_tokens,
  output_tokens`` as CSV, JSON Lines or Parquet (`workloads.trace`).
* ``azure``: the Azure LLM inference traces of Microsoft's AzurePublicDataset
  (github.com/Azure/AzurePublicDataset; ``AzureLLMInferenceDataset2023.md`` and
  ``...2024.md``). CSV with the header ``TIMESTAMP,ContextTokens,GeneratedTokens``.

  - 2023 (Splitwise, ISCA'24): ``data/AzureLLMInferenceTrace_code.csv`` (8,819
    requests) and ``_conv.csv`` (19,366), about an hour each; naive wall-clock
    timestamps with 7 fractional digits (.NET's 100 ns ticks), e.g.
    ``2023-11-16 18:17:03.9799600``.
  - 2024 (DynamoLLM): ``AzureLLMInferenceTrace_code_1week.csv`` and
    ``_conv_1week.csv`` (16.8M and 27.3M requests over a week), UTC timestamps
    with 6 fractional digits and an offset, ``2024-05-10 00:00:00.009930+00:00``,
    and no fraction at all when it is zero, ``2024-05-12 00:00:00+00:00``
    (both shapes are named in the dataset's own analysis notebook).

  Both shapes, any number of fractional digits up to 9, with or without an
  offset, are parsed by pandas' vectorised ISO 8601 parser (offsets are
  converted to UTC; naive times are taken as UTC: only differences matter).
* ``burstgpt``: BurstGPT (github.com/HPMLL/BurstGPT; Wang et al., 2024), Azure
  OpenAI GPT-3.5/GPT-4 service logs, ``data/BurstGPT_1.csv`` etc. CSV with the
  header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
  ``Timestamp`` is seconds from 0:00:00 of the trace's first day. Its README says
  the files without ``_without_fails`` hold failed requests, whose ``Response
  tokens`` is 0: such a row is no request to replay (it asked for nothing that
  can be generated), so it is dropped and counted (``dropped_failed`` in the
  workload summary). Only ``Timestamp``, ``Request tokens`` and ``Response
  tokens`` are read; other columns (``Model``, ``Log Type``, and the ``Session
  ID`` / ``Elapsed time`` the README announces for later releases) are ignored.
* ``mooncake``: the Mooncake traces (github.com/kvcache-ai/Mooncake,
  ``FAST25-release/traces/*.jsonl`` and the older ``mooncake_trace.jsonl``;
  Qin et al., FAST'25). JSON Lines, one object per request:
  ``{"timestamp": 3000, "input_length": 13544, "output_length": 71,
  "hash_ids": [0, 219, ...]}``; ``timestamp`` is integer milliseconds since the
  first request; ``hash_ids`` are the ids of the prompt's 512-token KV blocks
  (equal ids: a shared prefix). They are kept on the `Trace` (not used by the
  simulator or the testbed yet); a row without them is fine.

Every public format comes back with arrival times in seconds from its earliest
request (the first request is at 0). Rows keep file order here; `load_trace`
sorts them. A malformed row raises `WorkloadError` with one line naming the
file, the line (1-based as an editor shows it, the header being line 1 of a CSV)
and the offending value. Reading is vectorised (pandas) for CSV; JSON Lines go
line by line with orjson when it is installed (Mooncake traces are ~10^4 lines).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workloads.spec import TRACE_FORMATS, WorkloadError

try:  # optional: about 5x faster than the standard library on long JSON Lines files
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads


@dataclass(frozen=True)
class Format:
    """A trace format: its name, container, and the source's column names."""

    name: str
    container: str  # "csv", "jsonl", or "any" (native: by file extension)
    time: str
    prompt: str
    output: str

    @property
    def columns(self) -> tuple[str, str, str]:
        return (self.time, self.prompt, self.output)


NATIVE = Format("native", "any", "arrival_s", "prompt_tokens", "output_tokens")
AZURE = Format("azure", "csv", "TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = Format("burstgpt", "csv", "Timestamp", "Request tokens", "Response tokens")
MOONCAKE = Format("mooncake", "jsonl", "timestamp", "input_length", "output_length")

# Detection order: native first, so a file that has the native columns is read as today.
FORMATS: dict[str, Format] = {f.name: f for f in (NATIVE, AZURE, BURSTGPT, MOONCAKE)}
assert tuple(FORMATS) == tuple(f for f in TRACE_FORMATS if f != "auto")


def known_formats() -> str:
    """One line listing every format and its columns, for error messages."""
    return "; ".join(f"{f.name}: {', '.join(f.columns)}" for f in FORMATS.values())


def detect(names, container: str) -> Format:
    """The format a header (or first JSON object's keys) names.

    A format whose columns are all present wins (native first); otherwise the
    one sharing most columns with the header (native on a tie or on none), so
    that a file missing a column is told which one.
    """
    have = {str(n).strip() for n in names}
    candidates = [f for f in FORMATS.values() if f.container in (container, "any")]
    for f in candidates:
        if set(f.columns) <= have:
            return f
    # max() keeps the first of equals: native.
    return max(candidates, key=lambda f: len(set(f.columns) & have))


# --------------------------------------------------------------------------- helpers


def clip(text: Any, n: int = 60) -> str:
    """`text` on one line, at most `n` characters."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    s = s.strip()
    return s if len(s) <= n else s[: n - 3] + "..."


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name where it has none (the one-line
    refusal of a trace; core/util/errors.py says the same for the packages above workloads)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _json_error(exc: BaseException) -> str:
    # json and orjson add the position within the line ("line 1 column 97 (char 96)"),
    # which reads like a line of the file; the message names the file's line instead.
    return re.sub(r":? line \d+ column \d+ \(char \d+\)", "", first_line(exc)).strip() or "bad JSON"


def record_lines(path: Path, n_rows: int, header: bool) -> np.ndarray | None:
    """The 1-based line of each record of a text table, vectorised.

    Blank (whitespace-only) lines are skipped, as pandas skips them. Returns
    None when the count does not match `n_rows` (e.g. a quoted field spanning
    lines), so callers fall back to row numbers rather than name a wrong line.
    """
    buf = np.fromfile(path, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [buf.size]))
    # A line that is not empty and does not start with white space is not blank; the
    # few others (empty, indented, the empty tail after the last newline) are looked at.
    first = buf[np.minimum(starts, max(buf.size - 1, 0))] if buf.size else np.zeros(len(starts), np.uint8)
    doubt = (ends == starts) | np.isin(first, np.array([32, 9, 13, 11, 12], dtype=np.uint8))
    solid = ~doubt
    for i in np.flatnonzero(doubt).tolist():
        solid[i] = bool(buf[starts[i]:ends[i]].tobytes().strip())
    nonblank = np.flatnonzero(solid) + 1
    if header:
        nonblank = nonblank[1:]
    return nonblank.astype(np.int64) if nonblank.size == n_rows else None


@dataclass(frozen=True)
class Rows:
    """Rows of a public trace in file order (see the module docstring)."""

    arrival_s: np.ndarray  # float64, seconds from the earliest request
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    line: np.ndarray | None  # int64, 1-based line of each row in the file (None: unknown)
    row: np.ndarray  # int64, 0-based index of each row among the file's data rows
    hash_ids: np.ndarray | None = None  # object array of lists (Mooncake)
    dropped: dict[str, int] = field(default_factory=dict)


class _Checker:
    """Vectorised checks of one file's columns, with errors that name the line."""

    def __init__(self, path: Path, line: np.ndarray | None):
        self.path, self.line = path, line

    def where(self, i: int) -> str:
        return f"line {int(self.line[i])}" if self.line is not None else f"data row {i + 1}"

    def fail(self, i: int, what: str) -> None:
        raise WorkloadError(f"trace {self.path}, {self.where(i)}: {what}")

    def numbers(self, raw: pd.Series, col: str) -> np.ndarray:
        if pd.api.types.is_bool_dtype(raw):
            self.fail(0, f"{col} holds booleans, expected numbers")
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            v = raw.iloc[i]
            self.fail(i, f"{col} is missing" if _missing(v) else f"{col} is not a number: {clip(v)!r}")
        return values

    def tokens(self, raw: pd.Series, col: str, allow_zero: bool = False) -> np.ndarray:
        v = self.numbers(raw, col)
        self.bad(v, v != np.floor(v), col, "must be an integer")
        self.bad(v, v < (0 if allow_zero else 1), col, "must be >= 0" if allow_zero else "must be >= 1")
        return v.astype(np.int64)

    def bad(self, v: np.ndarray, mask: np.ndarray, col: str, problem: str) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            self.fail(i, f"{col} {problem}, got {v[i]:g}")


def _missing(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v)) or (isinstance(v, str) and not v.strip())
    except (TypeError, ValueError):
        return False


def _rebase(arrival_s: np.ndarray) -> np.ndarray:
    return arrival_s - arrival_s.min() if arrival_s.size else arrival_s


# --------------------------------------------------------------------------- CSV formats


def csv_header(path: Path) -> list[str]:
    """A CSV file's column names (raises pandas' EmptyDataError on an empty file)."""
    return [str(c) for c in pd.read_csv(path, nrows=0).columns]


def _header_line(path: Path) -> int:
    """The line of a CSV's header: its first non-blank line."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                return lineno
    return 1


def _read_csv(path: Path, fmt: Format) -> tuple[pd.DataFrame, _Checker]:
    try:
        names = csv_header(path)
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"trace {path}: file is empty") from None
    except Exception as exc:
        raise WorkloadError(f"trace {path}: cannot read as csv: {first_line(exc)}") from None
    stripped = [c.strip() for c in names]
    missing = [c for c in fmt.columns if c not in stripped]
    if missing:
        raise WorkloadError(
            f"trace {path}, line {_header_line(path)}: missing column(s) {', '.join(missing)} for format {fmt.name} "
            f"(has: {clip(', '.join(names) or 'none', 200)})"
        )
    use = [names[stripped.index(c)] for c in fmt.columns]
    # Timestamps as text (parsed below); token columns inferred (int64 when clean).
    dtype = {use[0]: str} if fmt is AZURE else None
    # usecols only when there are other columns: without it pandas refuses a row with
    # too many fields (naming its line), with it such a row's extra fields are ignored.
    usecols = use if len(names) > len(use) else None
    try:
        df = pd.read_csv(path, usecols=usecols, dtype=dtype)
    except Exception as exc:  # a row with too many fields, a bad quote...
        raise WorkloadError(f"trace {path}: cannot read as csv: {first_line(exc)}") from None
    df.columns = [c.strip() for c in df.columns]
    if len(df) == 0:
        raise WorkloadError(f"trace {path}: no rows")
    return df, _Checker(path, record_lines(path, len(df), header=True))


def read_azure(path: Path) -> Rows:
    df, check = _read_csv(path, AZURE)
    raw = df[AZURE.time]
    ts = pd.to_datetime(raw, format="ISO8601", utc=True, errors="coerce")
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        v = raw.iloc[i]
        check.fail(i, f"{AZURE.time} is missing" if _missing(v) else f"{AZURE.time} is not a timestamp: {clip(v)!r}")
    # total_seconds works whatever unit pandas picked (ns for 7 digits, us for 6).
    arrival = (ts - ts.min()).dt.total_seconds().to_numpy(dtype=np.float64)
    return Rows(
        arrival,
        check.tokens(df[AZURE.prompt], AZURE.prompt),
        check.tokens(df[AZURE.output], AZURE.output),
        check.line,
        np.arange(len(df), dtype=np.int64),
    )


def read_burstgpt(path: Path) -> Rows:
    df, check = _read_csv(path, BURSTGPT)
    t = check.numbers(df[BURSTGPT.time], BURSTGPT.time)
    check.bad(t, t < 0, BURSTGPT.time, "must be >= 0")
    prompt = check.tokens(df[BURSTGPT.prompt], BURSTGPT.prompt)
    output = check.tokens(df[BURSTGPT.output], BURSTGPT.output, allow_zero=True)
    failed = output == 0  # a failed request in the original log (BurstGPT README)
    n_failed = int(failed.sum())
    line, row = check.line, np.arange(len(df), dtype=np.int64)
    if n_failed:
        keep = ~failed
        if not keep.any():
            raise WorkloadError(f"trace {path}: all {n_failed} rows are failed requests (Response tokens 0)")
        t, prompt, output, row = t[keep], prompt[keep], output[keep], row[keep]
        line = line[keep] if line is not None else None
    return Rows(_rebase(t), prompt, output, line, row, dropped={"failed": n_failed} if n_failed else {})


# --------------------------------------------------------------------------- JSON Lines


def first_json_object(path: Path) -> tuple[int, Any] | None:
    """(line, parsed value) of the first non-blank line, or None if there is none.

    Raises WorkloadError naming the line when it is not valid JSON."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    return lineno, _loads(raw)
                except Exception as exc:
                    raise WorkloadError(
                        f"trace {path}, line {lineno}: cannot read as jsonl: not valid JSON "
                        f"({_json_error(exc)}): {clip(raw)!r}"
                    ) from None
    return None


def read_mooncake(path: Path) -> Rows:
    fmt = MOONCAKE
    times: list[Any] = []
    prompts: list[Any] = []
    outputs: list[Any] = []
    hashes: list[Any] = []
    lines: list[int] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = _loads(raw)
            except Exception as exc:
                raise WorkloadError(
                    f"trace {path}, line {lineno}: cannot read as jsonl: not valid JSON "
                    f"({_json_error(exc)}): {clip(raw)!r}"
                ) from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"trace {path}, line {lineno}: expected a JSON object, got {clip(raw)!r}")
            try:
                vals = (obj[fmt.time], obj[fmt.prompt], obj[fmt.output])
            except KeyError as k:
                raise WorkloadError(
                    f"trace {path}, line {lineno}: missing key {k.args[0]!r} for format mooncake "
                    f"(has: {clip(', '.join(map(str, obj)) or 'none', 200)})"
                ) from None
            for key, v in zip(fmt.columns, vals):
                # JSON numbers only: a string or a boolean is malformed, not something to coerce.
                if type(v) is not int and type(v) is not float:
                    raise WorkloadError(f"trace {path}, line {lineno}: {key} is not a number: {clip(json.dumps(v))}")
            times.append(vals[0])
            prompts.append(vals[1])
            outputs.append(vals[2])
            h = obj.get("hash_ids")
            hashes.append(h if isinstance(h, list) else None)
            lines.append(lineno)
    if not times:
        raise WorkloadError(f"trace {path}: no rows")
    check = _Checker(path, np.asarray(lines, dtype=np.int64))
    t = np.asarray(times, dtype=np.float64)
    bad = ~np.isfinite(t)  # orjson/json may yield inf for 1e999
    check.bad(t, bad | (t < 0), fmt.time, "must be a finite number >= 0 (milliseconds)")
    prompt = check.tokens(pd.Series(prompts, dtype=object), fmt.prompt)
    output = check.tokens(pd.Series(outputs, dtype=object), fmt.output)
    hash_ids = np.empty(len(hashes), dtype=object)
    hash_ids[:] = hashes
    has_hashes = any(h is not None for h in hashes)
    return Rows(
        _rebase(t) / 1000.0, prompt, output, check.line, np.arange(len(t), dtype=np.int64),
        hash_ids if has_hashes else None,
    )


READERS = {"azure": read_azure, "burstgpt": read_burstgpt, "mooncake": read_mooncake}
