"""The router's Ray actor: a thin adapter around plain objects.

:class:`RouterActor` holds the run: the run context both worlds open
(:class:`core.run.RunContext`: writer, router, periodic loops, fault steps) on
the wall clock, :class:`RequestFlow`, the fault injector and the open-loop
replay of the workload. It lives on the head node and calls the engines'
actors (testbed/engines/actor.py).

It is an async actor, so an abort reaches an engine while its decode call is
still awaiting, and nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from core.canary import Reference
from core.canary import summary as canary_summary
from core.records import DEAD_PULL_WATCH_S, HostRecord
from core.run import RunContext
from core.spec.model import ExperimentSpec
from core.util.logs import configure_from_env
from core.topology import Topology
from core.view import Capacity
from testbed.faults.injector import FaultInjector, PodTargets
from testbed.router.flow import ABORT_GRACE_S, Liveness, RayEngine, RequestFlow
from vocab import ROLE_DECODE, ROLE_PREFILL

log = logging.getLogger(__name__)

# /health's wait for an engine's answer. Kubernetes probes default to 1 s; an engine actor's
# call here can queue behind a busy engine step on 2 shared cores, so a few seconds.
HEALTH_TIMEOUT_S = 5.0
# How often the router collects the engines' host samples during a run. An engine that dies takes
# the samples it still holds with it: the engine-death e2e lost a dead prefill engine's last 16 s,
# the stretch a 5.8 s prefill elsewhere fell in. 5 s keeps at most that much; each call moves
# about ten samples.
HOST_FETCH_S = 5.0


@dataclass
class FaultTargets:
    """What the router actor needs to run the fault schedule: per pod, its agent, processes and
    the probe of its link faults."""

    pods: list[PodTargets]


@ray.remote(num_cpus=0)
class RouterActor:
    def __init__(self, spec: ExperimentSpec, policy: str, seed: int, out: str, workload_summary: dict[str, Any],
                 meta: dict[str, Any], prefill: list[Any], decode: list[Any], topo: Topology, capacity: Capacity,
                 vocab: int, kv_bytes_per_token: int, kv_block_tokens: int, fault_targets: FaultTargets | None = None,
                 engine_names: list[str] | None = None, canaries: dict[int, Reference] | None = None) -> None:
        configure_from_env()  # the driver's level (core/util/logs.py)
        # the spec object the driver was handed (validated once, by the command line; Ray pickles it)
        self.spec = spec
        self.ctx = RunContext(spec, "testbed", policy, seed, out, topo, workload_summary, capacity, meta, flush_s=1.0)
        self.t0 = time.monotonic()
        self.flow = RequestFlow(self.ctx, [RayEngine(h) for h in prefill], [RayEngine(h) for h in decode],
                                spec.deadline_s, self.now, vocab, kv_bytes_per_token, kv_block_tokens, salt=seed,
                                first_token_limit_s=spec.first_token_limit_s, canaries=canaries)
        self.engine_names = engine_names or [f"engine{i}" for i in range(len(prefill) + len(decode))]
        self.liveness = Liveness(self.ctx, self.flow, self.now, HEALTH_TIMEOUT_S, self.engine_names)
        self.flow.on_engine_error = self.liveness.error
        # Every record the router emits also updates the run's Prometheus metrics (served in run()).
        from testbed.router.exporter import RunMetrics

        router = self.ctx.router
        self.metrics = RunMetrics(topo, lambda: router.view.loads)
        router.sink = self.metrics.tee(router.sink)
        self._metrics_server: Any = None
        self.sent = 0
        self.total = 0
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self.ingress: Any = None
        self._ingress_count = 0
        self._stop = asyncio.Event()
        self.t0_wall: float | None = None  # set when the run begins: the engines' host samples are on the wall clock
        self._host_since: dict[int, float] = {}  # per worker: the wall time its next host samples start at
        self._serving: asyncio.Future | None = None  # made in serve(), in the actor's event loop
        self.injector: FaultInjector | None = None
        self._injecting: asyncio.Future | None = None
        if self.ctx.steps:
            if fault_targets is None:
                raise ValueError(f"{spec.name}: the spec has faults but the run has no fault agents")
            self.injector = FaultInjector(self.ctx, fault_targets.pods, self.now, topo.fault_baseline_Bps * 8, vocab)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def _every(self, period: float, fn: Any) -> None:
        while True:
            fn(self.now())
            await asyncio.sleep(period)

    def _begin(self) -> None:
        """The run starts now (arrival times are relative to this): metrics, the router's
        periodic loops and the fault schedule."""
        self.t0 = time.monotonic()
        self.t0_wall = time.time()  # the engines' host samples are on the wall clock
        if self.spec.testbed.metrics_port and self._metrics_server is None:
            from testbed.router.exporter import serve

            self._metrics_server = serve(self.metrics, self.spec.testbed.metrics_host, self.spec.testbed.metrics_port)
        self._loops = [asyncio.ensure_future(self._every(period, fn)) for period, fn in self.ctx.periodic]
        # Liveness: every engine asked every testbed.engine_check_s whether it is down; a failed
        # call asks its engine at once (Liveness.error).
        self._loops.append(asyncio.ensure_future(self._every(self.spec.testbed.engine_check_s, self.liveness.tick)))
        # every table on disk within about flush_s of its rows, even one that gets no new row to
        # flush it (a SIGKILLed driver's run keeps its fault rows: tests/test_testbed_e2e_cluster.py)
        self._loops.append(asyncio.ensure_future(self._every(self.ctx.writer.flush_s, lambda _: self.ctx.writer.flush_due())))
        self._loops.append(asyncio.ensure_future(self._collect_host()))
        if self.injector:
            self._injecting = asyncio.ensure_future(self.injector.run())

    def _track(self, task: asyncio.Task) -> asyncio.Task:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.sent += 1
        return task

    async def run(self, arrival_s: list[float], prompt_tokens: list[int], output_tokens: list[int]) -> dict[str, int]:
        """Replay the workload open loop at wall-clock time; returns outcome counts."""
        self.total = len(arrival_s)
        self._begin()
        for i, (t, p, o) in enumerate(zip(arrival_s, prompt_tokens, output_tokens)):
            delay = t - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            self._track(asyncio.ensure_future(self.flow.handle(i, float(t), int(p), int(o))))
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        await self._drain_dead_pulls()
        await self._end_faults()
        return dict(self.flow.outcomes)

    # ---- serve mode: the OpenAI-compatible ingress (ingress.py) until stop()

    async def serve(self, model: str, host: str, port: int, build_model: bool = False,
                    dtype: str | None = None) -> dict[str, int]:
        """Serve outside clients through the ingress, the fault schedule running, until
        :meth:`stop`; then refuse new requests, let those in flight end (each within its
        deadline and abort grace) and return outcome counts. ``dtype``: the tiny model's where this
        node builds it (tiny_model.model_dtype of the driver's copy)."""
        from transformers import AutoTokenizer

        from testbed.router.ingress import Ingress

        self._serving = asyncio.get_running_loop().create_future()
        try:
            if build_model:  # the tokenizer too is the tiny model's: a node without the driver's disk builds it
                from testbed.engines.tiny_model import ensure_tiny_model

                await asyncio.to_thread(ensure_tiny_model, model, dtype)
            tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, model)
            self.ingress = Ingress(self._submit, self._health, Path(model).name, tokenizer,
                                   self.spec.testbed.max_model_len, self.spec.deadline_s)
            self._begin()
            self._serving.set_result(await self.ingress.start(host, port))
        except BaseException as e:
            if not self._serving.done():
                self._serving.set_exception(e)
            raise
        await self._stop.wait()
        self.ingress.accepting = False  # 503 from now on
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.spec.deadline_s + ABORT_GRACE_S)
        await self._drain_dead_pulls()
        await self.ingress.stop()
        await self._end_faults()
        return dict(self.flow.outcomes)

    async def ingress_address(self) -> tuple[str, int]:
        """Where the ingress listens, once it does (its start error if it could not)."""
        while self._serving is None:
            await asyncio.sleep(0.05)
        return await asyncio.shield(self._serving)

    async def stop(self) -> None:
        self._stop.set()

    def _submit(self, ids: list[int], max_tokens: int, sampling: dict[str, Any], on_tokens: Any) -> Any:
        # ids continue after the workload's, so an ingress request never shares a record's id
        rid = self.total + self._ingress_count
        self._ingress_count += 1
        sub = self.flow.submit(rid, self.now(), ids, max_tokens, on_tokens=on_tokens, sampling=sampling)
        if isinstance(sub.outcome, asyncio.Task):
            self._track(sub.outcome)
        return sub

    async def _health(self) -> tuple[bool, dict[str, Any]]:
        """Every engine's own health check (vLLM's: its core alive), with its load, and the
        router's health label of each pod."""
        engines = [*self.flow.prefill, *self.flow.decode]
        answers = await asyncio.gather(*(asyncio.wait_for(e.health(), HEALTH_TIMEOUT_S) for e in engines),
                                       return_exceptions=True)
        out: dict[str, Any] = {}
        for name, a in zip(self.engine_names, answers):
            out[name] = {"healthy": False, "error": f"{type(a).__name__}: {a}"} if isinstance(a, BaseException) \
                else {"healthy": True, **{k: a[k] for k in ("unfinished", "running", "waiting", "kv_usage")}}
        labels = self.ctx.router.view.pods.unhealthy
        pods = {f"pod{p}": {"unhealthy_label": bool(labels[p])} for p in range(len(labels))}
        return all(e["healthy"] for e in out.values()), {"engines": out, "pods": pods}

    async def _drain_dead_pulls(self) -> None:
        """The run ends once every dead pull's fate is recorded (each is watched for at most
        DEAD_PULL_WATCH_S; the margin covers a last call to a stuck engine)."""
        try:
            await asyncio.wait_for(self.flow.drain(), DEAD_PULL_WATCH_S + 10.0)
        except asyncio.TimeoutError:
            log.warning("%d dead pulls still watched at the run's end", len(self.flow.watches))

    async def _end_faults(self) -> None:
        """Stop the schedule after its current step and clear what is still on, recording it."""
        if self.injector is None or self._injecting is None:
            return
        self.injector.stop()
        await self._injecting
        self._injecting = None
        await self.injector.finish()

    async def progress(self) -> dict[str, Any]:
        return {"sent": self.sent, "total": self.total, "in_flight": len(self._tasks),
                "outcomes": dict(self.flow.outcomes), "now_s": self.now()}

    async def _record_host(self) -> None:
        """Every live engine's host samples of the run (hoststats.py) not yet recorded, into the
        ``host`` table: every HOST_FETCH_S while the run goes on and once at its close. What a dead
        engine held since the last collection is lost with it; one that does not answer within
        HEALTH_TIMEOUT_S is left for the next collection rather than holding the run."""
        t0_wall = self.t0_wall
        if t0_wall is None:  # the run never began
            return
        engines = [(role, self.liveness.worker(role, i), e)
                   for role, es in ((ROLE_PREFILL, self.flow.prefill), (ROLE_DECODE, self.flow.decode)) for i, e in enumerate(es)]
        since = self._host_since
        answers = await asyncio.gather(*(asyncio.wait_for(e.host_samples(since.get(w, t0_wall)), HEALTH_TIMEOUT_S)
                                         for _, w, e in engines), return_exceptions=True)
        for (role, worker, _), samples in zip(engines, answers):
            if isinstance(samples, BaseException) or not samples:
                continue
            pod = int(self.ctx.topo.worker_pod[worker])
            for wall, cpu, wait, pressure, busy, steal, lost in samples:
                self.ctx.writer.write(HostRecord(wall - t0_wall, worker, pod, role, cpu, wait, pressure, busy, steal,
                                                 lost))
            since[worker] = max(s[0] for s in samples) + 1e-6  # host_samples takes those at or after it

    async def _collect_host(self) -> None:
        while True:
            await asyncio.sleep(HOST_FETCH_S)
            await self._record_host()

    def node_id(self) -> str:
        """The Ray node this router runs on, where it writes the run directory."""
        return ray.get_runtime_context().get_node_id()

    def run_dir(self) -> str:
        """Where this run's records are written, on this router's node."""
        return str(self.ctx.run_dir)

    def run_archive(self) -> bytes:
        """The run directory as a gzip'd tar (testbed/router/run_archive.py), for a driver on another node."""
        from testbed.router.run_archive import pack_dir

        return pack_dir(self.ctx.run_dir)

    async def close(self, status: str = "finished", **extra: Any) -> dict[str, Any]:
        for t in [*self._tasks, *self.flow.watches]:
            t.cancel()
        try:
            await asyncio.wait_for(self._end_faults(), 60)
        except Exception as e:  # the rows must still be closed; the driver clears every agent next
            extra["fault_error"] = f"{type(e).__name__}: {e}"
            status = "interrupted"
        finally:
            for t in self._loops:
                t.cancel()
            if self.ingress is not None:
                await self.ingress.stop()
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server.server_close()
                self._metrics_server = None
        await self._record_host()
        # Importing either into the router's process holds its event loop for seconds (EngineError):
        # run.json says whether anything did during the run.
        imported = [m for m in ("vllm", "torch") if m in sys.modules]
        return self.ctx.close(status, testbed_end_s=self.now(), unseparated_decode_calls=self.flow.unseparated,
                              call_dispatch=self.flow.calls.summary(),
                              call_return=self.flow.calls.return_summary(),
                              router_imported=imported,
                              canaries=canary_summary(self.flow.canaries, self.flow.canary_verdicts), **extra)
