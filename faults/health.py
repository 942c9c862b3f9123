"""Health labels: what the router's mask reads, made as a monitor would make them.

Two detectors (``HealthSpec.model``), both per pod and vectorised over pods:

* ``checks`` (default), what production runs:

  - an **active probe** every ``probe_period_s`` (Kubernetes' readiness probe): its answer
    crosses the pod's core link and waits behind at most ``probe_queue_bytes`` of queue there,
    so its round trip is that over the link's current rate; above ``probe_timeout_s`` the probe
    fails; ``probe_failure_threshold`` failures in a row mark the pod down,
    ``probe_success_threshold`` successes in a row up again. A link at a fraction of its rate
    answers well within the timeout: only a (nearly) dead link fails the probe;
  - **passive outlier detection** on the requests' own outcomes (Envoy's
    ``consecutive_5xx``): ``outlier_consecutive_failures`` failures in a row charged to a pod
    (the router passes the pods of the one blame rule, ``core.stages.blamed_pods``; a timeout
    is a 504) eject it for
    ``outlier_base_ejection_s`` x the times it has been ejected (at most
    ``outlier_max_ejection_s``); a request that succeeds resets the count of the pods it
    touched; at most ``outlier_max_ejection_percent`` of the pods are ejected at once (at least
    one); ``miss_prob`` is the chance an ejection is not enforced; the multiplier drops by one
    per ``outlier_interval_s`` not ejected.

  Detection therefore depends on severity: a degradation that times no request out is never
  flagged.

* ``alert``: a persistence detector with hysteresis on the ground truth itself. A degradation
  episode (onset = first update that sees the truth degraded) is labelled unhealthy at the
  first update ``>= onset + detection_delay_s`` if it is still going on then, like an alert
  rule's ``for:`` window: an episode shorter than the delay is never labelled. Each onset is
  missed outright with probability ``miss_prob``. After recovery the label clears at the first
  update ``>= recovery + clear_delay_s``; a pod that degrades again before then simply stays
  labelled.

Two noise layers apply to either detector's output:

* false positives: a pod that was truly healthy and unlabelled over the
  interval since the previous update starts a spurious unhealthy label with
  probability ``1 - exp(-rate * dt)`` (a Poisson process sampled at updates),
  cleared at the first update ``>= start + false_positive_duration_s``.
* flapping: a pod detected over the interval reads healthy for
  ``flap_duration_s`` by the same construction at ``flap_rate_per_s``.

A pod still inside a false positive (or flap) at the previous update cannot
start the next one before the following update, so every spurious episode is
visible in the label stream with its own duration.

Labels change only at :meth:`HealthLabelModel.update` calls; the router calls
it every ``period_s`` and at the fault schedule's change times. Request outcomes reach
the checks through :meth:`HealthLabelModel.observe` as requests end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from faults.spec import HealthSpec
from vocab import ERROR, OK, TIMEOUT

# Clocks built from sums of float periods drift by ulps; an update that is due
# "exactly" at onset + delay must not be pushed to the next period by that.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class LabelChange:
    """One label row, same fields and order as ``core.records.HealthRecord``."""

    time_s: float
    pod: int
    unhealthy: bool  # the label as emitted to the router
    truth_degraded: bool  # the ground truth beside it


class _Checks:
    """The ``checks`` detector: active probe plus passive outlier ejection (module docstring)."""

    def __init__(self, spec: HealthSpec, n: int, rng: np.random.Generator) -> None:
        self.s, self.n, self.rng = spec, n, rng
        self.next_probe = 0.0
        self.fail_streak = np.zeros(n, np.int64)
        self.ok_streak = np.zeros(n, np.int64)
        self.probe_down = np.zeros(n, bool)
        # Failed requests in a row, per pod: a list, as every request ends with an update of it.
        self.consecutive = [0] * n
        self.ejected_until = np.full(n, -np.inf)
        self.times_ejected = np.zeros(n, np.int64)  # Envoy's ejection multiplier
        self.last_interval = 0.0
        self.max_ejected = max(1, int(n * spec.outlier_max_ejection_percent / 100.0))

    def observe(self, now: float, touched: Sequence[int], blamed: Sequence[int], outcome: str) -> None:
        if outcome == OK:
            consecutive = self.consecutive
            for p in touched:
                if p != -1:
                    consecutive[p] = 0
            return
        if outcome not in (TIMEOUT, ERROR):  # a rejection is the router's, not the pod's
            return
        s = self.s
        for p in sorted(set(blamed) - {-1}):
            self.consecutive[p] += 1
            if self.consecutive[p] < s.outlier_consecutive_failures or self.ejected_until[p] > now:
                continue
            if int((self.ejected_until > now).sum()) >= self.max_ejected:
                continue  # at the cap: the next failure tries again
            self.consecutive[p] = 0
            if s.miss_prob > 0 and self.rng.random() < s.miss_prob:
                continue  # detected, not enforced
            self.times_ejected[p] += 1
            self.ejected_until[p] = now + min(s.outlier_base_ejection_s * self.times_ejected[p],
                                              max(s.outlier_base_ejection_s, s.outlier_max_ejection_s))

    def update(self, now: float, link_Bps: np.ndarray | None) -> np.ndarray:
        s = self.s
        while self.next_probe <= now + _EPS:
            if link_Bps is None:
                rtt = np.zeros(self.n)
            else:
                with np.errstate(divide="ignore"):
                    rtt = np.where(link_Bps > 0, s.probe_queue_bytes / np.maximum(link_Bps, 1e-300), np.inf)
            failed = rtt > s.probe_timeout_s
            self.fail_streak = np.where(failed, self.fail_streak + 1, 0)
            self.ok_streak = np.where(failed, 0, self.ok_streak + 1)
            self.probe_down = (self.probe_down | (self.fail_streak >= s.probe_failure_threshold)) \
                & ~(self.ok_streak >= s.probe_success_threshold)
            self.next_probe += s.probe_period_s
        ejected = self.ejected_until > now
        intervals = int((now - self.last_interval) // s.outlier_interval_s)
        if intervals > 0:
            self.times_ejected = np.where(ejected, self.times_ejected, np.maximum(self.times_ejected - intervals, 0))
            self.last_interval += intervals * s.outlier_interval_s
        return self.probe_down | ejected


class HealthLabelModel:
    """Turns per-pod ground truth into labels (True = unhealthy)."""

    def __init__(self, spec: HealthSpec, n_pods: int, rng: np.random.Generator) -> None:
        if int(n_pods) != n_pods or n_pods < 1:
            raise ValueError(f"n_pods must be a positive integer, got {n_pods!r}")
        self.spec = spec
        self.n_pods = n = int(n_pods)
        self._rng = rng
        self._last: float | None = None
        self._truth = np.zeros(n, dtype=bool)
        self._detected = np.zeros(n, dtype=bool)  # the detector before noise
        self._missed = np.zeros(n, dtype=bool)  # current episode will never be detected
        self._onset = np.full(n, np.nan)  # start of the current episode
        self._recovered = np.full(n, np.nan)  # last time the truth went healthy
        self._fp_until = np.full(n, -np.inf)
        self._flap_until = np.full(n, -np.inf)
        self._labels = np.zeros(n, dtype=bool)
        self._labels.flags.writeable = False
        self._checks = _Checks(spec, n, rng) if spec.model == "checks" else None

    @property
    def labels(self) -> np.ndarray:
        """Current labels per pod (True = unhealthy); read-only, replaced at each update."""
        return self._labels

    @property
    def detected(self) -> np.ndarray:
        """The detector's state before false positives and flapping (a copy)."""
        return self._detected.copy()

    def _poisson_hits(self, rate: float, dt: float, eligible: np.ndarray) -> np.ndarray:
        if rate <= 0 or dt <= 0 or not eligible.any():
            return np.zeros(self.n_pods, dtype=bool)
        return eligible & (self._rng.random(self.n_pods) < -np.expm1(-rate * dt))

    def observe(self, now: float, touched: Sequence[int], blamed: Sequence[int], outcome: str) -> None:
        """A request ended, having touched the pods ``touched``; a failure is charged to ``blamed``
        (the router's blame rule). The ``checks`` detector's passive outlier detection counts it."""
        if self._checks is not None:
            self._checks.observe(now, touched, blamed, outcome)

    def update(self, now: float, truth: np.ndarray, link_Bps: np.ndarray | None = None) -> list[LabelChange]:
        """Advance to ``now`` given the ground truth per pod (and, for the probe, each pod's core
        link rate now, bytes/s; None: intact); return the label rows to record.

        The first call returns one row per pod (the initial state); later calls
        return rows for pods whose label or truth changed.
        """
        s = self.spec
        truth = np.asarray(truth, dtype=bool)
        if truth.shape != (self.n_pods,):
            raise ValueError(f"truth has shape {truth.shape}, expected ({self.n_pods},)")
        first = self._last is None
        if not first and now < self._last:
            raise ValueError(f"update at {now} s is before the previous one at {self._last} s")
        dt = 0.0 if first else now - self._last
        prev_truth, prev_detected, prev_labels = self._truth, self._detected, self._labels
        t = now + _EPS

        if self._checks is not None:
            detected = self._checks.update(now, None if link_Bps is None else np.asarray(link_Bps, float))
        else:
            onset = np.flatnonzero(truth & ~prev_truth)
            if onset.size:
                self._onset[onset] = now
                self._missed[onset] = (self._rng.random(onset.size) < s.miss_prob) if s.miss_prob > 0 else False
            recovery = ~truth & prev_truth
            self._recovered[recovery] = now
            self._onset[recovery] = np.nan

            # NaN onset / recovery compare False, so pods without an episode are untouched.
            detect = truth & ~self._missed & (t >= self._onset + s.detection_delay_s)
            clear = ~truth & (t >= self._recovered + s.clear_delay_s)
            detected = (prev_detected | detect) & ~clear

        # Poisson starts are drawn for the interval (previous update, now], so only
        # pods that spent it in the right state qualify: one still inside a flap or
        # false positive at the previous update waits one update before the next
        # can start, which keeps every spurious episode visible with its duration.
        t_prev = -np.inf if first else self._last + _EPS
        flap_prev = t_prev < self._flap_until
        fp_prev = t_prev < self._fp_until

        # A flap belongs to a detection; it must not carry over to a later one.
        self._flap_until[~detected] = -np.inf
        flapping = t < self._flap_until
        new_flap = self._poisson_hits(s.flap_rate_per_s, dt, prev_detected & detected & ~flap_prev)
        self._flap_until[new_flap] = now + s.flap_duration_s
        flapping |= new_flap

        fp = t < self._fp_until
        fp_eligible = ~prev_truth & ~truth & ~prev_detected & ~detected & ~fp_prev
        new_fp = self._poisson_hits(s.false_positive_rate_per_s, dt, fp_eligible)
        self._fp_until[new_fp] = now + s.false_positive_duration_s
        fp |= new_fp

        labels = (detected & ~flapping) | fp
        labels.flags.writeable = False
        self._truth, self._detected, self._labels, self._last = truth.copy(), detected, labels, float(now)

        pods = np.arange(self.n_pods) if first else np.flatnonzero((labels != prev_labels) | (truth != prev_truth))
        now_f = float(now)
        return [LabelChange(now_f, p, lab, tr) for p, lab, tr in zip(pods.tolist(), labels[pods].tolist(), truth[pods].tolist())]
