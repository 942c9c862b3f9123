"""The SimPy model of a PD-disaggregated cluster (docs/simulator.md "The model" describes it).

* prefill workers: FCFS queue, batches of up to ``prefill_batch_tokens`` prompt tokens, each
  batch timed by core/engine_timing.py, slowed by the pod's compute fault;
* decode admission: a request reserves KV memory and a batch slot on its decode worker before its
  KV is pulled (as vLLM allocates blocks before a NIXL read); without room it waits (``decode_queue``);
* KV transfer: a fluid flow of the prompt's KV in whole blocks over the sender NIC, the pods' core
  links and the receiver NIC, max-min fair (:mod:`simulator.network`), then the pull's fixed cost;
* decode: continuous batching as a fluid, the step time of core/engine_timing.py recomputed
  whenever the batch changes;
* the limits (deadline, first-token limit, a retried attempt's per-try timeout) give an attempt up
  where it is; :mod:`core.retry` decides whether it is routed again;
* engines that share a host's cores: :class:`simulator.host.HostedClusterSim`; engines that die:
  simulator/engine_deaths.py, through the surface marked below.

Everything around the cluster is the run context both worlds open (:class:`core.run.RunContext`):
routing returns a :class:`core.ticket.Ticket`, on which this model marks the stages of
:mod:`core.stages` and which builds the request's record when it ends; the fault timeline's steps
come from there too, and this model only sets its links' capacities and workers' speeds.

Speed: a request's events are the cheap kinds of :mod:`simulator.events`, made exactly where SimPy
timeouts and processes would be, so the event order (ties included) is SimPy's. The hot path reads
Python numbers (the workload's columns, the engine's constants, each decode batch's step time, kept
current) rather than numpy scalars or pydantic fields, and a finished request's ticket is dropped
at once. Only simulator/events.py touches SimPy's internals; the model reads the clock as ``env.now``.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Callable

import numpy as np
import simpy

from core.engine_timing import decode_step_s, prefill_s
from core.limits import first_token_limit
from core.records import DEAD_PULL_WATCH_S, NAN
from core.run import RunContext
from core.spec.model import EngineSpec
from core.ticket import Ticket
from core.topology import kv_transfer_bytes
from faults.schedule import FaultStep, ScheduledEvent
from faults.telemetry import link_measure_s
from vocab import (CORRUPT, DECODE, DECODE_QUEUE, FAULT_COMPUTE, FAULT_ENGINE, FAULT_LINK, KV_TRANSFER, OK, PREFILL,
                   PULL_CANCELLED, PULL_DONE, PULL_UNSEEN, TIMEOUT)
from workloads.generate import Workload

from .control_path import ControlPath
from .engine_deaths import EngineDeaths
from .events import Call, Chain, call_after, run_until
from .network import FlowNetwork
from .workers import DecodeWorker, PrefillWorker


class ClusterSim(ControlPath):
    def __init__(
        self,
        env: simpy.Environment,
        ctx: RunContext,
        engine: EngineSpec,
        workload: Workload,
        deadline_s: float,
        kv_bytes_per_token: int,
        progress: Callable[[float], None] | None = None,
        wire_overhead: float = 1.0,
        first_token_limit_s: float | None = None,
    ) -> None:
        self.env, self.ctx, self.topo, self.e = env, ctx, ctx.topo, engine
        self.wl, self.deadline = workload, deadline_s
        self.kv_bpt = kv_bytes_per_token
        self.wire_overhead = wire_overhead
        self.progress = progress
        topo = self.topo
        self.net = FlowNetwork(env, topo.link_capacity_Bps())
        worker_pod = topo.worker_pod.tolist()
        self.prefill = [PrefillWorker(worker_pod[w]) for w in topo.prefill_ids.tolist()]
        self.slowdown: list[float] = [1.0] * topo.n_pods
        self._applied: FaultStep | None = None  # the last step set (its measurement may still run)
        self._measuring: deque[FaultStep] = deque()  # steps whose measurement has not ended, in order
        self._measured_at = 0.0  # when the last of them ends
        self.reqs: list[Ticket | None] = []  # by request id (= arrival order); None once done
        self._flows: dict[Ticket, int] = {}  # an attempt's KV flow, while in kv_transfer
        # engine.kv_pull_on_abort "finish": a request given up in kv_transfer keeps its flow and its
        # decode blocks until the pull ends. When it was given up and the KV bytes moved by then.
        self._finish_pulls = engine.kv_pull_on_abort == "finish"
        self._dead: dict[Ticket, tuple[float, float]] = {}
        # engine.kv_lease_s without renewal: a pull that ended (kv_end_s) after its prefill engine
        # freed the KV decodes from reused blocks; the request ends "corrupt" instead of "ok" (vLLM
        # returns success). A renewed lease (vLLM 0.32's heartbeats) never ends under a live request.
        self._heal_disconnect = engine.kv_heal_disconnect_s
        self._lease: float | None = (float(engine.kv_lease_s) if engine.kv_lease_s is not None
                                     and not engine.kv_lease_renewed else None)
        # router.retry's per-try timeout: each attempt that could be retried gets a timer
        self._attempt_ttft = ctx.retries is not None and ctx.retries.spec.attempt_ttft_s is not None
        self._seq = 0
        self.end_time = (float(workload.arrival_s[-1]) if len(workload) else 0.0) + deadline_s + 1.0
        # Per-request columns and the engine's constants as Python numbers: the hot path never
        # reads a numpy scalar or a pydantic field.
        self._arr: list[float] = workload.arrival_s.tolist()
        self._pt: list[int] = workload.prompt_tokens.tolist()
        self._ot: list[int] = workload.output_tokens.tolist()
        e = engine
        self._prefill_budget, self._prefill_overhead, self._prefill_tps = (
            e.prefill_batch_tokens, e.prefill_overhead_s, e.prefill_tokens_per_s)
        self._step_base, self._step_per_seq, self._step_per_kv = (
            e.decode_step_base_s, e.decode_step_per_seq_s, e.decode_step_per_kv_token_s)
        self._max_batch, self._kv_tokens = e.decode_max_batch, e.decode_kv_tokens
        self._block_tokens, self._pull_latency = e.kv_block_tokens, e.kv_transfer_latency_s
        # The serving stack's control path (engine.prefill_call_s, decode_call_s, decode_join_s):
        # a call on its way to an engine, or a pulled request waiting for the decode scheduler.
        self._prefill_call, self._decode_call, self._join_delay = e.prefill_call_s, e.decode_call_s, e.decode_join_s
        self._joining: set[Ticket] = set()  # KV in, not yet in the running batch
        self.decode = [DecodeWorker(worker_pod[w]) for w in topo.decode_ids.tolist()]
        for d in self.decode:
            d.step_s = self.step_s(d)  # an empty batch's
        self.first_token_limit = first_token_limit(deadline_s, first_token_limit_s)
        # Arrivals and the sweeps of the per-request limits are chains (simulator.events), made
        # where processes would be: the event order is what SimPy processes would give.
        self._chains = [Chain(env, self._arrivals), Chain(env, self._deadlines)]
        if self.first_token_limit < deadline_s:
            self._chains.append(Chain(env, self._first_token_limits))
        env.process(self._faults())
        # Engines that die (simulator/engine_deaths.py). The router asks every engine whether it is
        # down every testbed.engine_check_s from run start, and at once when a call to one raised.
        self.deaths = EngineDeaths(self)
        if any(f.kind == FAULT_ENGINE for f in ctx.spec.faults):
            env.process(self._every(ctx.spec.testbed.engine_check_s, self.deaths.check))
        for period, fn in ctx.periodic:
            env.process(self._every(period, fn))

    def run(self) -> None:
        run_until(self.env, self.end_time, self._chains)
        while self._measuring:  # measurements still running at the end: they end now
            self._end_step()
        # Dead pulls still going: the run goes on (as the testbed's router watches them) until they
        # end, for up to DEAD_PULL_WATCH_S after each was given up; then as far as they got.
        if self._dead:
            watch_until = max(given_up for given_up, _ in self._dead.values()) + DEAD_PULL_WATCH_S
            env = self.env
            while self._dead and env.peek() <= watch_until:
                env.step()
        for req in list(self._dead):
            given_up, moved = self._dead.pop(req)
            flow = self._flows.pop(req, None)  # None: its bytes are there, the completion is not
            now_moved = req.kv_bytes if flow is None else self.net.transferred(flow) / self.wire_overhead
            self.ctx.dead_pull(req, given_up, NAN, PULL_UNSEEN, now_moved - moved)
        closing = self.ctx.closing_step(self.env.now)  # faults still on when the run ends are cleared, recorded
        if closing is not None:
            self._apply(closing, measure=False)

    # --- processes and sweeps ----------------------------------------------------
    def _every(self, period: float, fn: Callable[[float], None]):
        while True:
            fn(self.env.now)
            yield self.env.timeout(period)

    def _arrivals(self, chain: Chain) -> None:
        """Route the requests in arrival order, each at its arrival time."""
        self._walk(chain, 0.0, self._arrive)

    def _walk(self, chain: Chain, offset: float, fn: Callable[[int, float], None]) -> None:
        """Call ``fn(i, now)`` for request i at its arrival time + ``offset``, in arrival order.
        Woken for request ``chain.data`` (None: at the start), it handles that one without
        looking at the clock again (now may differ from the due time by rounding), then any due
        with it, and sleeps until the next one is due."""
        arr, now = self._arr, self.env.now  # the clock stands still while a chain runs
        i = chain.data
        if i is None:
            i = 0
        else:
            fn(i, now)
            i += 1
        while i < len(arr):
            due = arr[i] + offset
            if due > now:
                chain.data = i
                chain.sleep(due - now)
                return
            fn(i, now)
            i += 1
        chain.end()

    def _arrive(self, i: int, now: float) -> None:
        if not self.ctx.admit(now, i, self._arr[i], self._pt[i], self._ot[i]):
            self.reqs.append(None)  # recorded as rejected; nothing to time out
            return
        req = self.ctx.route(now, i, self._arr[i], self._pt[i], self._ot[i])
        self.reqs.append(req)
        self._dispatch(req, now)
        if self._attempt_ttft:
            self._limit_attempt(req, now)
        if self.progress is not None and i % 2000 == 0:
            self.progress(now / self.end_time)

    def _deadlines(self, chain: Chain) -> None:
        """Time out, in arrival order (= deadline order, the deadline being the same for all),
        every request from ``chain.data`` on that is due by now and not done, then sleep until
        the next one is due (and look at the clock again then)."""
        arr, reqs, deadline, now = self._arr, self.reqs, self.deadline, self.env.now
        i = chain.data or 0
        while i < len(arr):
            due = arr[i] + deadline
            if due > now:
                chain.data = i
                chain.sleep(due - now)
                return
            if i >= len(reqs):  # not arrived yet (cannot happen for due <= now, but stay safe)
                chain.data = i
                chain.sleep(0)
                return
            req = reqs[i]
            if req is not None and not req.done:
                self._give_up(req, TIMEOUT)
            reqs[i] = None  # nothing refers to it any more
            i += 1
        chain.end()

    def _first_token_limits(self, chain: Chain) -> None:
        """The time-to-first-token limit, swept in arrival order like the deadline: a request
        still without its first token then (not yet in decode, or its first step not done) times
        out where it is."""
        self._walk(chain, self.first_token_limit, self._first_token_check)

    def _first_token_check(self, i: int, now: float) -> None:
        req = self.reqs[i] if i < len(self.reqs) else None
        if req is not None and not req.done and not req.first_token_s <= now:
            self._give_up(req, TIMEOUT)

    # --- retries (router.retry) ----------------------------------------------------
    def _limit_attempt(self, req: Ticket, now: float) -> None:
        """The attempt's per-try timeout, if a retry could follow it."""
        limit = self.ctx.attempt_limit(req, self._arr[req.request_id] + self.first_token_limit)
        if limit < self._arr[req.request_id] + self.first_token_limit:
            call_after(self.env, limit - now, self._attempt_due, req)

    def _attempt_due(self, ev: Call) -> None:
        req = ev.data
        if not req.done and not req.first_token_s <= self.env.now:
            self._give_up(req, TIMEOUT)

    def _retry(self, ev: Call) -> None:
        """Route a retried request again (its earlier attempt is in ``attempts``)."""
        i, nxt = ev.data
        now = self.env.now
        req = self.ctx.route(now, i, self._arr[i], self._pt[i], self._ot[i], nxt)
        self.reqs[i] = req
        self._dispatch(req, now)
        self._limit_attempt(req, now)

    def _faults(self):
        env = self.env
        for step in self.ctx.steps:
            if step.time_s > env.now:
                yield env.timeout(step.time_s - env.now)
            self._apply(step)

    def _apply(self, step: FaultStep, measure: bool = True) -> None:
        """Set the step's link capacities and worker speeds. What the simulator measures is what it
        set, but the router learns of a link change only when the testbed's probe of it would have
        ended (faults.telemetry.link_measure_s): measurements end in step order."""
        now, topo = self.env.now, self.topo
        self.ctx.begin_step(step, now)
        for ev in step.events:
            if ev.kind == FAULT_ENGINE:
                (self.deaths.kill if ev.event == "apply" else self.deaths.restart)(ev, now)
        before = self._applied
        for p in step.changed.tolist():
            for side, link in (("uplink", topo.uplink(p)), ("downlink", topo.downlink(p))):
                new, old = getattr(step, side)[p], getattr(before, side)[p] if before else 1.0
                if old == 0 and new > 0 and self._heal_disconnect is not None:
                    # the KV endpoints across it stay dead until UCX finds them disconnected
                    call_after(self.env, self._heal_disconnect, self.deaths.reconnect, (link, p, side))
                else:
                    self.net.set_capacity(link, topo.core_link_Bps(new))
            if step.slowdown[p] != self.slowdown[p]:
                self._set_slowdown(p, float(step.slowdown[p]))
        old = (before.uplink, before.downlink) if before is not None else (np.ones(topo.n_pods),) * 2
        delay = link_measure_s(old, (step.uplink, step.downlink), step.changed, topo.fault_baseline_Bps * 8) \
            if measure else 0.0
        self._applied = step
        self._measuring.append(step)
        if delay > 0 or len(self._measuring) > 1:
            due = max(now + delay, self._measured_at)
            self._measured_at = due
            self.env.timeout(due - now).callbacks.append(lambda _e: self._end_step())
        else:
            self._end_step()

    def _end_step(self) -> None:
        """The oldest running measurement ends: the router sees that step's bandwidth."""
        step = self._measuring.popleft()
        self.ctx.end_step(step, self.env.now, step.bw_factor, self._rows)

    @staticmethod
    def _rows(ev: ScheduledEvent) -> list[tuple[str, float, float, float]]:
        target = f"pod{ev.pod}." + {FAULT_LINK: "core_links", FAULT_COMPUTE: "workers", FAULT_ENGINE: "engines"}[ev.kind]
        return [(target, ev.time_s, NAN, NAN)]

    # --- request path ---------------------------------------------------------
    def _dispatch(self, req: Ticket, now: float) -> None:
        """The prefill call: the request reaches its prefill engine's queue ``prefill_call_s`` later."""
        if self._prefill_call > 0:
            call_after(self.env, self._prefill_call, self._prefill_called, req)
        else:
            self._enqueue_prefill(req, now)

    def _enqueue_prefill(self, req: Ticket, now: float) -> None:
        w = self.prefill[req.p_idx]
        if w.dead:  # routed before the router knew: the call raises at once
            self.deaths.fail(req, now)
            self.deaths.call_failed(int(self.topo.prefill_ids[req.p_idx]), now)
            return
        w.queue.append(req)
        if not w.busy:
            self._start_prefill(req.p_idx, now)

    def _start_prefill(self, idx: int, now: float) -> None:
        w = self.prefill[idx]
        queue = w.queue
        batch: list[Ticket] = []
        tokens = 0
        budget = self._prefill_budget
        while queue:
            req = queue[0]
            if req.done:  # timed out while queued
                queue.popleft()
                continue
            if batch and tokens + req.prompt_tokens > budget:
                break
            queue.popleft()
            batch.append(req)
            tokens += req.prompt_tokens
        if not batch:
            w.busy = False
            return
        w.busy = True
        w.batch = batch
        for req in batch:
            req.enter(PREFILL, now)
        self._run_prefill(idx, batch, tokens)

    def _run_prefill(self, idx: int, batch: list[Ticket], tokens: int) -> None:
        """Time the batch just started on prefill worker idx (simulator.host makes it fluid)."""
        dur = self.slowdown[self.prefill[idx].pod] * prefill_s(self._prefill_overhead, self._prefill_tps, tokens)
        call_after(self.env, dur, self._end_prefill, (idx, batch))

    def _end_prefill(self, ev: Call) -> None:
        idx, batch = ev.data
        if self.prefill[idx].dead:  # the batch died with its engine
            return
        self.prefill[idx].batch = []
        now = self.env.now
        for req in batch:
            if req.done:
                continue
            req.enter(DECODE_QUEUE, now)  # waiting for decode admission; the prefill worker is free of it
            if self._decode_call > 0:
                call_after(self.env, self._decode_call, self._decode_called, req)
            else:
                self._enqueue_decode(req, now)
        if self.prefill[idx].queue:
            self._start_prefill(idx, now)
        else:
            self.prefill[idx].busy = False

    def _enqueue_decode(self, req: Ticket, now: float) -> None:
        """The decode call reaches its engine: the request waits for admission there."""
        d = self.decode[req.d_idx]
        if d.dead:  # the decode call raises at once
            self.orphaned(req)
            self.deaths.fail(req, now)
            self.deaths.call_failed(int(self.topo.decode_ids[req.d_idx]), now)
            return
        d.waiting.append(req)
        self._admit(d, now)

    def _admit(self, d: DecodeWorker, now: float) -> None:
        waiting = d.waiting
        max_batch, kv_tokens = self._max_batch, self._kv_tokens
        while waiting:
            req = waiting[0]
            if req.done:
                waiting.popleft()
                continue
            need = req.prompt_tokens + req.output_tokens
            if d.reserved_slots >= max_batch or (d.reserved_kv and d.reserved_kv + need > kv_tokens):
                return
            waiting.popleft()
            d.reserved_slots += 1
            d.reserved_kv += need
            self._start_transfer(req, now)

    def _start_transfer(self, req: Ticket, now: float) -> None:
        req.enter(KV_TRANSFER, now)
        req.kv_bytes = nbytes = kv_transfer_bytes(req.prompt_tokens, self._block_tokens, self.kv_bpt)
        on_wire = nbytes * self.wire_overhead  # protocol headers travel too
        self._flows[req] = self.net.start(self.topo.path(req.prefill_worker, req.decode_worker), on_wire,
                                                     lambda _fid, req=req: self._end_flow(req))

    def _end_flow(self, req: Ticket) -> None:
        if req.done and req not in self._dead:
            return
        del self._flows[req]
        latency = self._pull_latency
        if latency > 0:  # the bytes are there; the pull's completion reaches the scheduler later
            call_after(self.env, latency, self._on_pull_done, req)
        else:
            self._end_transfer(req)

    def _on_pull_done(self, ev: Call) -> None:
        self._end_transfer(ev.data)

    def _end_transfer(self, req: Ticket) -> None:
        if req.done:  # timed out while the completion was on its way, or a dead pull's end
            dead = self._dead.pop(req, None)
            if dead is not None:
                now = self.env.now
                given_up, moved = dead
                self.ctx.dead_pull(req, given_up, now, PULL_DONE, req.kv_bytes - moved)
                self._release(self.decode[req.d_idx], req, now)
            return
        now = self.env.now
        req.enter(DECODE, now)
        if self._join_delay > 0:  # the decode scheduler takes it in at a later step
            self._joining.add(req)
            call_after(self.env, self._join_delay, self._joined, req)
        else:
            self._decode_join(req, now)

    # --- decode (fluid continuous batching) ----------------------------------
    def step_s(self, d: DecodeWorker) -> float:
        """The step time of d's batch now (d.step_s keeps it: call when the batch or speed changes)."""
        return self.slowdown[d.pod] * decode_step_s(self._step_base, self._step_per_seq, self._step_per_kv, d.n, d.kv_in_batch)

    def _advance(self, d: DecodeWorker, now: float) -> None:
        if d.n:
            d.V += (now - d.t) / d.step_s
        d.t = now

    def _decode_join(self, req: Ticket, now: float) -> None:
        d = self.decode[req.d_idx]
        self._advance(d, now)
        d.n += 1
        d.kv_in_batch += req.prompt_tokens
        d.step_s = self.step_s(d)
        self._seq += 1
        heappush(d.heap, (d.V + req.output_tokens, self._seq, req))
        req.first_token_s = now + d.step_s
        self._decode_schedule(d)

    def _decode_leave(self, d: DecodeWorker, req: Ticket) -> None:
        d.n -= 1
        d.kv_in_batch -= req.prompt_tokens
        d.step_s = self.step_s(d)
        self._unreserve(d, req)

    def _decode_schedule(self, d: DecodeWorker) -> None:
        """(Re)schedule the end of the next sequence; a step-end event scheduled before is stale."""
        heap = d.heap
        while heap and heap[0][2].done:  # timed-out sequences leave lazily
            heappop(heap)
        if not heap:
            d.timer = None
            return
        delay = max(0.0, (heap[0][0] - d.V) * d.step_s)
        d.timer = call_after(self.env, delay, self._decode_tick, d)

    def _decode_tick(self, ev: Call) -> None:
        d = ev.data
        if ev is not d.timer:
            return
        now = self.env.now
        self._advance(d, now)
        heap = d.heap
        eps = 1e-9 * max(1.0, d.V)
        while heap and heap[0][0] <= d.V + eps:
            _, _, req = heappop(heap)
            if req.done:
                continue
            self._decode_leave(d, req)
            lease = self._lease
            req.finish(now, OK if lease is None or req.kv_end_s <= req.prefill_end_s + lease else CORRUPT)
            self.reqs[req.request_id] = None  # the sweeps skip it; its memory goes now
        if d.waiting:
            self._admit(d, now)
        self._decode_schedule(d)

    # --- endings -------------------------------------------------------------
    def _give_up(self, req: Ticket, outcome: str) -> None:
        """A limit (the deadline, the first-token limit, an attempt's per-try timeout): the attempt
        ends in the stage it is in, the request with it unless it is retried; the worker it occupied
        lets it go (queued ones are skipped lazily when reached)."""
        now = self.env.now
        stage = req.stage
        self.end_attempt(req, now, outcome)
        if stage == KV_TRANSFER:
            flow = self._flows.get(req)
            if flow is not None and self._finish_pulls:
                # vLLM cannot cancel the read: it goes on, and the blocks stay held until it ends
                self._dead[req] = (now, self.net.transferred(flow) / self.wire_overhead)
                return
            if flow is not None:  # None: the bytes had arrived, the completion had not
                self.net.abort(self._flows.pop(req))
            self.ctx.dead_pull(req, now, now, PULL_CANCELLED if flow is not None else PULL_DONE, 0.0)
            self._release(self.decode[req.d_idx], req, now)
        elif stage == DECODE and req in self._joining:  # KV in, never in the batch
            self._unjoin(req, now)
        elif stage == DECODE:
            d = self.decode[req.d_idx]
            self._advance(d, now)
            self._decode_leave(d, req)
            self._admit(d, now)
            self._decode_schedule(d)

    @staticmethod
    def _unreserve(d: DecodeWorker, req: Ticket) -> None:
        """The request's decode blocks and batch slot, reserved at admission, are free again."""
        d.reserved_slots -= 1
        d.reserved_kv -= req.prompt_tokens + req.output_tokens

    # --- the surface engine deaths act through (simulator/engine_deaths.py) ------------------
    def end_attempt(self, req: Ticket, now: float, outcome: str) -> None:
        """The attempt ends as ``outcome`` in its stage, the request with it unless it is retried
        (then routed again after the backoff); the caller frees what it held."""
        i = req.request_id
        nxt = self.ctx.end_attempt(now, req, outcome, self._arr[i] + self.first_token_limit)
        self.reqs[i] = None
        if nxt is not None:
            call_after(self.env, nxt.at_s - now, self._retry, (i, nxt))

    def pulls(self) -> list[Ticket]:
        """The attempts whose KV is on the wire now, given-up pulls that go on included."""
        return list(self._flows)

    def given_up_pulls(self) -> list[Ticket]:
        """Pulls given up whose reads go on (engine.kv_pull_on_abort "finish")."""
        return list(self._dead)

    def stop_pull(self, req: Ticket) -> None:
        """``req``'s KV flow, if one is on the wire, stops."""
        flow = self._flows.pop(req, None)
        if flow is not None:
            self.net.abort(flow)

    def end_given_up(self, req: Ticket, at_s: float, outcome: str) -> None:
        """A given-up pull's read ends as ``outcome`` at ``at_s`` (NaN: no one sees it end)."""
        given_up, _ = self._dead.pop(req)
        self.stop_pull(req)
        self.ctx.dead_pull(req, given_up, at_s, outcome, NAN)

    def release(self, req: Ticket, now: float) -> None:
        """``req``, out of the batch, gives its decode reservation back."""
        self._release(self.decode[req.d_idx], req, now)

    def take_joining(self, d: DecodeWorker) -> list[Ticket]:
        """The requests whose KV is in on ``d`` but not yet in its batch, no longer joining."""
        joining = [r for r in self._joining if self.decode[r.d_idx] is d]
        self._joining.difference_update(joining)
        return joining

    def restore_link(self, link: int, pod: int, side: str) -> None:
        """The link carries KV at the rate the fault timeline sets for it now."""
        self.net.set_capacity(link, self.topo.core_link_Bps(float(getattr(self._applied, side)[pod])))

    # Hooks of the host model (simulator/host.py HostedClusterSim): engines of their own hold nothing.
    def unhold(self, req: Ticket) -> None:
        """The prefill engine no longer holds ``req``'s KV for a reader (the host model's demand)."""

    def orphaned(self, req: Ticket) -> None:
        """No decoder will read ``req``'s KV (its decode engine died): the host model's hold ends later."""

    def prefill_died(self, idx: int) -> None:
        """Prefill worker ``idx`` died: it computes and holds nothing from now (the host model's demand)."""

    def held_for(self, d: DecodeWorker) -> list[Ticket]:
        """The requests whose KV a prefill engine holds for decode worker ``d`` (the host model's)."""
        return []

    def decode_died(self, d: DecodeWorker) -> None:
        """Decode worker ``d`` died and holds nothing (the host model's demand)."""

    def _release(self, d: DecodeWorker, req: Ticket, now: float) -> None:
        """A request that never joined the batch gives its reservation back; the next may be admitted."""
        self._unreserve(d, req)
        self._admit(d, now)

    def _set_slowdown(self, pod: int, factor: float) -> None:
        """Compute degradation: decode batches of the pod advance at the new speed from now;
        a running prefill batch keeps the speed it started with (batches are short)."""
        now = self.env.now
        for d in self.decode:
            if d.pod == pod:
                self._advance(d, now)
        self.slowdown[pod] = factor
        for d in self.decode:
            if d.pod == pod:
                d.step_s = self.step_s(d)
                self._decode_schedule(d)
