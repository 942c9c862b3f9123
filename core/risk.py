"""The slow loop's pod-level risk price.

    pi_j(t) = alpha * util_j(t) + beta * (1 - bw_j(t) / bw0_j) + gamma * timeout_rate_j(t) + eta * failure_rate_j(t)

Timeout and failure rates are over a sliding window of finished requests
(time buckets in a ring, so an observation is O(1) and an update O(window)).
Observations count into Python lists for the bucket they fall in, which join
the ring when the bucket changes or a price is computed: an observation (one
per request) is then two list increments, and as the counts are whole numbers
the sums are exactly those of counting into the ring directly.
A finished request counts against every pod it touched; a failure is charged
to the pod(s) of the stage it failed in, by the one blame rule of
:mod:`core.stages` (``blamed_pods``).
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from vocab import OK, TIMEOUT
from .policies.weights import Weights
from .stages import blamed_pods


@dataclass(frozen=True)
class PriceComponents:
    price: np.ndarray
    util: np.ndarray
    bw_term: np.ndarray  # NaN where telemetry gives no bandwidth
    timeout_rate: np.ndarray
    failure_rate: np.ndarray


class RiskPriceEstimator:
    def __init__(self, n_pods: int, weights: Weights, window_s: float, bucket_s: float) -> None:
        if window_s <= 0 or bucket_s <= 0:
            raise ValueError("risk price: window_s and bucket_s must be positive")
        self.w = weights
        self.bucket_s = bucket_s
        self.n_buckets = max(1, math.ceil(window_s / bucket_s))
        self._ids = np.full(self.n_buckets, -1, dtype=np.int64)  # absolute bucket held by each ring slot
        self._total = np.zeros((self.n_buckets, n_pods))
        self._timeouts = np.zeros((self.n_buckets, n_pods))
        self._failures = np.zeros((self.n_buckets, n_pods))
        self._n_pods = n_pods
        self._bucket: int | None = None  # the absolute bucket of the counts not yet in the ring
        self._new_total = [0] * n_pods
        self._new_timeouts = [0] * n_pods
        self._new_failures = [0] * n_pods

    def _slot(self, b: int) -> int:
        """The ring slot of absolute bucket ``b``, emptied if it held an older bucket (one that left the window)."""
        s = b % self.n_buckets
        if self._ids[s] != b:
            self._ids[s] = b
            self._total[s] = 0.0
            self._timeouts[s] = 0.0
            self._failures[s] = 0.0
        return s

    def _commit(self) -> None:
        """Add the counts not yet in the ring to their bucket's slot."""
        if self._bucket is None:
            return
        s = self._slot(self._bucket)
        n = self._n_pods
        for ring, new in ((self._total, self._new_total), (self._timeouts, self._new_timeouts),
                          (self._failures, self._new_failures)):
            ring[s] += new
            new[:] = [0] * n
        self._bucket = None

    def observe(self, now: float, prefill_pod: int, decode_pod: int, outcome: str, stage: str | None) -> None:
        """Count one finished request (any outcome) against the pods it touched."""
        b = int(now // self.bucket_s)
        if b != self._bucket:
            self._commit()
            self._bucket = b
        total = self._new_total
        if prefill_pod != -1:
            total[prefill_pod] += 1
        if decode_pod != -1 and decode_pod != prefill_pod:
            total[decode_pod] += 1
        if outcome == OK:
            return
        counts = self._new_timeouts if outcome == TIMEOUT else self._new_failures
        for p in blamed_pods(stage, prefill_pod, decode_pod):
            counts[p] += 1

    def update(self, now: float, util: np.ndarray, bw: np.ndarray | None, bw0: np.ndarray,
               overdue: np.ndarray | None = None) -> PriceComponents:
        """Prices at ``now`` from utilisation and telemetry (``bw`` None: no bandwidth term);
        ``overdue``: per pod, requests still in flight that count as timeouts for now
        (core/in_flight.py), added to the window's timeouts and requests."""
        self._commit()
        cur = int(now // self.bucket_s)
        live = (self._ids > cur - self.n_buckets) & (self._ids <= cur)
        total = self._total[live].sum(axis=0)
        timeouts = self._timeouts[live].sum(axis=0)
        if overdue is not None:
            total = total + overdue
            timeouts = timeouts + overdue
        denom = np.maximum(total, 1.0)
        timeout_rate = timeouts / denom
        failure_rate = self._failures[live].sum(axis=0) / denom
        w = self.w
        price = w.alpha * util + w.gamma * timeout_rate + w.eta * failure_rate
        if bw is None:
            bw_term = np.full_like(util, np.nan)
        else:
            bw_term = np.clip(1.0 - bw / bw0, 0.0, 1.0)
            price = price + w.beta * bw_term
        return PriceComponents(price, util, bw_term, timeout_rate, failure_rate)
