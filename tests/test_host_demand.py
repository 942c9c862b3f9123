"""Demand by state measured in a run (analysis/checks/host_demand.py), on a hand-built run whose engines'
CPU and states are set by hand, so each state's demand is known."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from analysis.checks.calibration import POOLED
from analysis.checks.host_demand import CSV_NAME, demand_ratios, host_demand_check, print_host_demand, write_host_demand
from analysis.run.data import load_run
from core.records import HostRecord, RequestRecord, RunWriter

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

SPEC = {"deadline_s": 30.0, "engine": {"host_engine_cores": 1.0}}
# Cores each engine gets over 0-10 s, and the machine's busy cores: worker 0 computes a 10 s
# prefill (the reference), worker 1 holds KV worker 2 pulls for 10 s, worker 3 decodes.
CPU = {0: 0.25, 1: 0.75, 2: 0.5, 3: 0.3}
BUSY = 2.0
ROLE = {0: "prefill", 1: "prefill", 2: "decode", 3: "decode"}
# what each state demands against the computing engine: its cores / 0.25; the background is the
# machine's busy cores beyond the engines' (2.0 - 1.8 = 0.2) / 0.25
EXPECTED = {"hold": 3.0, "pull": 2.0, "decode": 1.2, "background": 0.8}


def _req(rid: int, pw: int, dw: int, p0: float, p1: float, k1: float, end: float) -> RequestRecord:
    return RequestRecord(rid, p0, 500, 20, prefill_worker=pw, decode_worker=dw, prefill_pod=pw, decode_pod=dw,
                         routed_s=p0, prefill_start_s=p0, prefill_end_s=p1, kv_start_s=p1, kv_end_s=k1,
                         first_token_s=k1, end_s=end, outcome="ok", failed_stage=None, kv_bytes=1_000_000)


def write_run(d: Path, policy: str = "LC", cpu: dict[int, float] = CPU) -> Path:
    reqs = [
        _req(0, 0, 3, 0.0, 10.0, 10.01, 10.5),  # A: worker 0 prefills all along
        _req(1, 1, 2, 0.0, 0.1, 10.0, 10.2),  # B: prefilled on 1, its pull to 2 hangs to 10 s
        _req(2, 1, 3, 0.0, 0.05, 0.1, 10.5),  # C: from 1 to 3, decoding from 0.1 s to 10.5 s
    ]
    # the first interval [0, 0.5] is mixed for workers 1-3 (B and C prefill and pull in it): not counted
    host = [HostRecord(float(t), w, w, ROLE[w], cpu_s=cpu[w] * t, wait_s=0.0, pressure_s=0.0, busy_s=BUSY * t,
                       steal_s=0.0) for w in ROLE for t in np.arange(0.0, 10.01, 0.5)]
    w = RunWriter(d, {"world": "testbed", "scenario": "link", "policy": policy, "seed": 0, "spec": SPEC},
                  flush_s=1e9)
    for rec in [*reqs, *host]:
        w.write(rec)
    w.close()
    return d


def test_each_state_is_rated_against_the_computing_engine_beside_it(tmp_path):
    r = demand_ratios(load_run(write_run(tmp_path / "run")))
    got = r.groupby("state")["ratio"].agg(["median", "size"])
    assert set(got.index) == set(EXPECTED)
    for state, ratio in EXPECTED.items():
        assert got.loc[state, "median"] == pytest.approx(ratio)
    # 20 reference intervals; in the first, workers 1-3 were doing several things: only the
    # background (every engine seen) counts there
    assert got.loc["background", "size"] == 20 and got.loc["hold", "size"] == got.loc["pull", "size"] == 19


def test_the_calibration_is_held_against_the_run_and_a_miss_beyond_15_percent_is_flagged(tmp_path):
    write_run(tmp_path / "runs" / "a", "LC")
    write_run(tmp_path / "runs" / "b", "OTF-R", {**CPU, 1: 0.5})  # here holding gets 2x, not 3x
    table = host_demand_check([tmp_path / "runs"], {"hold": 2.75, "pull": 1.5, "decode": 1.2})
    pooled = table[table["policy"] == POOLED].set_index("state")
    # pooled: hold's ratios are half 3.0 and half 2.0; the median lies between (numpy's: 2.5)
    assert pooled.loc["hold", "run_cores"] == pytest.approx(2.5)
    assert pooled.loc["hold", "residual"] == pytest.approx(0.1) and not pooled.loc["hold", "flag"]
    assert pooled.loc["pull", "residual"] == pytest.approx(-0.25) and pooled.loc["pull", "flag"]
    assert pooled.loc["decode", "residual"] == pytest.approx(0.0) and not pooled.loc["decode", "flag"]
    # not calibrated: shown, not judged
    assert pd.isna(pooled.loc["background", "calibration_cores"]) and not pooled.loc["background", "flag"]
    per_run = table[table["policy"] == "OTF-R"].set_index("state")
    assert per_run.loc["hold", "run_cores"] == pytest.approx(2.0) and per_run.loc["hold", "flag"]  # 2.75 vs 2: +38%
    path = write_host_demand(table, tmp_path / "out")
    assert path.name == CSV_NAME and len(pd.read_csv(path)) == len(table)
    buf = io.StringIO()
    print_host_demand(table, Console(file=buf, width=160))
    text = buf.getvalue()
    assert "MISS" in text and "hold" in text and "+10%" in text


def test_a_run_without_host_samples_measures_nothing(tmp_path):
    d = tmp_path / "run"
    w = RunWriter(d, {"world": "testbed", "scenario": "link", "policy": "LC", "seed": 0, "spec": SPEC}, flush_s=1e9)
    w.write(_req(0, 0, 2, 0.0, 1.0, 1.1, 2.0))
    w.close()
    assert demand_ratios(load_run(d)).empty
    table = host_demand_check([d], {"hold": 2.0})
    assert (table["n"] == 0).all() and not table["flag"].any()
    # and the console says so, rather than printing zeros alone
    buf = io.StringIO()
    print_host_demand(table, Console(file=buf, width=400))
    assert "not checked: no interval of the run measures hold, pull, decode, background" in buf.getvalue()
