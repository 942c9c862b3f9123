"""The testbed's host inside and outside the fault window (analysis/checks/host_window.py), on hand-built
host samples whose rates are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.checks.host_window import run_host_window

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def _counter(t: np.ndarray, rate_out: float, rate_in: float, onset: float, end: float) -> np.ndarray:
    """A cumulative counter rising at rate_in inside [onset, end) and rate_out elsewhere."""
    rate = np.where((t[:-1] >= onset) & (t[:-1] < end), rate_in, rate_out)
    return np.concatenate([[100.0], 100.0 + np.cumsum(rate * np.diff(t))])


def _host(onset: float = 4.0, end: float = 8.0) -> pd.DataFrame:
    t = np.arange(0.0, 12.01, 0.5)
    busy = _counter(t, 0.3, 1.0, onset, end)  # the machine's, in every engine's samples
    rows = []
    for worker, pod, cpu in ((0, 0, _counter(t, 0.1, 0.3, onset, end)), (1, 1, _counter(t, 0.05, 0.05, onset, end))):
        rows += [{"time_s": x, "worker": worker, "pod": pod, "role": "prefill", "cpu_s": c, "busy_s": b}
                 for x, c, b in zip(t, cpu, busy)]
    return pd.DataFrame(rows)


def test_the_window_splits_the_machine_and_the_engines_cores():
    rows = {r["window"]: r for r in run_host_window(_host(), 4.0, 8.0, degraded_pods=[0])}
    inside, outside = rows["inside"], rows["outside"]
    assert inside["intervals"] == 8 and outside["intervals"] == 16  # [4, 8) and [0, 4) + [8, 12] in 0.5 s
    assert inside["busy_cores"] == pytest.approx(1.0) and outside["busy_cores"] == pytest.approx(0.3)
    assert (inside["engine_cores"], inside["degraded_pod_cores"], inside["other_pod_cores"]) == \
        pytest.approx((0.35, 0.3, 0.05))
    assert (outside["engine_cores"], outside["degraded_pod_cores"]) == pytest.approx((0.15, 0.1))


def test_an_interval_across_the_windows_edge_counts_in_neither():
    # the fault from 4.25 s: the interval [4.0, 4.5] straddles the onset and is left out
    rows = {r["window"]: r for r in run_host_window(_host(onset=4.25, end=8.25), 4.25, 8.25, degraded_pods=[0])}
    assert rows["inside"]["intervals"] == 7 and rows["outside"]["intervals"] == 15
