"""The host the engines share: the simulator's host model (docs/simulator.md "The host model").

On the emulated testbed every engine is a vLLM CPU engine on one machine (each pod is a network
namespace of it), and they compete for its cores (``engine.host_cores``). What an engine demands
depends on what it does (docs/simulator.md "Demand by state"):

* ``engine.host_engine_cores`` while it computes: a prefill batch runs;
* ``engine.host_decode_cores`` while a decode engine's batch decodes;
* ``engine.host_hold_cores`` while a prefill engine computes nothing but holds KV a decoder has yet
  to read: vLLM keeps such a request in its scheduler until the read is done
  (``delay_free_blocks``), and an engine core whose scheduler has requests steps every millisecond
  (``EngineCore._process_engine_step`` sleeps 1 ms while ``scheduler.has_requests()``), each step
  a call to its worker;
* ``engine.host_pull_cores`` while a decode engine decodes nothing but holds admitted requests: a
  pull in flight to it, a dead pull it still waits for (``engine.kv_pull_on_abort: finish``);
* ``engine.host_engine_cores`` for ``engine.host_spin_s`` after all of that: the worker's reader of
  the shared-memory queue busy-waits that long after its last read (``shm_broadcast.SpinCondition``,
  ``busy_loop_s``);

and the rest of the host (Ray, the router, the driver) ``engine.host_background_cores`` all along.
When that is more than the host has, every computing engine computes at cores / demand of its speed
(processor sharing, as Linux's fair scheduler gives runnable threads): a running prefill batch is an
amount of work whose end is rescheduled whenever that factor changes, and a decode step takes
``step_s / factor``. Both multiply with a compute fault's slowdown; here a prefill batch follows a
slowdown that changes under it too (the plain model keeps the speed it started with). KV pulls are
not slowed: their bytes are the network's (``simulator/network.py``).

:class:`HostedClusterSim` is :class:`simulator.cluster.ClusterSim` with the host, made by
:func:`cluster_sim` when ``host_cores`` is set; without it the run is ClusterSim's, untouched. A
change of the factor reschedules every running batch of the cluster, so the model is for a host's
handful of engines, not for a 1,024-worker cluster.
"""

from __future__ import annotations

from typing import Any

from core.engine_timing import prefill_s
from core.host_model import host_speed
from core.spec.model import EngineSpec
from core.ticket import Ticket
from vocab import DECODE_QUEUE, KV_TRANSFER

from .cluster import ClusterSim
from .events import Call, call_after
from .workers import DecodeWorker

__all__ = ["HostedClusterSim", "cluster_sim"]


def cluster_sim(env: Any, ctx: Any, engine: EngineSpec, *args: Any, **kwargs: Any) -> ClusterSim:
    """The cluster model for ``engine`` (ClusterSim's arguments): with the shared host where the
    engine names one (``host_cores``), else ClusterSim itself."""
    cls = ClusterSim if engine.host_cores is None else HostedClusterSim
    return cls(env, ctx, engine, *args, **kwargs)


