"""One real vLLM engine (prefill or decode) with NIXL KV transfer, as a plain object.

`Engine` wraps `vllm.v1.engine.async_llm.AsyncLLM`. A Ray actor (or a test's
subprocess) holds one and forwards calls; nothing here imports Ray, and vLLM is
imported only when `start()` runs. The prefill/decode flow is vLLM's own
(the disaggregation proxy's and Ray Serve LLM's):

1. `prefill()` on the prefill engine: the prompt with `max_tokens=1` and
   `kv_transfer_params={"do_remote_decode": True}`; it returns the params that
   tell a decoder where the KV lies (engine id, block ids, host, port).
2. `decode()` on the decode engine with those params: its NIXL connector pulls
   the KV blocks (a NIXL READ: the bytes leave the prefill node) and decodes.

Process model. Each engine is two processes: this one (the `AsyncLLM` front
end) and a *spawned* EngineCore (scheduler, NIXL handshake side channel, and
with the uni executor, `EngineConfig.executor`, the model, KV cache and NIXL
agent too, as vLLM runs an engine of one GPU); so code that starts an engine
needs an `if __name__ == "__main__":` guard. vLLM's CPU build would otherwise
spawn a third, a worker fed through a busy-waiting shared-memory queue.
Give each engine a process of its own (a Ray actor is one): the environment
below is set in `os.environ` before the children start, and vLLM's Prometheus
logger unregisters every `vllm:` collector of the process when an engine
starts, so two engines in one process would share one environment and one
registry. An engine therefore keeps its own counters (`metrics()`; stats.py)
fed by a stat logger, rather than reading the registry.

vLLM's in-process hooks. vLLM takes its KV connector from the module this
engine names by path (`HOOKS_MODULE`, testbed/engines/vllm_hooks.py): vLLM's own
`NixlConnector` plus the stage log (stagelog.py) and the CPUs given back; importing
that module, in each engine process, installs the NIXL progress-thread delay
(`TESTBED_NIXL_PROGRESS_DELAY_US`: NIXL's agent would spin a core per engine) and
the record of missed wake-ups of the queue between the engine core and its worker
(shm_wakeups.py; only the mp executor has that queue). This module never imports it, so
importing it imports no vLLM.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.engines import shm_wakeups
from testbed.engines.results import DecodeResult, EngineError, PrefillResult  # noqa: F401 (re-exported)
from testbed.engines.stagelog import PULL_ENDS, STAGE_LOG_ENV, StageLog
from testbed.engines.stats import EngineStats
from testbed.engines.tiny_model import model_dtype
from testbed.machine.cache_dirs import compile_cache_dir, vllm_cache_dir
from testbed.machine.kv_ports import KV_PORT_RANGE
from testbed.machine.rdma import kv_class_environment, rdma_port_of
from vocab import EXECUTORS, ROLE_BOTH, ROLES, Executor, Role

#: Environment variable read in the worker process: NIXL progress-thread delay
#: (vllm_hooks.install_nixl_progress_delay).
PROGRESS_DELAY_ENV = "TESTBED_NIXL_PROGRESS_DELAY_US"
#: The module vLLM imports by path in each engine process for its KV connector and our hooks
#: (kv_connector_module_path); named, never imported here: it imports vLLM.
HOOKS_MODULE = "testbed.engines.vllm_hooks"
# "0" in an engine's environment: vLLM's NIXL worker keeps a peer whose endpoint failed, as vLLM 0.32
# does, instead of handshaking with it again (vllm_hooks.install_rehandshake); for measuring both.
REHANDSHAKE_ENV = "TESTBED_NIXL_REHANDSHAKE"
# Calls that raised whose stages an engine keeps for the router's next question (Engine.stages): it
# asks at once, so a few hundred cover every request an engine can hold.
ENDED_KEPT = 512
# Receives each output's new token ids and its finish reason (None until the last).
TokenSink = Callable[[list[int], "str | None"], None]
MiB = 1 << 20


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class EngineConfig:
    """Everything that makes one engine; `role` is informational (any engine can do both).

    `request_deadline_s` is the longest a request may live end to end (the
    router aborts it then). The KV lease is derived from it: the prefill
    engine keeps KV it holds for a remote decoder for
    `kv_lease_s = ceil(request_deadline_s + lease_margin_s)` (at least 6 s so
    vLLM's heartbeat period, lease // 6, is at least 1 s). A lease that ran out
    under a slow pull would let the prefill engine free (and reuse) blocks the
    pull still reads: the decoder would decode from corrupt KV and return
    success. With lease >= deadline that can only happen after the router has
    given the request up; and vLLM 0.32's decoder renews the lease by heartbeat
    while it holds the request (measured: docs/reliability.md "The lease, measured"), so only
    KV of requests it dropped expires. The price: a decoder that dies pins its
    prefill KV for 2/3 of the lease after its last heartbeat, and on the CPU
    build the prefill engine spins meanwhile (docs/reliability.md "A dead decoder's
    prefill partner").
    `lease_s` sets the lease outright (core.spec.model.EngineSpec.kv_lease_s); the
    run's canaries (core/canary.py) catch what an expiry corrupts.
    """

    model: Path
    run_dir: Path
    name: str
    side_channel_port: int
    role: Role = ROLE_BOTH
    host_ip: str = "127.0.0.1"
    net_device: str | None = None
    # core.spec.model.TestbedSpec.transport: tcp (KV over net_device, host-memory buffer) or rdma
    transport: str = "tcp"
    # rdma with rdma_link_faults dcb_maxrate: the DSCP that puts the KV in its traffic class
    # (core.spec.model.TestbedSpec.kv_dscp, testbed/machine/rdma.py); None: UCX's own marking
    kv_dscp: int | None = None
    request_deadline_s: float = 60.0
    lease_margin_s: float = 10.0
    # core.spec.model.EngineSpec.kv_lease_s: a lease set outright (a study of expiry), not derived
    lease_s: int | None = None
    max_model_len: int = 4096
    kv_cache_bytes: int = 256 * MiB
    # None: the model's own (tiny_model.model_dtype: the tiny model's, else vLLM's "auto")
    dtype: str | None = None
    omp_threads_bind: str = "nobind"
    # core.spec.model.TestbedSpec.executor: "uni" runs the model in the engine core's process, as vLLM
    # does for one GPU; "mp" is the CPU build's own default, a worker process fed through a
    # busy-waiting shared-memory queue (docs/reliability.md "The worker process, removed").
    executor: Executor = "uni"
    # Torch's intra-op threads per engine (OMP_NUM_THREADS). One: several engines share a few
    # cores, and a multi-threaded forward pass then waits at every OpenMP barrier for a thread the
    # kernel has descheduled. Measured on 2 cores, 4 engines: while a decode engine busy-waited on
    # a throttled pull (1.65 of 2 cores busy), a 500-token prefill elsewhere took 2.3-4.8 s
    # instead of 0.05-0.35 s with torch's default of a thread per core. None: torch's default.
    # (CPU engines only, as the two settings below: a GPU engine keeps vLLM's and torch's defaults.)
    omp_threads: int | None = 1
    # NIXL's progress thread would spin a core per engine (vllm_hooks.install_nixl_progress_delay)
    nixl_progress_delay_us: int = 1000
    # The idle engine core's and worker's re-check of their shared-memory queue (shm_wakeups.py);
    # None: vLLM's own (5000 ms).
    shm_recheck_ms: int | None = None
    # After a failed read, handshake with the peer again (core.spec.model.TestbedSpec.nixl_rehandshake).
    nixl_rehandshake: bool = True
    # The engine's CPU and run-queue wait, sampled this often (hoststats.py): the host stalls in
    # question last 1-10 s (a deadline is 10 s), so half a second places them within a stage.
    host_sample_s: float = 0.5
    nixl_num_threads: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    seed: int = 0
    gpu: bool = False
    # core.spec.model.TestbedSpec.enforce_eager: None follows the device (`eager`), a bool wins
    enforce_eager: bool | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.transport not in ("tcp", "rdma"):
            raise ValueError(f"transport={self.transport!r} must be 'tcp' or 'rdma'")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor={self.executor!r} must be one of {', '.join(EXECUTORS)}")
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r} must be one of {', '.join(ROLES)}")
        if not 1 <= self.side_channel_port <= 65535:
            raise ValueError(f"side_channel_port={self.side_channel_port} is not a port")
        if self.request_deadline_s <= 0:
            raise ValueError(f"request_deadline_s={self.request_deadline_s} must be > 0")
        if self.kv_cache_bytes < 16 * MiB:
            raise ValueError(f"kv_cache_bytes={self.kv_cache_bytes} is below 16 MiB")
        if self.host_sample_s <= 0:
            raise ValueError(f"host_sample_s={self.host_sample_s} must be > 0")
        if self.nixl_progress_delay_us < 0:
            raise ValueError(f"nixl_progress_delay_us={self.nixl_progress_delay_us} must be >= 0")
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty path component")

    @property
    def eager(self) -> bool:
        """vLLM's enforce_eager for this engine: eager on vLLM's CPU build, CUDA graphs (vLLM's own
        default) on a GPU, unless `enforce_eager` says otherwise (why: core.spec.model.TestbedSpec.enforce_eager)."""
        return (not self.gpu) if self.enforce_eager is None else self.enforce_eager

    @property
    def kv_lease_s(self) -> int:
        if self.lease_s is not None:
            return max(6, int(self.lease_s))
        return max(6, math.ceil(self.request_deadline_s + self.lease_margin_s))

    @property
    def engine_dir(self) -> Path:
        """Run-owned folder of this engine: its TMPDIR and IPC sockets, stage and wake-up logs."""
        return Path(self.run_dir) / self.name

    @property
    def stage_log_path(self) -> Path:
        """Where the engine's scheduler writes when it queues, allocates and receives KV (stagelog.py)."""
        return self.engine_dir / "stages.tsv"

    @property
    def wakeup_log_path(self) -> Path:
        """Where the engine core and worker record missed wake-ups of their queue (shm_wakeups.py)."""
        return self.engine_dir / "shm_wakeups.tsv"

    def environment(self) -> dict[str, str]:
        """Variables set before the engine's processes start (they inherit them)."""
        d = self.engine_dir
        env = {
            "VLLM_HOST_IP": self.host_ip,
            "VLLM_NIXL_SIDE_CHANNEL_HOST": self.host_ip,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port),
            "TMPDIR": str(d / "tmp"),
            # shared by the node's engines and kept between their starts (cache_dirs.py)
            "TORCHINDUCTOR_CACHE_DIR": str(compile_cache_dir()),
            "VLLM_CACHE_ROOT": str(vllm_cache_dir()),
            "VLLM_RPC_BASE_PATH": str(d / "tmp"),
            "GLOO_SOCKET_IFNAME": "lo",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            REHANDSHAKE_ENV: "1" if self.nixl_rehandshake else "0",
            STAGE_LOG_ENV: str(self.stage_log_path),
            shm_wakeups.LOG_ENV: str(self.wakeup_log_path),
        }
        if self.shm_recheck_ms is not None:
            env[shm_wakeups.RECHECK_ENV] = str(self.shm_recheck_ms)
        if self.transport == "tcp":
            # Only TCP: otherwise UCX sees engines of one host and copies across processes
            # (CMA), and on real clusters it takes RDMA; either bypasses the shaped interface.
            env["UCX_TLS"] = "tcp"
            if self.net_device:
                env["UCX_NET_DEVICES"] = self.net_device
            # In the engine's own environment, not the node's: on a real node, where nothing else
            # sets it, UCX would take an ephemeral port and a kv_only link fault would match nothing.
            env["UCX_TCP_PORT_RANGE"] = KV_PORT_RANGE
        elif self.kv_dscp is not None:  # the KV in the class the NIC limits, on the NIC the faults name
            env.update(kv_class_environment(self.kv_dscp, rdma_device=rdma_port_of(self.net_device)
                                            if self.net_device else None))
        if self.executor == "uni":
            # vLLM's CPU platform turns "uni" into "mp" unless this is 0 (platforms/cpu.py
            # check_and_update_config); AsyncLLM keeps its engine core in a process of its own
            # either way (EngineCoreClient.make_async_mp_client).
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not self.gpu:  # the CPU build's own settings; a GPU engine keeps vLLM's defaults
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_threads_bind
            env[PROGRESS_DELAY_ENV] = str(self.nixl_progress_delay_us)
            if self.omp_threads is not None:
                env["OMP_NUM_THREADS"] = str(self.omp_threads)
        env.update(self.extra_env)
        return env


# --------------------------------------------------------------------------- engine


class Engine:
    """One vLLM engine with NIXL KV transfer; create it, `await start()`, then serve."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._llm: Any = None
        self._stats = EngineStats(clock)
        self._lost_wakeups = shm_wakeups.LostSeconds(config.wakeup_log_path)
        self._inflight: set[str] = set()
        self._submitted: dict[str, float] = {}  # request id -> when its call reached this engine
        self._ended: dict[str, dict[str, float]] = {}  # calls that raised: where they were (stages)
        self._first: dict[str, float] = {}  # request id -> when its first token reached the front end
        self._stage_log = StageLog(config.stage_log_path)
        # Aborted requests whose KV pull had started and not ended: when their call reached this
        # engine. vLLM cannot cancel the read; its end comes later (pull_end).
        self._dead_pulls: dict[str, float] = {}
        self.startup_s: float | None = None
        self.warmup_s: float | None = None

    # ---- lifecycle

    def engine_args(self) -> Any:
        """The `AsyncEngineArgs` this engine starts with (vLLM must be importable)."""
        from vllm.config import KVTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self.config
        extra: dict[str, Any] = {"kv_lease_duration": cfg.kv_lease_s}
        if cfg.nixl_num_threads is not None:
            extra["num_threads"] = cfg.nixl_num_threads
        kv = KVTransferConfig(
            kv_connector="NixlConnector",
            kv_connector_module_path=HOOKS_MODULE,
            kv_role="kv_both",
            # tcp stages the KV through host memory: UCX over TCP cannot read GPU memory
            kv_buffer_device="cuda" if cfg.gpu and cfg.transport == "rdma" else "cpu",
            kv_connector_extra_config=extra,
        )
        kwargs: dict[str, Any] = dict(
            model=str(cfg.model),
            dtype=cfg.dtype or model_dtype(cfg.model),
            max_model_len=cfg.max_model_len,
            enforce_eager=cfg.eager,
            kv_cache_memory_bytes=cfg.kv_cache_bytes,
            kv_transfer_config=kv,
            seed=cfg.seed,
            disable_log_stats=False,
            enable_log_requests=False,
            distributed_executor_backend=cfg.executor,
        )
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        if cfg.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        return AsyncEngineArgs(**kwargs)

    async def start(self, warmup: bool = True) -> float:
        """Start the engine; returns the start-up seconds (warm-up included).

        On 2 CPU cores one engine starts in 25-30 s alone and 50-70 s when two
        start together. The first decode steps of a fresh engine are slow (the
        CPU kernels are built on first use: 6-30 s for the first request), so
        `warmup` runs one local request of three blocks before returning.
        """
        if self._llm is not None:
            raise RuntimeError(f"engine {self.config.name} is already started")
        (self.config.engine_dir / "tmp").mkdir(parents=True, exist_ok=True)
        os.environ.update(self.config.environment())
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = self._clock()
        args = self.engine_args()
        # Built in a thread so the caller's event loop stays responsive; AsyncLLM
        # starts its output handler lazily on the first request.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[self._stats.logger_factory()])
        if warmup:
            t1 = self._clock()
            prompt = [4 + (7 * i) % 2000 for i in range(2 * self.block_tokens() + 45)]
            await self.decode(f"warmup-{self.config.name}", prompt, max_tokens=8)
            self.warmup_s = self._clock() - t1
        self.startup_s = self._clock() - t0
        return self.startup_s

    async def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    def block_tokens(self) -> int:
        """Tokens per KV cache block of this engine, vLLM's own: what its arguments set, else its
        platform's default (128 on the CPU build, 16 on CUDA: docs/verified.md "KV cache blocks of
        128 tokens"). NIXL pulls whole blocks, so a prompt's KV is this many tokens' worth per block."""
        return int(self._require().vllm_config.cache_config.block_size)

    def gpu_uuid(self) -> str | None:
        """NVML UUID (``GPU-...``) of the GPU this engine computes on; None for a CPU engine.

        Resolved here, in the engine's process, where Ray set CUDA_VISIBLE_DEVICES: a
        fault agent's NVML numbers GPUs physically, so the UUID is how it finds this one.
        vLLM runs on CUDA device 0 of this process (one GPU per engine); its engine core,
        a child, inherits the same CUDA_VISIBLE_DEVICES. It initialises CUDA in this process."""
        if not self.config.gpu:
            return None
        from testbed.machine.gpu import visible_gpu_uuid

        return visible_gpu_uuid(0)

    def _require(self) -> Any:
        if self._llm is None:
            raise RuntimeError(f"engine {self.config.name} is not started")
        return self._llm

    # ---- requests

    async def _generate(self, request_id: str, prompt_token_ids: Sequence[int], params: Any,
                        times: list[float] | None = None, on_tokens: TokenSink | None = None,
                        ) -> tuple[float | None, Any, dict[str, float]]:
        """(first token time, last output, the scheduler's events as offsets from the call's start);
        ``times`` gets the arrival time of every output that brought new tokens, ``on_tokens``
        those new tokens (and the finish reason on the last)."""
        llm = self._require()
        first: float | None = None
        last = None
        seen = 0
        self._inflight.add(request_id)
        t0 = self._submitted[request_id] = self._clock()
        try:
            async for out in llm.generate(
                    prompt={"prompt_token_ids": list(prompt_token_ids)},
                    sampling_params=params, request_id=request_id):
                n = len(out.outputs[0].token_ids) if out.outputs else 0
                if n > seen:
                    now = self._clock()
                    if first is None:
                        first = self._first[request_id] = now
                    if times is not None:
                        times.append(now)
                    if on_tokens is not None:
                        comp = out.outputs[0]
                        on_tokens(list(comp.token_ids[seen:n]), comp.finish_reason)
                    seen = n
                last = out
        except BaseException:
            # A call that raised (its engine core died: EngineDeadError) takes its log with it; the
            # router asks next where the request was (stages), so that answer is kept for it.
            self._ended[request_id] = self._offsets(request_id, t0)
            while len(self._ended) > ENDED_KEPT:
                self._ended.pop(next(iter(self._ended)))
            raise
        finally:
            self._inflight.discard(request_id)
            self._submitted.pop(request_id, None)
            self._first.pop(request_id, None)
            events = self._stage_log.pop(request_id)
        return first, last, {k: t - t0 for k, t in events.items()}

    def _offsets(self, request_id: str, t0: float) -> dict[str, float]:
        out = {k: t - t0 for k, t in self._stage_log.get(request_id).items()}
        if request_id in self._first:
            out["first_token"] = self._first[request_id] - t0
        return out

    async def stages(self, request_id: str) -> dict[str, float]:
        """Where an in-flight request is: the scheduler's events so far ("queued", "alloc",
        "alloc_remote", "recv_done") and the front end's "first_token", in seconds after its
        call reached this engine."""
        t0 = self._submitted.get(request_id)
        if t0 is None:  # ended: a call that raised left its answer (_generate), else nothing
            return self._ended.pop(request_id, {})
        return self._offsets(request_id, t0)

    async def prefill(self, request_id: str, prompt_token_ids: Sequence[int]) -> PrefillResult:
        """Compute the prompt's KV and keep it for a remote decoder (max_tokens=1)."""
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=1, temperature=0.0, detokenize=False,
            extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        t0 = self._clock()
        _, last, stages = await self._generate(request_id, prompt_token_ids, params)
        reason = last.outputs[0].finish_reason if last is not None and last.outputs else None
        stats = getattr(last, "metrics", None)
        queued = None
        if stats is not None and getattr(stats, "scheduled_ts", 0.0) and getattr(stats, "queued_ts", 0.0):
            queued = max(0.0, float(stats.scheduled_ts - stats.queued_ts))
        return PrefillResult(
            request_id=request_id,
            kv_transfer_params=None if last is None else last.kv_transfer_params,
            num_prompt_tokens=len(prompt_token_ids),
            submitted_s=t0, finished_s=self._clock(), finish_reason=reason, queued_s=queued, stages=stages)

    async def decode(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                     kv_transfer_params: Mapping[str, Any] | None = None, *,
                     logprobs: int | None = None, ignore_eos: bool = True,
                     sampling: Mapping[str, Any] | None = None, on_tokens: TokenSink | None = None) -> DecodeResult:
        """Greedy-decode `max_tokens` tokens; with `kv_transfer_params` the prompt's KV is pulled.

        Without params the engine computes the prompt itself (a single-engine run).
        ``sampling``: further `SamplingParams` fields (an OpenAI request's temperature, top_p,
        seed, ignore_eos), over the greedy defaults; ``on_tokens`` gets tokens as they come.
        """
        from vllm import SamplingParams

        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        extra = None if kv_transfer_params is None else {
            "kv_transfer_params": dict(kv_transfer_params)}
        fields: dict[str, Any] = dict(temperature=0.0, ignore_eos=ignore_eos, logprobs=logprobs)
        fields.update(sampling or {})
        params = SamplingParams(max_tokens=max_tokens, detokenize=False, extra_args=extra, **fields)
        t0 = self._clock()
        times: list[float] = []
        first, last, stages = await self._generate(request_id, prompt_token_ids, params, times, on_tokens)
        end = self._clock()
        if last is None or not last.outputs:
            return DecodeResult(request_id, (), t0, first, end, "abort", stages=stages, token_times=tuple(times))
        comp = last.outputs[0]
        tops: tuple[tuple[float, ...], ...] = ()
        top_tokens: tuple[tuple[int, ...], ...] = ()
        if logprobs and comp.logprobs:
            ranked = [sorted(step.items(), key=lambda kv: kv[1].logprob, reverse=True) for step in comp.logprobs]
            tops = tuple(tuple(lp.logprob for _, lp in step) for step in ranked)
            top_tokens = tuple(tuple(int(tok) for tok, _ in step) for step in ranked)
        return DecodeResult(request_id, tuple(comp.token_ids), t0, first, end,
                            comp.finish_reason, tops, stages, tuple(times), top_tokens)

    async def decode_stream(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                            kv_transfer_params: Mapping[str, Any] | None = None, *,
                            sampling: Mapping[str, Any] | None = None) -> AsyncIterator[Any]:
        """`decode` as a stream: (new token ids, finish reason) for each output that brought
        tokens, then the `DecodeResult`. What a Ray streaming call relays to the router."""
        chunks: asyncio.Queue = asyncio.Queue()
        call = asyncio.ensure_future(self.decode(
            request_id, prompt_token_ids, max_tokens, kv_transfer_params, sampling=sampling,
            on_tokens=lambda ids, reason: chunks.put_nowait((ids, reason))))
        call.add_done_callback(lambda _: chunks.put_nowait(None))
        try:
            while (chunk := await chunks.get()) is not None:
                yield chunk
            yield call.result()
        finally:
            if not call.done():  # the consumer went away: the request must not run on unseen
                await self.abort(request_id)
                call.cancel()

    async def abort(self, request_id: str) -> None:
        """Cancel a request (the router's deadline); its `decode` returns with `aborted` at once.
        A KV pull in flight goes on regardless (vLLM 0.32 frees an aborted request's blocks only
        once its NIXL read has ended): its end is kept for :meth:`pull_end`, timed from this abort's
        arrival. The pull was still going then, so the caller, adding the offset to when it sent the
        abort, places the end after the abort; an offset from the original call's arrival would leave
        out that call's dispatch delay (over 1 s on a loaded host), and place it too early."""
        if request_id in self._submitted:
            events = self._stage_log.get(request_id)
            if "alloc_remote" in events and not PULL_ENDS & events.keys():
                self._dead_pulls[request_id] = self._clock()
        await self._require().abort(request_id)

    async def pull_end(self, request_id: str, forget: bool = False) -> dict[str, float]:
        """How an aborted request's KV pull ended ("recv_done" or "recv_failed", in seconds after
        the abort reached this engine), once the scheduler has logged it; {} until then (or for a
        request without a pull in flight at its abort). Found, or with ``forget``, it is dropped."""
        t0 = self._dead_pulls.get(request_id)
        if t0 is None:
            return {}
        out = {k: t - t0 for k, t in self._stage_log.get(request_id).items() if k in PULL_ENDS}
        if out or forget:
            del self._dead_pulls[request_id]
            self._stage_log.forget(request_id)
        return out

    async def reset_prefix_cache(self) -> bool:
        """Drop cached prefixes, so one run's prompts cannot speed up the next run's."""
        return bool(await self._require().reset_prefix_cache())

    async def release_remote_kv(self, request_id: str,
                                kv_transfer_params: Mapping[str, Any]) -> None:
        """Tell the prefill engine to free KV it holds for a decode that will never run.

        Call it on a decode engine when the router drops a prefilled request
        before decoding it; otherwise the blocks stay pinned until the lease ends.
        """
        await self._require().notify_kv_transfer_request_rejected(
            request_id, dict(kv_transfer_params))

    # ---- observation

    async def load(self) -> dict[str, Any]:
        """Queue and KV state from the last scheduler step plus the front end's own count."""
        llm = self._require()
        snap = self._stats.snapshot
        age = None if self._stats.snapshot_s is None else self._clock() - self._stats.snapshot_s
        return {
            "unfinished": llm.get_num_unfinished_requests(),
            "running": snap.get("running", 0),
            "waiting": snap.get("waiting", 0),
            "kv_usage": snap.get("kv_usage", 0.0),
            "kv_fetching": snap.get("kv_fetching", {}),
            "stats_age_s": age,
        }

    async def health(self) -> dict[str, Any]:
        """vLLM's own health check (the engine core alive and not errored: what vLLM's
        ``/health`` answers), then the load: a dead core raises here."""
        await self._require().check_health()
        return await self.load()

    async def metrics(self) -> dict[str, float | None]:
        """Cumulative counters since start, named like vLLM's Prometheus series."""
        out: dict[str, float | None] = dict(self._stats.counters)
        out["nixl_last_xfer_time_s"] = self._stats.last_xfer_time_s
        out["nixl_max_xfer_time_s"] = self._stats.max_xfer_time_s
        out["startup_s"] = self.startup_s
        out["warmup_s"] = self.warmup_s
        # missed wake-ups of the engine core's and worker's queue (shm_wakeups.py); run.json's
        # `engines` holds their deltas over the run
        out["shm_lost_wakeup_s"] = self._lost_wakeups()
        out["shm_missed_wakeups"] = self._lost_wakeups.count
        return out
