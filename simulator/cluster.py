"""The SimPy model of a PD-disaggregated cluster.

* prefill workers: FCFS queue, batches of up to ``prefill_batch_tokens`` prompt
  tokens (a longer prompt runs alone), batch time = slowdown x (overhead +
  tokens / throughput);
* decode admission: a request reserves KV memory (prompt + output tokens) and a
  batch slot on its decode worker before its KV is pulled, as vLLM's decode
  engine allocates blocks before a NIXL read; without room it waits (stage
  ``queue``);
* KV transfer: a fluid flow of prompt_tokens x kv_bytes_per_token over the
  sender NIC, the pods' core links and the receiver NIC, max-min fair
  (:mod:`simulator.network`);
* decode: continuous batching as a fluid: every running sequence advances one
  token per step, step time = slowdown x (base + per_seq x batch + per_kv_token x
  KV tokens in the batch), recomputed whenever the batch changes;
* the deadline: a request not finished ``deadline_s`` after arrival is aborted
  where it is and recorded as a timeout of that stage.

The routing itself is :class:`testbed.routing.Router`, the same object the
real testbed's router actor drives.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable

import numpy as np
import simpy

from faults.schedule import FaultSchedule
from faults.spec import HealthSpec
from testbed.records import NAN, FaultEvent, RequestRecord
from testbed.routing import Route, Router
from testbed.spec import EngineSpec
from testbed.topology import Topology
from workloads.generate import Workload

from .network import FlowNetwork


class _Req:
    __slots__ = ("id", "arrival", "prompt", "output", "route", "stage", "done", "prefill_released",
                 "routed", "p_start", "p_end", "kv_start", "kv_end", "first_token", "flow", "kv_bytes",
                 "decode_key")

    def __init__(self, i: int, arrival: float, prompt: int, output: int) -> None:
        self.id, self.arrival, self.prompt, self.output = i, arrival, prompt, output
        self.route: Route | None = None
        self.stage = "queue"
        self.done = False
        self.prefill_released = False
        self.routed = self.p_start = self.p_end = self.kv_start = self.kv_end = self.first_token = NAN
        self.flow = -1
        self.kv_bytes = 0
        self.decode_key = 0.0


class _Prefill:
    __slots__ = ("queue", "busy", "pod")

    def __init__(self, pod: int) -> None:
        self.queue: deque[_Req] = deque()
        self.busy = False
        self.pod = pod


class _Decode:
    """Fluid continuous batching: V counts tokens produced per running sequence."""

    __slots__ = ("pod", "heap", "n", "kv_in_batch", "V", "t", "version", "reserved_kv", "reserved_slots", "waiting")

    def __init__(self, pod: int) -> None:
        self.pod = pod
        self.heap: list[tuple[float, int, _Req]] = []
        self.n = 0  # running sequences
        self.kv_in_batch = 0  # their prompt tokens (the KV each step reads)
        self.V = 0.0
        self.t = 0.0
        self.version = 0
        self.reserved_kv = 0  # admitted requests (in transfer or decoding)
        self.reserved_slots = 0
        self.waiting: deque[_Req] = deque()


class ClusterSim:
    def __init__(
        self,
        env: simpy.Environment,
        topo: Topology,
        engine: EngineSpec,
        router: Router,
        schedule: FaultSchedule,
        workload: Workload,
        deadline_s: float,
        kv_bytes_per_token: int,
        health: HealthSpec,
        slow_loop_s: float,
        sink: Callable[[Any], None],
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.env, self.topo, self.e, self.router = env, topo, engine, router
        self.schedule, self.wl, self.deadline = schedule, workload, deadline_s
        self.kv_bpt = kv_bytes_per_token
        self.health_spec = health
        self.sink = sink
        self.progress = progress
        self.net = FlowNetwork(env, topo.link_capacity_Bps())
        self.prefill = [_Prefill(int(topo.worker_pod[w])) for w in topo.prefill_ids]
        self.decode = [_Decode(int(topo.worker_pod[w])) for w in topo.decode_ids]
        self.slowdown = np.ones(topo.n_pods)
        self.reqs: list[_Req | None] = []
        self._seq = 0
        self.end_time = (float(workload.arrival_s[-1]) if len(workload) else 0.0) + deadline_s + 1.0
        env.process(self._arrivals())
        env.process(self._deadlines())
        env.process(self._faults())
        env.process(self._every(health.period_s, router.health_tick))
        env.process(self._every(slow_loop_s, router.slow_tick))

    def run(self) -> None:
        self.router.observe_bandwidth(0.0, np.full(self.topo.n_pods, self.topo.uplink_Bps))
        self.env.run(until=self.end_time)

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
            req = _Req(i, t, int(pt[i]), int(ot[i]))
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

    def _faults(self):
        env, topo, sched = self.env, self.topo, self.schedule
        events = sched.events()
        k = 0
        for t in sched.change_times():
            t = float(t)
            if t > env.now:
                yield env.timeout(t - env.now)
            bw = sched.bw_factor_at(t)
            up, down = sched.link_factors_at(t)
            for p in range(topo.n_pods):
                self.net.set_capacity(topo.uplink(p), topo.uplink_Bps * up[p])
                self.net.set_capacity(topo.downlink(p), topo.uplink_Bps * down[p])
            slow = sched.slowdown_at(t)
            for p in np.flatnonzero(slow != self.slowdown):
                self._set_slowdown(int(p), float(slow[p]))
            self.router.set_truth(sched.degraded_at(t, self.health_spec))
            self.router.observe_bandwidth(t, topo.uplink_Bps * bw)
            self.router.health_tick(t)  # the label model sees the onset now, not at its next period
            while k < len(events) and events[k].time_s <= t:
                ev = events[k]
                target = f"pod{ev.pod}.core_links" if ev.kind == "link" else f"pod{ev.pod}.workers"
                self.sink(FaultEvent(ev.time_s, ev.fault_id, ev.event, ev.kind, ev.pod, target, ev.severity))
                k += 1

    # --- request path ---------------------------------------------------------
    def _dispatch(self, req: _Req) -> None:
        now = self.env.now
        req.route = r = self.router.route(now, req.id, req.prompt, req.output)
        req.routed = now
        w = self.prefill[r.p_idx]
        w.queue.append(req)
        if not w.busy:
            self._start_prefill(r.p_idx)

    def _start_prefill(self, idx: int) -> None:
        w = self.prefill[idx]
        batch: list[_Req] = []
        tokens = 0
        budget = self.e.prefill_batch_tokens
        while w.queue:
            req = w.queue[0]
            if req.done:  # timed out while queued
                w.queue.popleft()
                continue
            if batch and tokens + req.prompt > budget:
                break
            w.queue.popleft()
            batch.append(req)
            tokens += req.prompt
        if not batch:
            w.busy = False
            return
        w.busy = True
        now = self.env.now
        for req in batch:
            req.stage = "prefill"
            req.p_start = now
        dur = self.slowdown[w.pod] * (self.e.prefill_overhead_s + tokens / self.e.prefill_tokens_per_s)
        ev = self.env.timeout(dur)
        ev.callbacks.append(lambda _e, idx=idx, batch=batch: self._end_prefill(idx, batch))

    def _end_prefill(self, idx: int, batch: list[_Req]) -> None:
        now = self.env.now
        for req in batch:
            if req.done:
                continue
            req.p_end = now
            req.prefill_released = True
            self.router.prefill_done(req.route)
            req.stage = "queue"  # waiting for decode admission
            d = self.decode[req.route.d_idx]
            d.waiting.append(req)
            self._admit(req.route.d_idx)
        self._start_prefill(idx)

    def _admit(self, d_idx: int) -> None:
        d = self.decode[d_idx]
        e = self.e
        while d.waiting:
            req = d.waiting[0]
            if req.done:
                d.waiting.popleft()
                continue
            need = req.prompt + req.output
            if d.reserved_slots >= e.decode_max_batch or (d.reserved_kv and d.reserved_kv + need > e.decode_kv_tokens):
                return
            d.waiting.popleft()
            d.reserved_slots += 1
            d.reserved_kv += need
            self._start_transfer(req)

    def _start_transfer(self, req: _Req) -> None:
        r = req.route
        req.stage = "kv_transfer"
        req.kv_start = self.env.now
        nbytes = req.prompt * self.kv_bpt
        req.kv_bytes = nbytes
        req.flow = self.net.start(self.topo.path(r.prefill_worker, r.decode_worker), nbytes,
                                  lambda _fid, req=req: self._end_transfer(req))

    def _end_transfer(self, req: _Req) -> None:
        if req.done:
            return
        req.flow = -1
        req.kv_end = self.env.now
        req.stage = "decode"
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

    def _decode_join(self, req: _Req) -> None:
        d = self.decode[req.route.d_idx]
        self._advance(d)
        d.n += 1
        d.kv_in_batch += req.prompt
        req.decode_key = d.V + req.output
        self._seq += 1
        heapq.heappush(d.heap, (req.decode_key, self._seq, req))
        req.first_token = self.env.now + self._step_s(d)
        self._decode_schedule(req.route.d_idx)

    def _decode_leave(self, d: _Decode, req: _Req) -> None:
        d.n -= 1
        d.kv_in_batch -= req.prompt
        d.reserved_slots -= 1
        d.reserved_kv -= req.prompt + req.output

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
            self._finish(req, "ok", None)
        self._admit(d_idx)
        self._decode_schedule(d_idx)

    # --- endings -------------------------------------------------------------
    def _timeout(self, req: _Req) -> None:
        stage = req.stage
        if stage == "kv_transfer":
            req.kv_bytes = int(self.net.abort(req.flow))
            d = self.decode[req.route.d_idx]
            d.reserved_slots -= 1
            d.reserved_kv -= req.prompt + req.output
            req.done = True
            self._admit(req.route.d_idx)
        elif stage == "decode":
            d = self.decode[req.route.d_idx]
            self._advance(d)
            self._decode_leave(d, req)
            req.done = True
            self._admit(req.route.d_idx)
            self._decode_schedule(req.route.d_idx)
        elif stage == "prefill":
            req.kv_bytes = 0
        self._finish(req, "timeout", stage)

    def _finish(self, req: _Req, outcome: str, stage: str | None) -> None:
        now = self.env.now
        req.done = True
        r = req.route
        self.router.finished(now, r, outcome, stage, req.prefill_released)
        req.prefill_released = True
        if outcome != "ok":
            req.kv_bytes = req.kv_bytes if stage in ("kv_transfer", "decode") else 0
        self.sink(RequestRecord(
            req.id, req.arrival, req.prompt, req.output, r.prefill_worker, r.decode_worker, r.prefill_pod,
            r.decode_pod, req.routed, req.p_start, req.p_end, req.kv_start, req.kv_end,
            req.first_token if outcome == "ok" or stage == "decode" else NAN, now if outcome == "ok" else NAN,
            outcome, stage, req.kv_bytes))

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
