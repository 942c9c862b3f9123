"""The OpenAI-compatible ingress (testbed/router/ingress.py), driven by the real `openai`
client over loopback, in front of the router's real RequestFlow and run context; engines
are scripted here (the emulated cluster's real vLLM engines are in test_testbed_e2e_serving.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest

from core.experiment import build_topology
from core.records import read_table
from core.run import RunContext
from builders import fixed, parse, small_spec_dict
from testbed.engines.engine import DecodeResult, PrefillResult
from testbed.router.ingress import Ingress
from testbed.router.flow import RequestFlow

MAX_LEN = 512


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from testbed.engines.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tok") / "tiny", layers=1, hidden=64, head_dim=16, kv_heads=2,
                            vocab=512)
    return AutoTokenizer.from_pretrained(path)


class StreamingEngine:
    """A scripted engine pair: prefill in ``prefill_s``; decode admits, pulls, then makes one
    token every ``step_s`` (ids 300, 301, ...) through ``on_tokens``, as the real engine's
    stream does; ``first_s`` delays the first token (a stalled pull)."""

    def __init__(self, prefill_s: float = 0.01, step_s: float = 0.005, first_s: float = 0.0) -> None:
        self.prefill_s, self.step_s, self.first_s = prefill_s, step_s, first_s
        self.aborted: set[str] = set()
        self.sampling: list[dict] = []
        self._t0: dict[str, float] = {}

    async def prefill(self, rid, ids):
        t0 = time.monotonic()
        await asyncio.sleep(self.prefill_s)
        return PrefillResult(rid, {"remote_block_ids": [0]}, len(ids), t0, time.monotonic(), "length",
                             stages={"alloc": 0.0})

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None, *, on_tokens=None, sampling=None):
        t0 = self._t0[rid] = time.monotonic()
        self.sampling.append(sampling)
        first = None
        toks: list[int] = []
        await asyncio.sleep(self.first_s)
        for i in range(max_tokens):
            if rid in self.aborted:
                break
            await asyncio.sleep(self.step_s)
            first = first or time.monotonic()
            toks.append(300 + i % 100)
            if on_tokens is not None:
                on_tokens([toks[-1]], "length" if i == max_tokens - 1 else None)
        reason = "abort" if rid in self.aborted else "length"
        return DecodeResult(rid, tuple(toks), t0, first, time.monotonic(), reason,
                            stages={"alloc_remote": 0.0, "recv_done": 0.001})

    async def abort(self, rid):
        self.aborted.add(rid)

    async def stages(self, rid):
        return {"alloc_remote": 0.0, "recv_done": 0.001} if rid in self._t0 else {}


def _spec(deadline_s: float = 30.0, max_in_flight: int | None = None):
    return parse(small_spec_dict(name="ingress", topology={"pods": 1},
                                 workload={"prompt": fixed(16), "output": fixed(4)},
                                 router={"max_in_flight": max_in_flight}, deadline_s=deadline_s))


async def _serving(tmp_path: Path, tokenizer, engine: StreamingEngine, client_fn, deadline_s: float = 30.0,
                   healthy: bool = True, workload_requests: int = 7, max_in_flight: int | None = None):
    """Run ``client_fn(base_url, ingress)`` against an ingress over the real flow; returns
    its result and the run directory."""
    spec = _spec(deadline_s, max_in_flight)
    topo = build_topology(spec)
    with RunContext(spec, "testbed", "LC", 0, tmp_path, topo, {"source": "ingress"}) as ctx:
        t0 = time.monotonic()
        clock = lambda: time.monotonic() - t0  # noqa: E731
        flow = RequestFlow(ctx, [engine], [engine], spec.deadline_s, clock, vocab=512, kv_bytes_per_token=8192,
                           block_tokens=spec.engine.kv_block_tokens)
        count = iter(range(workload_requests, 10**6))  # as the router actor: after the workload's ids

        def submit(ids, max_tokens, sampling, on_tokens):
            return flow.submit(next(count), clock(), ids, max_tokens, on_tokens=on_tokens, sampling=sampling)

        async def health():
            return healthy, {"engines": {"pod0-prefill": {"healthy": healthy}}}

        ingress = Ingress(submit, health, "tiny", tokenizer, MAX_LEN, spec.deadline_s)
        host, port = await ingress.start("127.0.0.1", 0)
        try:
            result = await client_fn(f"http://{host}:{port}", ingress)
        finally:
            await ingress.stop()
    return result, ctx.run_dir


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_completions_and_chat_through_the_openai_client_are_routed_and_recorded(tmp_path, tokenizer):
    engine = StreamingEngine()

    async def client_fn(base, _):
        c = _client(base)
        models = await c.models.list()
        plain = await c.completions.with_raw_response.create(model="tiny", prompt="The quick brown fox", max_tokens=6,
                                                             temperature=0.0)
        chunks = []
        stream = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello there"}],
                                                 max_tokens=5, stream=True, stream_options={"include_usage": True})
        async for ch in stream:
            chunks.append(ch)
        return models, plain, chunks

    (models, plain, chunks), run_dir = asyncio.run(_serving(tmp_path, tokenizer, engine, client_fn))
    assert [m.id for m in models.data] == ["tiny"]
    body = plain.parse()
    # the text is the engine's tokens detokenised, the usage the prompt's real token count
    assert body.choices[0].text == tokenizer.decode([300, 301, 302, 303, 304, 305], skip_special_tokens=True)
    assert body.choices[0].finish_reason == "length"
    n_prompt = len(tokenizer.encode("The quick brown fox"))
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (n_prompt, 6)
    assert plain.headers["x-testbed-request-id"] == "7"
    assert engine.sampling[0]["temperature"] == 0.0 and engine.sampling[1]["temperature"] == 1.0  # OpenAI's default
    # streamed: the role first, deltas that add up to the detokenised output, a usage chunk at the end
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode([300, 301, 302, 303, 304], skip_special_tokens=True)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    # both are in the run directory, with their stages, under the ids the responses named
    req = read_table(run_dir, "requests").sort_values("request_id")
    assert req.request_id.tolist() == [7, 8] and set(req.outcome) == {"ok"}
    assert req.prompt_tokens.tolist()[0] == n_prompt and req.output_tokens.tolist() == [6, 5]
    stages = req[["routed_s", "prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s", "first_token_s", "end_s"]]
    assert stages.notna().all().all()
    assert (stages.diff(axis=1).iloc[:, 1:] >= 0).all().all()
    assert len(read_table(run_dir, "decisions")) == 2


def test_a_request_past_its_deadline_gets_504_or_an_error_event_and_is_a_recorded_timeout(tmp_path, tokenizer):
    engine = StreamingEngine(first_s=5.0)  # the first token would come after the deadline

    async def client_fn(base, _):
        c = _client(base)
        errors = []
        try:
            await c.completions.create(model="tiny", prompt="slow", max_tokens=3)
        except openai.APIStatusError as e:
            errors.append((e.status_code, str(e)))
        try:
            stream = await c.completions.create(model="tiny", prompt="slow too", max_tokens=3, stream=True)
            async for _ in stream:
                pass
        except openai.APIError as e:
            errors.append((None, str(e)))
        return errors

    errors, run_dir = asyncio.run(_serving(tmp_path, tokenizer, engine, client_fn, deadline_s=0.5))
    assert errors[0][0] == 504 and "timed out" in errors[0][1]
    assert len(errors) == 2 and "timed out" in errors[1][1]
    req = read_table(run_dir, "requests")
    assert req.outcome.tolist() == ["timeout", "timeout"]
    assert len(engine.aborted) == 2  # aborted in the engine, as the workload's requests are


def test_past_the_admission_limit_a_request_gets_429_at_once_and_is_recorded_rejected(tmp_path, tokenizer):
    engine = StreamingEngine(first_s=0.5)  # two requests in flight for half a second

    async def client_fn(base, _):
        c = _client(base)
        slow = [asyncio.ensure_future(c.completions.create(model="tiny", prompt=f"first {i}", max_tokens=2))
                for i in range(2)]
        await asyncio.sleep(0.2)  # both routed and in flight
        refused = []
        for stream in (False, True):
            t0 = time.monotonic()
            try:
                await c.completions.create(model="tiny", prompt="one too many", max_tokens=2, stream=stream)
            except openai.APIStatusError as e:
                refused.append((e.status_code, e.body["message"], time.monotonic() - t0))
        done = await asyncio.gather(*slow)
        after = await c.completions.create(model="tiny", prompt="room again", max_tokens=2)
        return refused, done, after

    (refused, done, after), run_dir = asyncio.run(_serving(tmp_path, tokenizer, engine, client_fn, max_in_flight=2))
    assert [r[0] for r in refused] == [429, 429]  # a stream too: refused before its first event
    assert all("admission limit" in r[1] and r[2] < 0.3 for r in refused), refused  # at once, not after a wait
    assert len(done) == 2 and after.choices[0].finish_reason == "length"
    req = read_table(run_dir, "requests").sort_values("request_id")
    assert req.outcome.tolist() == ["ok", "ok", "rejected", "rejected", "ok"]
    rejected = req[req.outcome == "rejected"]
    assert (rejected.failed_stage == "admission").all() and (rejected.prefill_pod == -1).all()
    assert rejected.routed_s.isna().all()
    assert len(read_table(run_dir, "decisions")) == 3  # a rejected request is never routed
    assert len(engine.sampling) == 3


def test_bad_requests_get_openais_error_body_and_reach_no_engine(tmp_path, tokenizer):
    engine = StreamingEngine()

    async def client_fn(base, _):
        c = _client(base)
        out = {}
        for name, call in {
            "model": lambda: c.completions.create(model="gpt-4", prompt="x", max_tokens=2),
            "context": lambda: c.completions.create(model="tiny", prompt=[5] * 500, max_tokens=20),
            "n": lambda: c.completions.create(model="tiny", prompt="x", max_tokens=2, n=2),
            "max_tokens": lambda: c.completions.create(model="tiny", prompt="x", max_tokens=0),
            "vocab": lambda: c.completions.create(model="tiny", prompt=[5, 100000], max_tokens=2),
            "messages": lambda: c.chat.completions.create(model="tiny", messages=[]),
        }.items():
            try:
                await call()
            except openai.APIStatusError as e:
                out[name] = (e.status_code, e.body["message"] if isinstance(e.body, dict) else str(e.body))
        async with httpx.AsyncClient(base_url=base) as h:  # what no OpenAI client sends
            for name, r in {"json": await h.post("/v1/completions", content=b'{"prompt": [5, 6'),
                            "get": await h.get("/v1/chat/completions")}.items():
                out[name] = (r.status_code, r.json()["error"]["message"])
        return out

    out, run_dir = asyncio.run(_serving(tmp_path, tokenizer, engine, client_fn))
    assert out["model"] == (404, "The model `gpt-4` does not exist.")
    assert out["context"][0] == 400 and "maximum context length is 512 tokens" in out["context"][1]
    assert out["n"][0] == 400 and "one choice" in out["n"][1]
    assert out["max_tokens"][0] == 400 and out["max_tokens"][1].startswith("max_tokens:")
    assert out["messages"][0] == 400 and out["messages"][1].startswith("messages:")
    assert out["vocab"] == (400, "prompt: token id 100000 is out of vocabulary (0..511)")
    assert out["json"][0] == 400 and out["json"][1].startswith("Invalid JSON") and "\n" not in out["json"][1]
    assert out["get"] == (405, "GET /v1/chat/completions: only POST")
    assert not (run_dir / "requests.parquet").exists() or read_table(run_dir, "requests").empty
    assert engine.sampling == []


@pytest.mark.parametrize("healthy", [True, False])
def test_health_answers_what_the_engines_say_and_503_while_draining(tmp_path, tokenizer, healthy):
    async def client_fn(base, ingress):
        async with httpx.AsyncClient(base_url=base) as h:
            first = await h.get("/health")
            ingress.accepting = False
            drained = await h.get("/health")
            refused = await h.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        return first, drained, refused

    (first, drained, refused), _ = asyncio.run(_serving(tmp_path, tokenizer, StreamingEngine(), client_fn,
                                                       healthy=healthy))
    assert first.status_code == (200 if healthy else 503)
    assert first.json()["engines"]["pod0-prefill"]["healthy"] is healthy
    assert drained.status_code == 503 and refused.status_code == 503
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"


def test_an_occupied_port_is_a_one_line_error(tmp_path, tokenizer):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        async def start():
            ing = Ingress(lambda *a: None, None, "tiny", tokenizer, MAX_LEN, 1.0)
            await ing.start("127.0.0.1", port)

        with pytest.raises(OSError, match=rf"^ingress: cannot listen on 127.0.0.1:{port}: "):
            asyncio.run(start())


def test_streamed_text_adds_up_to_the_whole_decode_even_across_split_characters(tokenizer):
    import random

    from testbed.router.ingress import _Detok

    # byte-level BPE splits multi-byte characters across tokens: held back, never garbled
    text = "héllo wörld — ünïcode ✓ 漢字, spaces  kept"
    cases = [tokenizer.encode(text)] + [[random.Random(i).randrange(512) for _ in range(30)] for i in range(50)]
    for n, ids in enumerate(cases):
        rng, d, out, i = random.Random(n), _Detok(tokenizer), "", 0
        while i < len(ids):
            k = rng.randrange(1, 4)
            i += k
            out += d.add(ids[i - k:i], final=i >= len(ids))
        assert out == tokenizer.decode(ids, skip_special_tokens=True)
