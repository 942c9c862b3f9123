"""One request's life on the real testbed, under the router's deadline.

:class:`RequestFlow` is the router actor's logic, written against plain async
engine clients (a Ray actor handle behind :class:`RayEngine`), so it imports
neither Ray nor vLLM. Routing itself is :class:`testbed.routing.Router`, the
very object the simulator drives; only the clock differs.

Stage timestamps are taken on the router's clock (seconds since run start);
durations measured inside an engine (queueing, prefill compute, time to first
decode token) are added to the router's send time, so engine clocks never need
to agree with the router's. The KV-transfer stage ends with the decode
engine's first token: the first evidence on the decode side that the pull
completed (vLLM gives no per-request transfer end).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..records import NAN, RequestRecord
from ..routing import Route, Router

log = logging.getLogger(__name__)

# After an abort the engine call returns within a step or two; this bounds the wait.
ABORT_GRACE_S = 30.0


class EngineClient(Protocol):
    async def prefill(self, request_id: str, prompt_token_ids: Sequence[int]) -> Any: ...
    async def decode(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                     kv_transfer_params: Any = None) -> Any: ...
    async def abort(self, request_id: str) -> None: ...
    async def load(self) -> dict[str, Any]: ...


class RayEngine:
    """Awaitable calls on an engine actor handle (`EngineActor` in actors.py)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def prefill(self, request_id: str, prompt_token_ids: Sequence[int]) -> Any:
        return await self.handle.prefill.remote(request_id, list(prompt_token_ids))

    async def decode(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                     kv_transfer_params: Any = None) -> Any:
        return await self.handle.decode.remote(request_id, list(prompt_token_ids), max_tokens, kv_transfer_params)

    async def abort(self, request_id: str) -> None:
        await self.handle.abort.remote(request_id)

    async def load(self) -> dict[str, Any]:
        return await self.handle.load.remote()


def prompt_ids(request_id: int, n_tokens: int, vocab: int, salt: int = 0) -> list[int]:
    """Deterministic prompt tokens for a request (ids 4.. avoid special tokens)."""
    rng = np.random.default_rng([salt, request_id])
    return (4 + rng.integers(0, vocab - 4, n_tokens)).tolist()


@dataclass
class _Times:
    routed: float = NAN
    p_start: float = NAN
    p_end: float = NAN
    kv_start: float = NAN
    kv_end: float = NAN
    first: float = NAN
    end: float = NAN


class RequestFlow:
    """Routes and runs requests; every ending becomes a RequestRecord through ``sink``."""

    def __init__(
        self,
        router: Router,
        prefill: Sequence[EngineClient],
        decode: Sequence[EngineClient],
        deadline_s: float,
        clock: Callable[[], float],
        sink: Callable[[Any], None],
        vocab: int,
        kv_bytes_per_token: int,
        block_tokens: int = 128,
        salt: int = 0,
    ) -> None:
        self.router, self.prefill, self.decode = router, list(prefill), list(decode)
        self.deadline_s, self.clock, self.sink = deadline_s, clock, sink
        self.vocab, self.kv_bpt, self.block = vocab, kv_bytes_per_token, block_tokens
        self.salt = salt
        self.outcomes: dict[str, int] = {}

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

    async def handle(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> str:
        """Serve one request end to end; returns its outcome."""
        now = self.clock()
        r = self.router.route(now, request_id, prompt_tokens, output_tokens)
        t = _Times(routed=now)
        deadline = arrival_s + self.deadline_s
        rid = f"req-{self.salt}-{request_id}"
        ids = prompt_ids(request_id, prompt_tokens, self.vocab, self.salt)
        p_eng, d_eng = self.prefill[r.p_idx], self.decode[r.d_idx]
        prefill_released = False
        try:
            # --- prefill (queue, then compute) -----------------------------------------
            sent = self.clock()
            ok, res = await self._until(deadline, p_eng.prefill(rid, ids))
            if not ok:
                load = await p_eng.load()
                stage = "prefill" if load.get("waiting", 0) == 0 else "queue"
                await self._abort(p_eng, rid, res)
                return self._end(r, t, arrival_s, "timeout", stage, 0, prefill_released)
            t.p_end = self.clock()
            queued = getattr(res, "queued_s", None)
            t.p_start = sent + queued if queued is not None else sent
            self.router.prefill_done(r)
            prefill_released = True
            if res.kv_transfer_params is None or res.finish_reason == "abort":
                return self._end(r, t, arrival_s, "error", "prefill", 0, prefill_released)
            # --- KV pull and decode on the decode engine ---------------------------------
            t.kv_start = self.clock()
            ok, res = await self._until(deadline, d_eng.decode(rid, ids, output_tokens, res.kv_transfer_params))
            if not ok:
                res = await self._abort(d_eng, rid, res)
                first = getattr(res, "first_token_s", None) if res is not None else None
                # vLLM cannot cancel a NIXL read in flight: the abort takes effect once the
                # KV has arrived, and a first token can follow after the deadline. At the
                # deadline the request was still in kv_transfer then.
                if first is not None and t.kv_start + (first - res.submitted_s) > deadline:
                    first = None
                if first is not None:
                    t.first = t.kv_end = t.kv_start + (first - res.submitted_s)
                stage = "kv_transfer" if first is None else "decode"
                return self._end(r, t, arrival_s, "timeout", stage, self._kv_bytes(prompt_tokens) if first else 0,
                                 prefill_released)
            if res.aborted or res.first_token_s is None:
                return self._end(r, t, arrival_s, "error", "decode" if res.first_token_s else "kv_transfer", 0,
                                 prefill_released)
            t.first = t.kv_end = t.kv_start + (res.first_token_s - res.submitted_s)
            t.end = self.clock()
            return self._end(r, t, arrival_s, "ok", None, self._kv_bytes(prompt_tokens), prefill_released)
        except Exception as e:  # an engine died or a call failed: an error, recorded, not a crash
            log.warning("request %s failed: %s", rid, e)
            stage = "queue" if math.isnan(t.p_end) else ("kv_transfer" if math.isnan(t.first) else "decode")
            return self._end(r, t, arrival_s, "error", stage, 0, prefill_released)

    def _kv_bytes(self, prompt_tokens: int) -> int:
        # NIXL pulls every block of the prompt, the partial last one included (measured).
        return -(-prompt_tokens // self.block) * self.block * self.kv_bpt

    def _end(self, r: Route, t: _Times, arrival_s: float, outcome: str, stage: str | None, kv_bytes: int,
             prefill_released: bool) -> str:
        now = self.clock()
        self.router.finished(now, r, outcome, stage, prefill_released)
        self.sink(RequestRecord(
            r.request_id, arrival_s, r.prompt_tokens, r.output_tokens, r.prefill_worker, r.decode_worker,
            r.prefill_pod, r.decode_pod, t.routed, t.p_start, t.p_end, t.kv_start, t.kv_end, t.first,
            t.end if outcome == "ok" else NAN, outcome, stage, kv_bytes))
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome
