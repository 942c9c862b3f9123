"""Health labels: the ground truth as an imperfect monitor would report it.

The model is a persistence detector with hysteresis plus two noise layers,
all per pod and vectorised over pods:

* detector: a degradation episode (onset = first update that sees the truth
  degraded) is labelled unhealthy at the first update ``>= onset +
  detection_delay_s`` if it is still going on then, like an alert rule's
  ``for:`` window: an episode shorter than the delay is never labelled. Each
  onset is missed outright with probability ``miss_prob``. After recovery
  the label clears at the first update ``>= recovery + clear_delay_s``;
  a pod that degrades again before then simply stays labelled.
* false positives: a pod that was truly healthy and unlabelled over the
  interval since the previous update starts a spurious unhealthy label with
  probability ``1 - exp(-rate * dt)`` (a Poisson process sampled at updates),
  cleared at the first update ``>= start + false_positive_duration_s``.
* flapping: a pod detected over the interval reads healthy for
  ``flap_duration_s`` by the same construction at ``flap_rate_per_s``.

A pod still inside a false positive (or flap) at the previous update cannot
start the next one before the following update, so every spurious episode is
visible in the label stream with its own duration.

Labels change only at :meth:`HealthLabelModel.update` calls; the driver calls
it every ``period_s`` (the simulator may also call it at the schedule's
change times so that onsets are seen exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from faults.spec import HealthSpec

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

    def update(self, now: float, truth: np.ndarray) -> list[LabelChange]:
        """Advance to ``now`` given the ground truth per pod; return the label rows to record.

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