class HostedClusterSim(ClusterSim):
    """ClusterSim whose engines share ``engine.host_cores`` cores (module docstring).

    Engines are numbered prefill workers first, then decode workers. ``factor`` is the speed the
    host leaves every computing engine now (1: the host keeps up with what they demand)."""

    def __init__(self, env: Any, ctx: Any, engine: EngineSpec, *args: Any, **kwargs: Any) -> None:
        if engine.host_cores is None:
            raise ValueError("HostedClusterSim needs engine.host_cores (ClusterSim models engines without a shared host)")
        self.factor = 1.0  # read by step_s, which ClusterSim.__init__ calls
        super().__init__(env, ctx, engine, *args, **kwargs)
        self._cores, self._per_engine = float(engine.host_cores), float(engine.host_engine_cores)
        self._hold, self._pull = float(engine.host_hold_cores), float(engine.host_pull_cores)
        self._decoding, self._background = float(engine.host_decode_cores), float(engine.host_background_cores)
        self._spin_s = float(engine.host_spin_s)
        n_p = len(self.prefill)
        self._engine_of = {d: n_p + i for i, d in enumerate(self.decode)}
        n = n_p + len(self.decode)
        self._state = [0.0] * n  # what an engine's work demands now (0: none)
        self._dem = [0.0] * n  # what it demands now: its work's, or its spin's after it
        self._tail: list[Call | None] = [None] * n  # the pending end of an engine's spin
        self._total = self._background  # all the host's demand now
        self._held: dict[Ticket, int] = {}  # request -> the prefill worker holding its KV for the pull
        self._held_n = [0] * n_p
        # a prefill worker's running batch: work left (seconds at full speed) as of `since`, its end event
        self._work = [0.0] * n_p
        self._since = [0.0] * n_p
        self._batch: list[Any] = [None] * n_p
        self._timer: list[Call | None] = [None] * n_p
        # for run.json: seconds with the host short of cores, the lowest factor, core-seconds the
        # engines demanded
        self._counted_to = 0.0
        self.slowed_s = 0.0
        self.min_factor = 1.0
        self.demand_core_s = 0.0
        if host_speed(self._cores, self._total) < 1.0:  # the background alone exceeds the host
            self._rescale(host_speed(self._cores, self._total), 0.0)

    def host_summary(self) -> dict[str, float]:
        """What the host did over the run (run.json ``sim_host``)."""
        self._count(self.env.now)
        return {"cores": self._cores, "engine_cores": self._per_engine, "hold_cores": self._hold,
                "pull_cores": self._pull, "decode_cores": self._decoding, "background_cores": self._background,
                "spin_s": self._spin_s, "slowed_s": self.slowed_s, "min_factor": self.min_factor,
                "demand_core_s": self.demand_core_s}

    # --- demand --------------------------------------------------------------------
    def _set_state(self, e: int, cores: float) -> None:
        """Engine e's work now demands ``cores`` (0: it has none left): from now, or, going idle, its
        worker's spin demands a computing thread's for spin_s more."""
        if cores == self._state[e]:
            return
        self._state[e] = cores
        if cores > 0:
            self._tail[e] = None  # a pending end of its spin is stale
            self._set_demand(e, cores)
        elif self._spin_s > 0:
            self._set_demand(e, self._per_engine)
            self._tail[e] = call_after(self.env, self._spin_s, self._spin_end, e)
        else:
            self._set_demand(e, 0.0)

    def _spin_end(self, ev: Call) -> None:
        e = ev.data
        if ev is self._tail[e]:
            self._tail[e] = None
            self._set_demand(e, 0.0)

    def _set_demand(self, e: int, cores: float) -> None:
        if cores == self._dem[e]:
            return
        now = self.env.now
        self._count(now)
        self._dem[e] = cores
        self._total = self._background + sum(self._dem)  # summed anew: no drift from adding and taking
        factor = host_speed(self._cores, self._total)
        if factor != self.factor:
            self._rescale(factor, now)

    def _count(self, now: float) -> None:
        dt = now - self._counted_to
        if self.factor < 1.0:
            self.slowed_s += dt
        self.demand_core_s += dt * (self._total - self._background)
        self._counted_to = now

    def _prefill_state(self, idx: int) -> None:
        self._set_state(idx, self._per_engine if self.prefill[idx].busy else self._hold if self._held_n[idx] else 0.0)

    def _decode_state(self, d: DecodeWorker) -> None:
        self._set_state(self._engine_of[d], self._decoding if d.n else self._pull if d.reserved_slots else 0.0)

    def _rescale(self, factor: float, now: float) -> None:
        """Every running batch goes on at the new speed from now: what it did so far at the old."""
        for d in self.decode:
            self._advance(d, now)
        running = [i for i, t in enumerate(self._timer) if t is not None]
        for i in running:
            self._progress(i, now)
        self.factor = factor
        self.min_factor = min(self.min_factor, factor)
        for d in self.decode:
            d.step_s = self.step_s(d)
            if d.heap:
                self._first_tokens(d, now)
                self._decode_schedule(d)
        for i in running:
            self._schedule_prefill(i)

    @staticmethod
    def _first_tokens(d: DecodeWorker, now: float) -> None:
        """A sequence's first token comes one step's progress after it joined (V at its join + 1);
        ClusterSim fixes it at the join, which a factor changing within that step would miss."""
        V, step_s = d.V, d.step_s
        for end_v, _, req in d.heap:
            if req.first_token_s > now and not req.done:
                req.first_token_s = now + (end_v - req.output_tokens + 1 - V) * step_s

    # --- prefill: a fluid batch ------------------------------------------------------
    def _run_prefill(self, idx: int, batch: list[Ticket], tokens: int) -> None:
        self._set_state(idx, self._per_engine)  # first: a new demand reschedules the others, this one starts at its speed
        self._work[idx] = prefill_s(self._prefill_overhead, self._prefill_tps, tokens)
        self._since[idx] = self.env.now
        self._batch[idx] = (idx, batch)
        self._schedule_prefill(idx)

    def _schedule_prefill(self, idx: int) -> None:
        # work x slowdown / factor: with factor 1 the very delay ClusterSim gives the batch
        delay = self._work[idx] * self.slowdown[self.prefill[idx].pod] / self.factor
        self._timer[idx] = call_after(self.env, delay, self._prefill_due, self._batch[idx])

    def _progress(self, idx: int, now: float) -> None:
        done = (now - self._since[idx]) * self.factor / self.slowdown[self.prefill[idx].pod]
        self._work[idx] = max(0.0, self._work[idx] - done)
        self._since[idx] = now

    def _prefill_due(self, ev: Call) -> None:
        idx = ev.data[0]
        if ev is self._timer[idx]:  # else rescheduled since
            self._timer[idx] = None
            self._end_prefill(ev)

    def _end_prefill(self, ev: Call) -> None:
        idx, batch = ev.data
        for req in batch:  # the KV of those that go on is held here until it is read
            if not req.done:
                self._held[req] = idx
                self._held_n[idx] += 1
        super()._end_prefill(ev)
        self._prefill_state(idx)

    def unhold(self, req: Ticket) -> None:
        idx = self._held.pop(req, None)
        if idx is not None:
            self._held_n[idx] -= 1
            self._prefill_state(idx)

    def _end_transfer(self, req: Ticket) -> None:
        self.unhold(req)  # read (a dead pull's end included): the prefill engine frees the KV
        super()._end_transfer(req)

    def _give_up(self, req: Ticket, outcome: str) -> None:
        stage = req.stage
        super()._give_up(req, outcome)
        # a dead pull goes on reading (its end unholds); otherwise the KV is no longer waited for
        if (stage == DECODE_QUEUE or stage == KV_TRANSFER) and req not in self._dead:
            self.unhold(req)

    # --- engines that die (the hooks simulator/engine_deaths.py calls): they demand nothing from then on
    def prefill_died(self, idx: int) -> None:
        self._timer[idx] = None  # its batch's end is stale
        for req in [r for r, i in self._held.items() if i == idx]:
            del self._held[req]
        self._held_n[idx] = 0
        self._prefill_state(idx)

    def held_for(self, d: DecodeWorker) -> list[Ticket]:
        return [r for r in self._held if self.decode[r.d_idx] is d]

    def decode_died(self, d: DecodeWorker) -> None:
        self._decode_state(d)

    def orphaned(self, req: Ticket) -> None:
        """No decoder will read ``req``'s KV (its decode engine died): the prefill engine keeps it (and
        steps meanwhile) until its lease runs out. A dead decoder renews nothing, and vLLM's renewal
        extends a lease to 2/3 of it (docs/reliability.md "A dead decoder's prefill
        partner"); without a lease set, the first-token limit, which the testbed's derived
        lease exceeds (EngineConfig.kv_lease_s), bounds it."""
        lease = self.e.kv_lease_s
        call_after(self.env, 2 / 3 * lease if lease is not None else self.first_token_limit, self._lease_ended, req)

    def _lease_ended(self, ev: Call) -> None:
        self.unhold(ev.data)

    def _set_slowdown(self, pod: int, factor: float) -> None:
        now = self.env.now
        running = [i for i, t in enumerate(self._timer) if t is not None and self.prefill[i].pod == pod]
        for i in running:
            self._progress(i, now)
        super()._set_slowdown(pod, factor)
        for i in running:
            self._schedule_prefill(i)

    # --- decode ----------------------------------------------------------------------
    def step_s(self, d: DecodeWorker) -> float:
        return ClusterSim.step_s(self, d) / self.factor

    def _admit(self, d: DecodeWorker, now: float) -> None:
        super()._admit(d, now)
        self._decode_state(d)

    def _decode_join(self, req: Ticket, now: float) -> None:
        super()._decode_join(req, now)
        self._decode_state(self.decode[req.d_idx])

    def _unreserve(self, d: DecodeWorker, req: Ticket) -> None:  # also as a sequence leaves the batch
        ClusterSim._unreserve(d, req)
        self._decode_state(d)
