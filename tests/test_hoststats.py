"""The host's account of an engine (testbed/engines/hoststats.py) against real processes, and each
request's share of host stall from it (analysis/run/host_stall.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from analysis.run.host_stall import request_host_stall, run_host_marks
from testbed.engines.hoststats import HostSampler, node_times, task_times

SPIN = "while True: pass"


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code])
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def _over(pids: list[int], seconds: float) -> tuple[float, float]:
    c0, w0 = task_times(pids)
    time.sleep(seconds)
    c1, w1 = task_times(pids)
    return c1 - c0, w1 - w0


def test_two_spinners_on_one_cpu_each_wait_about_as_long_as_they_run(children) -> None:
    cpu = max(os.sched_getaffinity(0))
    a, b = children(SPIN), children(SPIN)
    for p in (a, b):
        os.sched_setaffinity(p.pid, {cpu})
    time.sleep(0.3)  # past start-up
    run, wait = _over([a.pid], 2.0)
    both_run, _ = _over([a.pid, b.pid], 1.0)
    print(f"one of two spinners on CPU {cpu}: ran {run:.2f} s, waited {wait:.2f} s in 2 s; both ran {both_run:.2f} s in 1 s")
    # the CPU is shared between the two (and whatever else wants it): each gets at most half of it
    assert 0.2 <= run <= 1.2 and wait >= 0.6 * run
    assert both_run <= 1.1  # one CPU's worth between them


def test_a_sleeping_process_neither_runs_nor_waits(children) -> None:
    p = children("import time; time.sleep(60)")
    time.sleep(0.3)
    run, wait = _over([p.pid], 1.0)
    assert run < 0.02 and wait < 0.02


def test_the_sampler_keeps_the_cpu_of_a_process_that_exits(children) -> None:
    # an engine core killed under its actor: the engine's CPU count must not drop with it
    stays = children("import time; time.sleep(30)")
    # 0.6 s of its own CPU, not of the clock: beside a busy loop on each core 0.6 s of the clock gives less
    spins = children("import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass")
    s = HostSampler(lambda: [stays.pid, spins.pid], period_s=0.1)
    try:
        spins.wait(10)
        time.sleep(0.5)
        got = s.samples()
    finally:
        s.stop()
    cpu = np.array([x.cpu_s for x in got])
    assert (np.diff(cpu) >= 0).all(), cpu
    # What the live processes alone hold now: the sleeper's start-up, no fixed figure (0.103 CPU s
    # beside a busy loop on each core on a slow day, 2026-12-01), and nothing of the spinner gone.
    live = task_times([stays.pid, spins.pid])[0]
    assert live == pytest.approx(task_times([stays.pid])[0], abs=0.005)
    assert cpu[-1] - live > 0.3  # most of the spinner's 0.6 s of CPU (read every 0.1 s), kept after its exit


def test_a_process_gone_counts_nothing() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert task_times([p.pid]) == (0.0, 0.0)


def test_the_node_counters_only_grow() -> None:
    first = node_times()
    time.sleep(0.2)
    second = node_times()
    for a, b in zip(first, second):
        assert math.isnan(a) or b >= a
    assert second[1] > 0  # some CPU was busy since boot


def test_the_sampler_keeps_samples_at_its_period_and_stops(children) -> None:
    p = children(SPIN)
    s = HostSampler(lambda: [p.pid], period_s=0.1)
    try:
        time.sleep(1.05)
        got = s.samples()
        later = s.samples(since_wall=got[len(got) // 2].wall_s)
    finally:
        s.stop()
    # never faster than its period; slower only when the host holds the sampling thread back
    assert 3 <= len(got) <= 12 and (np.diff([x.wall_s for x in got]) >= 0.09).all()
    assert len(later) < len(got) and all(x.wall_s >= got[len(got) // 2].wall_s for x in later)
    cpu = np.array([x.cpu_s for x in got])
    assert (np.diff(cpu) >= 0).all() and cpu[-1] > cpu[0]  # a spinner's CPU time, growing
    n = len(s.samples())
    time.sleep(0.3)
    assert len(s.samples()) == n  # stopped
    with pytest.raises(ValueError, match="period_s"):
        HostSampler(lambda: [], period_s=0)


def _host(worker: int, t: np.ndarray, pressure: np.ndarray, cpu: np.ndarray, wait: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"time_s": t, "worker": worker, "pod": worker, "role": "x", "cpu_s": cpu,
                         "wait_s": wait, "pressure_s": pressure, "busy_s": 0.0, "steal_s": 0.0})


def test_a_request_is_host_stalled_when_its_prefill_took_twice_its_time_under_cpu_pressure() -> None:
    t = np.arange(0.0, 31.0, 0.5)
    # worker 0's node (prefill): pressure 0.9 of the time from t=10 to 20, 0.1 otherwise
    p0 = 0.1 * t + 0.8 * np.clip(np.minimum(t, 20) - 10, 0, None)
    # worker 1's node (decode): 0.1 all along; its engine runs 0.2 s and waits 0.01 s per second
    host = pd.concat([_host(0, t, p0, 0.5 * t, 0.3 * t), _host(1, t, 0.1 * t, 0.2 * t, 0.01 * t)])
    req = pd.DataFrame({
        "routed_s": [11.0, 2.0, 12.0, 40.0, 18.0, 11.0],
        "prefill_start_s": [11.0, 2.0, 12.5, np.nan, 18.0, 11.0],
        "prefill_end_s": [15.0, 2.5, np.nan, np.nan, 19.0, 11.2],
        "end_s": [15.5, 3.0, np.nan, np.nan, 23.0, 11.25],
        "prefill_pod": [0] * 6,
        "prefill_worker": [0] * 6,
        "decode_worker": [1] * 6,
    }, index=[7, 8, 9, 10, 11, 12])
    expected = np.full(6, 0.5)  # each prompt's calibrated prefill time
    out = request_host_stall(req, host, 5.0, expected)
    # request 7: 4 s at 0.9 on the prefill node, 0.5 s at 0.1 on the decode node; a prefill 8x its time
    assert out.loc[7, "host_pressure"] == pytest.approx((4 * 0.9 + 0.5 * 0.1) / 4.5)
    assert out.loc[7, "host_cpu_s"] == pytest.approx(4 * 0.5 + 0.5 * 0.2)
    assert out.loc[7, "host_wait_s"] == pytest.approx(4 * 0.3 + 0.5 * 0.01)
    assert out.loc[7, "prefill_slowdown"] == pytest.approx(8.0) and bool(out.loc[7, "host_stalled"])
    # request 8: before the pressure, at its calibrated time
    assert out.loc[8, "host_pressure"] == pytest.approx(0.1) and not bool(out.loc[8, "host_stalled"])
    # request 9: its prefill never ended: no slowdown to judge (its window runs to its deadline)
    assert out.loc[9, "host_pressure"] == pytest.approx(0.9) and not bool(out.loc[9, "host_stalled"])
    # request 10: after the samples end: no account, no mark
    assert pd.isna(out.loc[10, "host_stalled"]) and math.isnan(out.loc[10, "host_pressure"])
    # request 11: a slow prefill (2x) but 4 of its 5 s on a calm node: pressure (0.9 + 0.4) / 5 < 0.5
    assert out.loc[11, "host_pressure"] == pytest.approx((0.9 + 4 * 0.1) / 5)
    assert out.loc[11, "prefill_slowdown"] == pytest.approx(2.0) and not bool(out.loc[11, "host_stalled"])
    # request 12: under pressure, but its prefill took its own time
    assert out.loc[12, "host_pressure"] > 0.5 and not bool(out.loc[12, "host_stalled"])
    # a compute fault on its prefill pod makes a slow prefill the fault's, not the host's
    faulted = request_host_stall(req, host, 5.0, expected, compute_faulted=np.array([1, 0, 0, 0, 0, 0], bool))
    assert not bool(faulted.loc[7, "host_stalled"])
    # the factor is the caller's to vary (docs/history/2026-11-23-prefill-stall.md "Fault against
    # control": the sensitivity)
    assert not bool(request_host_stall(req, host, 5.0, expected, factor=10.0).loc[7, "host_stalled"])


def test_the_runs_compute_faults_and_engine_speed_are_read_for_the_marks() -> None:
    t = np.arange(0.0, 20.0, 0.5)
    host = pd.concat([_host(0, t, 0.9 * t, 0.5 * t, 0.3 * t), _host(1, t, 0.9 * t, 0.2 * t, 0.01 * t)])
    req = pd.DataFrame({"routed_s": [1.0, 8.0], "prefill_start_s": [1.0, 8.0], "prefill_end_s": [2.0, 9.0],
                        "end_s": [2.5, 9.5], "prompt_tokens": [400, 400], "prefill_pod": [0, 0],
                        "prefill_worker": [0, 0], "decode_worker": [1, 1]})
    meta = {"spec": {"deadline_s": 10.0, "engine": {"prefill_tokens_per_s": 4000.0, "prefill_overhead_s": 0.0}}}
    faults = pd.DataFrame({"time_s": [5.0, 12.0], "fault_id": [0, 0], "event": ["apply", "clear"],
                           "kind": ["compute", "compute"], "pod": [0, 0]})
    out = run_host_marks(req, host, meta, faults)
    assert out["prefill_slowdown"].tolist() == pytest.approx([10.0, 10.0])  # 1 s for 0.1 s of work
    # the first before the compute fault: the host's; the second under it: the fault's
    assert out["host_stalled"].astype(bool).tolist() == [True, False]


def test_the_engines_calibrated_speed_in_run_json_is_what_a_prefill_is_held_against() -> None:
    # A 400-token prompt's prefill took 1 s under pressure: 10x the spec's nominal 4,000 tokens/s
    # (marked), but just its time at the 500 tokens/s and 0.2 s overhead its engines were calibrated at.
    t = np.arange(0.0, 20.0, 0.5)
    host = pd.concat([_host(0, t, 0.9 * t, 0.5 * t, 0.3 * t), _host(1, t, 0.9 * t, 0.2 * t, 0.01 * t)])
    req = pd.DataFrame({"routed_s": [1.0], "prefill_start_s": [1.0], "prefill_end_s": [2.0], "end_s": [2.5],
                        "prompt_tokens": [400], "prefill_pod": [0], "prefill_worker": [0], "decode_worker": [1]})
    spec = {"deadline_s": 10.0, "engine": {"prefill_tokens_per_s": 4000.0, "prefill_overhead_s": 0.0}}
    nominal = run_host_marks(req, host, {"spec": spec})
    assert nominal.loc[0, "prefill_slowdown"] == pytest.approx(10.0) and bool(nominal.loc[0, "host_stalled"])
    cal = {"path": "calibration.json", "measured_here": True,
           "engine": {"prefill_tokens_per_s": 500.0, "prefill_overhead_s": 0.2}}
    measured = run_host_marks(req, host, {"spec": spec, "calibration": cal})
    assert measured.loc[0, "prefill_slowdown"] == pytest.approx(1.0 / (0.2 + 400 / 500))
    assert not bool(measured.loc[0, "host_stalled"])


def test_no_host_samples_no_marks() -> None:
    req = pd.DataFrame({"routed_s": [1.0], "prefill_start_s": [1.0], "prefill_end_s": [1.5], "end_s": [2.0],
                        "prefill_worker": [0], "decode_worker": [1]})
    out = request_host_stall(req, pd.DataFrame(columns=["time_s", "worker", "cpu_s", "wait_s", "pressure_s"]), 10.0)
    assert out["host_stalled"].isna().all() and out["host_pressure"].isna().all()


def test_missed_wakeups_mark_a_request_on_a_calm_host_and_a_prefill_given_up_has_a_lower_bound() -> None:
    # a calm host (pressure 0.1 of the time), but worker 0's engine lost 5 s to a missed wake-up
    # of its queue, read at t = 16 (testbed/engines/shm_wakeups.py: counted when read)
    t = np.arange(0.0, 40.0, 0.5)
    lost = np.where(t >= 16.0, 5.0, 0.0)
    host = pd.concat([_host(0, t, 0.1 * t, 0.1 * t, 0.0 * t).assign(lost_wakeup_s=lost),
                      _host(1, t, 0.1 * t, 0.1 * t, 0.0 * t).assign(lost_wakeup_s=0.0)])
    req = pd.DataFrame({
        "arrival_s": [10.9, 20.0, 1.0, 14.0],
        "routed_s": [11.0, 20.0, 1.0, 14.0],
        "prefill_start_s": [11.0, 20.0, 1.0, 14.2],
        "prefill_end_s": [16.2, 20.5, np.nan, 14.3],
        "first_token_s": [16.4, 20.6, np.nan, 14.4],
        "end_s": [16.5, 21.0, np.nan, 14.5],
        "outcome": ["ok", "ok", "timeout", "ok"],
        "prompt_tokens": [400, 400, 400, 400],
        "prefill_pod": [0] * 4, "prefill_worker": [0] * 4, "decode_worker": [1] * 4,
    }, index=[1, 2, 3, 4])
    meta = {"spec": {"deadline_s": 30.0, "ttft_timeout_s": 8.0,
                     "engine": {"prefill_tokens_per_s": 4000.0, "prefill_overhead_s": 0.0}}}
    out = run_host_marks(req, host, meta)
    # request 1: its prefill window holds the 5 s lost: marked although the host was calm
    assert out.loc[1, "host_lost_wakeup_s"] == pytest.approx(5.0)
    assert out.loc[1, "host_pressure"] == pytest.approx(0.1) and bool(out.loc[1, "host_stalled"])
    # request 2: after it, nothing lost; request 4 ended before the read: nothing counted
    assert out.loc[2, "host_lost_wakeup_s"] == 0.0 and not bool(out.loc[2, "host_stalled"])
    assert out.loc[4, "host_lost_wakeup_s"] == 0.0 and not bool(out.loc[4, "host_stalled"])
    # request 3: timed out in prefill, given up at arrival + the first-token limit (1 + 8 s): its
    # prefill took at least 8 s for 0.1 s of work, but on a calm host with nothing lost: unmarked
    assert out.loc[3, "prefill_slowdown"] == pytest.approx(80.0) and not bool(out.loc[3, "host_stalled"])
    # the same under pressure is marked (a window up to its give-up, not routed + deadline)
    hot = pd.concat([_host(0, t, 0.9 * t, 0.1 * t, 0.0 * t), _host(1, t, 0.9 * t, 0.1 * t, 0.0 * t)])
    assert bool(run_host_marks(req, hot, meta).loc[3, "host_stalled"])
    # a host table from before the column: no account of wake-ups, the rest unchanged
    old = run_host_marks(req, host.drop(columns="lost_wakeup_s"), meta)
    assert old["host_lost_wakeup_s"].isna().all() and not bool(old.loc[1, "host_stalled"])
