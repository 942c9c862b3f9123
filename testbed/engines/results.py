"""What an engine call returns to the router, or raises across to it (testbed/engines/engine.py):
plain values only, so that unpickling them in the router's process imports no vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class EngineError(RuntimeError):
    """What an engine call raised, as its type's name and message only. vLLM's own exceptions
    (EngineDeadError, ...) must not cross to the router: unpickling one there imports vLLM, and
    with it torch, in the router's process, which held its event loop (and every request's
    deadline) for 7-10 s on this host, measured with py-spy after an engine core was killed."""

    @classmethod
    def of(cls, e: BaseException) -> "EngineError":
        return cls(f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class PrefillResult:
    """What the prefill engine hands the router: pass `kv_transfer_params` to `decode`."""

    request_id: str
    kv_transfer_params: dict[str, Any] | None
    num_prompt_tokens: int
    submitted_s: float
    finished_s: float
    finish_reason: str | None
    # Seconds the request waited in the engine's scheduler before its prefill was
    # scheduled (vLLM's queued_ts -> scheduled_ts); None when vLLM gave no stats.
    queued_s: float | None = None
    # The scheduler's events for the request, seconds after `submitted_s` (StageLog).
    stages: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeResult:
    """Output of one decode; times are `time.monotonic()` in the engine's process."""

    request_id: str
    token_ids: tuple[int, ...]
    submitted_s: float
    first_token_s: float | None
    finished_s: float
    finish_reason: str | None
    top_logprobs: tuple[tuple[float, ...], ...] = ()
    # The scheduler's events for the request, seconds after `submitted_s` (StageLog):
    # "alloc_remote" (KV blocks allocated, the pull starts), "recv_done" (the pull ended).
    stages: Mapping[str, float] = field(default_factory=dict)
    # When each step's new tokens reached the front end (one entry per output vLLM yields,
    # normally one token per engine step): step times and host stalls are read from these.
    token_times: tuple[float, ...] = ()
    # With `logprobs`: per step, the tokens of `top_logprobs` in the same order (core/canary.py
    # excuses a divergence only where the output took the reference's second choice).
    top_tokens: tuple[tuple[int, ...], ...] = ()

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"
