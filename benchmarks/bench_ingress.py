"""What the router and its OpenAI-compatible ingress add to a request (not a test: prints figures).

    python benchmarks/bench_ingress.py [--requests N] [--prompt-tokens P] [--max-tokens K]

Brings up the embedded testbed scenario's emulated cluster (4 pods in network namespaces,
one vLLM engine each, root needed), starts its engines, and then, in the head's namespace,
sends the same requests two ways, one at a time and interleaved (so drift in the host's
speed hits both alike):

* **straight to the engines**: prefill on a prefill engine, then a streamed decode on a
  decode engine, through the very engine-call code the router uses
  (:class:`testbed.router.flow.RayEngine`), cycling over every (prefill, decode) pair;
* **through the ingress and the router**: an HTTP streaming ``/v1/completions`` with the
  prompt as token ids, served by the router actor (policy Random, so that it spreads the
  requests over the pairs as the direct path does; every record written).

TTFT is the first streamed token's arrival at the client, E2E the last's. The difference
is what the project adds: HTTP, routing, records, the router actor's hop. Next to it: the
decision latency the router recorded for these requests.

Before that, with engines that answer at once (``--no-engines``: only this part), the
project's own time alone: the ingress and the router's flow in a process of their own (as
the router actor is), driven by a minimal raw-socket client (the target's measure), by httpx
(what the ``openai`` client adds on top), and the flow without HTTP in the server's loop.
Target: router + ingress add at most 1 ms p99 to TTFT. Takes 6-8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
POLICY = "LC"
# On real engines the router spreads requests over the pairs at random, as the direct path cycles
# over them: LC sends idle sequential requests to the pair of its own choosing, and pairs differ.
ENGINE_POLICY = "Random"


def _quantiles(x: list[float]) -> tuple[float, float]:
    return float(np.percentile(x, 50)) * 1e3, float(np.percentile(x, 99)) * 1e3


async def _direct(p: Any, d: Any, rid: str, ids: list[int], max_tokens: int) -> tuple[float, float]:
    """Prefill then streamed decode, as the router's flow calls them; (TTFT, E2E) in seconds."""
    t0 = time.perf_counter()
    first: list[float] = []

    def mark(_tokens: list[int], _reason: str | None) -> None:
        if not first:
            first.append(time.perf_counter())

    pre = await p.prefill(rid, ids)
    await d.decode(rid, ids, max_tokens, pre.kv_transfer_params, on_tokens=mark,
                   sampling={"temperature": 0.0, "ignore_eos": True})
    return first[0] - t0, time.perf_counter() - t0


