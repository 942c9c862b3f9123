"""Engines that die in the simulator (an ``engine`` fault, faults.spec.EngineFault): the part of
:class:`simulator.cluster.ClusterSim` that kills them, kept apart from its hot path, which only
asks whether an engine is dead (``dead`` of its worker) when a request reaches it.

What a dead engine held ends as ``error`` in its stage at once, as the calls on it raise on the
testbed; a pull of KV a dead prefill engine held fails in ``kv_transfer`` (vLLM's default
``kv_load_failure_policy: fail``). The router stops choosing it by the liveness rule both worlds
share (core/liveness.py): when a call on it failed (a dead core's calls
``engine.core_death_notice_s`` after the kill), else at the next periodic check or the first call
routed to it (docs/reliability.md "Engine death in both worlds"). Also the outage after a down
link's outage (``engine.kv_heal_disconnect_s``), which fails the reads across it as a death does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.liveness import ALIVE, DEAD, EngineLiveness
from core.records import NAN
from core.ticket import Ticket
from faults.schedule import ScheduledEvent
from vocab import ERROR, KV_TRANSFER, PULL_FAILED, PULL_UNSEEN, ROLE_DECODE, ROLE_PREFILL

from .events import Call, call_after

if TYPE_CHECKING:
    from .cluster import ClusterSim
    from .workers import DecodeWorker


class EngineDeaths:
    """A simulated cluster's engine deaths: the engines an engine fault kills and restarts, what they
    held, and the router's liveness rule fed with what each engine would answer. It acts on the
    cluster's workers, pulls and requests through the surface :class:`simulator.cluster.ClusterSim`
    offers it (``sim``; its methods under "the surface engine deaths act through"), and tells the
    cluster's hooks what died (the shared host's demand, simulator/host.py)."""

    def __init__(self, sim: ClusterSim) -> None:
        self.sim = sim
        self.liveness = EngineLiveness(sim.ctx)
        self._unseen: dict[int, str] = {}  # dead, not yet seen by the router (worker -> why)
        self._restarted: set[int] = set()  # serving again, not yet seen up by the router

    def kill(self, ev: ScheduledEvent, now: float) -> None:
        """The engine fault's engines on ``ev.pod`` die now. What each held ends as ``error`` in its
        stage, as the calls on it raise on the testbed; a death that failed a call is seen by the
        router at once (Liveness.error), any other at its next liveness check or first call."""
        f = self.sim.ctx.spec.faults[ev.fault_id]
        why = f"killed by faults[{ev.fault_id}] ({f.process})"
        for role, idx, w, worker in self._engines_of(f, ev.pod):
            if not w.dead:
                failed = self._kill_prefill(idx, now) if role == ROLE_PREFILL else self._kill_decode(w, now)
                self._unseen[worker] = why
                notice = self.sim.e.core_death_notice_s if f.process == "core" else 0.0
                if failed and notice > 0:  # a check or a later call may still see it first
                    call_after(self.sim.env, notice, self._noticed, worker)
                elif failed:
                    self.call_failed(worker, now)

    def _noticed(self, ev: Call) -> None:
        self.call_failed(ev.data, self.sim.env.now)

    def check(self, now: float) -> None:
        """The router's periodic question to every engine, answered as each would (core/liveness.py
        decides what an answer changes; only the answers that change something are given: a dead
        engine not yet seen, a restarted one the router still takes for down)."""
        for worker, why in list(self._unseen.items()):
            self.call_failed(worker, now, why)
        for worker in sorted(self._restarted):
            self.liveness.answered(now, worker, ALIVE, "restarted (engine fault)")
        self._restarted.clear()

    def restart(self, ev: ScheduledEvent, now: float) -> None:
        """The engine fault's restart: its dead engines on ``ev.pod`` start again and serve
        ``engine.engine_start_s`` later (empty: what they held died with them)."""
        for _, _, w, worker in self._engines_of(self.sim.ctx.spec.faults[ev.fault_id], ev.pod):
            if w.dead:
                call_after(self.sim.env, self.sim.e.engine_start_s, self._started, (w, worker))

    def _engines_of(self, f: Any, pod: int) -> list[tuple[str, int, Any, int]]:
        """The workers engine fault ``f`` acts on in ``pod``: (role, index in its role, worker state,
        global worker id)."""
        return [(role, idx, w, int(ids[idx]))
                for role, workers, ids in ((ROLE_PREFILL, self.sim.prefill, self.sim.topo.prefill_ids),
                                           (ROLE_DECODE, self.sim.decode, self.sim.topo.decode_ids)) if f.kills(role)
                for idx, w in enumerate(workers) if w.pod == pod]

    def _started(self, ev: Call) -> None:
        w, worker = ev.data
        w.dead = False
        if self._unseen.pop(worker, None) is None:  # the router took it for down: its next check finds it up
            self._restarted.add(worker)

    def call_failed(self, worker: int, now: float, why: str | None = None) -> None:
        """The router asked a dead engine (a call on it failed, or a check): it answers with an error."""
        why = self._unseen.pop(worker, why)
        if why is not None:
            self.liveness.answered(now, worker, DEAD, why)

    def fail(self, req: Ticket, now: float) -> None:
        """The attempt ends as ``error`` in the stage it is in (its engine died), the request with it
        unless it is retried; the caller frees what it held."""
        self.sim.end_attempt(req, now, ERROR)

    def _kill_prefill(self, idx: int, now: float) -> int:
        """Prefill worker ``idx`` dies: its queue and running batch fail, and so does every pull of
        KV it held (the decode engine's read of a dead peer fails: pull_failed). How many failed."""
        sim = self.sim
        w = sim.prefill[idx]
        w.dead = True
        doomed = [r for r in (*w.batch, *w.queue) if not r.done]
        w.queue.clear()
        w.batch = []
        w.busy = False
        for req in doomed:
            self.fail(req, now)
        held = [r for d in sim.decode for r in d.waiting if r.p_idx == idx and not r.done]
        held += [r for r in sim.pulls() if r.p_idx == idx and not r.done]
        for req in held:
            self.pull_failed(req, now)
        for req in [r for r in sim.given_up_pulls() if r.p_idx == idx]:  # dead pulls from it: the read fails now
            sim.end_given_up(req, now, PULL_FAILED)
            sim.release(req, now)
        sim.prefill_died(idx)
        return len(doomed) + len(held)

    def pull_failed(self, req: Ticket, now: float) -> None:
        """The KV ``req`` waits for or pulls is gone with its prefill engine: the request fails
        where it is on its decode engine, which frees its blocks."""
        stage = req.stage
        self.fail(req, now)
        if stage == KV_TRANSFER:
            self.sim.stop_pull(req)
            self.sim.release(req, now)
        self.sim.unhold(req)

    def _kill_decode(self, d: DecodeWorker, now: float) -> int:
        """Decode worker ``d`` dies: whatever waits for it, pulls into it or decodes on it fails,
        and it holds nothing after. How many failed."""
        sim = self.sim
        orphans = sim.held_for(d)  # KV prefill engines hold for it: no one reads it now
        d.dead = True
        doomed = [r for r in d.waiting if not r.done]
        doomed += [r for r in sim.pulls() if sim.decode[r.d_idx] is d and not r.done]
        doomed += [r for _, _, r in d.heap if not r.done]
        doomed += [r for r in sim.take_joining(d) if not r.done]
        for req in doomed:
            sim.stop_pull(req)
            self.fail(req, now)
        for req in [r for r in sim.given_up_pulls() if sim.decode[r.d_idx] is d]:  # dead pulls into it die unseen,
            sim.end_given_up(req, NAN, PULL_UNSEEN)  # as the testbed's router finds no end in a dead engine's log
        d.waiting.clear()
        d.heap.clear()
        d.n = d.kv_in_batch = d.reserved_kv = d.reserved_slots = 0
        d.timer = None  # a pending step end is stale
        d.step_s = sim.step_s(d)
        for req in orphans:
            sim.orphaned(req)
        sim.decode_died(d)
        return len(doomed)

    # --- the outage after the outage (engine.kv_heal_disconnect_s) ---------------------------
    def reconnect(self, ev: Call) -> None:
        """``kv_heal_disconnect_s`` after a down link came back: the reads across it fail (error in
        kv_transfer; a dead pull ends ``failed``), then the link carries KV at its rate now."""
        sim = self.sim
        link, pod, side, now = *ev.data, sim.env.now
        given_up = set(sim.given_up_pulls())
        for req in [r for r in sim.pulls() if link in sim.topo.path(r.prefill_worker, r.decode_worker)]:
            if req in given_up:
                sim.end_given_up(req, now, PULL_FAILED)
                sim.release(req, now)
                sim.unhold(req)
            elif not req.done:
                self.pull_failed(req, now)
        sim.restore_link(link, pod, side)
