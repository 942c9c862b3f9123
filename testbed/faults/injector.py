"""The fault timeline on the wall clock: how the testbed acts on a step.

The steps are the run context's (:class:`core.run.RunContext`, the same
:class:`faults.schedule.FaultStep` list the simulator walks, at the same offsets
from run start: what every pod should have, overlapping faults composed, the
truth, the events). At each step the context gives the router the truth and a
label update; this injector then makes every changed pod so through its fault
agent, measures what it got, and hands the context one ``faults`` row per event
and direction with the measured rate or factor, and the measured bandwidth for
the telemetry (``delayed`` and ``none`` act on it in
:class:`faults.telemetry.BandwidthTelemetry`, as in the simulator).

Measuring a link, both directions at once, under a load that fills the limit
(testbed/faults/load.py: paced TCP streams offering 1.5x the limit): for the
uplink the pod's agent sends it to its peer (testbed/faults/probe_paths.py: the
head's agent, or another node's, reached through the shaped interface) and reads
its counters; for the downlink the peer sends it to the pod's address on that
interface while the pod's agent reads its ingress shaper's. The counters are the
limited class's (with ``kv_only`` the interface also carries unshaped traffic),
read from one step of the shaper to the last over 0.4 s, or up to 2 s at a few
Mbit/s, where the shaper releases 64 KiB GSO packets a good part of a second
apart: the rate the link carried, at any rate the NIC has, never the rate set.
The load competes with KV traffic meanwhile. Clearing is measured the same way at
twice the old limit: a load that gets through at 1.5x or more proves the limit
gone, and the row reads 1.0 (the baseline is not the probe's to reach). Both
directions set to one limit that read apart (SIDES_AGREE) are probed once more.

With ``testbed.transport: rdma`` and ``rdma_link_faults: dcb_maxrate`` a link fault is the NIC's rate
limit of the KV's traffic class (testbed/faults/dcb.py), which no host-side load crosses as the KV
does: its row records the rate the NIC configured, read back, never measured. A compute fault on
GPU engines records the slow-down the engines' own probe requests felt, the SM clock ratio beside
it (testbed/faults/felt.py).

An engine fault's engines are killed through their pod's agent (``kill_engine``: SIGKILL of the
process the fault names, which each engine actor reports), one row per engine, and with
``restart_s`` started again by their actors; the router learns of the deaths and of the restarted
engines from the engines themselves (testbed/router/flow.py Liveness), as in the simulator.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from core.run import FaultRow, RunContext
from faults.schedule import FaultStep, ScheduledEvent
from faults.spec import EngineFault, LinkFault
from faults.telemetry import probe_offered_bps, probe_window_s
from testbed.faults import felt
from testbed.faults.probe_paths import ProbePath
from vocab import FAULT_COMPUTE, FAULT_ENGINE, FAULT_LINK

log = logging.getLogger(__name__)

# The kinds of fault this injector acts on (a step's links and speeds; an engine fault's kills). A kind
# of the fault model not listed here is refused before any engine starts (testbed/runs/jobs.py).
INJECTED_KINDS = (FAULT_LINK, FAULT_COMPUTE, FAULT_ENGINE)

CLEARED_IF_ABOVE = 1.5  # a probe at 2x the removed limit that gets 1.5x through: the limit is gone
# The two directions of a pod's link set to one limit and probed at once read within this share of
# each other, or the probe runs again. In the end-to-end jobs' tables of five suites (2026-11-30,
# b1a0fe6 to 8e18f6f) every reading of r = 0.2, 0.05 and 0.01 of a 10 Gbit/s baseline lay within
# 0.947-1.045 of what the link carried but in two probes, whose directions read 24% and more apart
# (0.838 and 1.106 of r; 0.313 and 0), where the 23 other probes of a limit on both directions read
# them within 2.6% of each other; a sixth suite read a slower port's downlink at 0.54 of what it
# carried (docs/history/2026-11-30-ci-8e18f6f.md). Apart by more, a reading is off, or the link is
# (a slower port behind one side), which the second probe shows again. The simulator times one probe
# (faults.telemetry.link_measure_s): a second holds the testbed's later steps back by its length.
SIDES_AGREE = 0.10


@dataclass
class PodTargets:
    """Where a pod's faults act: its agent, interface and engine processes, the
    device its engines run on (which picks the compute throttle: never the host's hardware)
    and, on the CPU, the cores its engines compute on (a slow-down's quota is that over the
    factor; None: every core of the host); on the GPU, the NVML UUIDs of its engines' GPUs
    (each engine's ``gpu_uuid()``: NVML indices ignore CUDA_VISIBLE_DEVICES, so an index
    would aim at the wrong GPU; a GPU fault without UUIDs is refused by the agent)."""

    agent: Any
    ifname: str
    pids: list[int]
    backend: str = "cpu"
    cores: float | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    engines: list[tuple[str, str, Any]] = field(default_factory=list)  # (role, name, actor handle) on the pod
    probe: ProbePath | None = None  # where its link faults are measured from (None: the runs fault no link of it)
    peer: Any = None  # the agent at the probe's other end


class FaultInjector:
    def __init__(self, ctx: RunContext, pods: list[PodTargets], now: Callable[[], float], baseline_bps: float,
                 vocab: int) -> None:
        self.ctx, self.spec, self.pods = ctx, ctx.spec, pods
        self.now = now
        self.baseline_bps = baseline_bps
        self.vocab = vocab  # the model's: the GPU compute fault's probe prompts (testbed/faults/felt.py)
        t = ctx.spec.testbed  # RDMA link faults as the NIC's limit of the KV's class (core/spec/model.py)
        self.dcb = t.transport == "rdma" and t.rdma_link_faults == "dcb_maxrate"
        self._felt_base: dict[int, list[list[felt.StepTimes]]] = {}  # per pod: its engines' probes before
        self._probes = 0
        n = ctx.topo.n_pods
        # Measured residual factor per pod and side: the telemetry reports the narrower one.
        self.measured = {"uplink": np.ones(n), "downlink": np.ones(n)}
        self._stop = asyncio.Event()
        self._restarts: set[asyncio.Task] = set()  # engines starting again (engine faults' restart_s)

    # --- the timeline -----------------------------------------------------
    async def run(self) -> None:
        """Walk the steps from run start (``now() == 0``) to the last, or until :meth:`stop`."""
        for step in self.ctx.steps:
            delay = step.time_s - self.now()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if self._stop.is_set():
                return  # between steps: what is applied is exactly the context's last step
            await self.step(step)

    def stop(self) -> None:
        """Stop after the step in progress (never in the middle of one)."""
        self._stop.set()

    async def finish(self) -> None:
        """The run ended before the timeline did: clear what is on now, recording those clears."""
        closing = self.ctx.closing_step(self.now())
        if closing is not None:
            await self.step(closing)

    async def step(self, step: FaultStep) -> None:
        """Make the cluster match ``step`` and record its events with what was measured."""
        before = self.ctx.last_step
        self.ctx.begin_step(step, self.now())
        kills = [ev for ev in step.events if ev.kind == FAULT_ENGINE]
        results = await asyncio.gather(*(self._make_pod(p, step, before) for p in step.changed.tolist()),
                                       *(self._kill(ev) if ev.event == "apply" else self._restart(ev) for ev in kills))
        measured = dict(zip(step.changed.tolist(), results))
        killed = dict(zip(kills, results[len(measured):]))
        now = self.now()
        bw = np.minimum(self.measured["uplink"], self.measured["downlink"])
        self.ctx.end_step(step, now, bw, lambda ev: killed[ev] if ev in killed
                          else self._rows(ev, measured.get(ev.pod, {}), now))

    async def _restart(self, ev: ScheduledEvent) -> list[FaultRow]:
        """Start the fault's engines on ``ev.pod`` again (each actor a new engine core): a row each,
        measured 1 (the capacity back) when asked, NaN where the ask failed. Not awaited: a start
        takes the better part of a minute, and the steps after it keep their times; the router's
        liveness check finds the engine up once it serves."""
        f = self.spec.faults[ev.fault_id]
        assert isinstance(f, EngineFault)
        tg, rows = self.pods[ev.pod], []
        for role, name, handle in tg.engines:
            if f.kills(role):
                task = asyncio.ensure_future(self._start_again(handle, f"pod{ev.pod}:{name}/core"))
                self._restarts.add(task)
                task.add_done_callback(self._restarts.discard)
                rows.append((f"pod{ev.pod}:{name}/core", self.now(), 1.0, np.nan))
        return rows

    @staticmethod
    async def _start_again(handle: Any, target: str) -> None:
        try:
            res = await handle.restart.remote()
            log.info("engine fault: %s started again in %.1f s", target, res["startup_s"])
        except Exception as e:
            log.warning("engine fault: restart of %s failed: %s", target, e)

    async def _kill(self, ev: ScheduledEvent) -> list[FaultRow]:
        """Kill the fault's engines on ``ev.pod``: a row each, measured 0 (the capacity left) once the
        agent sent the SIGKILL, NaN where it could not (the engine already gone)."""
        f = self.spec.faults[ev.fault_id]
        assert isinstance(f, EngineFault)
        tg, rows = self.pods[ev.pod], []
        for role, name, handle in tg.engines:
            if not f.kills(role):
                continue
            target = f"pod{ev.pod}:{name}/{f.process}"
            try:
                pid = await handle.process.remote(f.process)
                await tg.agent.kill_engine.remote(pid)
                rows.append((target, self.now(), 0.0, np.nan))
            except Exception as e:  # an engine that is dead already: nothing left to kill
                log.warning("engine fault on %s: %s", target, e)
                rows.append((target, self.now(), np.nan, np.nan))
        return rows

    def _rows(self, ev: ScheduledEvent, m: dict[str, Any], now: float) -> list[FaultRow]:
        """One row per target acted on; its time is when the agent had acted (the measurement comes after)."""
        name, at = f"pod{ev.pod}", m.get("acted_s", now)
        if ev.kind == FAULT_COMPUTE:  # GPU: the engines' step slow-down, the SM clock ratio beside it
            device = self.pods[ev.pod].backend
            return [(f"{name}:{device}", at, float(m.get("compute", np.nan)), np.nan, float(m.get("clock", np.nan)))]
        f = self.spec.faults[ev.fault_id]
        assert isinstance(f, LinkFault)
        ifname = self.pods[ev.pod].ifname
        return [(f"{name}:{ifname}/{direction}", at, float(m.get(side + "_factor", np.nan)), float(m.get(side, np.nan)),
                 np.nan) for side, direction in (("uplink", "egress"), ("downlink", "ingress")) if getattr(f, side)]

    # --- one pod ----------------------------------------------------------
    def _link_options(self, pod: int, t: float, side: str) -> dict[str, Any]:
        """kv_only, delay and loss of the strictest active link fault on that side of the pod."""
        active = [f for f in self.spec.faults if isinstance(f, LinkFault) and pod in f.pods
                  and f.start_s <= t < f.end_s and getattr(f, side)]
        if not active:
            return {}
        f = min(active, key=lambda f: f.residual_bw)
        return {"kv_only": f.kv_only, "delay_ms": f.delay_ms, "loss": f.loss}

    async def _make_pod(self, pod: int, step: FaultStep, before: FaultStep | None) -> dict[str, Any]:
        tg = self.pods[pod]
        ttl = self.ctx.ttl_s(step, self.spec.testbed.fault_ttl_margin_s)
        old_up, old_down, old_slow = ((before.uplink[pod], before.downlink[pod], before.slowdown[pod])
                                      if before is not None else (1.0, 1.0, 1.0))
        out: dict[str, Any] = {}
        sides = [(side, new, old) for side, new, old in (("uplink", step.uplink[pod], old_up),
                                                          ("downlink", step.downlink[pod], old_down)) if new != old]
        configured: dict[str, float] = {}  # dcb_maxrate: what the NIC reads back for the KV's class
        for side, new, old in sides:
            key = f"link-{side}"
            if new >= 1:
                await tg.agent.clear.remote(key)
            elif self.dcb:
                res = await tg.agent.apply_link_dcb.remote(key, tg.ifname, [side], new * self.baseline_bps, ttl,
                                                           self.spec.testbed.kv_traffic_class)
                configured[side] = float(res["configured_bps"])
            else:
                await tg.agent.apply_link.remote(key, tg.ifname, [side], new * self.baseline_bps, ttl,
                                                 **self._link_options(pod, step.time_s, side))
        if sides and self.dcb:
            # No host-side load crosses an RDMA NIC's class as the KV does (testbed/faults/dcb.py): the
            # rate recorded is the one the NIC configured, never measured; a cleared class, the baseline.
            out["acted_s"] = self.now()
            for side, new, _ in sides:
                bps = configured.get(side, self.baseline_bps)
                out[side], out[side + "_factor"] = bps, bps / self.baseline_bps
                self.measured[side][pod] = min(bps / self.baseline_bps, 1.0)
        elif sides:
            out["acted_s"] = self.now()
            # Both directions at once (separate traffic and counters), with the probe the
            # simulator assumes (faults.telemetry: its rate and window).
            offered = [probe_offered_bps(new, old, self.baseline_bps) for _, new, old in sides]
            def probe() -> Any:
                return asyncio.gather(*(measure_side(tg, side, o) for (side, _, _), o in zip(sides, offered)))

            rates = list(await probe())
            if not sides_agree(sides, rates):
                again = list(await probe())
                log.warning("link fault on pod%d: its directions read %s, apart by more than %.0f%%: probed again, "
                            "read %s", pod, [f"{r / 1e9:.3g}" for r in rates], 100 * SIDES_AGREE,
                            [f"{r / 1e9:.3g}" for r in again])
                # a probe's load or sampler starved of the CPU reads a link below what it carries, never above
                rates = again if sides_agree(sides, again) else [max(a, b) for a, b in zip(rates, again)]
            # A clear whose probe did not get through is probed once more: on 2 cores under engine
            # load the probe's own sender can start late and miss the window (seen on the downlink).
            for i, ((side, new, old), o) in enumerate(zip(sides, offered)):
                if new >= 1 and rates[i] < CLEARED_IF_ABOVE * old * self.baseline_bps:
                    rates[i] = max(rates[i], await measure_side(tg, side, o))
            for (side, new, old), bps in zip(sides, rates):
                if new < 1:
                    factor = bps / self.baseline_bps
                else:
                    factor = 1.0 if bps >= CLEARED_IF_ABOVE * old * self.baseline_bps else bps / self.baseline_bps
                out[side], out[side + "_factor"] = bps, factor
                self.measured[side][pod] = min(factor, 1.0)
        slow = step.slowdown[pod]
        if slow != old_slow:
            if tg.backend == "gpu":  # the clock ratio is not the slow-down: the engines' own steps are
                out["compute"], out["clock"], acted = await self._gpu_compute(pod, tg, float(slow), ttl)
                out.setdefault("acted_s", acted)
            elif slow > 1:
                out["compute"] = await tg.agent.apply_compute.remote("compute", tg.pids, float(slow), ttl, tg.backend,
                                                                     tg.cores, tg.gpu_uuids)
            else:
                res = await tg.agent.clear.remote("compute")
                out["compute"] = float(res) if res is not None else np.nan
            out.setdefault("acted_s", self.now())
        return out

    async def _gpu_compute(self, pod: int, tg: PodTargets, slow: float, ttl: float) -> tuple[float, float, float]:
        """A GPU compute change on ``pod``: (the slow-down its engines felt, the clock ratio, when the
        agent had acted). Their step times are read before the first change (once) and after each
        (testbed/faults/felt.py)."""
        if pod not in self._felt_base:
            try:
                self._felt_base[pod] = await self._probe_engines(pod, tg)
            except Exception as e:  # an engine already dead: the clock ratio stands alone (below)
                log.warning("GPU compute fault on pod%d: the engines' step times before it were not read (%s)", pod, e)
        if slow > 1:
            clock = await tg.agent.apply_compute.remote("compute", tg.pids, slow, ttl, tg.backend, tg.cores,
                                                        tg.gpu_uuids)
        else:
            res = await tg.agent.clear.remote("compute")
            clock = float(res) if res is not None else np.nan
        acted = self.now()
        try:
            after = await self._probe_engines(pod, tg)
            felt_factor = felt.felt_slowdown(self._felt_base[pod], after, [role for role, _, _ in tg.engines])
        except Exception as e:  # no baseline, or an engine that died meanwhile: the clock ratio stands alone
            log.warning("GPU compute fault on pod%d: the engines' step times were not read (%s)", pod, e)
            felt_factor = np.nan
        return felt_factor, clock, acted

    async def _probe_engines(self, pod: int, tg: PodTargets) -> list[list[felt.StepTimes]]:
        """felt.PROBES probe requests on each of the pod's engines, one after another on each."""
        async def one(k: int, handle: Any) -> list[felt.StepTimes]:
            times = []
            for _ in range(felt.PROBES):
                self._probes += 1
                res = await handle.decode.remote(f"felt-pod{pod}-e{k}-{self._probes}",
                                                 felt.probe_prompt(self._probes, self.vocab), felt.STEPS + 1)
                times.append(felt.StepTimes.from_times(res.submitted_s, res.first_token_s, res.token_times))
            return times
        return list(await asyncio.gather(*(one(k, h) for k, (_, _, h) in enumerate(tg.engines))))


def sides_agree(sides: list[tuple[str, float, float]], rates: list[float]) -> bool:
    """Whether one probe's readings of a pod's link (``rates``, bit/s, per (side, new, old) of
    ``sides``) agree: both directions, set from one limit to another below the baseline and above
    0, read within SIDES_AGREE of each other. Anything else agrees: one side, sides set apart, a
    clear (its own rule) or a link down (nothing to read)."""
    if len(sides) != 2 or sides[0][1:] != sides[1][1:] or not 0 < sides[0][1] < 1:
        return True
    lo, hi = sorted(rates)
    return hi > 0 and (hi - lo) / hi <= SIDES_AGREE


async def measure_side(tg: PodTargets, side: str, offered_bps: float) -> float:
    """The rate one side of ``tg``'s shaped interface carries (bit/s) under a load offering
    ``offered_bps`` from its probe's far end (the module's docstring says how)."""
    window, p = probe_window_s(offered_bps), tg.probe
    if p is None:
        raise RuntimeError(f"{tg.ifname} of a pod without a probe path: its link faults were not planned for")
    if side == "uplink":
        return await tg.agent.measure_uplink.remote(tg.ifname, p.peer_ip, p.peer_port, offered_bps, window)
    load = tg.peer.fill.remote(p.pod_ip, p.pod_port, offered_bps, window + 0.3)
    rate = await tg.agent.measure_downlink.remote(tg.ifname, window)
    await load
    return rate
