"""The tiny random-weight model and tokenizer the testbed builds on disk (testbed/engines/tiny_model.py)
and loads like any model directory: cached, rebuilt on new parameters, its KV size, its tokenizer,
its logits."""

from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import pytest

HAVE_HF = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers"))
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="torch/transformers/tokenizers not installed "
                              "(see docs/verified.md)")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    if not HAVE_HF:
        pytest.skip("torch/transformers/tokenizers not installed")
    from testbed.engines.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@needs_hf
def test_tiny_model_is_cached_and_rebuilt_on_new_parameters(tiny_model, tmp_path):
    from testbed.engines.tiny_model import MARKER, build_tiny_model

    stamp = (tiny_model / MARKER).stat().st_mtime_ns
    t0 = time.monotonic()
    assert build_tiny_model(tiny_model) == tiny_model
    assert time.monotonic() - t0 < 0.5
    assert (tiny_model / MARKER).stat().st_mtime_ns == stamp
    other = build_tiny_model(tmp_path / "small", layers=2, hidden=64, head_dim=16, kv_heads=2,
                             vocab=512)
    cfg = json.loads((other / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (2, 64, 512)
    assert (other / "tokenizer.json").is_file() and (other / "model.safetensors").is_file()


@needs_hf
def test_kv_bytes_per_token_follows_the_config(tiny_model, tmp_path):
    from testbed.engines.tiny_model import build_tiny_model, kv_bytes_per_token

    # 8 KiB per token (8 layers x 32 x 2 x 8 heads x 2 bytes or 4 heads x 4): docs/verified.md "A tiny model built locally"
    assert kv_bytes_per_token(tiny_model) == 8192
    small = build_tiny_model(tmp_path / "f32", layers=2, hidden=64, head_dim=16, kv_heads=2,
                             vocab=512, dtype="float32")
    assert kv_bytes_per_token(small) == 2 * 2 * 16 * 2 * 4


@needs_hf
def test_the_default_model_is_in_the_machines_native_dtype_with_the_same_kv_in_either(tiny_model, tmp_path):
    """bf16 on a GPU or a CPU with AVX-512, else fp32 with half the KV heads: the KV a prompt moves is
    the same 8 KiB a token on every machine, and the engines run the model in the dtype it was
    built in (vLLM's "auto" would cast fp32 to bf16)."""
    from testbed.engines.tiny_model import build_tiny_model, kv_bytes_per_token, model_dtype, native_dtype

    assert model_dtype(tiny_model) == native_dtype(gpu=False)
    assert native_dtype(gpu=True) == "bfloat16"
    heads = {}
    for dtype in ("bfloat16", "float32"):
        path = tiny_model if dtype == native_dtype(gpu=False) else build_tiny_model(tmp_path / dtype, dtype=dtype)
        cfg = json.loads((path / "config.json").read_text())
        heads[dtype] = cfg["num_key_value_heads"]
        assert kv_bytes_per_token(path) == 8192 and model_dtype(path) == dtype
    assert heads == {"bfloat16": 8, "float32": 4}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert model_dtype(tmp_path / "other") == "auto"  # a model of the user's: vLLM's own choice


@needs_hf
def test_tiny_model_rejects_bad_shapes(tmp_path):
    from testbed.engines.tiny_model import build_tiny_model

    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "x", hidden=100, head_dim=32)
    with pytest.raises(ValueError, match="kv_heads"):
        build_tiny_model(tmp_path / "x", kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        build_tiny_model(tmp_path / "x", dtype="int8")


@needs_hf
def test_tiny_model_tokenizer_round_trips_text(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = "Return the number of items in a container."
    ids = tok(text).input_ids
    assert len(ids) < len(text) / 2  # merges were learned, not just bytes
    assert tok.decode(ids) == text


@needs_hf
def test_tiny_model_logits_are_peaked(tiny_model):
    from testbed.engines.tiny_model import greedy_margins

    rng = np.random.default_rng(3)
    margins = np.array(greedy_margins(tiny_model, [rng.integers(4, 2048, 150).tolist()
                                                    for _ in range(4)], 8))
    # Median top-1 margin above a nat (the same Llama with its lm_head unscaled: ~0.07).
    assert np.median(margins) > 1.0
