"""Reading a shaper's rate from its byte counter (testbed/faults/readings.py): drain_rate, step_rate, busy_rate."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest

from testbed.faults.agent import FaultAgent

from testbed.faults.readings import drain_rate

# The computations run in the background (tests/conftest.py); the two tests of the fault agent's
# probe (FaultAgent._rate_while) read the wall clock through its sampler's own sleeps and reads, so
# they run in the group, as the time-reading tests do: at SCHED_IDLE beside the end-to-end cluster
# the sampler was starved and its synthetic load's gap read as 0.92 of the rate (a fresh clone at
# bd0bbf9, 2026-12-01).
background = pytest.mark.background


def released(sizes: list[int], rate_bps: float, t0: float = 3.0) -> list[tuple[float, int]]:
    """htb's steps for packets of ``sizes`` queued behind a busy class: each released once the
    class is out of debt, the next one the released packet's size over the rate later."""
    t, n, steps = t0, 0, []
    for size in sizes:
        n += size
        steps.append((t, n))
        t += size * 8 / rate_bps
    return steps


@background
def test_the_rate_of_packets_of_any_sizes_is_read_exactly():
    rng = np.random.default_rng(3)
    rate = 5e6
    for _ in range(50):
        sizes = [int(x) for x in rng.integers(1448, 65160, size=int(rng.integers(2, 20)))]
        steps = released(sizes, rate)
        assert drain_rate(steps, before=0) == pytest.approx(rate, rel=1e-12)
        # counting every step but the first instead reads the two end packets' difference
        other = (steps[-1][1] - steps[0][1]) * 8 / (steps[-1][0] - steps[0][0])
        assert other / rate - 1 == pytest.approx((sizes[-1] - sizes[0]) / sum(sizes[:-1]), rel=1e-9)


@background
def test_the_count_before_the_first_step_is_where_it_starts():
    steps = released([64_000, 1_500, 64_000], 10e6)
    assert drain_rate([(t, n + 7_000) for t, n in steps], before=7_000) == pytest.approx(10e6)


@background
def test_fewer_than_two_steps_are_refused_in_one_line():
    with pytest.raises(ValueError, match="1 counter step"):
        drain_rate([(0.0, 10)], before=0)


def sampled(steps: list[tuple[float, int]], reads: list[float]) -> list[tuple[float, int]]:
    """A sampler's reads of the counter whose steps are ``steps``, at times ``reads``."""
    return [(t, max([n for s, n in steps if s <= t], default=0)) for t in reads]


@background
def test_a_read_that_came_late_is_left_out_at_the_windows_ends():
    """testbed/faults/readings.py step_rate: at 5 Mbit/s (64 KiB every 105 ms) read every 5 ms, then the
    sampler starved for 0.6 s before the window's end (beside a CPU hog): its one late read lumps six
    packets. Left out whole with its time counted (drain_rate over every step), the rate reads 0.6 of
    itself; without the late read, exactly."""
    from testbed.faults.readings import step_rate

    rate = 5e6
    steps = released([65_536] * 40, rate, t0=0.0)
    reads = [k * 0.005 for k in range(int(1.5 / 0.005))] + [2.1, 2.2]  # nothing read from 1.5 s to 2.1 s
    samples = sampled(steps, reads)
    assert step_rate(samples, 0.7, 2.15) == pytest.approx(rate, rel=0.02)
    inside = [i for i, (t, _) in enumerate(samples) if 0.7 <= t < 2.15]
    moved = [i for i in inside if samples[i][1] != samples[i - 1][1]]
    lumped = drain_rate([samples[i] for i in moved], samples[moved[0] - 1][1])
    assert lumped / rate < 0.75  # what the window read before
    # and a late read at the window's start, counted whole there, would read high
    reads = [0.0, 0.005, 1.0] + [1.0 + k * 0.005 for k in range(1, 240)]
    assert step_rate(sampled(steps, reads), 0.5, 2.1) == pytest.approx(rate, rel=0.02)


