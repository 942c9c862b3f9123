"""The serving stack's control path in the simulator (engine.prefill_call_s, decode_call_s,
decode_join_s: core/spec/model.py): the part of :class:`simulator.cluster.ClusterSim` that holds a
request between the stages, kept apart from its hot path, which only schedules these.

* the **prefill call**: a routed request reaches its prefill engine's queue ``prefill_call_s``
  later (the router's decision, the call, the engine loop's next step), unless given up on its way;
* the **decode call**: ``decode_call_s`` after its prefill, the decode engine has it; if the
  prefill engine holding its KV died meanwhile, the pull it would start fails;
* the **join**: ``decode_join_s`` after its pull ended, the decode scheduler takes it into the
  running batch; until then it holds its reservation but is not in the batch (a request given up
  meanwhile gives the reservation back; one whose engine dies fails with it).

They are measured on the testbed under a load shaped like the run's (analysis/checks/refit.py;
docs/twin.md "A calibration under the run's conditions"); a scenario's default is 0, and then
none of these is scheduled.
"""

from __future__ import annotations

from typing import Any

from core.ticket import Ticket

from .events import Call


class ControlPath:
    """ClusterSim's control-path legs (a mixin: it reads ClusterSim's state)."""

    env: Any
    _joining: set[Ticket]

    def _prefill_called(self, ev: Call) -> None:
        req = ev.data
        if not req.done:  # else given up on its way
            self._enqueue_prefill(req, self.env.now)

    def _decode_called(self, ev: Call) -> None:
        req, now = ev.data, self.env.now
        if req.done:  # given up on its way
            return
        if self.prefill[req.p_idx].dead:  # the KV it was sent for died with its engine on the way
            self.deaths.pull_failed(req, now)
            return
        self._enqueue_decode(req, now)

    def _joined(self, ev: Call) -> None:
        req = ev.data
        if req in self._joining:  # else given up, or its engine died, meanwhile
            self._joining.discard(req)
            self._decode_join(req, self.env.now)

    def _unjoin(self, req: Ticket, now: float) -> None:
        """``req``, given up with its KV in but not yet in the batch, gives its reservation back."""
        self._joining.discard(req)
        self._release(self.decode[req.d_idx], req, now)
