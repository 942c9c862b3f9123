"""Prefill-decode pairs of engines exercised directly: unique prompts, one prompt through prefill and a
pull, every pair's first NIXL transfer made before a run (:func:`warm_pairs`) and every pair's KV path
checked between runs (:func:`check_pairs`). The calibration (testbed/calibration/calibrate.py) times
the same calls; the driver's engines (testbed/engines/pool.py) warm and check with them."""

from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

import ray

from testbed.engines.prompts import prompt_ids

SALT = 424242  # these prompts never share a prefix with a run's


class PromptIds:
    """Unique prompts: a per-calibration counter, so no prompt hits another's prefix cache. ``block``:
    the engines' KV block (tokens), which prompt lengths are counted in: a prompt of a block or less
    moves no KV (docs/verified.md "KV cache blocks of 128 tokens")."""

    def __init__(self, vocab: int, block: int) -> None:
        self.vocab, self.block = vocab, block
        self.n = itertools.count(10**8)

    def __call__(self, tokens: int) -> tuple[str, list[int]]:
        i = next(self.n)
        return f"cal-{i}", prompt_ids(i, tokens, self.vocab, salt=SALT)


XFER = "vllm:nixl_xfer_time_seconds"


def xfer_totals(decode: Any) -> tuple[float, float]:
    """The decode engine's cumulative NIXL transfer seconds and transfer count."""
    m = ray.get(decode.metrics.remote())
    return float(m[XFER + "_sum"]), float(m[XFER + "_count"])


def pull_with_wire(prefill: Any, decode: Any, rid: str, ids: list[int]) -> tuple[float | None, float | None]:
    """One pull as :func:`prefill_then_pull`, plus NIXL's own time for it: (stage seconds, NIXL seconds). The
    stats reach the engine's logger with the step after the read completes, so wait for them."""
    s0, c0 = xfer_totals(decode)
    _, pull, _ = prefill_then_pull(prefill, decode, rid, ids)
    end = time.monotonic() + 5.0
    while True:
        s1, c1 = xfer_totals(decode)
        if c1 > c0 or time.monotonic() > end:
            break
        time.sleep(0.05)
    return pull, (s1 - s0 if c1 > c0 else None)


def prefill_then_pull(prefill: Any, decode: Any, rid: str, ids: list[int]) -> tuple[float, float | None, float]:
    """One prompt through prefill then a 1-token decode; (prefill seconds as the router records
    them, pull seconds, the whole decode call's seconds in its engine)."""
    sent = time.monotonic()
    pre = ray.get(prefill.prefill.remote(rid, ids))
    back = time.monotonic()
    prefill_s = back - sent - pre.stages.get("alloc", 0.0)
    dec = ray.get(decode.decode.remote(rid, ids, 1, pre.kv_transfer_params))
    st = dict(dec.stages)
    pull = st["recv_done"] - st["alloc_remote"] if "recv_done" in st and "alloc_remote" in st else None
    return prefill_s, pull, dec.finished_s - dec.submitted_s


def warm_pairs(prefill: Sequence[Any], decode: Sequence[Any], vocab: int, block: int) -> list[float]:
    """Make every (prefill, decode) pair's first NIXL transfer now, not in a run, with prompts of
    two blocks and a token (``block``: the engines' KV block); returns the handshake cost per pair:
    the first decode call minus a second one of the same size (the handshake precedes decode
    admission, so it is not in the pull's own time)."""
    ids = PromptIds(vocab, block)
    tokens = 2 * block + 1
    out = []
    for p, d in itertools.product(prefill, decode):
        first = prefill_then_pull(p, d, *ids(tokens))[2]
        second = prefill_then_pull(p, d, *ids(tokens))[2]
        out.append(max(first - second, 0.0))
    return out


def check_pairs(prefill: Sequence[Any], decode: Sequence[Any], vocab: int, block: int,
                timeout_s: float) -> list[bool | None]:
    """Per (prefill, decode) pair, in warm_pairs' order: does a pull across it work now? One prompt
    of two blocks prefilled and decoded to its first token with the KV pulled: True when the token
    comes back, False when the call fails, is aborted or takes over ``timeout_s`` (a path a fault
    broke: vLLM 0.32's NIXL fails such a pull at once or leaves it hanging), None where an engine
    of the pair is dead (its actor gone: no path to judge, the router stops choosing it)."""
    ids = PromptIds(vocab, block)
    out: list[bool | None] = []
    for p, d in itertools.product(prefill, decode):
        rid, prompt = ids(2 * block + 1)
        try:
            pre = ray.get(p.prefill.remote(rid, prompt), timeout=timeout_s)
            dec = ray.get(d.decode.remote(rid, prompt, 1, pre.kv_transfer_params), timeout=timeout_s)
            out.append(dec.first_token_s is not None and not dec.aborted)
        except ray.exceptions.RayActorError:
            out.append(None)
        except (ray.exceptions.RayError, RuntimeError):  # includes GetTimeoutError: a hanging pull
            out.append(False)
    return out
