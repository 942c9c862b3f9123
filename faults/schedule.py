"""The ground-truth fault timeline: which pod is degraded how, at any time.

A fault is active on its pods over the half-open interval
``[start_s, start_s + duration_s)``. Overlapping faults on one pod compose:
the smallest residual bandwidth factor and the largest slowdown win. An engine
fault's engines die at ``start_s`` (its ``apply``: the world kills them) and, with
``restart_s``, are started again then (its ``clear``); without, it has no end. It
changes no link or speed.

Both worlds walk the same timeline of :class:`FaultStep` (``FaultSchedule.steps``):
"at ``t``, every pod's links and CPU are so, the truth is so, these events
happen, and what is active ends by ``until_s``". A world only acts on its links
and CPUs and says what it measured (``core.run.RunContext``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from faults.spec import ComputeFault, EngineFault, FaultSpec, HealthSpec, LinkFault
from vocab import FAULT_COMPUTE, FAULT_ENGINE, FAULT_LINK, FaultKind

_DEFAULT_HEALTH = HealthSpec()


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One apply or clear of one fault on one pod (FaultEvent minus target/measured)."""

    time_s: float
    fault_id: int  # index of the fault in the spec list
    event: Literal["apply", "clear"]
    kind: FaultKind
    pod: int
    severity: float  # link: residual bandwidth factor r; compute: slowdown factor; engine: 0 (capacity left)


@dataclass(frozen=True, eq=False)
class FaultStep:
    """What holds from ``time_s`` until the next step."""

    time_s: float
    uplink: np.ndarray  # (P,) residual bandwidth factor of each pod's uplink (1.0 = intact)
    downlink: np.ndarray  # (P,) same for its downlink
    slowdown: np.ndarray  # (P,) compute slow-down factor (1.0 = none)
    degraded: np.ndarray  # (P,) ground truth under the health spec's thresholds
    changed: np.ndarray  # pod indices whose uplink, downlink or slowdown differ from the step before
    events: tuple[ScheduledEvent, ...]  # the applies and clears that happen at this step
    until_s: float  # the last scheduled end of anything active now (time_s if nothing is): a TTL's base

    @property
    def bw_factor(self) -> np.ndarray:
        """The narrower side of each pod's core links, as the bandwidth telemetry reports it."""
        return np.minimum(self.uplink, self.downlink)


