"""The project's caches on a node, under the user's cache folder (``$XDG_CACHE_HOME``, else
``~/.cache``): what is built once and kept between commands, as vLLM and PyTorch keep theirs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "testbed"


def model_cache_dir() -> Path:
    """The tiny model and tokenizer, built once (testbed/engines/tiny_model.py)."""
    return cache_root() / "models" / "tiny-llama"


def compile_cache_dir() -> Path:
    """PyTorch Inductor's cache of the kernels vLLM compiles in an engine (the CPU build's sampler:
    a precompiled header and a few C++ kernels, ~150 MB, compiled by each decode engine as it
    starts). PyTorch's default, ``$TMPDIR/torchinductor_$USER``, is one cache for all of a user's
    processes; each engine's TMPDIR is its own folder (testbed/engines/engine.py), so without this
    every engine compiled them again at every start. Inductor locks and renames what it writes, so
    engines starting together share it safely."""
    return cache_root() / "inductor"


def vllm_cache_dir() -> Path:
    """vLLM's cache root (``VLLM_CACHE_ROOT``): its model-class inspection and, on GPUs, its
    torch.compile artifacts, which a GPU engine otherwise compiles again at every start. One per
    node, shared by its engines and kept between commands, as vLLM's own default (``~/.cache/vllm``)
    is: vLLM writes it atomically and reads a half-written or stale entry as absent
    (model_executor/models/registry.py)."""
    return cache_root() / "vllm"
