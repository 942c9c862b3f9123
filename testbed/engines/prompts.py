"""The prompts the testbed sends its engines: deterministic token ids per request, and the KV block
size NIXL pulls whole (the router's flow, the calibration and the engine checks share both)."""

from __future__ import annotations

import numpy as np

# vLLM's CPU build stores KV in blocks of 128 tokens; NIXL pulls whole blocks (docs/verified.md
# "KV cache blocks of 128 tokens").
CPU_BLOCK_TOKENS = 128


def prompt_ids(request_id: int, n_tokens: int, vocab: int, salt: int = 0) -> list[int]:
    """Deterministic prompt tokens for a request (ids 4.. avoid special tokens)."""
    rng = np.random.default_rng([salt, request_id])
    return (4 + rng.integers(0, vocab - 4, n_tokens)).tolist()
