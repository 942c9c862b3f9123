"""Fault specs, the ground-truth schedule, health labels and bandwidth telemetry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from faults import (
    BandwidthTelemetry,
    ComputeFault,
    FaultSchedule,
    FaultSpec,
    HealthLabelModel,
    HealthSpec,
    LinkFault,
    TelemetrySpec,
)

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

FAULT_LIST = TypeAdapter(list[FaultSpec])


def link(pods, start, dur, r):
    return LinkFault(pods=pods, start_s=start, duration_s=dur, residual_bw=r)


def compute(pods, start, dur, k):
    return ComputeFault(pods=pods, start_s=start, duration_s=dur, slowdown=k)


def quiet(**kw) -> HealthSpec:
    """A noise-free detector; keywords override."""
    return HealthSpec(**{"model": "alert", "detection_delay_s": 0.0, "clear_delay_s": 0.0, **kw})


def run_labels(model: HealthLabelModel, sched: FaultSchedule, times) -> tuple[list, np.ndarray]:
    """Drive a label model over ``times``; return all change rows and the labels per update."""
    rows, labels = [], []
    for t in times:
        rows += model.update(t, sched.degraded_at(t, model.spec))
        labels.append(model.labels.copy())
    return rows, np.array(labels)


def episodes(times: np.ndarray, on: np.ndarray) -> list[tuple[int, float, float]]:
    """(pod, label-on time, label-off time) for each closed run of True in ``on`` (time x pod)."""
    out = []
    for p in range(on.shape[1]):
        col = np.concatenate([[False], on[:, p], [False]]).astype(int)
        starts = np.flatnonzero(np.diff(col) == 1)
        ends = np.flatnonzero(np.diff(col) == -1)
        out += [(p, times[s], times[e]) for s, e in zip(starts, ends) if e < len(times)]
    return out


# --- specs -------------------------------------------------------------------


def test_misspelt_fields_are_validation_errors():
    with pytest.raises(ValidationError, match="residual_bandwidth"):
        LinkFault(pods=[0], start_s=0, duration_s=1, residual_bandwidth=0.1)
    with pytest.raises(ValidationError, match="detection_delay"):
        HealthSpec(detection_delay=3)
    with pytest.raises(ValidationError, match="lag"):
        TelemetrySpec(mode="delayed", lag=3)
    with pytest.raises(ValidationError, match="slow_down"):
        FAULT_LIST.validate_python([{"kind": "compute", "pods": [0], "start_s": 0, "duration_s": 1, "slow_down": 2}])


def test_fault_list_parses_by_kind_and_rejects_bad_values():
    fs = FAULT_LIST.validate_python([
        {"kind": "link", "pods": [3], "start_s": 1, "duration_s": 2, "residual_bw": 0.05},
        {"kind": "compute", "pods": [1, 2], "start_s": 0, "duration_s": 4, "slowdown": 3},
    ])
    assert isinstance(fs[0], LinkFault) and isinstance(fs[1], ComputeFault)
    down = FAULT_LIST.validate_python([{"kind": "link", "pods": [0], "start_s": 0, "duration_s": 1, "residual_bw": 0}])
    assert down[0].residual_bw == 0.0  # a link down
    bad = [
        {"kind": "link", "pods": [], "start_s": 0, "duration_s": 1, "residual_bw": 0.1},
        {"kind": "link", "pods": [0], "start_s": 0, "duration_s": 0, "residual_bw": 0.1},
        {"kind": "link", "pods": [0], "start_s": 0, "duration_s": math.inf, "residual_bw": 0.1},
        {"kind": "link", "pods": [0], "start_s": 0, "duration_s": 1, "residual_bw": -0.1},
        {"kind": "link", "pods": [0], "start_s": 0, "duration_s": 1, "residual_bw": 0.0, "delay_ms": 5},  # down: no delay
        {"kind": "link", "pods": [0, 0], "start_s": 0, "duration_s": 1, "residual_bw": 0.1},
        {"kind": "compute", "pods": [0], "start_s": 0, "duration_s": 1, "slowdown": 0.5},
        {"kind": "disk", "pods": [0], "start_s": 0, "duration_s": 1},
    ]
    for d in bad:
        with pytest.raises(ValidationError):
            FAULT_LIST.validate_python([d])


# --- schedule ----------------------------------------------------------------


def test_overlapping_faults_compose_and_clear_exactly_at_end():
    sched = FaultSchedule([
        link([1, 2], 2.0, 3.0, 0.2),  # [2, 5)
        link([2], 4.0, 4.0, 0.05),  # [4, 8)
        compute([2, 3], 1.0, 5.0, 2.0),  # [1, 6)
        compute([3], 3.0, 1.5, 4.0),  # [3, 4.5)
    ], n_pods=5)
    np.testing.assert_array_equal(sched.bw_factor_at(4.5), [1, 0.2, 0.05, 1, 1])
    np.testing.assert_array_equal(sched.bw_factor_at(3.0), [1, 0.2, 0.2, 1, 1])
    np.testing.assert_array_equal(sched.slowdown_at(3.0), [1, 1, 2, 4, 1])
    # Half-open intervals: active just before start + duration, gone at it.
    np.testing.assert_array_equal(sched.bw_factor_at(np.nextafter(5.0, 0)), [1, 0.2, 0.05, 1, 1])
    np.testing.assert_array_equal(sched.bw_factor_at(5.0), [1, 1, 0.05, 1, 1])
    np.testing.assert_array_equal(sched.slowdown_at(4.5), [1, 1, 2, 2, 1])
    np.testing.assert_array_equal(sched.bw_factor_at(8.0), np.ones(5))
    np.testing.assert_array_equal(sched.slowdown_at(6.0), np.ones(5))
    np.testing.assert_array_equal(sched.bw_factor_at(np.nextafter(2.0, 0)), np.ones(5))
    np.testing.assert_array_equal(sched.degraded_at(5.9), [False, False, True, True, False])
    np.testing.assert_array_equal(sched.degraded_at(7.0), [False, False, True, False, False])
    assert sched.window() == (1.0, 8.0)
    assert sched.fault_pods() == [1, 2, 3]
    np.testing.assert_array_equal(sched.change_times(), [1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 6.0, 8.0])


def test_steps_walk_the_timeline_with_changes_events_and_ttl_base():
    sched = FaultSchedule([
        link([1, 2], 2.0, 3.0, 0.2),  # [2, 5)
        link([2], 4.0, 4.0, 0.05),  # [4, 8)
        compute([3], 3.0, 1.5, 4.0),  # [3, 4.5)
    ], n_pods=5)
    steps = sched.steps(quiet())
    assert [s.time_s for s in steps] == [2.0, 3.0, 4.0, 4.5, 5.0, 8.0]
    # what changed is relative to the step before; the events are those at the step's time
    assert [s.changed.tolist() for s in steps] == [[1, 2], [3], [2], [3], [1], [2]]
    assert [[(e.event, e.fault_id, e.pod) for e in s.events] for s in steps] == [
        [("apply", 0, 1), ("apply", 0, 2)], [("apply", 2, 3)], [("apply", 1, 2)], [("clear", 2, 3)],
        [("clear", 0, 1), ("clear", 0, 2)], [("clear", 1, 2)]]
    at4 = steps[2]
    np.testing.assert_array_equal(at4.bw_factor, sched.bw_factor_at(4.0))
    np.testing.assert_array_equal(at4.slowdown, sched.slowdown_at(4.0))
    np.testing.assert_array_equal(at4.degraded, [False, True, True, True, False])
    assert at4.until_s == 8.0  # what is on at 4 s lasts until 8 s at most: a TTL's base
    assert steps[-1].until_s == 8.0 and not steps[-1].degraded.any()


def test_the_closing_step_clears_what_is_on_with_the_clears_of_started_faults():
    sched = FaultSchedule([link([1], 2.0, 10.0, 0.2), compute([0], 3.0, 10.0, 2.0), link([2], 20.0, 5.0, 0.1)],
                          n_pods=3)
    steps = sched.steps()
    assert sched.closing_step(1.0, None) is None  # nothing applied yet
    last = steps[1]  # the run ends at 6 s, after the steps at 2 s and 3 s
    closing = sched.closing_step(6.0, last)
    assert closing.time_s == 6.0 and closing.changed.tolist() == [0, 1]
    assert [(e.event, e.fault_id, e.time_s) for e in closing.events] == [("clear", 0, 6.0), ("clear", 1, 6.0)]
    np.testing.assert_array_equal(closing.bw_factor, np.ones(3))
    np.testing.assert_array_equal(closing.slowdown, np.ones(3))
    assert sched.closing_step(30.0, steps[-1]) is None  # the timeline ended by itself


def test_link_direction_splits_uplink_from_downlink():
    sched = FaultSchedule([
        LinkFault(pods=[0], start_s=0, duration_s=10, residual_bw=0.1, direction="uplink"),
        LinkFault(pods=[1], start_s=0, duration_s=10, residual_bw=0.05, direction="downlink"),
        LinkFault(pods=[2], start_s=0, duration_s=10, residual_bw=0.2),
    ], n_pods=4)
    up, down = sched.link_factors_at(5.0)
    np.testing.assert_array_equal(up, [0.1, 1, 0.2, 1])
    np.testing.assert_array_equal(down, [1, 0.05, 0.2, 1])
    # the truth and the telemetry's bandwidth see the narrower side
    np.testing.assert_array_equal(sched.bw_factor_at(5.0), [0.1, 0.05, 0.2, 1])
    np.testing.assert_array_equal(sched.degraded_at(5.0), [True, True, True, False])


def test_testbed_only_link_options_are_validated():
    f = LinkFault(pods=[0], start_s=0, duration_s=1, residual_bw=1.0, delay_ms=20, loss=0.01, kv_only=True)
    assert f.uplink and f.downlink and f.kv_only
    for bad in ({"direction": "sideways"}, {"loss": 1.0}, {"delay_ms": -1}):
        with pytest.raises(ValidationError):
            LinkFault(pods=[0], start_s=0, duration_s=1, residual_bw=0.1, **bad)


def test_degraded_thresholds_come_from_health_spec():
    sched = FaultSchedule([link([0], 0, 10, 0.1), link([1], 0, 10, 0.05), link([2], 0, 10, 1.0),
                           compute([3], 0, 10, 1.5), compute([4], 0, 10, 1.0)], n_pods=5)
    np.testing.assert_array_equal(sched.degraded_at(1.0), [True, True, False, True, False])
    strict = HealthSpec(min_residual_bw=0.1, min_slowdown=2.0)
    np.testing.assert_array_equal(sched.degraded_at(1.0, strict), [False, True, False, False, False])


def test_out_of_range_pod_is_a_one_line_error_naming_fault_and_pod():
    faults = [link([0, 1], 0, 1, 0.1), compute([2, 7], 0, 1, 2.0)]
    with pytest.raises(ValueError) as err:
        FaultSchedule(faults, n_pods=4)
    msg = str(err.value)
    assert "\n" not in msg and "fault 1" in msg and "pod 7" in msg
    FaultSchedule(faults, n_pods=8)  # in range: fine


def test_events_sorted_and_paired():
    specs = [link([4, 0], 5.0, 2.0, 0.1), compute([1], 0.0, 5.0, 3.0), link([1, 2], 3.0, 4.0, 0.01), link([3], 9.0, 0.5, 0.2)]
    events = FaultSchedule(specs, n_pods=5).events()
    times = [e.time_s for e in events]
    assert times == sorted(times)
    pairs = {(i, p) for i, f in enumerate(specs) for p in f.pods}
    assert len(events) == 2 * len(pairs)
    for fid, pod in pairs:
        mine = [e for e in events if (e.fault_id, e.pod) == (fid, pod)]
        f = specs[fid]
        assert [e.event for e in mine] == ["apply", "clear"]
        assert [e.time_s for e in mine] == [f.start_s, f.start_s + f.duration_s]
        assert {e.kind for e in mine} == {f.kind} and {e.severity for e in mine} == {f.severity}
    # At t = 5 fault 1 clears on pod 1 while fault 0 applies: clear first (half-open intervals).
    at5 = [e.event for e in events if e.time_s == 5.0]
    assert at5 == ["clear", "apply", "apply"]


def test_empty_schedule():
    sched = FaultSchedule([], n_pods=3)
    assert sched.events() == [] and sched.window() is None and sched.fault_pods() == []
    assert sched.change_times().size == 0
    np.testing.assert_array_equal(sched.bw_factor_at(1.0), np.ones(3))
    assert not sched.degraded_at(1.0).any()


# --- health labels -----------------------------------------------------------


def random_schedule(rng, n_pods, n_faults, horizon):
    specs = []
    for _ in range(n_faults):
        pods = rng.choice(n_pods, size=rng.integers(1, 5), replace=False).tolist()
        start, dur = float(rng.uniform(0, horizon)), float(rng.uniform(0.5, 20))
        specs.append(link(pods, start, dur, 0.1) if rng.random() < 0.5 else compute(pods, start, dur, 2.0))
    return FaultSchedule(specs, n_pods)


def test_zero_delay_no_noise_labels_equal_truth():
    rng = np.random.default_rng(1)
    sched = random_schedule(rng, 64, 40, 100.0)
    times = np.union1d(np.arange(0, 130, 0.7), sched.change_times())
    model = HealthLabelModel(quiet(), 64, np.random.default_rng(2))
    truths = []
    for t in times:
        model.update(t, sched.degraded_at(t))
        truths.append(sched.degraded_at(t))
        np.testing.assert_array_equal(model.labels, truths[-1])
    assert np.array(truths).any()


def test_first_update_emits_every_pod_then_only_changes():
    sched = FaultSchedule([link([2], 3.0, 2.0, 0.1)], n_pods=4)
    model = HealthLabelModel(quiet(), 4, np.random.default_rng(0))
    first = model.update(0.0, sched.degraded_at(0.0))
    assert [c.pod for c in first] == [0, 1, 2, 3] and not any(c.unhealthy or c.truth_degraded for c in first)
    assert model.update(1.0, sched.degraded_at(1.0)) == []
    onset = model.update(3.0, sched.degraded_at(3.0))
    assert [(c.time_s, c.pod, c.unhealthy, c.truth_degraded) for c in onset] == [(3.0, 2, True, True)]
    with pytest.raises(ValueError):
        model.update(2.0, sched.degraded_at(2.0))
    with pytest.raises(ValueError):
        model.update(4.0, np.zeros(5, dtype=bool))


def test_detection_and_clear_delays():
    # Degraded on [3.3, 10.3); updates every second plus at the change times.
    sched = FaultSchedule([link([1], 3.3, 7.0, 0.1)], n_pods=3)
    spec = HealthSpec(model="alert", detection_delay_s=2.5, clear_delay_s=1.5)
    times = np.union1d(np.arange(0.0, 20.0, 1.0), sched.change_times())
    rows, labels = run_labels(HealthLabelModel(spec, 3, np.random.default_rng(0)), sched, times)
    on = times[labels[:, 1]]
    assert on[0] == 6.0  # first update >= 3.3 + 2.5
    assert on[-1] == 11.0 and times[np.searchsorted(times, on[-1]) + 1] == 12.0  # cleared at first update >= 10.3 + 1.5
    assert np.all(np.diff(np.flatnonzero(labels[:, 1])) == 1)  # one contiguous run
    assert not labels[:, [0, 2]].any()
    pod1 = [(c.time_s, c.unhealthy, c.truth_degraded) for c in rows if c.pod == 1]
    assert pod1 == [(0.0, False, False), (3.3, False, True), (6.0, True, True), (10.3, True, False), (12.0, False, False)]


def test_detection_counts_from_the_first_update_that_sees_the_onset():
    sched = FaultSchedule([link([0], 3.3, 7.0, 0.1)], n_pods=1)
    times = np.arange(0.0, 20.0, 1.0)  # periodic only: the onset is seen at 4.0
    _, labels = run_labels(HealthLabelModel(HealthSpec(model="alert", detection_delay_s=2.5, clear_delay_s=0), 1, np.random.default_rng(0)), sched, times)
    assert times[labels[:, 0]].tolist() == [7.0, 8.0, 9.0, 10.0]


def test_episode_shorter_than_detection_delay_is_not_labelled_and_relapse_keeps_label():
    sched = FaultSchedule([
        link([0], 1.0, 2.0, 0.1),  # 2 s < 5 s delay: never labelled
        link([1], 1.0, 10.0, 0.1),  # detected at 6, recovers at 11 ...
        link([1], 13.0, 10.0, 0.1),  # ... relapses before the clear delay has run out
    ], n_pods=2)
    times = np.arange(0.0, 40.0, 1.0)
    _, labels = run_labels(HealthLabelModel(HealthSpec(model="alert", detection_delay_s=5, clear_delay_s=5), 2, np.random.default_rng(0)), sched, times)
    assert not labels[:, 0].any()
    assert times[labels[:, 1]].tolist() == list(np.arange(6.0, 28.0))  # 6 .. 23 + 5 (exclusive)


def test_miss_prob_one_never_labels():
    rng = np.random.default_rng(3)
    sched = random_schedule(rng, 32, 30, 60.0)
    times = np.union1d(np.arange(0, 100, 0.5), sched.change_times())
    rows, labels = run_labels(HealthLabelModel(quiet(miss_prob=1.0), 32, np.random.default_rng(4)), sched, times)
    assert not labels.any()
    assert any(c.truth_degraded for c in rows)  # the truth was there to be missed


def test_miss_prob_drawn_per_onset():
    # 400 pods, each with two separate episodes: about half of the 800 onsets are missed.
    n = 400
    sched = FaultSchedule([link(list(range(n)), 1.0, 5.0, 0.1), link(list(range(n)), 10.0, 5.0, 0.1)], n)
    times = np.arange(0.0, 20.0, 0.5)
    _, labels = run_labels(HealthLabelModel(quiet(miss_prob=0.5), n, np.random.default_rng(5)), sched, times)
    hit1, hit2 = labels[times == 3.0][0], labels[times == 12.0][0]
    assert 4 * 20 > abs(hit1.sum() - n / 2) and 4 * 20 > abs(hit2.sum() - n / 2)  # 4 sigma of Binomial(400, 1/2)
    assert (hit1 != hit2).any()  # not one draw per pod for all time
    # A detected episode is labelled throughout, a missed one never.
    for a, b in ((1.0, 6.0), (10.0, 15.0)):
        win = labels[(times >= a) & (times < b)]
        assert np.all(win == win[0])


def test_false_positive_rate_and_duration():
    n, period, rate, dur = 1024, 0.5, 0.02, 1.2
    sched = FaultSchedule([], n)
    times = np.arange(0.0, 100.0, period)
    rows, labels = run_labels(HealthLabelModel(quiet(false_positive_rate_per_s=rate, false_positive_duration_s=dur), n, np.random.default_rng(6)), sched, times)
    starts = (labels[1:] & ~labels[:-1]).sum()
    # Pods labelled healthy over an interval can start one there: p = 1 - exp(-rate * dt).
    eligible = n - labels[:-1].sum(axis=1)
    expected = float((eligible * -np.expm1(-rate * period)).sum())
    assert abs(starts - expected) < 4 * math.sqrt(expected) + 0.01 * expected, (starts, expected)
    assert 0.5 * rate * n * times[-1] < expected  # the check above is not vacuous
    # Each one ends at the first update >= start + duration: 1.5 s with 0.5 s updates.
    eps = episodes(times, labels)
    assert len(eps) > 1000 and {round(off - on, 9) for _, on, off in eps} == {1.5}
    assert not any(c.truth_degraded for c in rows)


def test_false_positives_only_on_healthy_pods():
    n = 200
    sched = FaultSchedule([link(list(range(100)), 0.0, 50.0, 0.1)], n)  # pods 0..99 degraded throughout
    times = np.arange(0.0, 50.0, 0.5)
    spec = HealthSpec(model="alert", detection_delay_s=10.0, clear_delay_s=0, false_positive_rate_per_s=0.05, false_positive_duration_s=1.0)
    _, labels = run_labels(HealthLabelModel(spec, n, np.random.default_rng(7)), sched, times)
    before = times < 10.0  # degraded but not yet detected: no spurious label either
    assert not labels[before][:, :100].any()
    assert labels[before][:, 100:].any()
    assert labels[~before][:, :100].all()


def test_flapping_only_on_detected_pods():
    n = 200
    sched = FaultSchedule([link(list(range(100)), 10.0, 50.0, 0.1)], n)
    times = np.arange(0.0, 80.0, 0.5)
    base = dict(detection_delay_s=2.0, clear_delay_s=2.0)
    _, clean = run_labels(HealthLabelModel(HealthSpec(model="alert", **base), n, np.random.default_rng(8)), sched, times)
    _, flappy = run_labels(HealthLabelModel(HealthSpec(model="alert", **base, flap_rate_per_s=0.1, flap_duration_s=2.0), n, np.random.default_rng(8)), sched, times)
    assert not (flappy & ~clean).any()  # flapping only removes labels, never adds them
    holes = clean & ~flappy
    assert holes.sum() > 100 and not holes[:, 100:].any()
    # Each flap lasts flap_duration_s (when the detection outlasts it).
    gaps = [off - on for _, on, off in episodes(times, holes) if off < 60.0]
    assert gaps and set(gaps) == {2.0}


def test_same_seed_same_stream():
    rng = np.random.default_rng(9)
    sched = random_schedule(rng, 128, 60, 100.0)
    spec = HealthSpec(model="alert", miss_prob=0.3, false_positive_rate_per_s=0.01, flap_rate_per_s=0.05)
    times = np.union1d(np.arange(0, 130, 1.0), sched.change_times())

    def stream(seed):
        return run_labels(HealthLabelModel(spec, 128, np.random.default_rng(seed)), sched, times)[0]

    a, b, c = stream(11), stream(11), stream(12)
    assert a == b and len(a) > 128
    assert a != c


# --- telemetry ---------------------------------------------------------------


BW0 = np.array([100.0, 100.0, 50.0])


def test_telemetry_direct():
    tel = BandwidthTelemetry(TelemetrySpec(mode="direct"), BW0)
    np.testing.assert_array_equal(tel.view(0.0), BW0)
    buf = np.array([10.0, 100.0, 50.0])
    tel.observe(1.0, buf)
    buf[0] = 99.0  # the caller reusing its buffer must not change what was observed
    np.testing.assert_array_equal(tel.view(1.0), [10.0, 100.0, 50.0])
    tel.observe(2.0, np.array([10.0, 1.0, 50.0]))
    np.testing.assert_array_equal(tel.view(2.0), [10.0, 1.0, 50.0])
    assert tel.history_len == 1


def test_telemetry_delayed():
    tel = BandwidthTelemetry(TelemetrySpec(mode="delayed", lag_s=10.0), BW0)
    half, low = BW0 / 2, BW0 / 10
    tel.observe(0.0, BW0)
    tel.observe(5.0, half)
    tel.observe(12.0, low)
    np.testing.assert_array_equal(tel.view(12.0), BW0)
    np.testing.assert_array_equal(tel.view(14.99), BW0)
    np.testing.assert_array_equal(tel.view(15.0), half)
    np.testing.assert_array_equal(tel.view(21.9), half)
    np.testing.assert_array_equal(tel.view(22.0), low)
    np.testing.assert_array_equal(tel.view(1000.0), low)


def test_telemetry_delayed_before_first_observation_is_bw0():
    tel = BandwidthTelemetry(TelemetrySpec(mode="delayed", lag_s=3.0), BW0)
    tel.observe(4.0, BW0 / 4)
    np.testing.assert_array_equal(tel.view(6.9), BW0)
    np.testing.assert_array_equal(tel.view(7.0), BW0 / 4)


def test_telemetry_delayed_history_is_bounded():
    tel = BandwidthTelemetry(TelemetrySpec(mode="delayed", lag_s=2.0), BW0)
    rng = np.random.default_rng(10)
    times = np.arange(0.0, 100.0, 0.1)
    values = rng.uniform(1, 100, size=(times.size, 3))
    for t, v in zip(times, values):
        tel.observe(t, v)
    assert tel.history_len <= 22  # about lag / 0.1 s, not 1000
    np.testing.assert_array_equal(tel.view(times[-1]), values[-21])  # in force 2 s ago
    with pytest.raises(ValueError):
        tel.view(50.0)  # its value was dropped


def test_telemetry_none():
    tel = BandwidthTelemetry(TelemetrySpec(mode="none"), BW0)
    tel.observe(1.0, BW0 / 2)
    assert tel.view(1.0) is None and tel.view(100.0) is None


def test_telemetry_rejects_bad_input():
    with pytest.raises(ValueError):
        BandwidthTelemetry(TelemetrySpec(), np.array([1.0, 0.0]))
    tel = BandwidthTelemetry(TelemetrySpec(mode="delayed"), BW0)
    with pytest.raises(ValueError):
        tel.observe(0.0, np.ones(4))
    tel.observe(2.0, BW0)
    with pytest.raises(ValueError):
        tel.observe(1.0, BW0)


def test_a_field_of_the_other_health_model_is_refused():
    with pytest.raises(ValueError, match="detection_delay_s does not apply to model: checks"):
        HealthSpec(detection_delay_s=3.0)
    with pytest.raises(ValueError, match="probe_timeout_s does not apply to model: alert"):
        HealthSpec(model="alert", probe_timeout_s=2.0)
    HealthSpec.model_validate(HealthSpec(model="alert").model_dump())  # defaults round-trip


@pytest.mark.parametrize("rate_Bps, down", [(5e9, False), (1e8, True), (0.0, True)])
def test_the_probe_fails_only_where_its_answer_cannot_cross_the_link_in_time(rate_Bps, down):
    # 165 MB of queue at 5 GB/s: 33 ms, well inside the 1 s timeout; at 100 MB/s, 1.65 s; a dead
    # link never answers. Three failed probes 10 s apart mark the pod; one success clears it.
    spec = HealthSpec()
    model = HealthLabelModel(spec, 2, np.random.default_rng(0))
    link = np.array([rate_Bps, 5e9])
    labelled = []
    for t in np.arange(0.0, 31.0, 1.0):
        model.update(t, np.array([True, False]), link)
        labelled.append(bool(model.labels[0]))
    assert not model.labels[1]
    assert labelled[-1] == down
    if down:  # marked at the third failed probe (t = 20 s), not before
        assert labelled.index(True) == 20
        model.update(35.0, np.array([False, False]), np.array([5e9, 5e9]))
        assert model.labels[0]  # the probe at 30 s still failed; the next one is at 40 s
        model.update(40.0, np.array([False, False]), np.array([5e9, 5e9]))
        assert not model.labels[0]