class FaultSchedule:
    """Vectorised view of a fault list over ``n_pods`` pods (one row per fault x pod)."""

    def __init__(self, faults: Sequence[FaultSpec], n_pods: int) -> None:
        if int(n_pods) != n_pods or n_pods < 1:
            raise ValueError(f"n_pods must be a positive integer, got {n_pods!r}")
        self.n_pods = int(n_pods)
        self.faults: tuple[FaultSpec, ...] = tuple(faults)
        fault_id, pod, start, end, sev, is_link, is_compute, up, down = [], [], [], [], [], [], [], [], []
        for i, f in enumerate(self.faults):
            if not isinstance(f, (LinkFault, ComputeFault, EngineFault)):
                raise TypeError(f"fault {i}: expected LinkFault, ComputeFault or EngineFault, got {type(f).__name__}")
            for p in f.pods:
                if not 0 <= p < self.n_pods:
                    raise ValueError(f"fault {i} ({f.kind}): pod {p} out of range 0..{self.n_pods - 1}")
                fault_id.append(i)
                pod.append(p)
                start.append(f.start_s)
                end.append(f.end_s)
                sev.append(f.severity)
                is_link.append(f.kind == FAULT_LINK)
                is_compute.append(f.kind == FAULT_COMPUTE)
                up.append(f.kind == FAULT_LINK and f.uplink)
                down.append(f.kind == FAULT_LINK and f.downlink)
        self._fault_id = np.asarray(fault_id, dtype=np.int64)
        self._pod = np.asarray(pod, dtype=np.int64)
        self._start = np.asarray(start, dtype=np.float64)
        self._end = np.asarray(end, dtype=np.float64)
        self._sev = np.asarray(sev, dtype=np.float64)
        self._is_link = np.asarray(is_link, dtype=bool)
        self._is_compute = np.asarray(is_compute, dtype=bool)
        self._ends = np.isfinite(self._end)  # rows with a clear (an engine fault without a restart has none)
        self._is_engine = ~(self._is_link | self._is_compute)
        self._up = np.asarray(up, dtype=bool)
        self._down = np.asarray(down, dtype=bool)

    def _active(self, now: float) -> np.ndarray:
        return (self._start <= now) & (now < self._end)

    def bw_factor_at(self, now: float) -> np.ndarray:
        """Residual bandwidth factor per pod: min r of active link faults (either side), 1.0 if none."""
        return np.minimum(*self.link_factors_at(now))

    def link_factors_at(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Residual bandwidth factor per pod of its uplink and of its downlink."""
        active = self._active(now)
        out = []
        for side in (self._up, self._down):
            bw = np.ones(self.n_pods)
            m = active & side
            np.minimum.at(bw, self._pod[m], self._sev[m])
            out.append(bw)
        return out[0], out[1]

    def slowdown_at(self, now: float) -> np.ndarray:
        """Compute slowdown per pod: max of active compute faults, 1.0 if none."""
        slow = np.ones(self.n_pods)
        m = self._active(now) & self._is_compute
        np.maximum.at(slow, self._pod[m], self._sev[m])
        return slow

    def degraded_at(self, now: float, health: HealthSpec | None = None) -> np.ndarray:
        """Ground truth per pod: a link below ``min_residual_bw`` or a slowdown above ``min_slowdown``."""
        h = health or _DEFAULT_HEALTH
        # min r < threshold <=> some active r < threshold (same for max slowdown), so
        # the composed factors give the same answer as checking fault by fault.
        return (self.bw_factor_at(now) < h.min_residual_bw) | (self.slowdown_at(now) > h.min_slowdown)

    def events(self) -> list[ScheduledEvent]:
        """Every apply and clear, sorted by time; at equal times clears come before
        applies (intervals are half-open), then by fault id and pod."""
        rows = [
            (float(t), ev_order, int(fid), int(p), ev, self.faults[fid].kind, float(s))
            for t0, t1, fid, p, s in zip(self._start, self._end, self._fault_id, self._pod, self._sev)
            for t, ev_order, ev in ((t0, 1, "apply"), (t1, 0, "clear")) if np.isfinite(t)
        ]
        rows.sort(key=lambda r: r[:4])
        return [ScheduledEvent(t, fid, ev, kind, p, s) for t, _, fid, p, ev, kind, s in rows]

    def step_at(self, t: float, events: Sequence[ScheduledEvent], before: FaultStep | None,
                health: HealthSpec | None = None) -> FaultStep:
        """The step at ``t`` after ``before`` (None: the fault-free start)."""
        up, down = self.link_factors_at(t)
        slow = self.slowdown_at(t)
        if before is None:
            changed = (up != 1.0) | (down != 1.0) | (slow != 1.0)
        else:
            changed = (up != before.uplink) | (down != before.downlink) | (slow != before.slowdown)
        active = self._active(t) & self._ends & ~self._is_engine  # what a TTL must undo (a dead engine is not)
        until = float(self._end[active].max()) if active.any() else float(t)
        return FaultStep(float(t), up, down, slow, self.degraded_at(t, health), np.flatnonzero(changed),
                         tuple(events), until)

    def steps(self, health: HealthSpec | None = None) -> list[FaultStep]:
        """Every change of the timeline, in order, each with the events that happen then."""
        events, k, out = self.events(), 0, []
        for t in self.change_times():
            due = []
            while k < len(events) and events[k].time_s <= t:
                due.append(events[k])
                k += 1
            out.append(self.step_at(float(t), due, out[-1] if out else None, health))
        return out

    def closing_step(self, now: float, last: FaultStep | None, health: HealthSpec | None = None) -> FaultStep | None:
        """The run ends at ``now`` with ``last`` the step applied last: a step that clears whatever is
        still on, with the clear events (at ``now``) of the faults that had started. None if nothing is on."""
        if last is None or not ((last.uplink < 1).any() or (last.downlink < 1).any() or (last.slowdown > 1).any()):
            return None
        clears = [dataclasses.replace(ev, time_s=float(now)) for ev in self.events()  # (no engine's restart)
                  if ev.event == "clear" and ev.kind != FAULT_ENGINE and ev.time_s > last.time_s
                  and self.faults[ev.fault_id].start_s <= last.time_s]
        ones = np.ones(self.n_pods)
        changed = (last.uplink != 1.0) | (last.downlink != 1.0) | (last.slowdown != 1.0)
        return FaultStep(float(now), ones, ones.copy(), ones.copy(), np.zeros(self.n_pods, bool),
                         np.flatnonzero(changed), tuple(clears), float(now))

    def change_times(self) -> np.ndarray:
        """Sorted unique times at which the truth may change (every apply and clear)."""
        return np.unique(np.concatenate([self._start, self._end[self._ends]]))

    def window(self) -> tuple[float, float] | None:
        """(first apply, last clear; inf with an engine fault that never restarts), or None without faults."""
        if self._start.size == 0:
            return None
        return float(self._start.min()), float(self._end.max())

    def fault_pods(self) -> list[int]:
        """Pods named by any fault, sorted."""
        return [int(p) for p in np.unique(self._pod)]

    def __len__(self) -> int:
        return len(self.faults)
