"""The testbed's front door: an OpenAI-compatible HTTP API in front of the router.

    GET  /v1/models                 the served model
    POST /v1/completions            prompt (text or token ids), SSE with ``stream: true``
    POST /v1/chat/completions       messages, SSE with ``stream: true``
    GET  /health                    200 when every engine passes vLLM's own health check

A FastAPI app served by uvicorn *inside the router actor's event loop* (not Ray Serve):
the router's state (the view its policy scores, the in-flight counters, the run's
records) lives in that one actor, so a Serve deployment would add an HTTP proxy
actor and a handle hop (Ray's docs give Serve about 1-2 ms per request) in front of
the same actor. Here a request is parsed, tokenised and routed in the process that
routes it, and goes through the very :class:`testbed.router.flow.RequestFlow` the
driver's workload goes through: same policy object, deadlines, aborts, records.

Request and response bodies follow the OpenAI API as vLLM serves it, including its
extension ``ignore_eos``; ``max_tokens`` defaults as in vLLM (16 for completions, the
rest of the context for chat). A response carries ``X-Testbed-Request-Id``, the
request's ``request_id`` in the run directory. Where the testbed differs from vLLM:
one prompt and one choice per request (``n`` > 1 and prompt lists are refused), no
stop strings or logprobs (refused, not ignored), and a client that disconnects does
not abort its request: it runs to its end, so its record stays a measurement of the
serving system rather than of the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from testbed.router.flow import Submitted
from vocab import CORRUPT, ERROR, OK, REJECTED, TIMEOUT

log = logging.getLogger(__name__)

# A tokenizer without a chat template (the project's tiny model has none) gets ChatML,
# the format most chat models use; vLLM would refuse such a model's chat requests.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
COMPLETION_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


# --------------------------------------------------------------------------- request bodies


class _Body(BaseModel):
    # Unknown fields are ignored, as vLLM does: benchmark clients send their own extras.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    stop: str | list[str] | None = None
    logprobs: Any = None


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class _EventStream(StreamingResponse):
    """SSE without the task group Starlette adds per response to listen for a disconnect when
    the server speaks ASGI < 2.4 (uvicorn does): measured, it cost more than the router. A gone
    client is not listened for because it changes nothing here: its request runs to its end
    (module docstring), and uvicorn drops what is sent to a closed connection."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # as Starlette does
            raise ClientDisconnect() from None


