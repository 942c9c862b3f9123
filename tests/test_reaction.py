"""reaction_s on hand-built request tables: the time from the fault's onset to the first k routing
decisions that send at most half the degraded pods' pre-fault share there."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.run.metrics import REACTION_FRACTION, REACTION_K, FaultWindow, degraded_pod_shares, reaction_s
from analysis.run.data import load_run
from analysis.run.scalars import run_metrics
from core.records import RequestRecord
from test_analysis import link_fault, write_run

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

BAD = 3  # the degraded pod
ONSET, END = 20.0, 40.0
WINDOW = FaultWindow(ONSET, END, True, (BAD,))
PRE = [True, False, True, False, False] * 2  # before onset 4 of 10 touch the bad pod: s_pre = 0.4


def table(pre: list[bool], during: list[bool], after: list[bool] = (), gap_s: float = 0.5) -> pd.DataFrame:
    """Requests routed 1 s apart before onset, ``gap_s`` apart from onset + gap_s on, and 1 s apart from
    the window's end on; True touches the bad pod (as prefill pod, or as decode pod on odd rows, so
    both count), False goes to pods 0 and 1."""
    times = ([float(i) for i in range(len(pre))] + [ONSET + gap_s * (i + 1) for i in range(len(during))]
             + [END + i for i in range(len(after))])
    touch = [*pre, *during, *after]
    pp = [BAD if t and i % 2 == 0 else 0 for i, t in enumerate(touch)]
    dp = [BAD if t and i % 2 == 1 else 1 for i, t in enumerate(touch)]
    return pd.DataFrame({"arrival_s": np.asarray(times) - 0.01, "routed_s": times, "prefill_pod": pp,
                         "decode_pod": dp})


def at(i: int, gap_s: float = 0.5) -> float:
    """The reaction time if the i-th request in the window (from 0) starts the k requests."""
    return gap_s * (i + 1)


def test_the_table_has_the_pre_fault_share_the_cases_assume():
    assert degraded_pod_shares(table(PRE, [False] * 5), WINDOW)[0] == pytest.approx(0.4)
    assert (REACTION_K, REACTION_FRACTION) == (5, 0.5)  # the cases below count on at most 1 of 5 touching


def test_an_immediate_switch_reacts_at_the_first_request_after_onset():
    assert reaction_s(table(PRE, [False] * 8), WINDOW) == pytest.approx(at(0))


def test_a_switch_after_several_requests():
    # 6 touching, then none: the first 5 with at most one touching start at the 6th (index 5)
    during = [True] * 6 + [False] * 10
    assert reaction_s(table(PRE, during), WINDOW) == pytest.approx(at(5))


def test_a_policy_that_keeps_sending_the_same_share_never_reacts():
    assert math.isnan(reaction_s(table(PRE, PRE * 3), WINDOW))


def test_a_single_clean_request_among_touching_ones_does_not_end_it_early():
    # a clean request at index 2, touching ones around it; then clean from index 7 on: the first 5 with
    # at most one touching are indices 6..10 (6 touches, 7..10 do not)
    during = [True, True, False, True, True, True, True] + [False] * 8
    assert reaction_s(table(PRE, during), WINDOW) == pytest.approx(at(6))


def test_a_single_stray_request_after_the_switch_does_not_hold_it_back():
    # switched at index 3, one stray touching request at index 5: 3..7 hold one touching, within the share
    during = [True, True, True, False, False, True, False, False, False, False]
    assert reaction_s(table(PRE, during), WINDOW) == pytest.approx(at(3))
    # two strays among the five are beyond it: the first window with one is 6..10
    during2 = [True, True, True, False, False, True, True] + [False] * 6
    assert reaction_s(table(PRE, during2), WINDOW) == pytest.approx(at(6))


def test_no_pre_fault_traffic_or_none_to_the_bad_pod_or_no_fault_is_nan():
    assert math.isnan(reaction_s(table([], [False] * 8), WINDOW))
    assert math.isnan(reaction_s(table([False] * 10, [False] * 8), WINDOW))  # s_pre = 0
    assert math.isnan(reaction_s(table(PRE, [False] * 8), None))


def test_the_k_requests_must_all_be_routed_inside_the_window():
    # the switch comes with 3 requests left in the window; the clean ones after its end do not count
    during = [True] * 10 + [False] * 3
    assert math.isnan(reaction_s(table(PRE, during, after=[False] * 10), WINDOW))
    assert math.isnan(reaction_s(table(PRE, [False] * 4), WINDOW))  # fewer than k in the window


def test_routing_order_is_by_routed_s_and_unrouted_requests_are_left_out():
    during = [True] * 6 + [False] * 10
    t = table(PRE, during)
    rejected = pd.DataFrame({"arrival_s": [ONSET + 0.1] * 3, "routed_s": [math.nan] * 3,
                             "prefill_pod": [-1] * 3, "decode_pod": [-1] * 3})
    shuffled = pd.concat([t, rejected]).sample(frac=1.0, random_state=7).reset_index(drop=True)
    assert reaction_s(shuffled, WINDOW) == pytest.approx(at(5))


def test_k_and_fraction_are_parameters():
    # the same share as before onset (2 of 5) meets fraction 1 at once
    assert reaction_s(table(PRE, PRE * 3), WINDOW, fraction=1.0) == pytest.approx(at(0))
    # with k = 1 the first clean request is the reaction
    during = [True, True, False, True, True]
    assert reaction_s(table(PRE, during), WINDOW, k=1) == pytest.approx(at(2))
    # a gap between decisions scales the time, not the count
    assert reaction_s(table(PRE, [True] * 6 + [False] * 10, gap_s=0.01), WINDOW) == pytest.approx(at(5, 0.01))
    with pytest.raises(ValueError, match="k >= 1"):
        reaction_s(table(PRE, PRE), WINDOW, k=0)


def test_run_metrics_reports_it_from_a_run_directory(tmp_path: Path):
    t = table(PRE, [True] * 6 + [False] * 10)
    recs = [RequestRecord(request_id=i, arrival_s=float(r.arrival_s), prompt_tokens=10, output_tokens=5,
                          prefill_worker=int(r.prefill_pod) * 10, decode_worker=int(r.decode_pod) * 10,
                          prefill_pod=int(r.prefill_pod), decode_pod=int(r.decode_pod), routed_s=float(r.routed_s),
                          first_token_s=float(r.routed_s) + 0.1, end_s=float(r.routed_s) + 0.2)
            for i, r in enumerate(t.itertuples())]
    run = load_run(write_run(tmp_path / "run", reqs=recs, faults=link_fault(ONSET, END, pod=BAD)))
    assert run_metrics(run)["reaction_s"] == pytest.approx(at(5))