@background
def test_a_flow_read_late_now_and_then_is_read_at_its_rate():
    """At 2 Gbit/s every read lumps many packets; reads late by tens of ms (a collection, a starved
    thread) here and there, the window's ends among them, change nothing."""
    from testbed.faults.readings import step_rate

    rate = 2e9
    steps = released([65_536] * 12_000, rate, t0=0.0)
    rng = np.random.default_rng(5)
    reads = np.cumsum(rng.choice([0.005, 0.005, 0.005, 0.06], size=120)).tolist()
    got = step_rate(sampled(steps, reads), reads[2], reads[-1] + 1e-9)
    assert got == pytest.approx(rate, rel=0.01)


@background
def test_reads_a_few_times_late_at_the_windows_ends_leave_a_busy_link_within_one_packet():
    """r = 0.01 of 10 Gbit/s as the probe reads it: 100 Mbit/s in 22 KB packets (its GSO size there)
    over 0.4 s, read every 5 ms but now and then 18 ms late (the sampler waiting for the interpreter,
    under LATE_READ's four gaps, so never left out). Step to step alone, a late read at one end and
    not the other moves the reading by up to the difference of the two gaps over the window; read
    from read to read (readings._stepped takes it where its bound is the tighter), the reading is off
    by at most one packet in flight at each end: GSO_MAX_BYTES over the bytes, the bound it states."""
    from testbed.faults.readings import step_rate
    from testbed.faults.shaping import GSO_MAX_BYTES

    rate, window = 100e6, 0.4
    steps = released([22_080] * 450, rate, t0=0.0)
    rng = np.random.default_rng(11)
    worst_step_only = 0.0
    for _ in range(200):
        reads = (0.1 + np.cumsum(rng.choice([0.005, 0.005, 0.005, 0.018], size=100))).tolist()
        samples = sampled(steps, reads)
        t0, t1 = reads[0], reads[0] + window
        got = step_rate(samples, t0, t1)
        inside = [i for i, (t, _) in enumerate(samples) if t0 <= t < t1]
        bound = GSO_MAX_BYTES / (samples[inside[-1]][1] - samples[inside[0]][1])
        assert abs(got / rate - 1) <= bound, (got / rate, bound)
        moved = [i for i in inside[1:] if samples[i][1] != samples[i - 1][1]]
        step_only = drain_rate([samples[i] for i in moved], samples[moved[0] - 1][1])
        worst_step_only = max(worst_step_only, abs(step_only / rate - 1))
    assert worst_step_only > 2 * GSO_MAX_BYTES * 8 / (rate * window)  # what step to step alone read here


@background
def test_a_rate_that_rises_inside_the_window_is_read_as_its_average():
    """Reads on time: nothing is left out, so a window across a shaping's removal (80 Mbit/s, then
    line rate) reads what passed in it, far above the limit it had."""
    from testbed.faults.readings import step_rate

    slow = released([65_536] * 40, 80e6, t0=0.0)
    t, n = slow[-1]
    fast = [(t + (k + 1) * 65_536 * 8 / 2e9, n + (k + 1) * 65_536) for k in range(4_000)]
    reads = [k * 0.005 for k in range(1, 120)]
    samples = sampled(slow + fast, reads)
    window = (reads[-60], reads[-1] + 1e-9)
    moved = samples[-1][1] - samples[-60][1]
    got = step_rate(samples, *window)
    assert got == pytest.approx(moved * 8 / (reads[-1] - reads[-60]), rel=0.1) and got > 20 * 20e6


