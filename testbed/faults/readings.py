"""A shaper's rate, read from its byte counter sampled through a window: the one rule the fault
agent's link probes (testbed/faults/agent.py) and the tests' samplers (tests/traffic.py) read by.

htb releases whole packets (GSO ones up to 64 KiB) and goes into debt for them, so the counter
moves in steps, at a few Mbit/s a good part of a second apart (:func:`drain_rate`); a sampler
starved of the CPU reads late and lumps steps (:func:`step_rate`); and a probe whose load was
starved leaves the shaper idle, so its window reads the load, not the link (:func:`busy_rate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from testbed.faults.load import SLICE_S
from testbed.faults.shaping import GSO_MAX_BYTES

# A read this many times the window's typical interval after the one before came late: the sampler
# was starved of the CPU meanwhile (beside a CPU hog), and its step lumps what moved in that time.
LATE_READ = 4.0
# A queue read empty this long or longer: the load stopped (its threads starved), not its pacing,
# which sends in slices of load.SLICE_S and can leave a shallow queue empty for about one.
IDLE_S = 4 * SLICE_S


def drain_rate(steps: Sequence[tuple[float, int]], before: int) -> float:
    """Bit/s a busy shaper drained, read from the steps of a byte counter: ``steps`` as (time, count
    after the step), the counter's moves in order; ``before``, its count just before the first.

    htb releases a whole packet (GSO ones up to 64 KiB) once its class is out of debt, then goes
    into debt for it: the time from one release to the next is the size of the packet released
    first over the rate. So the rate is the bytes of every step but the last over the time from
    the first step to the last. Counting every step but the first instead is off by the two
    packets' difference: 0.945-1.032 of a 5 Mbit/s TCP stream's rate over 1.5 s, where this reads
    0.953-0.958 (docs/verified.md "htb counts GSO packets whole")."""
    if len(steps) < 2:
        raise ValueError(f"{len(steps)} counter step(s): a shaper's rate needs two")
    (t_first, _), (t_last, _) = steps[0], steps[-1]
    return (steps[-2][1] - before) * 8 / (t_last - t_first)


def _typical_gap(samples: Sequence[tuple[float, int]], idx: Sequence[int]) -> float:
    gaps = sorted(samples[i][0] - samples[i - 1][0] for i in idx[1:])
    return gaps[len(gaps) // 2]


def _stepped(samples: Sequence[tuple[float, int]], idx: list[int], typical: float) -> tuple[int, float] | None:
    """(bytes, seconds) over the reads ``idx`` (consecutive indices of ``samples``) of a busy shaper,
    late reads at either end left out; None with fewer than two steps. Of two readings, the one whose
    error bound is the smaller:

    * step to step (:func:`drain_rate`): exact in the packets' sizes, but a step is seen only at the
      read after it, so each end of its time is uncertain by the gap before the read that saw it;
      relative bound, the two gaps over its time. Tight where steps are far apart next to the reads
      (a few Mbit/s).
    * read to read, the bytes between the reads of the first step and the last over their time: each count is
      timed by its own read, and a busy shaper moves its rate times that time but for the packet in
      flight at each end, so at most one packet (:data:`GSO_MAX_BYTES`) off; relative bound, that
      packet over the bytes. Tight where many packets pass in the window (100 Mbit/s and up over 0.4 s).

    Step to step alone, the end-to-end cluster's probes read r = 0.01 of 10 Gbit/s at 0.84-1.11 of
    itself, more than a busy shaper can pass: the reads' times moved it, not the packets. On the
    probe's own reads beside two busy loops the choice halved the spread
    (docs/history/2026-12-01-shaped-reads.md)."""
    def late(i: int) -> bool:
        return samples[i][0] - samples[i - 1][0] > LATE_READ * typical

    idx = list(idx)
    while len(idx) > 2 and late(idx[-1]):
        idx.pop()
    while len(idx) > 2 and late(idx[1]):
        idx.pop(0)
    steps = [i for i in idx[1:] if samples[i][1] != samples[i - 1][1]]
    if len(steps) < 2:
        return None
    a, b = steps[0], steps[-1]
    stepped = samples[steps[-2]][1] - samples[a - 1][1], samples[b][0] - samples[a][0]
    gaps = (samples[a][0] - samples[a - 1][0]) + (samples[b][0] - samples[b - 1][0])
    # read to read between the reads of the first step and the last, so that a counter standing
    # still at either end (a load not yet arrived, or ended) adds no time; from the second step when
    # the first one's read came late: it is timed at the middle of a call that waited for the
    # interpreter, when its count may have been taken at the call's start
    first = steps[1] if late(a) and len(steps) > 2 else a
    moved = samples[b][1] - samples[first][1]
    if GSO_MAX_BYTES / moved < gaps / stepped[1]:
        return moved, samples[b][0] - samples[first][0]
    return stepped


def step_rate(samples: Sequence[tuple[float, int]], t0: float, t1: float) -> float:
    """Bit/s through a byte counter sampled as (time, bytes) over [t0, t1), read from its first
    step in the window to its last (:func:`drain_rate`): a plain delta over the window would be off
    by up to a step at each end (docs/verified.md "htb counts GSO packets whole"). The window's
    first read is where the count starts. Late reads at either end are left out
    (:data:`LATE_READ`): the step of a late last read lumps the packets of its gap, which the
    step-to-step reading leaves out while counting the gap's time (5 Mbit/s read as 2.81 beside a
    CPU hog, 2026-11-30); at the start, one is counted whole, its gap's packets without their time.
    With fewer than two steps, the plain delta: 0 where nothing moved."""
    inside = [i for i, (t, _) in enumerate(samples) if t0 <= t < t1]
    if len(inside) < 2:
        raise ValueError(f"no two counter samples in [{t0:.3f}, {t1:.3f}): the sampler did not run")
    got = _stepped(samples, inside, _typical_gap(samples, inside))
    if got is not None:
        return got[0] * 8 / got[1]
    (ta, ba), (tb, bb) = samples[inside[0]], samples[inside[-1]]
    return (bb - ba) * 8 / (tb - ta)


def busy_rate(samples: Sequence[tuple[float, int, int | None]]) -> tuple[float, float]:
    """(bit/s, seconds read busy) of a shaper from reads of (time, bytes, bytes queued), the queue
    None where it says nothing (an unshaped counter, a link down): step to step as :func:`step_rate`,
    over the stretches between the ones whose reads found its queue empty for IDLE_S or longer. A
    shaper whose queue stays empty is idle below its rate: its load did not keep up (a probe starved
    of the CPU on a loaded host, on the 2-core machine beside four engines: r = 0.01 of 10 Gbit/s read
    0.31 and 0, 2026-11-30), so those reads say what the load offered, not what the link carries.
    Shorter empty stretches are the load's own pacing against a shallow queue (an ifb's holds 32
    packets) and stay in. Without a busy stretch of two steps, every read counts (:func:`step_rate`),
    and the seconds busy are 0 where the queue was read."""
    pairs = [(t, n) for t, n, _ in samples]
    if len(samples) < 2:
        raise ValueError(f"{len(samples)} counter read(s): a rate needs two")
    queued = [q for _, _, q in samples]
    if all(q is None for q in queued):
        return step_rate(pairs, samples[0][0], float("inf")), samples[-1][0] - samples[0][0]
    # stretches of reads alike in finding the queue empty; an empty one stops the run when it lasts
    # IDLE_S or more, or opens or closes the window (the load not arrived yet, or ended)
    stretches = [(empty, [i for i, _ in g]) for empty, g in groupby(enumerate(queued), key=lambda x: x[1] == 0)]
    last = len(queued) - 1
    stops = [empty and (idx[0] == 0 or idx[-1] == last or pairs[idx[-1]][0] - pairs[idx[0]][0] >= IDLE_S)
             for empty, idx in stretches]
    runs = [[i for _, (_, idx) in group for i in idx]
            for stop, group in groupby(zip(stops, stretches), key=lambda x: x[0]) if not stop]
    typical = _typical_gap(pairs, range(len(pairs)))
    spans = [s for s in (_stepped(pairs, r, typical) for r in runs if len(r) >= 3) if s is not None]
    busy_s = sum(s for _, s in spans)
    if busy_s > 0:
        return sum(b for b, _ in spans) * 8 / busy_s, busy_s
    return step_rate(pairs, samples[0][0], float("inf")), 0.0
