"""The router's logic, world-independent: the simulator and the Ray router actor
both drive this object, passing ``now`` from their own clock.

* fast loop: :meth:`Router.route` scores candidates with the policy, charges
  the chosen workers' in-flight counters and returns the request's
  :class:`core.ticket.Ticket`, which releases them when the request ends;
* slow loop: :meth:`Router.slow_tick` turns utilisation, bandwidth telemetry and
  outcome history into pod prices;
* :meth:`Router.health_tick` turns ground truth into labels for the mask.

Every decision, label change and price is handed to ``sink`` as a record.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from faults.health import HealthLabelModel
from faults.telemetry import BandwidthTelemetry
from vocab import OK, ROLE_DECODE, ROLE_PREFILL

from .breaker import PodBreakers
from .in_flight import InFlightEvidence
from .policies import Policy
from .records import DecisionRecord, EngineRecord, HealthRecord, PriceRecord, make_row
from .risk import RiskPriceEstimator
from .stages import blamed_pods
from .ticket import Ticket, rejected_record
from .topology import Topology
from .view import Capacity, ClusterView, Loads, PodState


class Router:
    def __init__(
        self,
        topo: Topology,
        capacity: Capacity,
        policy: Policy,
        estimator: RiskPriceEstimator,
        health: HealthLabelModel,
        telemetry: BandwidthTelemetry,
        bw0: np.ndarray,
        sink: Callable[[Any], None],
        max_in_flight: int | None = None,
        breakers: PodBreakers | None = None,
        evidence: InFlightEvidence | None = None,
    ) -> None:
        self.topo = topo
        self.policy = policy
        self.estimator = estimator
        self.health = health
        self.telemetry = telemetry
        self.bw0 = np.asarray(bw0, float)
        self.sink = sink
        self.view = ClusterView(topo, capacity, Loads.zeros(topo), PodState.initial(topo.n_pods))
        # The topology's ids as Python lists: route reads four of them per request.
        self._prefill_ids: list[int] = topo.prefill_ids.tolist()
        self._decode_ids: list[int] = topo.decode_ids.tolist()
        self._worker_pod: list[int] = topo.worker_pod.tolist()
        self._truth = np.zeros(topo.n_pods, bool)
        self._link_Bps: np.ndarray | None = None  # None: every core link intact
        self.max_in_flight = max_in_flight  # None: no admission limit
        self.in_flight = 0  # routed and not yet ended
        self.rejected = 0
        self.breakers = breakers  # None: no circuit breaker
        self.evidence = evidence  # None: the price learns from ended requests only

    # --- fast loop --------------------------------------------------------
    def admit(self, now: float, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether the request may be routed (the admission limit); a refused one is recorded at
        once as ``rejected`` in ``admission`` (never routed: no worker, no stage times)."""
        if self.max_in_flight is None or self.in_flight < self.max_in_flight:
            return True
        self.rejected += 1
        self.sink(rejected_record(request_id, arrival_s, prompt_tokens, output_tokens))
        return False

    def route(self, now: float, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
              attempt: int = 0, avoid: frozenset[int] | None = None) -> Ticket:
        """Choose the request's prefill and decode workers; its ticket starts in ``prefill_queue``.
        A retry (``attempt`` > 0) avoids the pods in ``avoid`` where others are left, and is still
        in flight (the admission limit counts a request once)."""
        if self.breakers is not None and now >= self.breakers.next_change_s and self.breakers.tick(now):
            self._breakers_changed()
        t0 = time.perf_counter()
        c = self.policy.choose(self.view, avoid) if avoid else self.policy.choose(self.view)
        latency = time.perf_counter() - t0
        p, d = c.prefill, c.decode
        pw, dw = self._prefill_ids[p], self._decode_ids[d]
        pp, dp = self._worker_pod[pw], self._worker_pod[dw]
        loads = self.view.loads
        loads.prefill_outstanding[p] += 1
        loads.prefill_tokens[p] += prompt_tokens
        loads.decode_outstanding[d] += 1
        loads.decode_kv_tokens[d] += prompt_tokens + output_tokens
        if not attempt:
            self.in_flight += 1
        # every field in order (make_row: without the named tuple's constructor, once per request)
        self.sink(make_row(DecisionRecord, (now, request_id, self.policy.name, c.n_candidates, c.n_filtered, latency,
                                            pw, dw, pp, dp, c.score)))
        return Ticket(self, now, request_id, arrival_s, prompt_tokens, output_tokens, p, d, pw, dw, pp, dp, attempt,
                      avoid or frozenset())

    # Called by Ticket only: a world marks stages and finishes tickets, never these.
    def prefill_done(self, t: Ticket) -> None:
        """The request left its prefill worker (finished prefill, or failed there)."""
        loads = self.view.loads
        loads.prefill_outstanding[t.p_idx] -= 1
        loads.prefill_tokens[t.p_idx] -= t.prompt_tokens
        if self.evidence is not None and not t.done:  # handed to decode (not failed in prefill)
            self.evidence.handed_off(t, t.prefill_end_s, t.prefill_pod, t.decode_pod)

    def finished(self, now: float, t: Ticket, outcome: str, stage: str | None, retrying: bool = False) -> None:
        """The request's attempt ended (its prefill counters are already released); ``retrying``:
        the request goes on with another attempt, so it stays in flight."""
        if not retrying:
            self.in_flight -= 1
        loads = self.view.loads
        loads.decode_outstanding[t.d_idx] -= 1
        loads.decode_kv_tokens[t.d_idx] -= t.prompt_tokens + t.output_tokens
        pp, dp = t.prefill_pod, t.decode_pod
        self.estimator.observe(now, pp, dp, outcome, stage)
        if self.evidence is not None:
            self.evidence.ended(now, t, outcome == OK)
        blamed = () if outcome == OK else blamed_pods(stage, pp, dp)
        self.health.observe(now, (pp, dp), blamed, outcome)
        if self.breakers is not None:
            served = () if outcome != OK else (pp,) if pp == dp else (pp, dp)
            if self.breakers.observe(now, served, blamed):
                self._breakers_changed()

    def _breakers_changed(self) -> None:
        self.view.pods = self.view.pods.replace(blocked=self.breakers.blocked)
        self.policy.prepare(self.view)  # off the next decision's path

    def set_engine_state(self, now: float, worker: int, reason: str, up: bool = False) -> None:
        """The engine of ``worker`` is down (``up`` False): never chosen again while its role has
        another, until it is up again (a restarted engine found serving). Each change recorded once."""
        down = np.zeros(self.topo.n_workers, bool) if self.view.pods.down is None else self.view.pods.down.copy()
        if down[worker] != up:
            return
        down[worker] = not up
        self.view.pods = self.view.pods.replace(down=down)
        self.policy.prepare(self.view)  # off the next decision's path
        role = ROLE_PREFILL if worker in self._prefill_ids else ROLE_DECODE
        self.sink(EngineRecord(now, worker, self._worker_pod[worker], role, "up" if up else "down", reason))

    # --- ground truth, labels, telemetry ----------------------------------
    def set_truth(self, degraded: np.ndarray, link_Bps: np.ndarray | None = None) -> None:
        """Ground truth (OracleAvoidance's filter reads it; the alert labels are made from it)
        and each pod's core-link rate (what the health probe's answer crosses)."""
        self._truth = np.asarray(degraded, bool).copy()
        if link_Bps is not None:
            self._link_Bps = np.asarray(link_Bps, float).copy()
        self.view.pods = self.view.pods.replace(degraded=self._truth)
        self.policy.prepare(self.view)  # off the next decision's path

    def observe_bandwidth(self, now: float, bw: np.ndarray) -> None:
        self.telemetry.observe(now, np.asarray(bw, float))

    def health_tick(self, now: float) -> None:
        changes = self.health.update(now, self._truth, self._link_Bps)
        if changes:
            for ch in changes:
                self.sink(HealthRecord(ch.time_s, ch.pod, ch.unhealthy, ch.truth_degraded))
            self.view.pods = self.view.pods.replace(unhealthy=self.health.labels.copy())
            self.policy.prepare(self.view)  # off the next decision's path

    # --- slow loop --------------------------------------------------------
    def slow_tick(self, now: float) -> None:
        overdue = None if self.evidence is None else self.evidence.overdue(now)
        comp = self.estimator.update(now, self.view.pod_util(), self.telemetry.view(now), self.bw0, overdue)
        self.view.pods = self.view.pods.replace(price=comp.price)
        self.policy.prepare(self.view)  # off the next decision's path
        columns = (comp.price.tolist(), comp.util.tolist(), comp.bw_term.tolist(), comp.timeout_rate.tolist(),
                   comp.failure_rate.tolist())
        for p, row in enumerate(zip(*columns)):
            self.sink(make_row(PriceRecord, (now, p, *row)))