def test_the_fault_agents_probe_leaves_out_a_late_last_read():
    """The agent's probe (FaultAgent._rate_while) reads by the tests' rule: a shaper at 100 Mbit/s in
    22 KB packets (r = 0.01 of 10 Gbit/s, the probe's GSO size there), its queue full throughout, its
    last read in the window stalled 0.15 s as behind another thread holding the interpreter. The
    agent's rule before counted that read's lump at the end: 0.70 of the rate here (2026-11-30), as
    the end-to-end job read r = 0.01 three times (0.71-0.76 of it); left out, the rate is exact."""
    rate, pkt, window = 100e6, 22_080, 0.4
    t0 = time.monotonic()
    stalled = []

    def read() -> tuple[int, int]:
        elapsed = time.monotonic() - t0
        if elapsed > 0.1 + window - 0.05 and not stalled:  # the probe settles 0.1 s, then reads
            stalled.append(elapsed)
            time.sleep(0.15)
            elapsed = time.monotonic() - t0
        return int(elapsed * rate / 8 // pkt) * pkt, 300_000

    got = FaultAgent._rate_while(counter_of(read), None, window)
    assert stalled, "the window ended before the stalled read"
    assert got == pytest.approx(rate, rel=0.03)


def test_the_probe_reads_the_link_while_its_queue_was_full_not_the_gaps_of_a_starved_load():
    """A load that stops for 0.2 s of a 0.4 s window (its threads starved of the CPU) leaves the
    shaper's queue empty and the link idle: counted whole, the window reads half the rate; read
    while the queue held bytes (busy_rate), the rate. A load that arrives late (a peer's, started
    by another process) is waited for."""
    rate, pkt, window = 100e6, 22_080, 0.4
    t0 = time.monotonic()
    late_s, gap = 0.3, (0.5, 0.7)  # from the probe's start: the load arrives, then pauses inside the window

    def read() -> tuple[int, int]:
        t = time.monotonic() - t0
        busy = max(0.0, t - late_s) - max(0.0, min(t, gap[1]) - gap[0])
        idle = t < late_s or gap[0] <= t < gap[1]
        return int(busy * rate / 8 // pkt) * pkt, 0 if idle else 300_000

    got = FaultAgent._rate_while(counter_of(read), None, window)
    assert time.monotonic() - t0 > late_s + window, "the window did not wait for the load"
    assert got == pytest.approx(rate, rel=0.03)


def counter_of(read):
    @contextmanager
    def counter():
        yield read
    return counter()


@background
def test_busy_rate_counts_only_the_stretches_a_queue_was_read_in():
    from testbed.faults.readings import busy_rate

    rate = 80e6
    steps = released([22_080] * 400, rate, t0=0.0)
    reads = [k * 0.005 for k in range(1, 160)]
    samples = sampled(steps, reads)
    idle = (0.3, 0.5)  # the queue empty here: the counter stands still, then carries on
    shift = idle[1] - idle[0]
    rows = []
    for t, _ in samples:
        if t < idle[0]:
            n = sampled(steps, [t])[0][1]
            rows.append((t, n, 100_000))
        elif t < idle[1]:
            rows.append((t, sampled(steps, [idle[0]])[0][1], 0))
        else:
            rows.append((t, sampled(steps, [t - shift])[0][1], 100_000))
    got, busy_s = busy_rate(rows)
    assert got == pytest.approx(rate, rel=0.02) and busy_s == pytest.approx(0.795 - shift, abs=0.03)
    # counted whole, the idle stretch reads low
    from testbed.faults.readings import step_rate
    assert step_rate([(t, n) for t, n, _ in rows], 0.0, 1.0) < 0.8 * rate
    # no queue to read (an unshaped counter, a link down): every read counts, as step_rate
    plain = [(t, n, None) for t, n, _ in rows]
    assert busy_rate(plain)[0] == pytest.approx(step_rate([(t, n) for t, n, _ in rows], 0.0, 1.0))
    # a queue never busy: the plain reading, no busy seconds; nothing moved reads 0
    assert busy_rate([(t, 0, 0) for t, _, _ in rows]) == (0.0, 0.0)
