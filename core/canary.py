"""Canaries: a sample of a run's requests whose tokens are checked against a reference.

A corrupted KV transfer fails silently: the decode engine reads whatever the prefill
engine's blocks hold (a pull that outlived its KV lease reads blocks already freed and
reused) and returns success. On the testbed the only proof is the tokens: a canary is
a request whose greedy output is compared with the same prompt decoded on one engine
alone (no transfer), computed before the run. The tiny model's logits are peaked
(testbed/engines/tiny_model.py), so equal KV gives equal tokens except at a numerical
near-tie, where bf16 rounding may pick the other of the top two; a divergence anywhere
else, or to any other token, means the KV was not the prompt's: outcome ``corrupt``
(core/records.py).

Pure functions of their inputs: the same verdict serves the PD probe at start-up and
the request flow during a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from vocab import CORRUPT

# A divergence is a near-tie where the reference's top-2 logprob gap is below this. One bf16
# step at a logit of 60 is 0.25 nats and about 5 % of the tiny model's steps keep a margin
# below 0.15 nats (testbed/engines/tiny_model.py); 1 nat leaves four bf16 steps of room while a
# wrong context flips tokens whose margin is the median 3.6 nats.
NEAR_TIE_NATS = 1.0

# A canary's verdict; "corrupt" is the outcome it gives its request (vocab CORRUPT), one word for both.
EQUAL, NEAR_TIE = "equal", "near_tie"
VERDICTS = (EQUAL, NEAR_TIE, CORRUPT)


class Reference(NamedTuple):
    """A canary's single-engine greedy output: its tokens and, per step, the gap between the top
    two logprobs (nats; NaN where the engine returned fewer than two) and the second choice (-1
    where not known)."""

    tokens: tuple[int, ...]
    gaps: tuple[float, ...]
    runner_up: tuple[int, ...] = ()


class Verdict(NamedTuple):
    verdict: str  # one of VERDICTS
    position: int  # the first differing token; -1 when equal
    gap: float  # the reference's top-2 gap there (NaN when equal)


def canary_ids(n_requests: int, n_canaries: int) -> list[int]:
    """The request ids checked as canaries: ``n_canaries`` spread evenly over the run (first and
    last included), so a fault window anywhere in it holds some."""
    k = min(max(n_canaries, 0), n_requests)
    if k == 0:
        return []
    return sorted({int(i) for i in np.linspace(0, n_requests - 1, k).round()})


def reference(tokens: Sequence[int], top_logprobs: Sequence[Sequence[float]],
              top_tokens: Sequence[Sequence[int]] = ()) -> Reference:
    """A Reference from an engine's greedy output, its top logprobs per step (sorted, highest
    first) and their tokens, as testbed.engines.engine.DecodeResult gives them."""
    toks = tuple(int(t) for t in tokens)
    gaps = tuple(float(t[0] - t[1]) if len(t) >= 2 else float("nan") for t in top_logprobs)
    runner_up = tuple(next((int(t) for t in top[:2] if int(t) != toks[i]), -1) if i < len(toks) else -1
                      for i, top in enumerate(top_tokens))
    return Reference(toks, gaps, runner_up)


def verdict(ref: Reference, got: Sequence[int], tie_nats: float = NEAR_TIE_NATS) -> Verdict:
    """``got`` against ``ref``, up to the shorter of the two: equal; diverged first at a near-tie,
    to the reference's second choice there (its gap below ``tie_nats``: numerics, not corruption;
    what follows is another context, so it is not compared); or corrupt. Where the reference does
    not know its second choice, the gap alone decides."""
    for i, (a, b) in enumerate(zip(got, ref.tokens)):
        if int(a) != b:
            gap = ref.gaps[i] if i < len(ref.gaps) else float("nan")
            second = ref.runner_up[i] if i < len(ref.runner_up) else -1
            tie = gap < tie_nats and (second < 0 or int(a) == second)
            return Verdict(NEAR_TIE if tie else CORRUPT, i, gap)
    return Verdict(EQUAL, -1, float("nan"))


def summary(references: Mapping[int, Reference], verdicts: Mapping[int, Verdict]) -> dict[str, Any]:
    """run.json's ``canaries``: the ids checked, how many got each verdict, how many never decoded to
    their end (no verdict: their outcome is a failure already) and where each divergence was."""
    out: dict[str, Any] = {"ids": sorted(references), "checked": len(verdicts), **{v: 0 for v in VERDICTS},
                           "unchecked": len(set(references) - set(verdicts))}
    for v in verdicts.values():
        out[v.verdict] += 1
    out["diverged"] = {str(i): {"verdict": v.verdict, "position": v.position,
                                "gap": None if math.isnan(v.gap) else round(v.gap, 4)}
                       for i, v in sorted(verdicts.items()) if v.verdict != EQUAL}
    return out
