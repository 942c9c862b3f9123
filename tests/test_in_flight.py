"""The in-flight evidence of the risk price (core/in_flight.py, ``telemetry.in_flight``): what a
router knows of its own requests still in flight, on hand-built sequences with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from builders import parse, small_spec_dict
from core.experiment import build_topology, make_router, seed_streams
from core.in_flight import InFlightEvidence
from core.records import PriceRecord

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

A, B, C, D = "a", "b", "c", "d"  # request keys (the router uses its tickets)


def test_no_request_ended_ok_means_no_yardstick_and_no_evidence():
    ev = InFlightEvidence(4, window_s=30.0)
    ev.handed_off(A, 1.0, 0, 2)
    assert math.isnan(ev.longest_ok_s(50.0))
    assert ev.overdue(50.0).tolist() == [0, 0, 0, 0]  # however long A waits


def test_a_request_older_than_every_healthy_one_counts_against_both_its_pods_until_it_ends():
    ev = InFlightEvidence(4, window_s=30.0)
    ev.handed_off(A, 1.0, 0, 2)  # will hang
    ev.handed_off(B, 1.0, 1, 3)
    ev.ended(1.5, B, ok=True)  # healthy: 0.5 s from hand-off to end
    ev.handed_off(C, 1.2, 1, 2)
    ev.ended(2.0, C, ok=True)  # healthy: 0.8 s, the longest
    assert ev.longest_ok_s(2.0) == pytest.approx(0.8)
    assert ev.overdue(1.7).tolist() == [0, 0, 0, 0]  # A has waited 0.7 s: not past 0.8
    ev.handed_off(D, 2.0, 1, 3)
    assert ev.overdue(2.5).tolist() == [1, 0, 1, 0]  # A (1.5 s) is; D (0.5 s) is not
    ev.ended(2.6, A, ok=False)  # given up: its real outcome replaces the evidence
    assert ev.overdue(2.7).tolist() == [0, 0, 0, 0]  # D has waited 0.7 s
    assert ev.longest_ok_s(2.7) == pytest.approx(0.8)  # a failure is no yardstick
    assert ev.overdue(2.9).tolist() == [0, 1, 0, 1]  # D, 0.9 s


def test_the_yardstick_forgets_what_left_the_history_window():
    ev = InFlightEvidence(2, window_s=10.0)
    ev.handed_off(A, 0.0, 0, 1)
    ev.ended(5.0, A, ok=True)  # 5 s, ended at 5 s
    ev.handed_off(B, 6.0, 0, 1)
    ev.ended(6.5, B, ok=True)  # 0.5 s, ended at 6.5 s
    ev.handed_off(C, 7.0, 0, 1)
    assert ev.longest_ok_s(14.9) == pytest.approx(5.0) and ev.overdue(14.9).tolist() == [1, 1]
    assert ev.longest_ok_s(15.0) == pytest.approx(0.5)  # A's end left (5, 15]
    assert math.isnan(ev.longest_ok_s(16.5))


def test_a_request_whose_two_ends_are_one_pod_counts_once_there():
    ev = InFlightEvidence(2, window_s=30.0)
    ev.handed_off(A, 0.0, 0, 0)
    ev.ended(0.2, A, ok=True)
    ev.handed_off(B, 1.0, 1, 1)
    assert ev.overdue(2.0).tolist() == [0, 1]


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="window_s"):
        InFlightEvidence(2, 0.0)


@pytest.mark.parametrize("in_flight", [False, True])
def test_the_router_prices_a_stuck_request_before_it_is_given_up_only_with_the_option(in_flight):
    # by_pod: prefill on pod 0, decode on pod 1; telemetry none: the price sees no bandwidth
    spec = parse(small_spec_dict(topology={"pods": 2, "workers_per_pod": 2, "placement": "by_pod"},
                                 telemetry={"mode": "none", "in_flight": in_flight}, policies=["OTF-R"]))
    rows = []
    router = make_router(spec, build_topology(spec), "OTF-R", seed_streams(0), rows.append)
    healthy = router.route(0.0, 0, 0.0, 256, 10)
    healthy.enter("prefill", 0.0)
    healthy.enter("decode_queue", 0.2)
    healthy.finish(0.6)  # 0.4 s from hand-off to end
    stuck = router.route(1.0, 1, 1.0, 256, 10)
    stuck.enter("prefill", 1.0)
    stuck.enter("decode_queue", 1.2)  # handed off, then nothing: a hung pull
    stuck.enter("kv_transfer", 1.3)  # (the simulator knows this live, the testbed's router does not)
    failed_in_prefill = router.route(1.0, 2, 1.0, 256, 10)
    failed_in_prefill.enter("prefill", 1.0)
    failed_in_prefill.finish(1.1, "error")  # never handed off: no evidence of its own

    def timeout_rates(now):
        router.slow_tick(now)
        return [r.timeout_rate for r in rows if isinstance(r, PriceRecord) and r.time_s == now]

    assert timeout_rates(1.5) == [0.0, 0.0]  # 0.3 s: not past the healthy 0.4 s
    # 2 s after its hand-off: with the option, one overdue request against the 2 that ended (each
    # counts on both pods it touched) and itself: 1/3 on each pod; without, nothing yet
    expected = [1 / 3, 1 / 3] if in_flight else [0.0, 0.0]
    assert timeout_rates(3.2) == pytest.approx(expected)
    stuck.finish(16.0, "timeout")  # given up at its deadline: now it counts either way, once
    assert timeout_rates(16.0) == pytest.approx([1 / 3, 1 / 3])
    assert router.evidence is None or router.evidence.overdue(16.0).tolist() == [0, 0]


def test_the_option_is_part_of_the_telemetry_block_and_off_by_default():
    spec = parse(small_spec_dict())
    assert spec.telemetry.in_flight is False
    with pytest.raises(ValueError):
        parse(small_spec_dict(telemetry={"mode": "none", "in_flight": "sometimes"}))
