"""One request's life on the real testbed, under the router's two limits: a request without
its first token ``ttft_timeout_s`` after arrival (the engine's front end says when the first
token came: its ``stages`` carry ``first_token``), or unfinished ``deadline_s`` after it, is
aborted where it is and recorded as a timeout of that stage, as in the simulator. With
``router.retry`` a failed attempt, or one past its per-try timeout, may be routed again
(:mod:`core.retry`): each attempt is a ticket and a request id of its own on the engines.

:class:`RequestFlow` is the router actor's logic, written against plain async
engine clients (a Ray actor handle behind :class:`RayEngine`), so it imports
neither Ray nor vLLM. Routing returns the request's :class:`core.ticket.Ticket`
(the very objects the simulator drives; only the clock differs), and this flow
marks on it the stages of :mod:`core.stages` as the engines report them.

Stage times are the router's clock (seconds since run start) at which a call
reached its engine, plus offsets measured inside the engine from that arrival, so
engine clocks never need to agree with the router's. When a call reached its
engine is known from the engine's own clock at its arrival (the results'
``submitted_s``) and the clocks' offset, bounded by every call to that engine:
an arrival cannot precede its send, so ``submitted_s - sent`` bounds the offset
from above, and the smallest such bound seen is the estimate (:class:`CallClock`,
Cristian's method without the return leg). A call then counts its dispatch delay
beyond the fastest seen to that engine, which a loaded 2-core host makes large:
taken as nil, as before 2026-11-25, a decode call's delay was left out of every
stage time after it, and a pull's end placed before its give-up (docs/records.md
"Stages"):

* ``prefill_queue`` -> ``prefill``: the prefill engine's scheduler allocated the
  request's blocks (its stage log's ``alloc``; vLLM's ``queued_ts -> scheduled_ts``
  if the log has none);
* ``prefill`` -> ``decode_queue``: the prefill call returned (its KV is ready);
* ``decode_queue`` -> ``kv_transfer``: the decode engine's scheduler admitted the
  request, allocating its KV blocks, and the NIXL read started (``alloc_remote``);
* ``kv_transfer`` -> ``decode``: the worker reported the pull done (``recv_done``).

At a deadline the flow asks the engine holding the request where it is (the same
stage log) before aborting it there, so a timeout is recorded in the stage the
request was really in. Where an engine's log has no admission event (not the
testbed's connector), ``kv_start_s`` falls back to when the decode call was sent
(decode admission then counts as transfer) and the run counts it (``unseparated``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

import numpy as np

from core.canary import Reference, Verdict, verdict
from core.limits import first_token_limit
from core.liveness import ALIVE, DEAD, NO_ANSWER, EngineLiveness
from core.records import DEAD_PULL_WATCH_S, NAN
from core.run import RunContext
from core.ticket import Ticket
from core.topology import kv_transfer_bytes
from testbed.engines.engine import TokenSink  # (engine.py imports vLLM only when an engine starts)
from testbed.engines.prompts import prompt_ids
from testbed.engines.stagelog import PULL_ENDS
from vocab import (CORRUPT, DECODE, DECODE_QUEUE, ERROR, KV_TRANSFER, OK, PREFILL, PREFILL_QUEUE, PULL_DONE,
                   PULL_FAILED, PULL_UNSEEN, REJECTED, ROLE_DECODE, ROLE_PREFILL, TIMEOUT)

log = logging.getLogger(__name__)

# After an abort the engine call returns within a step or two; this bounds the wait.
ABORT_GRACE_S = 30.0
# How often the router asks a decode engine whether a dead pull (see _watch_dead_pull) has ended:
# its end is then known to this much, a small fraction of the throttled pulls' tens of seconds.
DEAD_PULL_POLL_S = 0.5


class EngineClient(Protocol):
    async def prefill(self, request_id: str, prompt_token_ids: Sequence[int]) -> Any: ...
    async def decode(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                     kv_transfer_params: Any = None) -> Any: ...
    async def abort(self, request_id: str) -> None: ...
    async def stages(self, request_id: str) -> dict[str, float]: ...
    async def health(self) -> Any: ...  # raises when the engine is down (Liveness)


class RayEngine:
    """Awaitable calls on an engine actor handle (`EngineActor`, testbed/engines/actor.py)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def prefill(self, request_id: str, prompt_token_ids: Sequence[int]) -> Any:
        return await self.handle.prefill.remote(request_id, list(prompt_token_ids))

    async def decode(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                     kv_transfer_params: Any = None, *, on_tokens: TokenSink | None = None,
                     sampling: dict[str, Any] | None = None) -> Any:
        """The `DecodeResult`; with ``on_tokens``, tokens are relayed as the engine makes them
        (a Ray streaming call: one object per engine output)."""
        if on_tokens is None and sampling is None:
            return await self.handle.decode.remote(request_id, list(prompt_token_ids), max_tokens, kv_transfer_params)
        result = None
        stream = self.handle.decode_stream.options(num_returns="streaming").remote(
            request_id, list(prompt_token_ids), max_tokens, kv_transfer_params, sampling)
        async for ref in stream:
            item = await ref
            if isinstance(item, tuple):
                if on_tokens is not None:
                    on_tokens(*item)
            else:
                result = item
        return result

    async def health(self) -> dict[str, Any]:
        return await self.handle.health.remote()

    async def abort(self, request_id: str) -> None:
        await self.handle.abort.remote(request_id)

    async def stages(self, request_id: str) -> dict[str, float]:
        return await self.handle.stages.remote(request_id)

    async def pull_end(self, request_id: str, forget: bool = False) -> dict[str, float]:
        return await self.handle.pull_end.remote(request_id, forget)

    async def host_samples(self, since_wall: float) -> list[tuple[float, ...]]:
        return await self.handle.host_samples.remote(since_wall)


