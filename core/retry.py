"""Retries of a request's failed attempt on another pair: the router option sgl-router and Envoy offer
(``router.retry``, off by default).

An attempt fails (outcome ``error``), or its per-try time to first token passes (``attempt_ttft_s``:
it is given up there, a timeout of its stage). It is retried when all of these hold:

* the request has attempts left (``max_attempts`` counts the first);
* the client has been sent nothing yet (no first token): a router cannot take back streamed tokens;
* the retry, after its backoff, starts before the request's first-token limit (what the client
  waits for; the limit and the deadline themselves are never retried).

The failed attempt is learned by the router like any failure (risk price, labels, breaker) and is
recorded in ``attempts.parquet``; the request stays admitted (the admission limit counts it once)
and its record is its last attempt's, with ``attempts`` the number made. The next attempt avoids
the pods the earlier failures were blamed on (``avoid_blamed``). Both worlds drive this with their
own clock through :meth:`core.run.RunContext.end_attempt`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vocab import ERROR, TIMEOUT
from core.spec.model import RetrySpec
from .stages import blamed_pods
from .ticket import Ticket

# What a retry may follow: a failure (sgl-router retries 5xx statuses) or a given-up attempt
# (its per-try timeout; Envoy's 504). "ok" ends a request; "rejected" never made an attempt;
# "corrupt" looked like a success to the router (only a canary's check or the simulator knows).
RETRYABLE = frozenset({ERROR, TIMEOUT})


class NextAttempt(NamedTuple):
    """The retry of a request: when to route it again, as which attempt, avoiding which pods."""

    at_s: float
    attempt: int
    avoid: frozenset[int]


class Retries:
    def __init__(self, spec: RetrySpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self._rng = rng

    def _backoff_s(self, attempt: int) -> float:
        """The backoff after failed attempt ``attempt`` (0 = the first), before jitter."""
        s = self.spec
        return min(s.initial_backoff_s * s.backoff_multiplier ** attempt, s.max_backoff_s)

    def attempt_limit(self, t: Ticket, first_by: float) -> float:
        """When attempt ``t`` is given up without a first token: its per-try timeout, if a retry
        could follow it (attempts left, and its longest backoff ends before ``first_by``, the
        request's first-token limit); else the limit itself."""
        s = self.spec
        if s.attempt_ttft_s is None or t.attempt + 1 >= s.max_attempts:
            return first_by
        limit = t.routed_s + s.attempt_ttft_s
        return limit if limit + self._backoff_s(t.attempt) * (1 + s.jitter) < first_by else first_by

    def next_attempt(self, now: float, t: Ticket, outcome: str, first_by: float) -> NextAttempt | None:
        """The retry after attempt ``t`` ended at ``now`` with ``outcome``; None: the request ends
        with this attempt."""
        s = self.spec
        if outcome not in RETRYABLE or t.attempt + 1 >= s.max_attempts or t.first_token_s <= now:
            return None
        delay = self._backoff_s(t.attempt) * (1 + s.jitter * (2.0 * self._rng.random() - 1.0))
        if now + delay >= first_by:
            return None
        avoid = t.avoided | set(blamed_pods(t.stage, t.prefill_pod, t.decode_pod)) if s.avoid_blamed else t.avoided
        return NextAttempt(now + delay, t.attempt + 1, frozenset(avoid))