async def _ingress(client: Any, ids: list[int], max_tokens: int) -> tuple[float, float] | None:
    t0 = time.perf_counter()
    first = None
    body = {"prompt": ids, "max_tokens": max_tokens, "stream": True, "temperature": 0.0, "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith('data: {"error"'):
                return None  # the router's limit cut it (a host stall: docs/verified.md "Host stalls on two cores"); counted apart
            if line.startswith("data: {") and first is None:
                first = time.perf_counter()
    return first - t0, time.perf_counter() - t0


class InstantEngine:
    """An engine pair that answers at once: what is left of a request's time is the project's
    own (HTTP, ingress, routing, records), measured apart from engines' noise."""

    async def prefill(self, rid: str, ids: list[int]) -> Any:
        from testbed.engines.engine import PrefillResult

        now = time.monotonic()
        return PrefillResult(rid, {"remote_block_ids": [0]}, len(ids), now, now, "length", stages={"alloc": 0.0})

    async def decode(self, rid: str, ids: list[int], max_tokens: int, kv_transfer_params: Any = None, *,
                     on_tokens: Any = None, sampling: Any = None) -> Any:
        from testbed.engines.engine import DecodeResult

        now = time.monotonic()
        for i in range(max_tokens):
            if on_tokens is not None:
                on_tokens([300 + i], "length" if i == max_tokens - 1 else None)
            await asyncio.sleep(0)  # one engine output per loop turn, as a stream delivers them
        return DecodeResult(rid, tuple(range(300, 300 + max_tokens)), now, now, time.monotonic(), "length",
                            stages={"alloc_remote": 0.0, "recv_done": 0.0})

    async def abort(self, rid: str) -> None:
        pass

    async def stages(self, rid: str) -> dict[str, float]:
        return {}


def _instant_server(conn: Any, work: str, prompt_tokens: int, max_tokens: int) -> None:
    """The router actor's part with instant engines, in a process of its own as the router actor
    is (a client in the same process would share its GIL): the ingress and the router's flow on
    the embedded spec. Answers the client process through ``conn``."""
    from transformers import AutoTokenizer

    from core.experiment import build_topology, testbed_capacity
    from core.records import read_table
    from core.run import RunContext
    from core.spec.model import load_spec
    from testbed.router.ingress import Ingress
    from testbed.runs.launch import prepare_model
    from testbed.engines.prompts import prompt_ids
    from testbed.router.flow import RequestFlow, Submitted

    spec = load_spec(None, default="testbed.yaml").model_copy(update={"faults": []})
    model, meta = prepare_model(spec)
    tokenizer = AutoTokenizer.from_pretrained(model)
    topo = build_topology(spec)
    ctx = RunContext(spec, "testbed", POLICY, 0, Path(work) / "scripted", topo, {"source": "bench_ingress"},
                     testbed_capacity(spec, meta["kv_bytes_per_token"]), flush_s=1.0)  # flush_s: RouterActor's
    t0 = time.monotonic()
    clock = lambda: time.monotonic() - t0  # noqa: E731
    eng = InstantEngine()
    flow = RequestFlow(ctx, [eng] * topo.prefill_ids.size, [eng] * topo.decode_ids.size, spec.deadline_s, clock,
                       meta["vocab"], meta["kv_bytes_per_token"], spec.engine.kv_block_tokens)
    count = iter(range(10**9))

    def submit(ids: list[int], max_tokens: int, sampling: dict[str, Any], on_tokens: Any) -> Submitted:
        return flow.submit(next(count), clock(), ids, max_tokens, on_tokens=on_tokens, sampling=sampling)

    async def healthy() -> tuple[bool, dict[str, Any]]:
        return True, {}

    async def router_alone(i: int) -> tuple[float, float]:
        """A request handed to the router's flow in this loop: no HTTP, no SSE."""
        first: list[float] = []
        start = time.perf_counter()
        sub = submit(prompt_ids(i, prompt_tokens, meta["vocab"], salt=4242), max_tokens,
                     {"temperature": 0.0, "ignore_eos": True},
                     lambda toks, reason: first or first.append(time.perf_counter()))
        await sub.outcome
        return first[0] - start, time.perf_counter() - start

    async def serve() -> dict[str, Any]:
        ingress = Ingress(submit, healthy, Path(model).name, tokenizer, spec.testbed.max_model_len, spec.deadline_s)
        app, inside = ingress.app, []

        async def timed(scope: Any, receive: Any, send: Any) -> None:
            """The server's own part of TTFT: the request's arrival in the app to its first event's send."""
            start, sent = time.perf_counter(), []

            async def send_timed(message: Any) -> None:
                if not sent and message.get("body", b"").startswith(b"data: {"):
                    sent.append(time.perf_counter() - start)
                await send(message)

            await app(scope, receive, send_timed)
            if sent and scope["method"] == "POST":
                inside.append(sent[0])

        ingress.app = timed
        conn.send((await ingress.start("127.0.0.1", 0), meta["vocab"]))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # the client is done
        await ingress.stop()
        alone = [await router_alone(i) for i in range(len(inside))]
        return {"inside_s": inside, "alone": alone}

    out = asyncio.run(serve())
    ctx.close()
    dec = read_table(Path(work) / "scripted" / spec.name / POLICY / "seed-0", "decisions")
    conn.send({**out, "decision_latency_s": dec.latency_s.tolist()})


def _raw_stream(sock: Any, request: bytes) -> tuple[float, float]:
    """One streamed completion over a kept-alive socket by a client that costs next to nothing
    (prebuilt request bytes, a byte search for the events): (TTFT, E2E) in seconds."""
    start = time.perf_counter()
    sock.sendall(request)
    got, first = b"", None
    while not got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):  # the last event, then chunked's end
        got += sock.recv(65536)
        if first is None and b"data: {" in got:
            first = time.perf_counter()
    if not got.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"bench_ingress: the ingress answered {got[:60]!r}")
    return first - start, time.perf_counter() - start


