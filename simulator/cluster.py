"""The SimPy model of a PD-disaggregated cluster.

* prefill workers: FCFS queue, batches of up to ``prefill_batch_tokens`` prompt
  tokens (a longer prompt runs alone), batch time = slowdown x (overhead +
  tokens / throughput);
* decode admission: a request reserves KV memory (prompt + output tokens) and a
  batch slot on its decode worker before its KV is pulled, as vLLM's decode
  engine allocates blocks before a NIXL read; without room it waits (stage
  ``decode_queue``);
* KV transfer: a fluid flow of the prompt's KV in whole cache blocks
  (``kv_block_tokens``) x kv_bytes_per_token over the sender NIC, the pods' core
  links and the receiver NIC, max-min fair (:mod:`simulator.network`), then the
  pull's fixed cost (``kv_transfer_latency_s``: its completion notice) before the
  request joins the decode batch;
* decode: continuous batching as a fluid: every running sequence advances one
  token per step, step time = slowdown x (base + per_seq x batch + per_kv_token x
  KV tokens in the batch), recomputed whenever the batch changes;
* the limits: a request without its first token ``ttft_timeout_s`` after arrival,
  or not finished ``deadline_s`` after it, is aborted where it is and recorded as a
  timeout of that stage.

Everything around the cluster is the run context both worlds open
(:class:`core.run.RunContext`): routing returns a :class:`core.ticket.Ticket`,
on which this model marks the stages of :mod:`core.stages` and which builds the
request's record when it ends; the fault timeline's steps come from there too,
and this model only sets its links' capacities and workers' speeds.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable

import numpy as np
import simpy

from core.records import NAN
from core.run import RunContext
from core.spec import EngineSpec
from core.ticket import Ticket
from core.topology import kv_transfer_bytes
from faults.schedule import FaultStep, ScheduledEvent
from faults.telemetry import link_measure_s
from workloads.generate import Workload

from .network import FlowNetwork


class _Prefill:
    __slots__ = ("queue", "busy", "pod")

    def __init__(self, pod: int) -> None:
        self.queue: deque[Ticket] = deque()
        self.busy = False
        self.pod = pod


class _Decode:
    """Fluid continuous batching: V counts tokens produced per running sequence."""

    __slots__ = ("pod", "heap", "n", "kv_in_batch", "V", "t", "version", "reserved_kv", "reserved_slots", "waiting")

    def __init__(self, pod: int) -> None:
        self.pod = pod
        self.heap: list[tuple[float, int, Ticket]] = []
        self.n = 0  # running sequences
        self.kv_in_batch = 0  # their prompt tokens (the KV each step reads)
        self.V = 0.0
        self.t = 0.0
        self.version = 0
        self.reserved_kv = 0  # admitted requests (in transfer or decoding)
        self.reserved_slots = 0
        self.waiting: deque[Ticket] = deque()


class ClusterSim:
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
        self.prefill = [_Prefill(int(topo.worker_pod[w])) for w in topo.prefill_ids]
        self.decode = [_Decode(int(topo.worker_pod[w])) for w in topo.decode_ids]
        self.slowdown = np.ones(topo.n_pods)
        self._applied: FaultStep | None = None  # the last step set (its measurement may still run)
        self._measuring: deque[FaultStep] = deque()  # steps whose measurement has not ended, in order
        self._measured_at = 0.0  # when the last of them ends
        self.reqs: list[Ticket | None] = []
        self._flows: dict[int, int] = {}  # request id -> its KV flow, while in kv_transfer
        self._seq = 0
        self.end_time = (float(workload.arrival_s[-1]) if len(workload) else 0.0) + deadline_s + 1.0
        env.process(self._arrivals())
        env.process(self._deadlines())
        self.first_token_limit = deadline_s if first_token_limit_s is None else min(first_token_limit_s, deadline_s)
        if self.first_token_limit < deadline_s:
            env.process(self._first_token_limits())
        env.process(self._faults())
        for period, fn in ctx.periodic:
            env.process(self._every(period, fn))

    def run(self) -> None:
        self.env.run(until=self.end_time)
        while self._measuring:  # measurements still running at the end: they end now
            self._end_step()
        closing = self.ctx.closing_step(self.env.now)  # faults still on when the run ends are cleared, recorded
        if closing is not None:
            self._apply(closing, measure=False)

    # --- processes ----------------------------------------------------------
    def _every(self, period: float, fn: Callable[[float], None]):
        while True:
            fn(self.env.now)
            yield self.env.timeout(period)

    def _arrivals(self):
        env, wl = self.env, self.wl
        arr, pt, ot = wl.arrival_s, wl.prompt_tokens, wl.output_tokens
        for i in range(len(wl)):
            t = float(arr[i])
            if t > env.now:
                yield env.timeout(t - env.now)
            req = self.ctx.route(env.now, i, t, int(pt[i]), int(ot[i]))
            self.reqs.append(req)
            self._dispatch(req)
            if self.progress is not None and i % 2000 == 0:
                self.progress(env.now / self.end_time)

    def _deadlines(self):
        """Sleep until the earliest deadline of a request not yet done (arrival order =
        deadline order, since the deadline is the same for all), then time it out."""
        env, i = self.env, 0
        n = len(self.wl)
        arr = self.wl.arrival_s
        while i < n:
            due = float(arr[i]) + self.deadline
            if due > env.now:
                yield env.timeout(due - env.now)
                continue
            if i < len(self.reqs):
                req = self.reqs[i]
                if req is not None and not req.done:
                    self._timeout(req)
                self.reqs[i] = None  # nothing refers to it any more
                i += 1
            else:  # not arrived yet (cannot happen for due <= now, but stay safe)
                yield env.timeout(0)

    def _first_token_limits(self):
        """The time-to-first-token limit, swept in arrival order like the deadline: a request
        still without its first token then (not yet in decode, or its first step not done) times
        out where it is."""
        env, arr, limit = self.env, self.wl.arrival_s, self.first_token_limit
        for i in range(len(self.wl)):
            due = float(arr[i]) + limit
            if due > env.now:
                yield env.timeout(due - env.now)
            req = self.reqs[i] if i < len(self.reqs) else None
            if req is not None and not req.done and not req.first_token_s <= env.now:
                self._timeout(req)

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
        for p in step.changed.tolist():
            self.net.set_capacity(topo.uplink(p), topo.core_link_Bps(step.uplink[p]))
            self.net.set_capacity(topo.downlink(p), topo.core_link_Bps(step.downlink[p]))
            if step.slowdown[p] != self.slowdown[p]:
                self._set_slowdown(p, float(step.slowdown[p]))
        before = self._applied
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
        target = f"pod{ev.pod}.core_links" if ev.kind == "link" else f"pod{ev.pod}.workers"
        return [(target, ev.time_s, NAN, NAN)]

    # --- request path ---------------------------------------------------------
    def _dispatch(self, req: Ticket) -> None:
        w = self.prefill[req.p_idx]
        w.queue.append(req)
        if not w.busy:
            self._start_prefill(req.p_idx)

    def _start_prefill(self, idx: int) -> None:
        w = self.prefill[idx]
        batch: list[Ticket] = []
        tokens = 0
        budget = self.e.prefill_batch_tokens
        while w.queue:
            req = w.queue[0]
            if req.done:  # timed out while queued
                w.queue.popleft()
                continue
            if batch and tokens + req.prompt_tokens > budget:
                break
            w.queue.popleft()
            batch.append(req)
            tokens += req.prompt_tokens
        if not batch:
            w.busy = False
            return
        w.busy = True
        now = self.env.now
        for req in batch:
            req.enter("prefill", now)
        dur = self.slowdown[w.pod] * (self.e.prefill_overhead_s + tokens / self.e.prefill_tokens_per_s)
        ev = self.env.timeout(dur)
        ev.callbacks.append(lambda _e, idx=idx, batch=batch: self._end_prefill(idx, batch))

    def _end_prefill(self, idx: int, batch: list[Ticket]) -> None:
        now = self.env.now
        for req in batch:
            if req.done:
                continue
            req.enter("decode_queue", now)  # waiting for decode admission; the prefill worker is free of it
            self.decode[req.d_idx].waiting.append(req)
            self._admit(req.d_idx)
        self._start_prefill(idx)

    def _admit(self, d_idx: int) -> None:
        d = self.decode[d_idx]
        e = self.e
        while d.waiting:
            req = d.waiting[0]
            if req.done:
                d.waiting.popleft()
                continue
            need = req.prompt_tokens + req.output_tokens
            if d.reserved_slots >= e.decode_max_batch or (d.reserved_kv and d.reserved_kv + need > e.decode_kv_tokens):
                return
            d.waiting.popleft()
            d.reserved_slots += 1
            d.reserved_kv += need
            self._start_transfer(req)

    def _start_transfer(self, req: Ticket) -> None:
        req.enter("kv_transfer", self.env.now)
        req.kv_bytes = nbytes = kv_transfer_bytes(req.prompt_tokens, self.e.kv_block_tokens, self.kv_bpt)
        on_wire = nbytes * self.wire_overhead  # protocol headers travel too
        self._flows[req.request_id] = self.net.start(self.topo.path(req.prefill_worker, req.decode_worker), on_wire,
                                                     lambda _fid, req=req: self._end_flow(req))

    def _end_flow(self, req: Ticket) -> None:
        if req.done:
            return
        del self._flows[req.request_id]
        latency = self.e.kv_transfer_latency_s
        if latency > 0:  # the bytes are there; the pull's completion reaches the scheduler later
            self.env.timeout(latency).callbacks.append(lambda _e, req=req: self._end_transfer(req))
        else:
            self._end_transfer(req)

    def _end_transfer(self, req: Ticket) -> None:
        if req.done:  # timed out while the completion was on its way
            return
        req.enter("decode", self.env.now)
        self._decode_join(req)

    # --- decode (fluid continuous batching) ----------------------------------
    def _step_s(self, d: _Decode) -> float:
        e = self.e
        return self.slowdown[d.pod] * (e.decode_step_base_s + e.decode_step_per_seq_s * d.n
                                       + e.decode_step_per_kv_token_s * d.kv_in_batch)

    def _advance(self, d: _Decode) -> None:
        now = self.env.now
        if d.n:
            d.V += (now - d.t) / self._step_s(d)
        d.t = now

    def _decode_join(self, req: Ticket) -> None:
        d = self.decode[req.d_idx]
        self._advance(d)
        d.n += 1
        d.kv_in_batch += req.prompt_tokens
        self._seq += 1
        heapq.heappush(d.heap, (d.V + req.output_tokens, self._seq, req))
        req.first_token_s = self.env.now + self._step_s(d)
        self._decode_schedule(req.d_idx)

    def _decode_leave(self, d: _Decode, req: Ticket) -> None:
        d.n -= 1
        d.kv_in_batch -= req.prompt_tokens
        d.reserved_slots -= 1
        d.reserved_kv -= req.prompt_tokens + req.output_tokens

    def _decode_schedule(self, d_idx: int) -> None:
        d = self.decode[d_idx]
        heap = d.heap
        while heap and heap[0][2].done:  # timed-out sequences leave lazily
            heapq.heappop(heap)
        d.version += 1
        if not heap:
            return
        delay = max(0.0, (heap[0][0] - d.V) * self._step_s(d))
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _e, d_idx=d_idx, v=d.version: self._decode_tick(d_idx, v))

    def _decode_tick(self, d_idx: int, version: int) -> None:
        d = self.decode[d_idx]
        if version != d.version:
            return
        self._advance(d)
        heap = d.heap
        eps = 1e-9 * max(1.0, d.V)
        while heap and heap[0][0] <= d.V + eps:
            _, _, req = heapq.heappop(heap)
            if req.done:
                continue
            self._decode_leave(d, req)
            req.finish(self.env.now, "ok")
        self._admit(d_idx)
        self._decode_schedule(d_idx)

    # --- endings -------------------------------------------------------------
    def _timeout(self, req: Ticket) -> None:
        """The deadline: the ticket records a timeout of the stage the request is in; the
        worker it occupied lets it go (queued ones are skipped lazily when reached)."""
        stage = req.stage
        req.finish(self.env.now, "timeout")
        if stage == "kv_transfer":
            flow = self._flows.pop(req.request_id, None)
            if flow is not None:  # None: the bytes had arrived, the completion had not
                self.net.abort(flow)
            d = self.decode[req.d_idx]
            d.reserved_slots -= 1
            d.reserved_kv -= req.prompt_tokens + req.output_tokens
            self._admit(req.d_idx)
        elif stage == "decode":
            d = self.decode[req.d_idx]
            self._advance(d)
            self._decode_leave(d, req)
            self._admit(req.d_idx)
            self._decode_schedule(req.d_idx)

    def _set_slowdown(self, pod: int, factor: float) -> None:
        """Compute degradation: decode batches of the pod advance at the new speed from now;
        a running prefill batch keeps the speed it started with (batches are short)."""
        for i, d in enumerate(self.decode):
            if d.pod == pod:
                self._advance(d)
        self.slowdown[pod] = factor
        for i, d in enumerate(self.decode):
            if d.pod == pod:
                self._decode_schedule(i)
