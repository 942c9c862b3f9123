"""A per-pod circuit breaker, the router option sgl-router offers (off by default there too).

Each pod's breaker is sgl-router's (``sgl-router/src/core/circuit_breaker.rs``), with the pod as
its unit since the pod is what this project blames (:func:`core.stages.blamed_pods`):

* closed: requests go to the pod; ``failure_threshold`` failures blamed on it in a row open it;
* open: the router keeps the pod out of every choice for ``open_s`` (as a filter, beside the
  health mask), then half-opens it;
* half-open: requests go to it again; ``success_threshold`` successes in a row close it, one
  failure opens it again.

A success counts for every pod an ``ok`` request went through; a failure for the pods its stage
blames (a request failed elsewhere leaves a pod's count alone). Both worlds drive it through
:class:`core.routing.Router` with their own clock, and every transition becomes a record.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .records import BreakerRecord

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class PodBreakers:
    def __init__(self, n_pods: int, failure_threshold: int, success_threshold: int, open_s: float,
                 sink: Callable[[BreakerRecord], None]) -> None:
        self.failure_threshold, self.success_threshold, self.open_s = failure_threshold, success_threshold, open_s
        self.sink = sink
        self.state = [CLOSED] * n_pods
        self._failures = [0] * n_pods
        self._successes = [0] * n_pods
        self._opened_at = [math.inf] * n_pods
        self.next_change_s = math.inf  # the earliest half-opening due (route() checks it cheaply)

    @property
    def blocked(self) -> np.ndarray:
        """The open pods: what the policies' filter removes (a new array, read only on a change)."""
        return np.array([s == OPEN for s in self.state])

    def _to(self, now: float, pod: int, state: str) -> None:
        self.state[pod] = state
        self._failures[pod] = self._successes[pod] = 0
        self._opened_at[pod] = now if state == OPEN else math.inf
        self.next_change_s = min(self._opened_at) + self.open_s
        self.sink(BreakerRecord(now, pod, state))

    def tick(self, now: float) -> bool:
        """Half-open the pods whose open time is over; True if any changed."""
        changed = False
        for pod, opened in enumerate(self._opened_at):
            if opened + self.open_s <= now:
                self._to(now, pod, HALF_OPEN)
                changed = True
        return changed

    def observe(self, now: float, ok_pods: tuple[int, ...], failed_pods: tuple[int, ...]) -> bool:
        """A request ended: a success for ``ok_pods``, a failure for ``failed_pods``; True if
        a pod opened or closed."""
        changed = False
        for pod in failed_pods:
            self._successes[pod] = 0
            self._failures[pod] += 1
            state = self.state[pod]
            if state == HALF_OPEN or (state == CLOSED and self._failures[pod] >= self.failure_threshold):
                self._to(now, pod, OPEN)
                changed = True
        for pod in ok_pods:
            self._failures[pod] = 0
            self._successes[pod] += 1
            if self.state[pod] == HALF_OPEN and self._successes[pod] >= self.success_threshold:
                self._to(now, pod, CLOSED)
                changed = True
        return changed
