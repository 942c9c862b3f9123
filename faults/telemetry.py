"""Bandwidth telemetry: what the risk price's bandwidth term gets to see.

The true bandwidth per pod is piecewise constant: each :meth:`observe` sets it
from that time on. ``direct`` shows the latest value, ``delayed`` the value in
force ``lag_s`` ago (``bw0`` before the first observation), ``none`` nothing
(:meth:`view` returns None and the price drops its bandwidth term).

A link change is observed when its measurement ends: a probe offered just above
the new limit (:func:`probe_offered_bps`) for :func:`probe_window_s`. The
testbed's fault agents measure with exactly these; the simulator hands the
router the new bandwidth that much after the change, so in both worlds the
price learns of a fault as late as the measurement allows.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from faults.spec import TelemetrySpec

# Same reason as in faults.health: summed float clocks drift by ulps.
_EPS = 1e-9
PROBE_MIN_S = 0.4  # at least this long (a few shaper steps at any rate)
PROBE_MAX_S = 2.0  # at a few Mbit/s the shaper's steps are this far apart
# A link going down (or back up) is probed as one at the study's smallest residual factor: nothing
# gets through a dead link either way, and the window is that of the slowest limit it shapes.
DOWN_PROBE_FACTOR = 0.01


def probe_offered_bps(new: float, old: float, baseline_bps: float) -> float:
    """The probe's rate for a link going from residual factor ``old`` to ``new``: a new limit is
    offered 1.5x itself (enough to saturate it, little to queue behind it), a removed one twice
    itself, to show it gone; a link going down or coming up (0 at either end) as one at
    DOWN_PROBE_FACTOR. At any rate: the testbed's load is paced TCP streams, which the kernel
    drives (testbed/faults/load.py)."""
    level = min(new, old) or DOWN_PROBE_FACTOR
    return (1.5 if new < 1 else 2.0) * level * baseline_bps


def probe_window_s(offered_bps: float) -> float:
    """How long a probe at ``offered_bps`` is read: about eight 64 KiB (GSO) packets, the
    shaper's step size (docs/verified.md "htb counts GSO packets whole": shorter windows read htb's
    debt, not its rate)."""
    return float(np.clip(8 * 65536 * 8 / (offered_bps / 2), PROBE_MIN_S, PROBE_MAX_S))


def link_measure_s(old: tuple[np.ndarray, np.ndarray], new: tuple[np.ndarray, np.ndarray], pods: np.ndarray,
                   baseline_bps: float) -> float:
    """How long measuring a fault step's link changes takes: the longest probe window over the
    changed pods' changed sides (uplink, downlink factors before and after); 0 without a change."""
    windows = [probe_window_s(probe_offered_bps(float(n[p]), float(o[p]), baseline_bps))
               for o, n in zip(old, new) for p in np.asarray(pods).tolist() if n[p] != o[p]]
    return max(windows, default=0.0)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)  # a copy: the caller may reuse its buffer
    a.flags.writeable = False
    return a


class BandwidthTelemetry:
    """Per-pod bandwidth as seen through ``spec.mode``; history bounded to ``lag_s``."""

    def __init__(self, spec: TelemetrySpec, bw0: np.ndarray) -> None:
        bw0 = _frozen(bw0)
        if bw0.ndim != 1 or bw0.size == 0 or not np.all(np.isfinite(bw0) & (bw0 > 0)):
            raise ValueError(f"bw0 must be a non-empty 1-D array of positive finite bandwidths, got shape {bw0.shape}")
        self.spec = spec
        self.bw0 = bw0
        self._times: list[float] = []
        self._values: list[np.ndarray] = []
        # Earliest time whose value is still known; older entries were dropped.
        self._floor = -np.inf

    @property
    def history_len(self) -> int:
        return len(self._times)

    def observe(self, now: float, bw: np.ndarray) -> None:
        """Record the true bandwidth per pod from ``now`` on (times non-decreasing)."""
        bw = _frozen(bw)
        if bw.shape != self.bw0.shape:
            raise ValueError(f"bw has shape {bw.shape}, expected {self.bw0.shape}")
        now = float(now)
        if self._times and now < self._times[-1]:
            raise ValueError(f"observation at {now} s is before the previous one at {self._times[-1]} s")
        if self.spec.mode != "delayed":
            self._times, self._values = [now], [bw]  # only the latest value is ever read
            return
        if self._values and np.array_equal(bw, self._values[-1]):
            return  # no change: the value in force already covers it
        if self._times and now == self._times[-1]:
            self._values[-1] = bw
        else:
            self._times.append(now)
            self._values.append(bw)
        # Future views are at >= now, so they read at >= now - lag: keep the entry
        # in force then and everything after it.
        k = bisect_right(self._times, now - self.spec.lag_s + _EPS) - 1
        if k > 0:
            del self._times[:k], self._values[:k]
            self._floor = self._times[0]

    def view(self, now: float) -> np.ndarray | None:
        """The bandwidth per pod the price may use at ``now`` (read-only), or None with mode ``none``."""
        mode = self.spec.mode
        if mode == "none":
            return None
        if mode == "direct":
            return self._values[-1] if self._values else self.bw0
        at = float(now) - self.spec.lag_s + _EPS
        if at < self._floor:
            raise ValueError(f"view at {now} s needs the bandwidth at {now - self.spec.lag_s} s, already dropped (history starts at {self._floor} s)")
        k = bisect_right(self._times, at) - 1
        return self._values[k] if k >= 0 else self.bw0
