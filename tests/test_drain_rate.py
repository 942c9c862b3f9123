"""Reading a shaper's rate from its byte counter's steps (testbed/faults/shaping.py drain_rate)."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.faults.shaping import drain_rate

pytestmark = pytest.mark.background  # a computation (tests/conftest.py)


def released(sizes: list[int], rate_bps: float, t0: float = 3.0) -> list[tuple[float, int]]:
    """htb's steps for packets of ``sizes`` queued behind a busy class: each released once the
    class is out of debt, the next one the released packet's size over the rate later."""
    t, n, steps = t0, 0, []
    for size in sizes:
        n += size
        steps.append((t, n))
        t += size * 8 / rate_bps
    return steps


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


def test_the_count_before_the_first_step_is_where_it_starts():
    steps = released([64_000, 1_500, 64_000], 10e6)
    assert drain_rate([(t, n + 7_000) for t, n in steps], before=7_000) == pytest.approx(10e6)


def test_fewer_than_two_steps_are_refused_in_one_line():
    with pytest.raises(ValueError, match="1 counter step"):
        drain_rate([(0.0, 10)], before=0)
