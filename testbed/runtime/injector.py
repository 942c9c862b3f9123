"""The spec's fault schedule on the wall clock: the testbed's counterpart of the
simulator's ``ClusterSim._faults``, at the same offsets from run start.

At each change time of :class:`faults.schedule.FaultSchedule` the injector
works out what every pod should have (residual rate of its uplink and downlink,
CPU slow-down: overlapping faults compose as in the simulator, smallest r and
largest slow-down win), makes it so through the pods' fault agents, measures
what it got, and then:

* writes one ``faults`` row per scheduled event and target, with the measured
  rate or factor;
* gives the router the ground truth (``set_truth``), the measured bandwidth
  (``observe_bandwidth``: the telemetry; ``delayed`` and ``none`` act on it in
  :class:`faults.telemetry.BandwidthTelemetry`, as in the simulator) and a
  health-label update, so labels see the onset at once and then follow the
  label model's delays.

Measuring a link, both directions at once: the pod's agent offers probe
datagrams at 1.5x the limit to the head (uplink) and reads its counters; for the
downlink the head's agent offers them to the pod while the pod's agent reads its
ingress shaper's. The counters are the limited class's (with ``kv_only`` the
interface also carries unshaped traffic), read from one step of the shaper to
the last over 0.4 s, or up to 2 s at a few Mbit/s, where the shaper releases
64 KiB GSO packets a good part of a second apart. The probe competes with KV
traffic meanwhile. Clearing is measured the same way at twice the old limit: a
probe that gets through at 1.5x or more proves the limit gone (Python cannot fill
a 10 Gbit/s baseline, so the row then reads 1.0, and the telemetry the baseline).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from faults.schedule import FaultSchedule
from faults.spec import LinkFault

from ..records import FaultEvent
from ..routing import Router
from ..spec import ExperimentSpec

MEASURE_WINDOW_S = 0.4  # at least; longer at low rates (see _window)
MAX_PROBE_BPS = 2e9  # what a Python probe can offer on this kind of machine
CLEARED_IF_ABOVE = 1.5  # a probe at 2x the removed limit that gets 1.5x through: the limit is gone


@dataclass
class PodTargets:
    """Where a pod's faults act: its agent, address, interface and engine processes."""

    agent: Any
    ip: str
    ifname: str
    pids: list[int]


