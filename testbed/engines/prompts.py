"""The prompts the testbed sends its engines: deterministic token ids per request (the router's flow,
the calibration and the engine checks share them). The KV block size NIXL pulls whole is each
engine's own (testbed/engines/engine.py Engine.block_tokens)."""

from __future__ import annotations

import numpy as np

def prompt_ids(request_id: int, n_tokens: int, vocab: int, salt: int = 0) -> list[int]:
    """Deterministic prompt tokens for a request (ids 4.. avoid special tokens)."""
    rng = np.random.default_rng([salt, request_id])
    return (4 + rng.integers(0, vocab - 4, n_tokens)).tolist()
