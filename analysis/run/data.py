"""One run directory read into memory: run.json and the record tables the metrics need.

Only :func:`load_run` touches the file system; a bad run.json raises a one-line ValueError.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from core.spec.metrics import MetricsSpec, parse_metrics_spec
from core.records import SCHEMAS, read_meta, read_table
from vocab import Outcome

# Tables the metrics read; health labels are not needed for any metric.
RUN_TABLES = ("requests", "decisions", "faults", "prices")


REQUIRED_META = ("world", "scenario", "policy", "seed")


@dataclass(frozen=True)
class RunData:
    """One run directory read into memory (the tables the metrics need)."""

    path: Path
    meta: dict[str, Any]
    spec: MetricsSpec
    requests: pd.DataFrame
    decisions: pd.DataFrame
    faults: pd.DataFrame
    prices: pd.DataFrame
    dead_pulls: pd.DataFrame  # empty for a run directory written before the table existed
    breaker: pd.DataFrame  # likewise
    attempts: pd.DataFrame  # likewise
    engines: pd.DataFrame  # likewise
    host: pd.DataFrame  # likewise; testbed only (empty in the simulator's runs)

    @property
    def scenario(self) -> str:
        return str(self.meta["scenario"])

    @property
    def policy(self) -> str:
        return str(self.meta["policy"])

    @property
    def world(self) -> str:
        return str(self.meta["world"])

    @property
    def seed(self) -> int:
        return int(self.meta["seed"])

    @functools.cached_property
    def host_marks(self) -> pd.DataFrame:
        """Each request's host-stall account and mark (analysis/run/host_stall.py), computed once for the
        metrics and the report; no columns without host samples (the simulator's runs)."""
        if self.host.empty:
            return pd.DataFrame(index=self.requests.index)
        from analysis.run.host_stall import run_host_marks

        return run_host_marks(self.requests, self.host, self.meta, self.faults)


def load_run(run_dir: Path | str) -> RunData:
    """Read run.json and the tables of one run directory; a bad run.json raises a one-line ValueError."""
    path = Path(run_dir)
    meta = read_meta(path)
    where = path / "run.json"
    for k in REQUIRED_META:
        if k not in meta:
            raise ValueError(f"{where}: missing key {k!r}")
    if isinstance(meta["seed"], bool) or not isinstance(meta["seed"], int):
        raise ValueError(f"{where}: seed must be an integer, got {meta['seed']!r}")
    spec_raw = meta.get("spec") or {}
    if not isinstance(spec_raw, dict):
        raise ValueError(f"{where}: spec must be a mapping, got {type(spec_raw).__name__}")
    spec = parse_metrics_spec(spec_raw.get("metrics"), f"{where}: spec")
    tables = {t: read_table(path, t) for t in RUN_TABLES}
    for t in ("dead_pulls", "breaker", "attempts", "engines", "host"):  # tables younger than some run directories
        tables[t] = read_table(path, t) if (path / f"{t}.parquet").exists() else SCHEMAS[t].empty_table().to_pandas()
    req = tables["requests"]
    if req["attempts"].isna().any():  # written before retries: one attempt each, none if rejected
        req["attempts"] = req["attempts"].fillna(req["outcome"].ne(Outcome.REJECTED).astype(int)).astype("int64")
    return RunData(path=path, meta=meta, spec=spec, **tables)
