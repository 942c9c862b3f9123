"""A compute fault as the engine felt it: its own prefill and decode steps, timed before and after.

A GPU compute fault locks the SM clocks (testbed/faults/gpu.py), and the clock ratio is not the
slow-down: a decode step is mostly bound by memory bandwidth and kernel launches, which a lower SM
clock slows by less, and an idle GPU parks its clock below any lock (docs/verified.md read a ratio
of about 5.7 on an idle H200 with no lock set). What the simulator's compute fault models is the
engine's step taking longer (core/engine_timing.py), so the testbed records that: the pod's
engines each run probe requests (:func:`probe_prompt`, a plain ``Engine.decode``) before the
fault and after each change, and the recorded factor is the ratio of their medians
(:func:`felt_slowdown`), the clock ratio beside it (faults.parquet ``clock_ratio``).

Each engine is judged on its own work: a prefill engine on its prefill time (the probe's first
token, queueing behind the batch it joined included: what the engine's requests feel), a decode
engine on its decode step (the median gap between the probe's tokens). The pod's figure is its
least slowed engine's, as the clock ratio is its least slowed GPU's. The probe shares the batch of
whatever runs: under load its step is the loaded step, before and after alike.

Nothing here imports vLLM or reads a clock: the times are the engine's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.engines.prompts import prompt_ids
from vocab import ROLE_PREFILL

# A probe: a prompt of two 128-token KV blocks (the CPU build's block, testbed/router/flow.py;
# 8 of the CUDA build's 16) and 16 decode steps after the first token. Its median step is read
# from 16 gaps, so one host stall moves it by one rank, not the figure; the prefill figure is
# the median of PROBES requests for the same reason.
PROMPT_TOKENS = 256
STEPS = 16
PROBES = 3
PROBE_SALT = 0xFE17  # the probes' prompts apart from any request's (salted by the run's seed)


class FeltError(ValueError):
    """Probe times that cannot give a slow-down; the message is one line."""


@dataclass(frozen=True)
class StepTimes:
    """One probe request's times on its engine: the first token after submission, and the median
    gap between its later tokens (one decode step each)."""

    prefill_s: float
    step_s: float

    @classmethod
    def from_times(cls, submitted_s: float, first_token_s: float | None, token_times: Sequence[float]) -> StepTimes:
        """From a decode's times (``DecodeResult``: submitted, first token, each output's arrival)."""
        if first_token_s is None or len(token_times) < 3:
            raise FeltError(f"a probe needs a first token and at least two steps after it, got "
                            f"{len(token_times)} output(s)")
        gaps = [b - a for a, b in zip(token_times[1:], token_times[2:])]  # after the first token's output
        return cls(first_token_s - submitted_s, statistics.median(gaps))


def probe_prompt(seed: int, vocab: int) -> list[int]:
    """Probe ``seed``'s prompt: PROMPT_TOKENS ids, distinct per seed (the testbed's own prompts under a
    salt of their own), so that no probe finds another's KV in the prefix cache: a cached prefill
    would time nothing."""
    return prompt_ids(seed, PROMPT_TOKENS, vocab, salt=PROBE_SALT)


def engine_figure(times: Sequence[StepTimes], role: str) -> float:
    """The median of an engine's probes on its own work: prefill time (``prefill`` role) or decode step."""
    if not times:
        raise FeltError("no probe times")
    return statistics.median(t.prefill_s if role == ROLE_PREFILL else t.step_s for t in times)


def felt_slowdown(before: Sequence[Sequence[StepTimes]], after: Sequence[Sequence[StepTimes]],
                  roles: Sequence[str]) -> float:
    """The pod's slow-down as its engines felt it: per engine, the median of its probes after over
    before on its own work, and of those the least (its least slowed engine). ``before[k]`` and
    ``after[k]`` are engine k's probes, ``roles[k]`` its role. NaN for a pod with no engine."""
    if not (len(before) == len(after) == len(roles)):
        raise FeltError(f"probe times for {len(before)} and {len(after)} engines, roles for {len(roles)}")
    ratios = []
    for b, a, role in zip(before, after, roles):
        base = engine_figure(b, role)
        if not (base > 0 and math.isfinite(base)):
            raise FeltError(f"a {role} engine's baseline probe time is {base}")
        ratios.append(engine_figure(a, role) / base)
    return min(ratios) if ratios else math.nan