class IngressError(Exception):
    """A request the ingress refuses: OpenAI's error body with this status."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "code": self.status}},
                            status_code=self.status)


# --------------------------------------------------------------------------- what the router provides


# (prompt token ids, max output tokens, sampling fields, token receiver) -> the request in flight
Submit = Callable[[list[int], int, dict[str, Any], Callable[[list[int], "str | None"], None]], Submitted]
# -> (every engine healthy, what to show)
Health = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]

# How the flow's outcomes answer a client (the record says more: stage, times). A rejection is
# OpenAI's (and sgl-router's) 429: the client may retry later.
_FAILED = {TIMEOUT: (504, "Timeout", "timed out"), ERROR: (502, "EngineError", "failed in an engine"),
           REJECTED: (429, "RateLimitError", "was rejected: the router's admission limit is reached"),
           CORRUPT: (502, "EngineError", "was decoded from KV that was not its prompt's")}


class _Detok:
    """Incremental detokenisation as vLLM does it (``detokenize_incrementally``): each step
    decodes only the tokens since the last emitted text plus a few before them (their context
    decides spaces), and holds back a trailing partial UTF-8 character (byte-level BPE splits
    characters across tokens). Decoding the whole output each step would cost O(n^2)."""

    CONTEXT = 5  # tokens of context before the new ones (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET)

    def __init__(self, tokenizer: Any) -> None:
        self.tok, self.ids = tokenizer, []
        self.prefix, self.read = 0, 0  # decode from `prefix`; text up to `read` is emitted

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        text = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if len(text) <= len(before) or (not final and text.endswith("\ufffd")):
            return ""
        self.prefix, self.read = max(len(self.ids) - self.CONTEXT, 0), len(self.ids)
        return text[len(before):]


class Ingress:
    """The app and its server. ``submit`` hands a tokenised request to the router; ``health``
    asks the engines. Start it with :meth:`start` in the router's event loop."""

    def __init__(self, submit: Submit, health: Health, model_name: str, tokenizer: Any, max_model_len: int,
                 deadline_s: float) -> None:
        self.submit, self.health = submit, health
        self.model_name, self.tok, self.max_model_len, self.deadline_s = model_name, tokenizer, max_model_len, deadline_s
        self.accepting = True
        self.created = int(time.time())
        self.served = 0
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self.address: tuple[str, int] | None = None
        self._api = self._build()
        self._generating = {"/v1/completions": (CompletionBody, self._completions),
                            "/v1/chat/completions": (ChatBody, self._chat)}
        self.app = self._asgi

    # ---- server

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind (an occupied port is an OSError here, not uvicorn's exit) and serve."""
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it (Linux): uvicorn writes a response's head and body
        # apart, and with Nagle the body waits for the client's delayed ACK of the head, 40 ms
        # on every keep-alive request (measured: 44 ms a request, 1 ms with this).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise OSError(f"ingress: cannot listen on {host}:{port}: {e.strerror}") from None
        # asgi3 named: uvicorn's detection takes a bound async method for an ASGI2 app
        config = uvicorn.Config(self.app, interface="asgi3", log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5, timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # its exception
                raise RuntimeError("ingress: the server stopped while starting")
            await asyncio.sleep(0.01)
        self.address = sock.getsockname()[:2]
        return self.address

    async def stop(self) -> None:
        self.accepting = False
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None

    # ---- requests

    def _check_model(self, body: _Body) -> None:
        if body.model not in (None, "", self.model_name):
            raise IngressError(404, f"The model `{body.model}` does not exist.", "NotFoundError")

    def _check_supported(self, body: _Body) -> None:
        if body.n != 1:
            raise IngressError(400, f"n={body.n}: the testbed serves one choice per request")
        if body.stop:
            raise IngressError(400, "stop: stop strings are not supported by the testbed's engines' token path")
        if body.logprobs not in (None, False):
            raise IngressError(400, "logprobs: not supported by the testbed's ingress")

    def _sampling(self, body: _Body) -> dict[str, Any]:
        s: dict[str, Any] = {"ignore_eos": body.ignore_eos}
        # OpenAI's default temperature is 1; vLLM's too. Greedy stays the testbed's default only
        # for its own workload.
        s["temperature"] = 1.0 if body.temperature is None else body.temperature
        if body.top_p is not None:
            s["top_p"] = body.top_p
        if body.seed is not None:
            s["seed"] = body.seed
        return s

    def _limit(self, ids: list[int], max_tokens: int | None, default: int | None) -> int:
        if not ids:
            raise IngressError(400, "the prompt is empty")
        room = self.max_model_len - len(ids)
        n = max_tokens if max_tokens is not None else (default if default is not None else room)
        if n < 1 or len(ids) + n > self.max_model_len:  # vLLM's own wording
            n = max(n, 1)
            raise IngressError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                    f"you requested {len(ids) + n} tokens ({len(ids)} in the messages, {n} in the "
                                    "completion). Please reduce the length of the messages or completion.")
        return n

    def _completion_ids(self, body: CompletionBody) -> list[int]:
        p: Any = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise IngressError(400, f"prompt: a list of {len(p)} prompts; the testbed serves one per request")
            p = p[0]
        if isinstance(p, str):
            return list(self.tok.encode(p))
        vocab = len(self.tok)
        if (bad := next((x for x in p if not 0 <= x < vocab), None)) is not None:
            # refused here, as vLLM does: the engine would fail it and the run would record an error
            raise IngressError(400, f"prompt: token id {bad} is out of vocabulary (0..{vocab - 1})")
        return list(p)

    def _chat_ids(self, body: ChatBody) -> list[int]:
        messages = []
        for m in body.messages:
            content = m.content
            if isinstance(content, list):  # OpenAI's content parts: the text ones
                content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
            messages.append({"role": m.role, "content": content or ""})
        template = getattr(self.tok, "chat_template", None) or CHATML
        # rendered, then tokenised, as vLLM does (the template holds any special tokens itself)
        text = self.tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                            tokenize=False)
        return list(self.tok.encode(text, add_special_tokens=False))

    async def _run(self, ids: list[int], max_tokens: int, body: _Body, chat: bool) -> Any:
        if not self.accepting:
            raise IngressError(503, "the testbed is shutting down", "ServiceUnavailableError")
        chunks: asyncio.Queue = asyncio.Queue()
        sub = self.submit(ids, max_tokens, self._sampling(body), lambda t, r: chunks.put_nowait((t, r)))
        self.served += 1
        if isinstance(sub.outcome, asyncio.Future) and sub.outcome.done() and sub.outcome.result() == REJECTED:
            # refused before anything started: a status, also for a stream (no event sent yet)
            status, kind, what = _FAILED[REJECTED]
            return IngressError(status, self._failure(sub.request_id, what), kind).response()
        outcome = asyncio.ensure_future(sub.outcome)
        outcome.add_done_callback(lambda _: chunks.put_nowait(None))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{sub.request_id}"
        headers = {"X-Testbed-Request-Id": str(sub.request_id)}
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return _EventStream(self._sse(rid, len(ids), chunks, outcome, chat, include_usage),
                                media_type="text/event-stream", headers=headers)
        out_ids: list[int] = []
        reason = None
        while (item := await chunks.get()) is not None:
            out_ids.extend(item[0])
            reason = item[1] or reason
        result = await outcome
        if result != OK:
            status, kind, what = _FAILED.get(result, (500, "InternalServerError", result))
            return IngressError(status, self._failure(sub.request_id, what), kind).response()
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        n = len(out_ids)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason or "length", "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}},
            headers=headers)

    def _failure(self, request_id: int, what: str) -> str:
        return (f"request {request_id} {what} (the router's limits: deadline {self.deadline_s:g} s); its record in "
                "requests.parquet gives the stage")

    async def _sse(self, rid: str, n_prompt: int, chunks: asyncio.Queue, outcome: asyncio.Future, chat: bool,
                   include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        detok = _Detok(self.tok)

        def event(choices: list[dict[str, Any]], **more: Any) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": self.model_name, "choices": choices,
                    **more}
            return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

        def choice(text: str, reason: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {"content": text}
                if first:
                    delta["role"] = "assistant"
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

        first, reason = True, None
        while (item := await chunks.get()) is not None:
            ids, reason = item
            text = detok.add(ids, final=reason is not None)
            if text or first or reason:
                yield event([choice(text, reason, first)])
                first = False
        result = await outcome
        if result != OK:
            # The status line is long gone: an error event, as vLLM sends one mid-stream.
            status, kind_, what = _FAILED.get(result, (500, "InternalServerError", result))
            yield f"data: {json.dumps({'error': {'message': self._failure(int(rid.split('-')[1]), what), 'type': kind_, 'code': status}})}\n\n"
        elif reason is None:  # the engine's last output brought no token: close the choice
            yield event([choice(detok.add([], final=True), "length")])
        if include_usage:
            n = len(detok.ids)
            yield event([], usage={"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n})
        yield "data: [DONE]\n\n"

    # ---- the app

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app uvicorn serves. The two generating endpoints are served here, straight
        from ASGI: FastAPI's middleware, routing and dependency layers cost 80-100 us a request
        (measured, bench_ingress), as much as the router's whole flow. The rest is FastAPI's."""
        endpoint = self._generating.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            return await self._api(scope, receive, send)
        if scope["method"] != "POST":
            refused = IngressError(405, f"{scope['method']} {scope['path']}: only POST", "MethodNotAllowed").response()
            refused.headers["Allow"] = "POST"
            return await refused(scope, receive, send)
        model, handler = endpoint
        raw = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            response = await handler(model.model_validate_json(b"".join(raw)))
        except ValidationError as e:
            response = IngressError(400, _first_error(e.errors())).response()
        except IngressError as e:
            response = e.response()
        await response(scope, receive, send)

    async def _completions(self, body: CompletionBody) -> Any:
        self._check_model(body)
        self._check_supported(body)
        ids = self._completion_ids(body)
        return await self._run(ids, self._limit(ids, body.max_tokens, COMPLETION_MAX_TOKENS), body, chat=False)

    async def _chat(self, body: ChatBody) -> Any:
        self._check_model(body)
        self._check_supported(body)
        ids = self._chat_ids(body)
        return await self._run(ids, self._limit(ids, body.max_completion_tokens or body.max_tokens, None), body,
                               chat=True)

    def _build(self) -> FastAPI:
        app = FastAPI(title="testbed ingress", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                                "owned_by": "testbed", "root": self.model_name,
                                                "max_model_len": self.max_model_len}]}

        @app.get("/health")
        async def health() -> JSONResponse:
            if not self.accepting:
                return JSONResponse({"status": "shutting down"}, status_code=503)
            ok, detail = await self.health()
            return JSONResponse({"status": "ok" if ok else "unhealthy", **detail}, status_code=200 if ok else 503)

        return app


def _first_error(errors: list[Any]) -> str:
    """A validation failure in one line, as the field it names and what is wrong with it."""
    first = errors[0] if errors else {}
    where = ".".join(str(x) for x in first.get("loc", ()))
    what = first.get("msg", "invalid request")
    return f"{where}: {what}" if where else what