def scripted(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Streamed requests one at a time through the ingress (in its own process) with instant
    engines; then, in the server's process, the same requests handed to the router's flow alone."""
    import multiprocessing

    import httpx

    from testbed.engines.prompts import prompt_ids

    warm = 100  # requests that warm each path up, left out of the figures
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_instant_server, args=(theirs, str(work), args.prompt_tokens, args.max_tokens), daemon=True)
    server.start()
    try:
        (host, port), vocab = ours.recv()
        res, bare = [], []
        body = {"max_tokens": args.max_tokens, "stream": True, "temperature": 0.0, "ignore_eos": True}
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
            for i in range(args.scripted_requests + warm):
                ids = prompt_ids(i, args.prompt_tokens, vocab, salt=4242)
                start = time.perf_counter()
                first = None
                with client.stream("POST", "/v1/completions", json={**body, "prompt": ids}) as r:
                    for line in r.iter_lines():
                        if first is None and line.startswith("data: {"):
                            first = time.perf_counter()
                res.append((first - start, time.perf_counter() - start))
            for i in range(args.scripted_requests + warm):  # the HTTP floor: a round trip that routes nothing
                start = time.perf_counter()
                client.get("/health")
                bare.append(time.perf_counter() - start)
        raw = []  # the same requests from a client that costs next to nothing: what the project adds
        with socket.create_connection((host, port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(args.scripted_requests + warm):
                payload = json.dumps({**body, "prompt": prompt_ids(i, args.prompt_tokens, vocab, salt=4242)}).encode()
                request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
                raw.append(_raw_stream(sock, request))
        ours.send("done")
        out = ours.recv()
    finally:
        server.join(timeout=60)
        if server.is_alive():
            server.kill()
    return {"res": res[warm:], "raw": raw[warm:], "bare_s": bare[warm:], "inside_s": out["inside_s"][warm:],
            "alone": out["alone"][warm:], "decision_latency_s": out["decision_latency_s"][warm:]}


def inner(args: argparse.Namespace) -> dict[str, Any]:
    """In the head's namespace, connected to the cluster: engines, router, both paths."""
    import httpx
    import ray

    from core.records import read_table
    from core.spec.model import load_spec
    from testbed.engines.pairs import warm_pairs
    from testbed.runs.driver import Engines, start_router
    from testbed.runs.launch import prepare_model
    from testbed.engines.prompts import prompt_ids
    from testbed.router.flow import RayEngine

    spec = load_spec(None, default="testbed.yaml")
    spec = spec.model_copy(update={"faults": []})
    model, meta = prepare_model(spec)
    ray.init(log_to_driver=False)
    engines = Engines(spec, str(model), Path(args.work) / "engines", "netns")
    out = Path(args.work) / "runs"
    try:
        t0 = time.monotonic()
        engines.start(spec.testbed.engine_start_timeout_s)
        meta["kv_block_tokens"] = engines.block_tokens
        warm_pairs(engines.prefill, engines.decode, meta["vocab"], engines.block_tokens)
        console.print(f"engines ready and paired in {time.monotonic() - t0:.0f} s")
        router, _ = start_router(spec, ENGINE_POLICY, 0, out, {"source": "bench_ingress"}, engines, meta)
        serving = router.serve.remote(str(model), "127.0.0.1", 0)
        host, port = ray.get(router.ingress_address.remote())
        pairs = [(RayEngine(p), RayEngine(d)) for p in engines.prefill for d in engines.decode]

        async def both() -> dict[str, list[tuple[float, float] | None]]:
            res: dict[str, list[tuple[float, float] | None]] = {"direct": [], "ingress": []}
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=120) as client:
                for i in range(args.requests + 4):  # the first 4 of each warm up the paths
                    p, d = pairs[i % len(pairs)]
                    order = ("direct", "ingress") if i % 2 == 0 else ("ingress", "direct")
                    for path in order:
                        # a prompt of its own each time: no prefix-cache hit on either path
                        ids = prompt_ids(2 * i + (path == "ingress"), args.prompt_tokens, meta["vocab"], salt=4242)
                        if path == "direct":
                            r = await _direct(p, d, f"bench-{i}", ids, args.max_tokens)
                        else:
                            r = await _ingress(client, ids, args.max_tokens)
                        if i >= 4:
                            res[path].append(r)
                        await asyncio.sleep(0.05)  # idle engines between requests: no queueing in either path
            return res

        res = asyncio.run(both())
        ray.get(router.stop.remote())
        ray.get(serving)
        ray.get(router.close.remote("finished"))  # (its engine counters are not this benchmark's subject)
        dec = read_table(out / spec.name / ENGINE_POLICY / "seed-0", "decisions")
        return {"res": res, "decision_latency_s": dec.latency_s.tolist()[4:],
                "pods": spec.topology.pods, "workers_per_pod": spec.topology.workers_per_pod}
    finally:
        engines.shutdown()
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100, help="requests per path (default 100)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--scripted-requests", type=int, default=2000,
                    help="requests through the ingress with instant engines (default 2000)")
    ap.add_argument("--no-engines", action="store_true", help="only the instant-engine part (no cluster, no root)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # the part run in the head's namespace
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        Path(args.inner).write_text(json.dumps(inner(args)))
        return

    from core.spec.model import load_spec
    from testbed.cluster.emulated import EmulatedCluster

    out = Console(width=120)
    work = Path(tempfile.mkdtemp(prefix="bench-ingress-"))
    sc = scripted(args, work)
    table = Table(title=f"instant engines: {args.scripted_requests} streamed requests per client, one at a time, "
                        f"{args.prompt_tokens}-token prompts, {args.max_tokens} output tokens (milliseconds)")
    for col in ("what the project adds", "TTFT p50", "TTFT p99", "E2E p50", "E2E p99"):
        table.add_column(col, justify="right" if col.startswith(("T", "E")) else "left")

    def row(label: str, pairs: list[tuple[float, float]]) -> None:
        ttft, e2e = zip(*pairs)
        table.add_row(label, *(f"{v:.2f}" for v in (*_quantiles(list(ttft)), *_quantiles(list(e2e)))))

    row("minimal client + ingress + router + records (target: 1 ms p99)", sc["raw"])
    table.add_row("of which in the server (request in, first event sent)",
                  *(f"{v:.2f}" for v in _quantiles(sc["inside_s"])), "", "")
    row("of which the router and records (no HTTP)", sc["alone"])
    row("the same through httpx (the openai client's HTTP library)", sc["res"])
    table.add_row("for scale: a bare GET /health through httpx", *(f"{v:.2f}" for v in _quantiles(sc["bare_s"])),
                  "", "")
    out.print(table)
    rec = np.array(sc["decision_latency_s"]) * 1e6
    out.print(f"decision latency recorded meanwhile ({POLICY}, back to back): p50 {np.percentile(rec, 50):.1f} us, "
              f"p99 {np.percentile(rec, 99):.1f} us")
    if args.no_engines:
        return
    spec = load_spec(None, default="testbed.yaml")
    cluster = EmulatedCluster(spec.topology.pods, mode="netns", launcher="direct")
    result = work / "result.json"
    try:
        cluster.up()
        rc = cluster.run_in_head([sys.executable, os.path.abspath(__file__), "--inner", str(result), "--work", str(work),
                                  "--requests", str(args.requests), "--prompt-tokens", str(args.prompt_tokens),
                                  "--max-tokens", str(args.max_tokens)]).returncode
        if rc != 0:
            raise SystemExit(f"bench_ingress: the head-side run failed ({rc})")
    finally:
        cluster.down()
    r = json.loads(result.read_text())
    table = Table(title=f"{args.requests} requests per path, {args.prompt_tokens}-token prompts, {args.max_tokens} "
                        f"output tokens, sequential (milliseconds)")
    for col in ("path", "TTFT p50", "TTFT p99", "E2E p50", "E2E p99", "cut by the deadline"):
        table.add_column(col, justify="right" if col != "path" else "left")
    rows = {}
    for path, label in (("direct", "straight to the engines"), ("ingress", "ingress + router")):
        done = [x for x in r["res"][path] if x is not None]
        ttft, e2e = zip(*done)
        rows[path] = (*_quantiles(list(ttft)), *_quantiles(list(e2e)))
        table.add_row(label, *(f"{v:.1f}" for v in rows[path]), str(len(r["res"][path]) - len(done)))
    table.add_row("added", *(f"{a - b:+.1f}" for a, b in zip(rows["ingress"], rows["direct"])), "")
    out.print(table)
    rec = np.array(r["decision_latency_s"]) * 1e6
    out.print(f"decision latency recorded by the router actor on the testbed ({ENGINE_POLICY}, {r['pods']} pods x "
              f"{r['workers_per_pod']}): p50 {np.percentile(rec, 50):.1f} us, p99 {np.percentile(rec, 99):.1f} us")


if __name__ == "__main__":
    main()
