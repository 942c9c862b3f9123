"""Rules and names the two worlds and the analysis share, defined once: the router's limits
(core/limits.py) and the metric names (analysis/run/names.py), which the report checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.run.names import RUN_IDENTITY, Metric, check_metric, fail_share, gap, latency
from analysis.run.report import KEY_METRICS, check_columns
from core.limits import first_token_limit, give_up_s, spec_first_token_limit
from core.spec.model import parse_spec
from core.stages import FAILURE_STAGES

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def test_the_first_token_limit_is_the_ttft_timeout_never_later_than_the_deadline():
    assert first_token_limit(20.0, 5.0) == 5.0
    assert first_token_limit(20.0, 60.0) == 20.0
    assert first_token_limit(20.0, None) == 20.0
    assert spec_first_token_limit({"deadline_s": 10, "ttft_timeout_s": 4}) == 4.0
    assert spec_first_token_limit({"deadline_s": 10}) == 10.0


def test_a_request_is_given_up_at_its_first_token_limit_without_a_first_token_else_at_its_deadline():
    ends = give_up_s([1.0, 2.0, 3.0], [False, True, False], 4.0, 10.0)
    np.testing.assert_array_equal(ends, [5.0, 12.0, 7.0])


def test_the_spec_the_simulator_and_the_router_take_the_limit_from_one_place(faulted_spec):
    from simulator import cluster
    from testbed.router import flow

    spec = parse_spec({**faulted_spec, "deadline_s": 12.0, "ttft_timeout_s": 30.0})
    assert spec.first_token_limit_s == 12.0
    assert cluster.first_token_limit is first_token_limit and flow.first_token_limit is first_token_limit


def test_every_metric_a_run_writes_is_a_known_name_and_every_known_run_metric_is_written(tmp_path, faulted_spec):
    from analysis.run.scalars import run_metrics
    from simulator.run import run_sim

    run = run_sim(parse_spec(faulted_spec), "OTF-R", 0, tmp_path)
    keys = set(run_metrics(run)) - set(RUN_IDENTITY)
    assert all(check_metric(k) == k for k in keys)
    added_elsewhere = {Metric.NEEDLESS_DEFLECTION_RATIO, Metric.NOISE_FLOOR, Metric.CLEAN_SHARE,
                       Metric.CLEAN_FAILURE_SHARE}  # per study cell / per compared run
    assert set(Metric) - added_elsewhere <= keys
    assert {fail_share(s) for s in FAILURE_STAGES} <= keys and latency("ttft", 50) in keys


@pytest.mark.parametrize("name", ["ttft_median_s", "failure_ratio", "gap_failure_ratio", "fail_share_nowhere",
                                  "latency_p50_s"])
def test_an_unknown_metric_name_is_refused_in_one_line(name):
    with pytest.raises(ValueError, match=f"unknown metric '{name}'"):
        check_metric(name)


def test_the_report_fails_loudly_on_a_metric_its_summary_lacks():
    cols = {f"{m}_{s}": [0.0] for m, _ in KEY_METRICS for s in ("mean", "ci") if not m.startswith("gap_")}
    check_columns(pd.DataFrame(cols), [m for m, _ in KEY_METRICS])  # the gap needs OracleAvoidance: may be absent
    renamed = pd.DataFrame({k.replace("failure_rate_", "failure_ratio_"): v for k, v in cols.items()})
    with pytest.raises(ValueError, match="metric 'failure_rate' is not in the runs' summary"):
        check_columns(renamed, [m for m, _ in KEY_METRICS])
    with pytest.raises(ValueError, match="unknown metric"):
        check_columns(pd.DataFrame(cols), ["failure_ratio"])
    assert gap(Metric.FAILURE_RATE) == "gap_failure_rate"
