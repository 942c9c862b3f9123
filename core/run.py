"""The run context both worlds open: one (policy, seed) of a spec, in either world.

It holds everything around the router that does not depend on the world:

* the run directory's metadata and writer (``run.json`` and the tables);
* the router, with its policy, risk price, label model and telemetry, fed the
  initial bandwidth view;
* the periodic loops (slow-loop price update, health-label ticks) as
  ``(period, fn(now))`` pairs that the world's clock drives;
* the fault timeline as steps (:class:`faults.schedule.FaultStep`): at each,
  :meth:`RunContext.begin_step` gives the router the new ground truth and a
  label update, the world acts on its links and CPUs, and
  :meth:`RunContext.end_step` records the events as acted and gives the
  router the bandwidth the world measured;
* :meth:`RunContext.route`, which returns a request's :class:`core.ticket.Ticket`, and
  :meth:`RunContext.end_attempt`, which ends it: the request's end, or with ``router.retry`` a
  failed attempt's, and then when and how to route it again (:mod:`core.retry`).

A world supplies only how it waits (SimPy's ``env.now`` or the wall clock), how
it acts on links and CPUs, and what it measured.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from faults.schedule import FaultSchedule, FaultStep, ScheduledEvent
from vocab import PULL_ENDINGS

from .experiment import make_router, run_dir_for, seed_streams
from .records import DeadPullRecord, FaultEvent, RunWriter
from .retry import NextAttempt, Retries
from core.spec.model import ExperimentSpec
from .ticket import Ticket
from .topology import Topology
from .view import Capacity

log = logging.getLogger(__name__)

# One fault row as a world recorded it: (target, time acted, measured on the severity's scale, measured bit/s),
# and for a GPU compute fault the SM clock ratio after them (core/records.py FaultEvent).
FaultRow = tuple[str, float, float, float] | tuple[str, float, float, float, float]


class RunContext:
    def __init__(self, spec: ExperimentSpec, world: str, policy: str, seed: int, out: Path | str, topo: Topology,
                 workload_summary: dict[str, Any], capacity: Capacity | None = None,
                 meta: dict[str, Any] | None = None, flush_s: float = 2.0) -> None:
        self.spec, self.topo, self.world = spec, topo, world
        self.schedule = FaultSchedule(spec.faults, topo.n_pods)
        self.steps: list[FaultStep] = self.schedule.steps(spec.health)
        self.run_dir = run_dir_for(Path(out), spec, policy, seed)
        self._logged_end = False  # closed, then the with block left: its end said once
        self.writer = RunWriter(self.run_dir, {
            "world": world, "scenario": spec.name, "policy": policy, "seed": seed,
            "spec": spec.model_dump(mode="json"), "workload": workload_summary,
            "fault_pods": self.schedule.fault_pods(), **(meta or {})}, flush_s=flush_s)
        rngs = seed_streams(seed)
        self.router = make_router(spec, topo, policy, rngs, self.writer.write, capacity)
        self.retries = Retries(spec.router.retry, rngs["retry"]) if spec.router.retry is not None else None
        self.router.observe_bandwidth(0.0, np.full(topo.n_pods, topo.uplink_Bps))
        self.last_step: FaultStep | None = None

    # --- loops ----------------------------------------------------------------
    @property
    def periodic(self) -> list[tuple[float, Callable[[float], None]]]:
        """What the world's clock calls every period, from run start: health labels, then prices."""
        return [(self.spec.health.period_s, self.router.health_tick),
                (self.spec.router.slow_loop_s, self.router.slow_tick)]

    def admit(self, now: float, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> bool:
        """False (and the request recorded as ``rejected``) past the spec's admission limit."""
        return self.router.admit(now, request_id, arrival_s, prompt_tokens, output_tokens)

    def route(self, now: float, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
              retry: NextAttempt | None = None) -> Ticket:
        """The request's ticket: its first attempt, or the retry ``end_attempt`` returned."""
        if retry is None:
            return self.router.route(now, request_id, arrival_s, prompt_tokens, output_tokens)
        return self.router.route(now, request_id, arrival_s, prompt_tokens, output_tokens, retry.attempt, retry.avoid)

    # --- retries (router.retry) ----------------------------------------------------
    def attempt_limit(self, t: Ticket, first_by: float) -> float:
        """When attempt ``t`` is given up without a first token (``first_by``: the request's
        first-token limit, which it is without retries)."""
        return first_by if self.retries is None else self.retries.attempt_limit(t, first_by)

    def end_attempt(self, now: float, t: Ticket, outcome: str, first_by: float) -> NextAttempt | None:
        """End attempt ``t`` at ``now`` with ``outcome``: the request's end (None returned), or, if
        it is retried (core/retry.py), the attempt's, and the retry the world routes at its time."""
        nxt = None if self.retries is None else self.retries.next_attempt(now, t, outcome, first_by)
        if nxt is None:
            t.finish(now, outcome)
        else:
            t.abandon(now, outcome, nxt.at_s - now)
        return nxt

    # --- the fault timeline -----------------------------------------------------
    def begin_step(self, step: FaultStep, now: float) -> None:
        """The truth changes with the schedule: the oracle and the label model see it now,
        not after the world has acted and measured."""
        topo = self.topo
        link = np.minimum([topo.core_link_Bps(f) for f in step.uplink], [topo.core_link_Bps(f) for f in step.downlink])
        self.router.set_truth(step.degraded, link)
        self.router.health_tick(now)

    def end_step(self, step: FaultStep, now: float, bw_factor: np.ndarray,
                 rows: Callable[[ScheduledEvent], Sequence[FaultRow]]) -> None:
        """Record the step's events as the world acted on them (``rows``: one or more per
        event) and show the router the residual bandwidth factor per pod it measured."""
        for ev in step.events:
            for target, at, *measured in rows(ev):
                self.writer.write(FaultEvent(at, ev.fault_id, ev.event, ev.kind, ev.pod, target, ev.severity,
                                             *measured))
        self.router.observe_bandwidth(now, np.asarray(bw_factor, float) * self.topo.uplink_Bps)
        self.last_step = step

    def closing_step(self, now: float) -> FaultStep | None:
        """The run ends at ``now`` before the timeline did: the step that clears what is on."""
        return self.schedule.closing_step(now, self.last_step, self.spec.health)

    def ttl_s(self, step: FaultStep, margin_s: float) -> float:
        """How long what a step applies may live without the driver: until its scheduled end, plus a margin."""
        return step.until_s - step.time_s + margin_s

    # --- engines ---------------------------------------------------------------------
    def engine_down(self, now: float, worker: int, reason: str) -> None:
        """The world saw the engine of ``worker`` die: the router stops choosing it (recorded once)."""
        self.router.set_engine_state(now, worker, reason)

    def engine_up(self, now: float, worker: int, reason: str) -> None:
        """The world saw the engine of ``worker``, down, serve again (restarted): chosen again."""
        self.router.set_engine_state(now, worker, reason, up=True)

    # --- dead work -----------------------------------------------------------------
    def dead_pull(self, t: Ticket, given_up_s: float, end_s: float, ending: str, bytes_after: float) -> None:
        """Record what became of the KV pull of ``t``, a request (or, retried, an attempt) given up
        in kv_transfer at ``given_up_s`` (both worlds call this once per such attempt)."""
        if ending not in PULL_ENDINGS:
            raise ValueError(f"unknown pull ending {ending!r} (known: {', '.join(PULL_ENDINGS)})")
        self.writer.write(DeadPullRecord(t.request_id, t.prefill_pod, t.decode_pod, given_up_s, end_s, ending,
                                         int(t.kv_bytes), bytes_after, t.attempt))

    # --- the end -----------------------------------------------------------------
    def _final_meta(self) -> None:
        """What run.json says of the run's load on its process: requests the admission limit
        rejected, and the peak resident memory of the process that ran the router (the router
        actor on the testbed; the simulator's process, whose earlier runs count too when one
        process runs several, as `testbed sim` does)."""
        self.writer.meta["rejected"] = self.router.rejected
        self.writer.meta["router_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def close(self, status: str = "finished", **extra: Any) -> dict[str, Any]:
        self._final_meta()
        self.writer.close(status, **extra)
        self._log_end()
        return self.writer.meta

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._final_meta()
        self.writer.__exit__(exc_type, exc, tb)
        self._log_end()

    def _log_end(self) -> None:
        if self._logged_end:
            return
        self._logged_end = True
        meta = self.writer.meta
        log.info("%s run %s (%s requests): %s", self.world, meta.get("status"),
                 (meta.get("rows") or {}).get("requests", 0), self.run_dir)
