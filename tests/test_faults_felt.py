"""The GPU compute fault's factor from the engines' own step times (testbed/faults/felt.py).

Hand-made probe times stand for what the engines' decodes return: the factor must follow the
engine's own work (prefill time on a prefill engine, decode step on a decode engine), take the
median so one stalled probe does not decide it, and be the least slowed engine's, not the clock
ratio. The probes themselves run on real CPU engines in tests/test_runtime_engine.py.
"""

from __future__ import annotations

import math

import pytest

from testbed.faults.felt import (PROMPT_TOKENS, FeltError, StepTimes, engine_figure, felt_slowdown,
                                 probe_prompt)
from vocab import ROLE_DECODE, ROLE_PREFILL


def _decode(prefill_s: float, step_s: float, steps: int = 16, t0: float = 100.0) -> StepTimes:
    """A decode's times as the engine returns them: submitted t0, the first token prefill_s later,
    then one output per step."""
    first = t0 + prefill_s
    return StepTimes.from_times(t0, first, [first + k * step_s for k in range(steps + 1)])


def test_times_of_one_probe_are_its_first_token_and_its_median_step():
    t = StepTimes.from_times(10.0, 10.5, [10.5, 10.6, 10.7, 12.0, 12.1])  # one 1.3 s stall among the steps
    assert t.prefill_s == pytest.approx(0.5)
    assert t.step_s == pytest.approx(0.1)  # gaps after the first token: 0.1, 1.3, 0.1


def test_a_probe_without_steps_or_first_token_is_refused_in_one_line():
    with pytest.raises(FeltError, match="at least two steps"):
        StepTimes.from_times(0.0, 1.0, [1.0, 1.1])
    with pytest.raises(FeltError, match="first token"):
        StepTimes.from_times(0.0, None, [])


def test_each_engine_is_judged_on_its_own_work():
    # the clock slows prefill 2.5x (compute bound) and the decode step only 1.2x (memory bound)
    before = [[_decode(0.2, 0.010)] * 3, [_decode(0.2, 0.010)] * 3]
    after = [[_decode(0.5, 0.012)] * 3, [_decode(0.5, 0.012)] * 3]
    assert felt_slowdown(before, after, [ROLE_PREFILL, ROLE_PREFILL]) == pytest.approx(2.5)
    assert felt_slowdown(before, after, [ROLE_DECODE, ROLE_DECODE]) == pytest.approx(1.2)
    # a pod's figure is its least slowed engine's
    assert felt_slowdown(before, after, [ROLE_PREFILL, ROLE_DECODE]) == pytest.approx(1.2)


def test_one_stalled_probe_does_not_decide_the_factor():
    before = [[_decode(0.2, 0.01), _decode(0.2, 0.01), _decode(0.2, 0.01)]]
    after = [[_decode(0.4, 0.02), _decode(3.0, 0.02), _decode(0.4, 0.02)]]  # a host stall in one
    assert engine_figure(after[0], ROLE_PREFILL) == pytest.approx(0.4)
    assert felt_slowdown(before, after, [ROLE_PREFILL]) == pytest.approx(2.0)


def test_cleared_reads_about_one_and_bad_inputs_are_one_line_errors():
    base = [[_decode(0.2, 0.01)] * 3]
    assert felt_slowdown(base, [[_decode(0.2, 0.01)] * 3], [ROLE_DECODE]) == pytest.approx(1.0)
    assert math.isnan(felt_slowdown([], [], []))
    with pytest.raises(FeltError, match="1 and 2 engines"):
        felt_slowdown(base, base * 2, [ROLE_DECODE])
    with pytest.raises(FeltError, match="baseline probe time is 0"):
        felt_slowdown([[_decode(0.0, 0.0)]], base, [ROLE_DECODE])


def test_probe_prompts_differ_per_probe_so_no_prefix_cache_answers():
    a, b = probe_prompt(1, 2048), probe_prompt(2, 2048)
    assert len(a) == len(b) == PROMPT_TOKENS and a != b and a[:16] != b[:16]
    assert min(a + b) >= 4 and max(a + b) < 2048  # the special ids below 4 left alone
    assert probe_prompt(1, 2048) == a