class FaultInjector:
    def __init__(self, spec: ExperimentSpec, schedule: FaultSchedule, pods: list[PodTargets], head_agent: Any,
                 head_ip: str, router: Router, sink: Callable[[Any], None], now: Callable[[], float],
                 baseline_bps: float) -> None:
        self.spec, self.schedule, self.pods = spec, schedule, pods
        self.head_agent, self.head_ip = head_agent, head_ip
        self.router, self.sink, self.now = router, sink, now
        self.baseline_bps = baseline_bps
        n = schedule.n_pods
        self.up, self.down, self.slow = np.ones(n), np.ones(n), np.ones(n)
        # Measured residual factor per pod and side: the telemetry reports the narrower one.
        self.measured = {"uplink": np.ones(n), "downlink": np.ones(n)}
        self._events = schedule.events()
        self._k = 0
        self._ttl_margin = spec.testbed.fault_ttl_margin_s
        self._stop = asyncio.Event()

    # --- the schedule -----------------------------------------------------
    async def run(self) -> None:
        """Walk the schedule from run start (``now() == 0``) to its last clear, or until :meth:`stop`."""
        for t in self.schedule.change_times():
            delay = float(t) - self.now()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if self._stop.is_set():
                return  # between steps: what is applied is exactly self.up/down/slow
            due = []
            while self._k < len(self._events) and self._events[self._k].time_s <= t:
                due.append(self._events[self._k])
                self._k += 1
            await self.step(float(t), due)

    def stop(self) -> None:
        """Stop after the step in progress (never in the middle of one)."""
        self._stop.set()

    async def finish(self) -> None:
        """The run ended before the schedule did: clear what is on now, recording those clears
        (faults that never started are dropped, as they never happened)."""
        pending = self._events[self._k:]
        self._k = len(self._events)
        started = [ev for ev in pending if ev.event == "clear" and ev.time_s - self.spec.faults[ev.fault_id].duration_s
                   < self.now()]
        if started or (self.up < 1).any() or (self.down < 1).any() or (self.slow > 1).any():
            end = self.schedule.window()
            await self.step(end[1] if end else self.now(), started)

    async def step(self, t: float, events: list[Any]) -> None:
        """Make the cluster match the schedule at time ``t``, record ``events`` with what was measured."""
        sched = self.schedule
        up, down = sched.link_factors_at(t)
        slow = sched.slowdown_at(t)
        changed = np.flatnonzero((up != self.up) | (down != self.down) | (slow != self.slow))
        # The truth changes with the schedule, as in the simulator: the oracle and the label
        # model see it now, not after the agents have acted and measured (about a second).
        self.router.set_truth(sched.degraded_at(t, self.spec.health))
        self.router.health_tick(self.now())
        results = await asyncio.gather(*(self._make_pod(int(p), t, up[p], down[p], slow[p]) for p in changed))
        measured = dict(zip(changed.tolist(), results))
        self.up, self.down, self.slow = up, down, slow
        now = self.now()
        for ev in events:
            m = measured.get(ev.pod, {})
            for target, value, value_bps in self._rows(ev, m):
                # the row's time: when the agent had acted (the measurement comes after)
                self.sink(FaultEvent(m.get("acted_s", now), ev.fault_id, ev.event, ev.kind, ev.pod, target,
                                     ev.severity, value, value_bps))
        bw = np.minimum(self.measured["uplink"], self.measured["downlink"]) * self.baseline_bps
        self.router.observe_bandwidth(now, bw / 8)  # the router's bandwidths are bytes/s

    def _rows(self, ev: Any, m: dict[str, Any]) -> list[tuple[str, float, float]]:
        name = f"pod{ev.pod}"
        if ev.kind == "compute":
            return [(f"{name}:cpu", float(m.get("compute", np.nan)), np.nan)]
        f = self.spec.faults[ev.fault_id]
        assert isinstance(f, LinkFault)
        ifname = self.pods[ev.pod].ifname
        rows = []
        for side, direction in (("uplink", "egress"), ("downlink", "ingress")):
            if getattr(f, side):
                bps = float(m.get(side, np.nan))
                rows.append((f"{name}:{ifname}/{direction}", float(m.get(side + "_factor", np.nan)), bps))
        return rows

    # --- one pod ----------------------------------------------------------
    def _ttl(self, t: float) -> float:
        """Until the last scheduled clear of anything active now, plus the margin."""
        ends = [f.end_s for f in self.spec.faults if f.start_s <= t < f.end_s]
        return max(ends, default=t) - t + self._ttl_margin

    def _link_options(self, pod: int, t: float, side: str) -> dict[str, Any]:
        """kv_only, delay and loss of the strictest active link fault on that side of the pod."""
        active = [f for f in self.spec.faults if isinstance(f, LinkFault) and pod in f.pods
                  and f.start_s <= t < f.end_s and getattr(f, side)]
        if not active:
            return {}
        f = min(active, key=lambda f: f.residual_bw)
        return {"kv_only": f.kv_only, "delay_ms": f.delay_ms, "loss": f.loss}

    async def _make_pod(self, pod: int, t: float, up: float, down: float, slow: float) -> dict[str, Any]:
        tg = self.pods[pod]
        out: dict[str, Any] = {}
        sides = [(side, new, old) for side, new, old in (("uplink", up, self.up[pod]), ("downlink", down, self.down[pod]))
                 if new != old]
        for side, new, old in sides:
            key = f"link-{side}"
            if new < 1:
                await tg.agent.apply_link.remote(key, tg.ifname, [side], new * self.baseline_bps, self._ttl(t),
                                                 **self._link_options(pod, t, side))
            else:
                await tg.agent.clear.remote(key)
        if sides:
            out["acted_s"] = self.now()
            # Both directions at once (separate traffic and counters). A new limit is offered
            # 1.5x itself (enough to saturate it, little to queue behind it); a removed one
            # twice itself, to show it gone.
            offered = [min((1.5 if new < 1 else 2.0) * min(new, old) * self.baseline_bps, MAX_PROBE_BPS)
                       for _, new, old in sides]
            rates = await asyncio.gather(*(self._measure(tg, side, o) for (side, _, _), o in zip(sides, offered)))
            for (side, new, old), bps in zip(sides, rates):
                if new < 1:
                    factor = bps / self.baseline_bps
                else:
                    factor = 1.0 if bps >= CLEARED_IF_ABOVE * old * self.baseline_bps else bps / self.baseline_bps
                out[side], out[side + "_factor"] = bps, factor
                self.measured[side][pod] = min(factor, 1.0)
        if slow != self.slow[pod]:
            if slow > 1:
                out["compute"] = await tg.agent.apply_compute.remote("compute", tg.pids, float(slow), self._ttl(t))
            else:
                res = await tg.agent.clear.remote("compute")
                out["compute"] = float(res) if res is not None else np.nan
            out.setdefault("acted_s", self.now())
        return out

    @staticmethod
    def _window(offered_bps: float) -> float:
        """Long enough for about eight 64 KiB (GSO) packets, the shaper's step size."""
        return float(np.clip(8 * 65536 * 8 / (offered_bps / 2), MEASURE_WINDOW_S, 2.0))

    async def _measure(self, tg: PodTargets, side: str, offered_bps: float) -> float:
        window = self._window(offered_bps)
        if side == "uplink":
            return await tg.agent.measure_uplink.remote(tg.ifname, self.head_ip, offered_bps, window)
        blast = self.head_agent.blast.remote(tg.ip, offered_bps, window + 0.3)
        rate = await tg.agent.measure_downlink.remote(tg.ifname, window)
        await blast
        return rate