def _with_call_log(where: Mapping[str, float], res: Any) -> dict[str, float]:
    """Where the engine said a request was at its limit, completed by the log its aborted call
    returned. A starved front end answers ``stages`` only once the call has ended, and then finds
    nothing: from a fresh clone (2026-11-24) a decode engine pulled a request's KV and decoded all
    its 3000 tokens (its counters), its actor answering neither ``stages`` nor the abort from the
    deadline until the decode ended 7 s later, and the timeout was recorded in decode_queue. The
    call's result holds the scheduler's whole log. Only events before the limit count (``_at``)."""
    return {**where, **(dict(res.stages) if res is not None else {})}


class CallClock:
    """When each call reached its engine, on the router's clock (module docstring). The offset of
    an engine's clock from the router's, ``theta``, is at most ``submitted_s - sent`` for every
    call (the arrival follows the send), so the least of those is its estimate: exact for the
    fastest call seen, and later calls are placed after their send by their dispatch beyond it.
    Monotonic clocks of one run drift by parts per million, so one offset per engine holds."""

    def __init__(self) -> None:
        self.theta: dict[tuple[str, int], float] = {}
        self.delays: dict[str, list[float]] = {ROLE_PREFILL: [], ROLE_DECODE: []}
        self.returns: dict[str, list[float]] = {ROLE_PREFILL: [], ROLE_DECODE: []}

    def arrived(self, engine: tuple[str, int], sent: float, res: Any) -> float:
        """Router time the call sent at ``sent`` reached ``engine`` (role, index), from its result
        ``res`` (its ``submitted_s``); ``sent`` where there is none."""
        submitted = getattr(res, "submitted_s", None)
        if submitted is None:
            return sent
        bound = float(submitted) - sent
        theta = self.theta[engine] = min(self.theta.get(engine, math.inf), bound)
        self.delays[engine[0]].append(bound - theta)
        return sent + (bound - theta)

    def returned(self, role: str, arrived: float, res: Any, now: float) -> None:
        """Record a finished call's return leg: from its engine's end (``res.finished_s``, placed on
        the router's clock through the call's arrival ``arrived``) to ``now``, when the router has
        the result. A stage time the router records at ``now`` includes it; the simulator's do not."""
        finished, submitted = getattr(res, "finished_s", None), getattr(res, "submitted_s", None)
        if finished is not None and submitted is not None:
            self.returns[role].append(max(0.0, now - (arrived + float(finished) - float(submitted))))

    @staticmethod
    def _stats(by_role: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        return {role: {"n": len(d), "p50_s": float(np.median(d)), "p90_s": float(np.percentile(d, 90)),
                       "max_s": float(max(d))} for role, d in by_role.items() if d}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per role, the calls' dispatch delays beyond the fastest one (p50, p90, max, count)."""
        return self._stats(self.delays)

    def return_summary(self) -> dict[str, dict[str, float]]:
        """Per role, the finished calls' return legs (:meth:`returned`; p50, p90, max, count)."""
        return self._stats(self.returns)


def _at(sent: float, offsets: dict[str, float], event: str, limit: float = math.inf) -> float | None:
    """Router time of an engine event (``sent``, when its call reached the engine, + its
    offset), if it happened by ``limit``."""
    off = offsets.get(event)
    if off is None or sent + off > limit:
        return None
    return sent + max(off, 0.0)


@dataclass
class Submitted:
    """A request handed to the flow: its id in the run's records and its outcome (a future; done
    at once, ``rejected``, when the admission limit refused it)."""

    request_id: int
    outcome: Awaitable[str]


class RequestFlow:
    """Routes and runs requests; every ending goes through the request's ticket."""

    def __init__(
        self,
        ctx: RunContext,
        prefill: Sequence[EngineClient],
        decode: Sequence[EngineClient],
        deadline_s: float,
        clock: Callable[[], float],
        vocab: int,
        kv_bytes_per_token: int,
        block_tokens: int,
        salt: int = 0,
        first_token_limit_s: float | None = None,
        on_engine_error: Callable[[str, int, BaseException], None] | None = None,
        canaries: Mapping[int, Reference] | None = None,
    ) -> None:
        self.ctx, self.prefill, self.decode = ctx, list(prefill), list(decode)
        self.deadline_s, self.clock = deadline_s, clock
        self.first_token_s = first_token_limit(deadline_s, first_token_limit_s)
        self.vocab, self.kv_bpt, self.block = vocab, kv_bytes_per_token, block_tokens
        self.salt = salt
        self.outcomes: dict[str, int] = {}
        self.unseparated = 0  # decode calls whose engine reported no admission time
        self.calls = CallClock()
        self.watches: set[asyncio.Task] = set()  # dead pulls being watched (drain() waits for them)
        # Told of a call that raised (role, index, the exception): the router actor asks that
        # engine whether it is down (an engine's death shows first as its calls failing).
        self.on_engine_error = on_engine_error
        # Canaries (core/canary.py): request id -> its single-engine reference; each one that
        # decodes to its end gets a verdict (counts here, its outcome "corrupt" on a mismatch).
        self.canaries: dict[int, Reference] = dict(canaries or {})
        self.canary_verdicts: dict[int, Verdict] = {}

    async def _until(self, deadline: float, coro: Any) -> tuple[bool, Any]:
        """Run ``coro`` until ``deadline`` (run time); (finished, result or task)."""
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - self.clock()))
        return (True, task.result()) if done else (False, task)

    async def _abort(self, engine: EngineClient, rid: str, task: asyncio.Future) -> Any:
        """Abort in the engine the request is in, then collect what its call returns."""
        try:
            await engine.abort(rid)
            return await asyncio.wait_for(task, ABORT_GRACE_S)
        except Exception as e:  # the abort itself failing must not lose the record
            log.warning("abort of %s: %s", rid, e)
            task.cancel()
            return None

    @staticmethod
    async def _where(engine: EngineClient, rid: str) -> dict[str, float]:
        try:
            return await engine.stages(rid)
        except Exception as e:  # an engine that cannot say leaves the stage as the router saw it
            log.warning("stages of %s: %s", rid, e)
            return {}

    def _mark_decode(self, t: Ticket, sent: float, offsets: dict[str, float], limit: float) -> None:
        """The decode engine's admission and pull end, as far as they happened by ``limit``."""
        admitted = _at(sent, offsets, "alloc_remote", limit)
        if admitted is not None:
            t.enter(KV_TRANSFER, admitted)
            t.kv_bytes = kv_transfer_bytes(t.prompt_tokens, self.block, self.kv_bpt)
        received = _at(sent, offsets, "recv_done", limit)
        if received is not None and admitted is not None:
            t.enter(DECODE, received)

    def _admit(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> bool:
        if self.ctx.admit(self.clock(), request_id, arrival_s, prompt_tokens, output_tokens):
            return True
        self.outcomes[REJECTED] = self.outcomes.get(REJECTED, 0) + 1
        return False

    def submit(self, request_id: int, arrival_s: float, ids: Sequence[int], output_tokens: int, *,
               on_tokens: TokenSink | None = None, sampling: dict[str, Any] | None = None) -> Submitted:
        """Hand over a tokenised request (the ingress's): admitted or refused now, so that a
        refusal can still be an HTTP status; if admitted, served by a task of this loop."""
        if not self._admit(request_id, arrival_s, len(ids), output_tokens):
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            done.set_result(REJECTED)
            return Submitted(request_id, done)
        return Submitted(request_id, asyncio.ensure_future(self._serve(
            request_id, arrival_s, len(ids), output_tokens, ids=ids, on_tokens=on_tokens, sampling=sampling)))

    async def handle(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int, *,
                     ids: Sequence[int] | None = None, on_tokens: TokenSink | None = None,
                     sampling: dict[str, Any] | None = None) -> str:
        """Serve one request end to end (after the admission limit); returns its outcome.

        A workload's request gets deterministic prompt tokens; an ingress request brings its own
        ``ids`` (its prompt tokenised), ``sampling`` fields and an ``on_tokens`` receiver of its
        output as the decode engine makes it. Both are routed, limited and recorded alike."""
        if not self._admit(request_id, arrival_s, prompt_tokens, output_tokens):
            return REJECTED
        return await self._serve(request_id, arrival_s, prompt_tokens, output_tokens, ids=ids, on_tokens=on_tokens,
                                 sampling=sampling)

    async def _serve(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int, *,
                     ids: Sequence[int] | None = None, on_tokens: TokenSink | None = None,
                     sampling: dict[str, Any] | None = None) -> str:
        """The request's attempts (one, unless ``router.retry`` retries a failed one), then its outcome."""
        deadline = arrival_s + self.deadline_s
        first_by = arrival_s + self.first_token_s  # the time-to-first-token limit
        if ids is None:
            ids = prompt_ids(request_id, prompt_tokens, self.vocab, self.salt)
        # only when asked: the workload's calls (and scripted engines in tests) keep the plain signature
        extra = {k: v for k, v in (("on_tokens", on_tokens), ("sampling", sampling)) if v is not None}
        retry = None
        while True:
            t = self.ctx.route(self.clock(), request_id, arrival_s, prompt_tokens, output_tokens, retry)
            # an engine's request id is used once: a retry's gets the attempt's number
            rid = f"req-{self.salt}-{request_id}" + (f"-{t.attempt}" if t.attempt else "")
            outcome, dead_pull = await self._attempt(t, rid, ids, self.ctx.attempt_limit(t, first_by), deadline,
                                                     extra)
            retry = self.ctx.end_attempt(self.clock(), t, outcome, first_by)
            if dead_pull is not None:
                self._watch(dead_pull)
            if retry is None:
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
                return outcome
            await asyncio.sleep(max(0.0, retry.at_s - self.clock()))

    async def _attempt(self, t: Ticket, rid: str, ids: Sequence[int], first_by: float, deadline: float,
                       extra: dict[str, Any]) -> tuple[str, Awaitable[None] | None]:
        """One attempt on the pair of ``t``, without its first token by ``first_by`` (the request's
        limit, or the attempt's per-try timeout) or unfinished by ``deadline`` given up where it is.
        Its outcome (the ticket is left to end), and the watch of its dead pull if it left one."""
        p_eng, d_eng = self.prefill[t.p_idx], self.decode[t.d_idx]
        calling = (ROLE_PREFILL, t.p_idx)
        try:
            # --- prefill_queue, prefill ---------------------------------------------------
            sent = self.clock()
            ok, res = await self._until(first_by, p_eng.prefill(rid, ids))  # no first token before it ends
            if not ok:
                where = await self._where(p_eng, rid)
                res = await self._abort(p_eng, rid, res)
                arrived = self.calls.arrived(calling, sent, res)
                started = _at(arrived, _with_call_log(where, res), "alloc", first_by)
                if started is not None:
                    t.enter(PREFILL, started)
                return TIMEOUT, None
            arrived = self.calls.arrived(calling, sent, res)
            started = _at(arrived, dict(res.stages), "alloc")
            queued = getattr(res, "queued_s", None)
            t.enter(PREFILL, started if started is not None else arrived + (queued or 0.0))
            if res.kv_transfer_params is None or res.finish_reason == "abort":
                return ERROR, None  # no KV to hand over: prefill failed
            self.calls.returned(ROLE_PREFILL, arrived, res, self.clock())
            t.enter(DECODE_QUEUE, self.clock())  # the prefill engine holds the KV for the decoder now
            # --- decode_queue, kv_transfer, decode on the decode engine ------------------
            calling = (ROLE_DECODE, t.d_idx)
            sent = self.clock()
            call = d_eng.decode(rid, ids, t.output_tokens, res.kv_transfer_params, **extra)
            limit = first_by
            ok, res = await self._until(first_by, call)
            if not ok and first_by < deadline:
                # The first-token limit: a request whose first token reached the engine's front
                # end by then goes on to the deadline; one without is cut there. (The call's
                # arrival is not known before it returns: its send is the lenient bound.)
                where = await self._where(d_eng, rid)
                if _at(sent, where, "first_token", first_by) is not None:
                    limit = deadline
                    ok, res = await self._until(deadline, res)
            if not ok:
                where = await self._where(d_eng, rid)
                aborted = self.clock()
                res = await self._abort(d_eng, rid, res)
                arrived = self.calls.arrived(calling, sent, res)
                self._mark_decode(t, arrived, _with_call_log(where, res), limit)
                first = getattr(res, "first_token_s", None) if res is not None else None
                if first is not None and t.stage == DECODE and arrived + (first - res.submitted_s) <= limit:
                    t.first_token_s = arrived + (first - res.submitted_s)
                if t.stage == KV_TRANSFER:
                    # vLLM cannot cancel a NIXL read in flight: the call returned at the abort,
                    # the pull goes on; what became of it is recorded once it is known
                    return TIMEOUT, self._watch_dead_pull(t, d_eng, rid, arrived, aborted, limit,
                                                            dict(res.stages) if res is not None else {})
                return TIMEOUT, None
            return self._decoded(t, rid, res, self.calls.arrived(calling, sent, res)), None
        except Exception as e:  # an engine died or a call failed: an error in the stage it was in
            await self._engine_failed(t, rid, e, calling, sent, p_eng if calling[0] == ROLE_PREFILL else d_eng)
            return ERROR, None

    def _decoded(self, t: Ticket, rid: str, res: Any, arrived: float) -> str:
        """A decode call that returned in time, marked on the ticket: its outcome (an aborted call
        or one without a first token is an error; a canary decoded from other KV, corrupt)."""
        offsets = dict(res.stages)
        if "alloc_remote" not in offsets:
            self.unseparated += 1
            offsets["alloc_remote"] = 0.0
        self._mark_decode(t, arrived, offsets, math.inf)
        if res.first_token_s is not None:
            t.first_token_s = arrived + (res.first_token_s - res.submitted_s)
            if t.stage == KV_TRANSFER:  # no pull end reported: the first token is the first evidence
                t.enter(DECODE, t.first_token_s)
        if res.aborted or res.first_token_s is None:
            return ERROR
        self.calls.returned(ROLE_DECODE, arrived, res, self.clock())
        ref = self.canaries.get(t.request_id)
        if ref is not None:
            v = self.canary_verdicts[t.request_id] = verdict(ref, res.token_ids)
            if v.verdict == CORRUPT:  # the canary verdict (core/canary.py)
                log.warning("request %s: corrupt output (token %d differs, reference gap %.2f nats)",
                            rid, v.position, v.gap)
                return CORRUPT
        return OK

    async def _engine_failed(self, t: Ticket, rid: str, e: Exception, calling: tuple[str, int], sent: float,
                             engine: Any) -> None:
        """A call on ``engine`` raised (it died, or the call failed): the router told, and the ticket
        marked in the stage the engine's log says it was in."""
        log.warning("request %s failed: %s", rid, e)
        if self.on_engine_error is not None:
            self.on_engine_error(*calling, e)
        # Where it was: the stage log of an engine whose core died is still read by its actor (a
        # dead actor answers nothing, and the stage stays the one the router saw, a queue).
        failed_at = self.clock()
        where = await self._where(engine, rid)
        if calling[0] == ROLE_PREFILL:
            started = _at(sent, where, "alloc", failed_at)
            if started is not None and t.stage == PREFILL_QUEUE:
                t.enter(PREFILL, started)
        elif t.stage == DECODE_QUEUE:
            self._mark_decode(t, sent, where, failed_at)

    def _watch(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.watches.add(task)
        task.add_done_callback(self.watches.discard)

    async def _watch_dead_pull(self, t: Ticket, engine: Any, rid: str, arrived: float, aborted: float,
                               given_up: float, stages: dict[str, float]) -> None:
        """The dead pull of ``t`` (given up in kv_transfer at ``given_up``, its decode call at the
        engine from ``arrived``, the abort sent at ``aborted``): its end, from the decode engine's
        stage log, within DEAD_PULL_WATCH_S; then its row in dead_pulls."""
        # Ended between the abort and the call's return: an offset from the call's arrival. (One
        # that mapped to before ``given_up`` would have put the request in decode: it lies after.)
        ends = {k: arrived + v for k, v in stages.items() if k in PULL_ENDS}
        until = given_up + DEAD_PULL_WATCH_S
        try:
            while not ends and self.clock() < until:
                await asyncio.sleep(DEAD_PULL_POLL_S)
                # offsets from the abort's arrival at the engine (its pull_end): the pull outlived the abort
                ends = {k: aborted + v for k, v in (await engine.pull_end(rid)).items()}
            if not ends:
                await engine.pull_end(rid, forget=True)
        except Exception as e:  # the engine gone (or without the call): the pull was not seen to end
            log.warning("dead pull of %s: %s", rid, e)
            ends = {}
        if "recv_done" in ends:
            end = ends["recv_done"]
            # At the pull's mean rate: a throttled link's is its shaper's constant rate (htb).
            span = end - t.kv_start_s
            share = min(1.0, max(0.0, (end - given_up) / span)) if span > 0 else 0.0
            self.ctx.dead_pull(t, given_up, end, PULL_DONE, t.kv_bytes * share)
        elif "recv_failed" in ends:  # UCX gave the read up: what it moved is not known, and useless
            self.ctx.dead_pull(t, given_up, ends["recv_failed"], PULL_FAILED, NAN)
        else:
            self.ctx.dead_pull(t, given_up, NAN, PULL_UNSEEN, NAN)

    async def drain(self) -> None:
        """Wait for every dead pull being watched (each within DEAD_PULL_WATCH_S of its start)."""
        while self.watches:
            await asyncio.wait(set(self.watches))


class Liveness:
    """Which engines are down, from their own state: vLLM's health check through each engine's
    actor (its engine core alive), asked every ``testbed.engine_check_s`` and at once when a call to
    the engine raised. What an answer changes is core/liveness.py's rule, the simulator's too: an
    error (the actor dead, the core dead) puts the engine down until a check finds it answering
    again (restarted by an engine fault's restart_s); no answer within ``timeout_s`` is a busy
    engine, not a dead one."""

    def __init__(self, ctx: RunContext, flow: RequestFlow, clock: Callable[[], float], timeout_s: float,
                 names: Sequence[str]) -> None:
        self.ctx, self.flow, self.clock, self.timeout_s, self.names = ctx, flow, clock, timeout_s, list(names)
        self.rule = EngineLiveness(ctx)  # core/liveness.py: what an answer changes
        self._checking: set[tuple[str, int]] = set()
        self.checks: set[asyncio.Task] = set()

    def worker(self, role: str, idx: int) -> int:
        """The global worker id of the flow's ``idx``-th engine of ``role``."""
        return int((self.ctx.topo.prefill_ids if role == ROLE_PREFILL else self.ctx.topo.decode_ids)[idx])

    def error(self, role: str, idx: int, exc: BaseException) -> None:
        """A call to an engine raised: ask it whether it is down."""
        self._check(role, idx)

    def tick(self, now: float) -> None:
        """Ask every engine: a live one whether it died, a down one whether it serves again (an
        engine fault's restart; a dead actor answers at once that it is still dead)."""
        for role, n in ((ROLE_PREFILL, len(self.flow.prefill)), (ROLE_DECODE, len(self.flow.decode))):
            for idx in range(n):
                self._check(role, idx)

    def _check(self, role: str, idx: int) -> None:
        if (role, idx) in self._checking:  # one question at a time per engine
            return
        self._checking.add((role, idx))
        task = asyncio.ensure_future(self._ask(role, idx))
        self.checks.add(task)
        task.add_done_callback(lambda t: (self._checking.discard((role, idx)), self.checks.discard(t)))

    async def _ask(self, role: str, idx: int) -> None:
        engine = (self.flow.prefill if role == ROLE_PREFILL else self.flow.decode)[idx]
        worker = self.worker(role, idx)
        name = self.names[idx if role == ROLE_PREFILL else len(self.flow.prefill) + idx]
        try:
            await asyncio.wait_for(engine.health(), self.timeout_s)
        except asyncio.TimeoutError:
            answer, why = NO_ANSWER, ""
        except Exception as e:
            answer, why = DEAD, f"{type(e).__name__}: {e}"[:300]
        else:
            answer, why = ALIVE, "health check answered (restarted)"
        changed = self.rule.answered(self.clock(), worker, answer, why)
        if changed is not None:
            log.warning("engine %s is %s: %s", name, "down" if changed else "up again", why)
