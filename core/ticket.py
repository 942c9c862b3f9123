"""One request's ticket: what routing hands a world, and the only way a request ends.

:meth:`core.routing.Router.route` returns a :class:`Ticket`; the world marks the
stages it passes (:meth:`Ticket.enter`, in the vocabulary of :mod:`core.stages`)
and ends it with :meth:`Ticket.finish`, which

* releases the router's in-flight counters (the prefill worker's as soon as the
  request leaves prefill, the decode worker's at the end),
* charges a failure to the pod(s) of the stage it was in (the one blame rule,
  :func:`core.stages.blamed_pods`),
* builds the request's record and hands it to the router's sink (the run's writer).

With ``router.retry`` a request may make several attempts, a ticket each: a failed attempt that is
retried ends with :meth:`Ticket.abandon` (its row in ``attempts``), the last one with ``finish``.

So neither world builds a :class:`core.records.RequestRecord` or tracks which
counters it released: the two worlds differ only in when they call ``enter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vocab import CORRUPT, OK, OUTCOMES, PREFILL_QUEUE, REJECTED
from .records import AttemptRecord, NAN, RequestRecord
from .stages import ADMISSION, AFTER_PREFILL, CORRUPTED_IN, STAGE_START

if TYPE_CHECKING:
    from .routing import Router


_ENTER = {s: (STAGE_START[s], s in AFTER_PREFILL) for s in STAGE_START}


def rejected_record(request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> RequestRecord:
    """The record of a request the admission limit refused: never routed, so no ticket."""
    return _record(request_id, arrival_s, prompt_tokens, output_tokens, -1, -1, -1, -1, NAN, NAN, NAN, NAN, NAN,
                   NAN, NAN, REJECTED, ADMISSION, 0, 0)


def _record(*fields: object) -> RequestRecord:
    # Positional, in the schema's column order (core.records.RequestRecord): keywords would cost
    # as much again as building the record, once per request. The one place a record is built.
    return RequestRecord(*fields)


class Ticket:
    __slots__ = ("router", "request_id", "arrival_s", "prompt_tokens", "output_tokens",
                 "p_idx", "d_idx", "prefill_worker", "decode_worker", "prefill_pod", "decode_pod",
                 "stage", "routed_s", "prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s",
                 "first_token_s", "kv_bytes", "done", "_prefill_held", "attempt", "avoided")

    def __init__(self, router: Router, now: float, request_id: int, arrival_s: float,
                 prompt_tokens: int, output_tokens: int, p_idx: int, d_idx: int, prefill_worker: int,
                 decode_worker: int, prefill_pod: int, decode_pod: int, attempt: int = 0,
                 avoided: frozenset[int] = frozenset()) -> None:
        self.router = router
        self.request_id, self.arrival_s = request_id, arrival_s
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.p_idx, self.d_idx = p_idx, d_idx
        self.prefill_worker, self.decode_worker = prefill_worker, decode_worker
        self.prefill_pod, self.decode_pod = prefill_pod, decode_pod
        self.stage = PREFILL_QUEUE
        self.routed_s = now
        self.prefill_start_s = self.prefill_end_s = self.kv_start_s = self.kv_end_s = self.first_token_s = NAN
        # KV bytes the request's transfer moves (its prompt's KV as the engine stores it), set by
        # the world when the transfer starts; 0 for a request that never reached kv_transfer.
        self.kv_bytes = 0
        self.done = False
        self._prefill_held = True  # the prefill worker's counters still count this request
        self.attempt = attempt  # 0: the request's first (router.retry makes more)
        self.avoided = avoided  # the pods this attempt was routed away from (core/retry.py)

    def enter(self, stage: str, at: float) -> None:
        """The request is in ``stage`` from time ``at`` (stamps the stage's start column)."""
        column, leaves_prefill = _ENTER[stage]  # one lookup: this runs four times per simulated request
        setattr(self, column, at)
        self.stage = stage
        if leaves_prefill and self._prefill_held:
            self._prefill_held = False
            self.router.prefill_done(self)

    def _end(self, now: float, outcome: str, retrying: bool) -> str | None:
        """Release the attempt's counters and show the router how it ended; its failed stage."""
        if self.done:
            raise RuntimeError(f"request {self.request_id} finished twice")
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r} (known: {', '.join(OUTCOMES)})")
        self.done = True
        failed = None if outcome == OK else CORRUPTED_IN if outcome == CORRUPT else self.stage
        if self._prefill_held:
            self._prefill_held = False
            self.router.prefill_done(self)
        self.router.finished(now, self, outcome, failed, retrying)
        return failed

    def finish(self, now: float, outcome: str = OK) -> RequestRecord:
        """End the request at ``now``: ``ok``, or a failure in the stage it is in."""
        failed = self._end(now, outcome, False)
        first = self.first_token_s if self.first_token_s <= now else NAN  # a first token after the end never came
        rec = _record(
            self.request_id, self.arrival_s, self.prompt_tokens, self.output_tokens,
            self.prefill_worker, self.decode_worker, self.prefill_pod, self.decode_pod,
            self.routed_s, self.prefill_start_s, self.prefill_end_s, self.kv_start_s, self.kv_end_s, first,
            now if outcome == OK or outcome == CORRUPT else NAN,  # end_s: decoded to its end
            outcome, failed, self.kv_bytes, self.attempt + 1)
        self.router.sink(rec)
        return rec

    def abandon(self, now: float, outcome: str, backoff_s: float) -> AttemptRecord:
        """End this attempt at ``now``, failed (``outcome``) in the stage it is in, the request to
        be retried ``backoff_s`` later (core/retry.py): its failure counts as any other, and its
        row goes to ``attempts``; the request stays admitted."""
        if outcome == OK:
            raise ValueError(f"request {self.request_id}: an attempt that ended ok is not retried")
        failed = self._end(now, outcome, True)
        rec = AttemptRecord(self.request_id, self.attempt, self.routed_s, now, self.prefill_worker, self.decode_worker,
                            self.prefill_pod, self.decode_pod, outcome, failed, self.kv_bytes, backoff_s)
        self.router.sink(rec)
        return rec
