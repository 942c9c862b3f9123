"""A compute fault's effect read from the requests (analysis/run/compute_effect.py), in the simulator,
where the engine's slow-down is the fault's factor by construction, and in `testbed report`."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.run.compute_effect import run_compute_effect
from analysis.run.data import load_run
from builders import parse, shipped_spec_dict
from simulator.run import run_sim

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def _spec(faults: list[dict]):
    # the embedded testbed scenario (4 pods, one engine each; pods 0-1 prefill), longer prompts
    return parse(shipped_spec_dict("testbed.yaml", faults=faults, policies=["Random"],
                                   workload={"arrival": {"kind": "poisson", "rate_rps": 2.0}, "duration_s": 40,
                                             "prompt": {"kind": "uniform", "low": 1500, "high": 1900},
                                             "output": {"kind": "fixed", "value": 4}}))


def test_the_simulators_engine_slows_by_the_faults_factor_and_the_table_says_so(tmp_path):
    spec = _spec([{"kind": "compute", "pods": [1], "slowdown": 3.0, "start_s": 10.0, "duration_s": 20.0}])
    run = load_run(run_sim(spec, "Random", 0, tmp_path))
    t = run_compute_effect(run)
    assert len(t) == 1, t
    r = t.iloc[0]
    assert (r.pod, r.asked, r.start_s, r.end_s, r.baseline) == (1, 3.0, 10.0, 30.0, "outside")
    assert r.n_inside >= 5 and r.n_baseline >= 5, r
    assert math.isnan(r.measured)  # no agent in the simulator
    # the simulator slows the whole prefill, its overhead too (simulator/cluster.py): the factor itself
    assert 2.5 < r.engine_slowdown < 3.5, r


def test_a_fault_over_the_whole_run_is_judged_against_the_other_pods_and_a_run_without_is_empty(tmp_path):
    spec = _spec([{"kind": "compute", "pods": [0], "slowdown": 2.0, "start_s": 0.0, "duration_s": 60.0}])
    r = run_compute_effect(load_run(run_sim(spec, "Random", 0, tmp_path / "a"))).iloc[0]
    assert r.baseline == "others" and r.n_baseline >= 5 and 1.6 < r.engine_slowdown < 2.4, r
    assert run_compute_effect(load_run(run_sim(_spec([]), "Random", 0, tmp_path / "b"))).empty


def test_report_writes_and_prints_the_table(tmp_path):
    from analysis.run.report import report
    from rich.console import Console

    spec = _spec([{"kind": "compute", "pods": [1], "slowdown": 3.0, "start_s": 10.0, "duration_s": 20.0}])
    d = run_sim(spec, "Random", 0, tmp_path / "runs")
    console = Console(record=True, width=200)
    report([d], tmp_path / "report", console)
    csv = pd.read_csv(tmp_path / "report" / "compute_effect.csv")
    assert list(csv.pod) == [1] and csv.engine_slowdown.between(2.5, 3.5).all()
    assert "Compute faults as the engines felt them" in console.export_text()
