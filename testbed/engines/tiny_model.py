"""A tiny random-weight Llama that vLLM loads like any model directory.

No model can be downloaded on the testbed machines, so the testbed builds its
own: `LlamaConfig` + `LlamaForCausalLM` with seeded random weights, saved with
`save_pretrained`, plus a byte-level BPE tokenizer trained locally on text that
ships with Python (stdlib docstrings). The default shape (8 layers, head_dim 32,
8 KV heads in bf16 or 4 in fp32) holds 8 KiB of KV per token in either dtype, so
a 4000-token prompt moves 32 MiB between engines while prefill stays around 2 s
on a CPU.

Its dtype is one the hardware computes fast (`native_dtype`): bf16 on a GPU or
where vLLM's CPU build loads its AVX-512 kernels (the machines of docs/twin.md's
figures), fp32 where it loads its AVX2 ones. There torch emulates bf16: its
matrix product ran 1.1-1.25 GFLOP/s per CPU second against fp32's 46-47 on a
2-core AVX2 EPYC, and vLLM's CPU engine prefilled 650 tokens in 1.2-1.4 s in
bf16 against 0.26-0.30 s in fp32 (docs/performance.md "A CPU without AVX-512"). The KV
heads follow the dtype so that the KV a prompt moves, the network's side of
every fault, is the same on every machine.

Peaked logits. With the default initialisation (std 0.02 everywhere) the
logits are a near-Gaussian random projection with a median top-1 margin of
about 0.07 nats, so greedy decoding flips between two numerically different
but equivalent code paths (prefill on one engine + decode on another vs. one
engine). The lm_head is therefore scaled by `LOGIT_SCALE`: the median top-1
margin becomes about 3.6 nats while the output still depends on the whole
context (changing the first 128 of 300 prompt tokens changed 6 of 6 greedy
continuations). Scaling cannot remove near-ties entirely: in bf16 a gap is
only resolved relative to the logit's own magnitude (one bf16 step at a logit
of 60 is 0.25), and about 5 % of steps keep a margin below 0.15 nats.
`greedy_margins` measures this; the end-to-end test tolerates a mismatch
only where the reference's own top-2 gap is such a near-tie.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
from pathlib import Path

#: Factor on the lm_head weights (initialised with std 0.02): peaks the logits.
LOGIT_SCALE = 50.0
#: Marker file written last; holds the parameters' hash so a rebuild is skipped.
MARKER = "tiny_model.json"

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
#: KV bytes per token of the default shape in any dtype (the module docstring; docs/verified.md
#: "A tiny model built locally"): the KV sizes the link faults' jobs and docs are derived from.
KV_BYTES_PER_TOKEN = 8192


def native_dtype(gpu: bool) -> str:
    """bf16 on a GPU or a CPU with AVX-512 (where vLLM's CPU build loads its AVX-512 kernels: the
    check vllm/platforms/cpu.py makes), else fp32 (the module docstring: the emulated bf16 of an
    AVX2 CPU is 40 times slower)."""
    import torch

    return "bfloat16" if gpu or torch.cpu._is_avx512_supported() else "float32"


def model_dtype(path: str | Path) -> str:
    """The dtype an engine runs a model in: the tiny model's own (the one it was built in; vLLM's
    "auto" would cast an fp32 model to bf16 on any x86 CPU), else vLLM's "auto" (the model's
    config, bf16 or fp16 for an fp32 checkpoint)."""
    try:
        return str(json.loads((Path(path) / MARKER).read_text())["params"]["dtype"])
    except (OSError, ValueError, KeyError):
        return "auto"


def _corpus() -> list[str]:
    """Training text for the tokenizer: docstrings of stdlib modules (ships with Python)."""
    import argparse, asyncio, collections, csv, json as json_mod, logging
    import pathlib, re, socket, subprocess, threading, typing, unittest

    texts: list[str] = []
    for mod in (argparse, asyncio, collections, csv, json_mod, logging, pathlib,
                re, socket, subprocess, threading, typing, unittest):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return texts


def _params(layers: int, kv_heads: int, head_dim: int, hidden: int, vocab: int,
            seed: int, dtype: str, max_positions: int) -> dict:
    return {
        "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "hidden": hidden,
        "vocab": vocab, "seed": seed, "dtype": dtype, "max_positions": max_positions,
        "logit_scale": LOGIT_SCALE, "format": 1,
    }


def _check(layers: int, kv_heads: int, head_dim: int, hidden: int, vocab: int,
           dtype: str) -> None:
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("hidden", hidden), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if hidden % head_dim:
        raise ValueError(f"hidden={hidden} is not a multiple of head_dim={head_dim}")
    heads = hidden // head_dim
    if heads % kv_heads:
        raise ValueError(f"attention heads ({heads} = hidden/head_dim) are not a multiple "
                         f"of kv_heads={kv_heads}")
    if vocab < 256 + len(_SPECIAL_TOKENS):
        raise ValueError(f"vocab={vocab} is below the byte alphabet plus specials "
                         f"({256 + len(_SPECIAL_TOKENS)})")


def build_tiny_model(path: Path, *, layers: int = 8, kv_heads: int | None = None, head_dim: int = 32,
                     hidden: int = 256, vocab: int = 2048, seed: int = 0,
                     dtype: str | None = None, max_positions: int = 8192) -> Path:
    """Build (or reuse) a random-weight Llama with a local BPE tokenizer in `path`.

    ``dtype`` None: this machine's CPU's `native_dtype`; ``kv_heads`` None: as many as hold
    KV_BYTES_PER_TOKEN. A second call with the same parameters returns at once: the directory's
    marker holds the parameters' hash. Different parameters rebuild in place.
    """
    dtype = dtype or native_dtype(gpu=False)
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    if kv_heads is None:
        kv_heads = max(1, KV_BYTES_PER_TOKEN // (layers * head_dim * 2 * _DTYPE_BYTES[dtype]))
    _check(layers, kv_heads, head_dim, hidden, vocab, dtype)
    path = Path(path)
    params = _params(layers, kv_heads, head_dim, hidden, vocab, seed, dtype, max_positions)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
    marker = path / MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("sha256") == digest:
                return path
        except (json.JSONDecodeError, OSError):
            pass  # unreadable marker: rebuild
    if path.exists():
        shutil.rmtree(path)
    tmp = path.with_name(path.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _write_tokenizer(tmp, vocab)
    _write_weights(tmp, params)
    (tmp / MARKER).write_text(json.dumps({"sha256": digest, "params": params}, indent=1))
    tmp.rename(path)  # the marker appears only with a complete directory
    return path


def ensure_tiny_model(path: str | Path, dtype: str | None = None) -> None:
    """A real cluster's node has no copy of the driver's tiny model: build the same one here
    (seeded weights, the driver's ``dtype``: its `model_dtype`), at the same path, once per node
    (a file lock beside it)."""
    import fcntl

    path = Path(path)
    if (path / "config.json").is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_tiny_model(path, dtype=None if dtype in (None, "auto") else dtype)


def _write_tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=_SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.model_max_length = 1 << 20
    fast.save_pretrained(out)


def _write_weights(out: Path, params: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, head_dim = params["hidden"], params["head_dim"]
    cfg = LlamaConfig(
        vocab_size=params["vocab"], hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=params["layers"], num_attention_heads=hidden // head_dim,
        num_key_value_heads=params["kv_heads"], head_dim=head_dim,
        max_position_embeddings=params["max_positions"], tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=3, torch_dtype=params["dtype"])
    torch.manual_seed(params["seed"])
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(params["logit_scale"])
    model = model.to(getattr(torch, params["dtype"]))
    model.save_pretrained(out, safe_serialization=True)


def kv_bytes_per_token(path: Path) -> int:
    """KV-cache bytes per token: layers x kv_heads x head_dim x 2 (K and V) x dtype bytes."""
    cfg_file = Path(path) / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cfg_file}: cannot read model config ({exc})") from None
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{cfg_file}: dtype {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return int(cfg["num_hidden_layers"]) * int(kv_heads) * int(head_dim) * 2 * _DTYPE_BYTES[dtype]


def greedy_margins(path: Path, prompts: list[list[int]], steps: int) -> "list[list[float]]":
    """Top-1 minus top-2 logit (nats) at each greedy step, computed in float32.

    The check that the model is peaked: the test asserts on these, and the
    end-to-end test uses them to tell a numerical near-tie from a real mismatch.
    """
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    margins: list[list[float]] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=3)
            row = []
            for logits in out.logits:
                top = torch.topk(logits[0].float(), 2).values
                row.append(float(top[0] - top[1]))
            margins.append(row)
    return margins
