"""The experiment spec: one YAML file drives the simulator and the testbed.

Validated with pydantic at the file boundary; every error is reported as one
line naming the file and the field (``load_spec``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.host_model import worker_spin_s
from core.limits import first_token_limit
from core.spec.metrics import MetricsSpec
from faults.spec import FaultSpec, HealthSpec, LinkFault, TelemetrySpec
from vocab import FAULT_ENGINE, FAULT_LINK, ROLE_BOTH, ROLE_PREFILL, EmulatedMode, Executor
from workloads.spec import WorkloadSpec

from core.policies import Weights, check_policy_name
from core.spec.study import StudySpec
from core.util.errors import first_error


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopologySpec(_Spec):
    pods: int = Field(32, ge=1)
    # One worker per pod is a valid `by_pod` cluster (a pod is a prefill or a decode node);
    # `within_pod` needs two (Topology.build says so).
    workers_per_pod: int = Field(32, ge=1)
    prefill_fraction: float = Field(0.5, gt=0, lt=1)
    placement: Literal["within_pod", "by_pod"] = "within_pod"
    # ConnectX-7 class NICs: one 400 Gbit/s NIC per GPU is the norm in current H100/H200 clusters.
    nic_gbps: float = Field(400.0, gt=0)
    # A pod's core links; None = the sum of its NICs over `oversubscription`.
    uplink_gbps: float | None = Field(None, gt=0)
    # NIC bandwidth of a pod over its core links' bandwidth: 1 = non-blocking, as a GPU back-end
    # fat-tree is inside a pod; 3:1 is the typical leaf-uplink ratio of general data-centre
    # fabrics (Lyons and Zolotow, IBM, "Converged Networking: Over-subscription ratio"), the
    # front-end network KV crosses where NIXL runs over TCP rather than a back-end RDMA fabric.
    oversubscription: float = Field(1.0, ge=1.0)
    # What a link fault's residual_bw r is relative to: it sets a pod's core links to
    # min(their capacity, r x this). None: their own capacity (a GPU cluster's NICs). The emulated
    # testbed's veth links have no rate of their own below the host's (UCX over TCP on the CPU
    # moves several Gbit/s), so its scenarios name the baseline, and the testbed shapes to r x it.
    link_baseline_gbps: float | None = Field(None, gt=0)
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 head_dim x 2 (K and V) x 2 bytes (bf16) = 128 KiB.
    kv_bytes_per_token: int = Field(131072, ge=1)
    # Bytes on the wire per KV byte (protocol headers): 1.0 models an RDMA fabric's large MTU;
    # NIXL over UCX/TCP measured about 1.05 (docs/verified.md "UCX over TCP, and what crosses the
    # wire"); `testbed calibrate` measures it.
    kv_wire_overhead: float = Field(1.0, ge=1.0)


class EngineSpec(_Spec):
    """Performance model of one worker (defaults: Llama-3.1-8B on one H100 SXM)."""

    # 2 x 8e9 FLOP per prompt token at ~25% of the H100's 989 dense bf16 TFLOP/s
    # (attention, padding and scheduling overheads included) ~ 15k tokens/s.
    prefill_tokens_per_s: float = Field(15000.0, gt=0)
    prefill_overhead_s: float = Field(0.005, ge=0)
    # vLLM's default max_num_batched_tokens for online serving.
    prefill_batch_tokens: int = Field(8192, ge=1)
    # Outstanding requests at which a prefill worker counts as fully utilised (load and util scale).
    prefill_slots: int = Field(16, ge=1)
    # Decode is memory bound: 16 GB of weights over 3.35 TB/s ~ 4.8 ms per step, plus
    # reading each sequence's KV (128 KiB per token / 3.35 TB/s ~ 39 ns per token).
    decode_step_base_s: float = Field(0.006, gt=0)
    decode_step_per_seq_s: float = Field(2e-5, ge=0)
    decode_step_per_kv_token_s: float = Field(3.9e-8, ge=0)
    # vLLM's default max_num_seqs.
    decode_max_batch: int = Field(256, ge=1)
    # (80 GB - 16 GB weights - activations) x 0.9 gpu_memory_utilization ~ 52 GB / 128 KiB.
    decode_kv_tokens: int = Field(400_000, ge=1)
    # KV moves in whole cache blocks (NIXL reads every block of the prompt, the partial last one
    # included): vLLM's CUDA block size is 16 tokens; its CPU build uses 128 (docs/verified.md
    # "KV cache blocks of 128 tokens").
    kv_block_tokens: int = Field(16, ge=1)
    # Fixed cost of one KV pull beside its bytes (descriptor set-up, the completion notice):
    # not modelled for GPUs (0); `testbed calibrate` measures it on the testbed's engines.
    kv_transfer_latency_s: float = Field(0.0, ge=0)
    # The serving stack's control path, which the engine models above leave out: how long a
    # routed request takes to reach its prefill engine's scheduler (the router's decision, the
    # call, the engine loop's next step), how long after its prefill the decode engine's scheduler
    # has it (the decode call), and how long a request whose KV is in waits for the decode
    # scheduler to take it into the running batch. Not modelled for GPUs (0: a scenario models the
    # engines); `testbed calibrate` measures them on the testbed under a load shaped like the run's
    # (analysis/checks/refit.py; docs/twin.md "A calibration under the run's conditions").
    prefill_call_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    decode_call_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    decode_join_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    # What the abort of a request in kv_transfer (its deadline) does to its KV pull, in the
    # simulator (the testbed's engines do what vLLM does):
    # * cancel: the pull stops there, its link share and decode blocks are free at once (an engine
    #   that can release a read in flight; the simulator's behaviour so far, hence the default);
    # * finish: the pull goes on to its end, loading the links and holding its decode blocks until
    #   then, as vLLM 0.32 with NIXL does (Scheduler.finish_requests in
    #   vllm/v1/core/sched/scheduler.py frees an aborted WAITING_FOR_REMOTE_KVS request's blocks
    #   only once its read has finished: delay_free_blocks). Both record the pull's fate in
    #   dead_pulls.parquet.
    kv_pull_on_abort: Literal["cancel", "finish"] = "cancel"
    # How long a prefill engine keeps the KV it holds for a remote decoder (vLLM's NIXL
    # kv_lease_duration); then it frees the blocks, and a pull still reading them reads what the
    # next prompts write there: outcome "corrupt". None: above the first-token limit
    # (testbed.engines.engine.EngineConfig.kv_lease_s). A value sets it in both worlds: the
    # testbed's engines get it; at least 6 s (vLLM renews every lease // 6 s).
    kv_lease_s: int | None = Field(None, ge=6)
    # Whether the decoder renews the lease while it holds the request. vLLM 0.32 does: its decode
    # scheduler sends a heartbeat every lease // 6 s until the pull ends or the request is aborted,
    # each extending the lease to 2/3 of it from then (nixl/base_scheduler.py, base_worker.py
    # _handle_heartbeat), so only KV of requests the decoder dropped expires; the testbed measured
    # it (docs/reliability.md "The lease, measured"). False models a lease that runs out from the
    # prefill's end regardless (lost heartbeats, a connector without renewal): the simulator then
    # ends a request whose pull ended after it as corrupt, every freed block taken as reused (an
    # upper bound).
    kv_lease_renewed: bool = True
    # How long after its engine core dies vLLM's front end fails the calls on it, and the router
    # (testbed/router/flow.py Liveness) takes the engine for down: the front end's monitor sees the
    # core's process end at once but shuts its client down before the calls raise EngineDeadError
    # (vllm/v1/engine/core_client.py MPClient.start_engine_core_monitor). A dead actor's calls fail
    # at once (Ray), as does any call to a core already found dead. 0: at once; measured on the
    # emulated testbed (docs/reliability.md "Engine death in both worlds").
    core_death_notice_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    # How long a restarted engine core takes to start serving (an engine fault's restart_s): vLLM
    # loads the model and warms up again. No default: it is the engine's and the host's. Not the
    # cluster's start-up (testbed.json `engines` startup_s: every engine at once, 73 s here), but one
    # core started beside serving ones: 11.2-12.2 s here (docs/reliability.md "Engine death in both
    # worlds", measured with testbed.engine_check_s 1 s; experiments/engine_restart.yaml).
    engine_start_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    # A link that was down (residual_bw 0) comes back: UCX over TCP finds its endpoints across it
    # disconnected this long after, and every KV read on them fails then (error in kv_transfer):
    # those hung since the outage and those started since, which hang meanwhile; the next read
    # handshakes anew and works (the testbed's re-handshake, testbed.nixl_rehandshake). Measured
    # on the emulated testbed (docs/testbed.md "The outage after the outage"). None: the healed
    # link carries its hung pulls on at once (what UCX alone did after both directions were down
    # for 30-60 s, the simulator's model so far).
    kv_heal_disconnect_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    # The host the engines run on (the simulator's host model: docs/simulator.md "The host model").
    # None: each engine has an accelerator of its own and shares nothing of its host that the model
    # would notice (a GPU cluster; the model as it was). A number: every engine of the cluster
    # shares that many CPU cores, as on the emulated testbed, where each pod is a network namespace
    # of one machine: an engine demands cores by what it does (host_engine_cores computing or
    # spinning, host_hold/pull/decode_cores below), and when the engines and the rest of the host
    # demand more than there is, each computes at cores / demand of its speed (processor
    # sharing, as Linux's fair scheduler gives runnable threads). `testbed calibrate` measures the
    # cores (core/calibration/fit.py HostCalibration) and sets this where CPU engines outnumber them.
    host_cores: float | None = Field(None, gt=0, allow_inf_nan=False)
    # What one engine demands while it has work: vLLM's CPU engine computes on one thread
    # (OMP_NUM_THREADS=1, docs/testbed.md "One engine thread"), and while it waits its worker spins on
    # that thread; measured at 1.0 core per VLLM::Worker process while pulls hung
    # (docs/history/2026-11-23-prefill-stall.md "Measured: the workers spin a core each").
    host_engine_cores: float = Field(1.0, gt=0, allow_inf_nan=False)
    # How long an engine's worker goes on spinning after its last call (core.host_model.worker_spin_s):
    # none with the testbed's default uni executor (testbed.executor), which has no worker process;
    # 1 s with the mp executor, whose shared-memory queue reader busy-waits that long after each
    # read (shm_broadcast.SpinCondition, busy_loop_s = 1: docs/reliability.md "What spins").
    # `testbed calibrate` records which (core/calibration/fit.py HostCalibration.spin_s).
    host_spin_s: float = Field(worker_spin_s("uni"), ge=0, allow_inf_nan=False)
    # What an engine demands by what it does, where it differs from computing (docs/simulator.md
    # "Demand by state"): the default is one thread each, the source's count (a waiting engine's
    # worker spins on one thread); `testbed calibrate` measures each against a computing engine beside
    # it, with pulls hanging (core/calibration/fit.py HostCalibration.demand). A prefill engine that holds
    # KV a decoder has yet to read and computes nothing; a decode engine with requests admitted whose
    # KV has not arrived and nothing decoding; a decode engine whose batch decodes.
    host_hold_cores: float = Field(1.0, gt=0, allow_inf_nan=False)
    host_pull_cores: float = Field(1.0, gt=0, allow_inf_nan=False)
    host_decode_cores: float = Field(1.0, gt=0, allow_inf_nan=False)
    # What the rest of the host demands all along (Ray's processes, the router, the driver): none
    # in the model's default, measured by `testbed calibrate` where the engines share one machine.
    host_background_cores: float = Field(0.0, ge=0, allow_inf_nan=False)

    @field_validator("host_cores", mode="before")
    @classmethod
    def _cores_not_bool(cls, v: Any) -> Any:
        # `host_cores: true` reads as "the host is shared" but would mean one core
        if isinstance(v, bool):
            raise ValueError(f"host_cores is a number of cores (e.g. 2) or null, not {str(v).lower()}")
        return v


class CircuitBreakerSpec(_Spec):
    """A per-pod circuit breaker (core/breaker.py). Defaults: sgl-router's CircuitBreakerConfig
    (sgl-router/src/core/circuit_breaker.rs: failure_threshold 5, success_threshold 2,
    timeout_duration 30 s)."""

    failure_threshold: int = Field(5, ge=1, description="failures in a row blamed on a pod that open its breaker")
    success_threshold: int = Field(2, ge=1, description="successes in a row that close a half-open breaker")
    open_s: float = Field(30.0, gt=0, description="how long an open breaker keeps its pod out before half-opening")


class RetrySpec(_Spec):
    """Retries of a failed attempt on another pair (core/retry.py). Defaults: sgl-router's
    RetryConfig (sgl-router/src/config/types.rs: max_retries 5, which counts attempts, the first
    included, since its disable_retries sets it to 1; initial_backoff_ms 50, backoff_multiplier
    1.5, max_backoff_ms 30000, jitter_factor 0.2: delay = min(50 ms x 1.5^k, 30 s) x (1 + U[-0.2,
    0.2]) before retry k + 1)."""

    max_attempts: int = Field(5, ge=1, description="attempts per request, the first included (1: no retry)")
    initial_backoff_s: float = Field(0.05, ge=0)
    backoff_multiplier: float = Field(1.5, ge=1.0)
    max_backoff_s: float = Field(30.0, ge=0)
    jitter: float = Field(0.2, ge=0, lt=1)
    # Envoy's per_try_timeout (route.v3.RetryPolicy), measured to the first token: an attempt
    # without its first token this long after it was routed is given up (a timeout of its stage)
    # and retried, if a retry can still start before the request's first-token limit; the last
    # attempt runs to that limit. None: only attempts that fail (outcome error) are retried, as in
    # sgl-router, which has no per-try timeout. No default can be derived for a cluster: a healthy
    # attempt's time to first token is the floor, the first-token limit over max_attempts the
    # ceiling (docs/router-options.md "Retries" shows the sensitivity).
    attempt_ttft_s: float | None = Field(None, gt=0)
    # Envoy's previous_hosts retry predicate, with the pod as the unit (the project's blame rule):
    # a retry avoids the pods its earlier attempts' failures were blamed on, unless that leaves no
    # candidate.
    avoid_blamed: bool = True

    @model_validator(mode="after")
    def _backoff_order(self) -> "RetrySpec":
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(f"max_backoff_s {self.max_backoff_s} is below initial_backoff_s {self.initial_backoff_s}")
        return self


class RouterSpec(_Spec):
    slow_loop_s: float = Field(1.0, gt=0, description="T_slow: period of the risk-price update")
    history_window_s: float = Field(30.0, gt=0, description="window of the timeout and failure rates")
    history_bucket_s: float = Field(1.0, gt=0)
    # Admission limit: requests in flight (routed, not yet ended) past which a new one is refused
    # at once, outcome `rejected` (the ingress answers 429), as sgl-router's --max-concurrent-requests
    # and vllm-router's rate limits do. None: no limit (theirs are off by default too). The engines'
    # batch capacity (prefill_slots x prefill workers + decode_max_batch x decode workers) is the
    # natural value: what lies beyond it only queues (docs/performance.md "Overload and the
    # admission limit").
    max_in_flight: int | None = Field(None, ge=1)
    # Off by default, as in sgl-router and vllm-router: `circuit_breaker: {}` turns it on with
    # sgl-router's defaults.
    circuit_breaker: CircuitBreakerSpec | None = None
    # Off by default so that no earlier result moves (sgl-router retries by default): `retry: {}`
    # turns it on with sgl-router's defaults, retrying failed attempts only (no per-try timeout).
    retry: RetrySpec | None = None


class TestbedSpec(_Spec):
    """What only the real cluster has. Its shape is the spec's ``topology`` (one vLLM
    engine per worker, prefill or decode as the topology places them), its batch limits
    the ``engine`` block's (``prefill_slots``, ``decode_max_batch``, ``prefill_batch_tokens``).

    On a machine without a GPU each pod is a network namespace holding a Ray node
    (``mode: netns``, needs root) or all pods share one local Ray node (``local``);
    ``auto`` picks netns when it can.
    """

    mode: EmulatedMode = "auto"
    # None: build (once, cached) the tiny random-weight model; else a local model directory.
    model: str | None = None
    max_model_len: int = Field(4096, ge=256)
    # 256 MiB of KV per engine: four engines fit the 12 GiB of NUMA node 0 on the CI machine.
    kv_cache_bytes: int = Field(256 * 2**20, ge=16 * 2**20)
    engine_start_timeout_s: float = Field(600.0, gt=0)
    subnet: str = "10.77.0.0/24"
    # The only interfaces a fault agent may shape (the pods' links); any other is refused.
    fault_interfaces: list[str] = Field(default_factory=lambda: ["eth0"], min_length=1)
    # Every fault's time to live is its duration plus this margin; the node's agent
    # removes it then by itself, even if the driver that set it is gone.
    fault_ttl_margin_s: float = Field(10.0, gt=0)
    # How the KV moves between pods (testbed/engines/engine.py):
    # * tcp: over the interface the link faults shape, fault_interfaces[0] (UCX_TLS=tcp,
    #   UCX_NET_DEVICES set to it); the KV buffer is in host memory, also on GPUs, since UCX
    #   needs a CUDA transport to read GPU memory and tcp with a CUDA buffer is refused by NIXL;
    # * rdma: UCX's fast path (its own transport choice, a GPU KV buffer on GPUs). The NIC then
    #   bypasses the kernel's qdiscs and /proc/net/dev, so tc-based link faults would act on
    #   nothing: a spec with a link fault is refused in this mode, unless rdma_link_faults says so.
    transport: Literal["tcp", "rdma"] = "tcp"
    # A link fault with transport rdma (docs/cluster.md "RDMA: what could fault it"): "refuse" (the
    # default: the path below has never run on an RDMA NIC, none being at hand), or "dcb_maxrate",
    # the NIC's own egress rate limit of the KV's traffic class (testbed/faults/dcb.py): uplink
    # faults only, since it limits egress, and only kv_only ones, since it limits the KV's class.
    rdma_link_faults: Literal["refuse", "dcb_maxrate"] = "refuse"
    # The KV's class for dcb_maxrate: the DSCP its RoCE packets carry (26: UCX's own RoCEv2 default,
    # its traffic class 106 >> 2) and the NIC's traffic class (0-7) it is mapped to, which is the
    # user's to set on each node (dcb app / dcb ets); 3: DSCP 24-31 -> priority 3 -> class 3, the
    # grouping NICs commonly start from (Intel's E810 RDMA guide lists it).
    kv_dscp: int = Field(26, ge=0, le=63)
    kv_traffic_class: int = Field(3, ge=0, le=7)
    # GPUs per vLLM engine (Ray's num_gpus on the engine actor); 0: vLLM's CPU build. At most 1
    # (_one_device): an engine here runs on one device (the uni executor, no tensor parallelism:
    # vLLM's config/parallel.py takes world size 1), so a second GPU would sit idle without a word.
    gpus_per_engine: int = Field(0, ge=0)
    # Whether vLLM runs the model eagerly: no torch.compile, no CUDA graphs. None: by the device
    # (testbed/engines/engine.py EngineConfig.eager):
    # * GPU engines (gpus_per_engine 1): False, vLLM 0.32's own default (vllm/config/model.py
    #   ModelConfig.enforce_eager = False: "CUDA graph and eager execution in hybrid for maximal
    #   performance"), torch.compile and CUDA graphs, as a GPU deployment serves. The price: every
    #   engine start compiles and captures the graphs, so an engine.engine_start_s (restarts) must
    #   be measured with the same setting.
    # * CPU engines (0): True. vLLM's CPU platform has no CUDA graphs (vllm/platforms/cpu.py
    #   check_and_update_config empties cudagraph_capture_sizes) and does not read enforce_eager;
    #   without it vLLM compiles the model with inductor (DYNAMO_TRACE_ONCE), and an engine started
    #   in 40-90 s against 25-30 s eager (docs/verified.md "Engine settings"), the setting every
    #   measurement of the CPU testbed was made with.
    # A bool sets it for either (e.g. to measure what the graphs change).
    enforce_eager: bool | None = None
    # Prometheus metrics of the run while it runs (testbed/router/exporter.py), served by the
    # router actor on the head node at http://metrics_host:metrics_port/metrics; 0: none. 9464 is
    # the port OpenTelemetry's Prometheus exporter uses by default; localhost unless opened up.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535)
    # The OpenAI-compatible ingress of `testbed run --serve` (testbed/router/ingress.py), on the
    # head node; 8000 is vLLM's own server's default port. Localhost unless opened up.
    ingress_host: str = "127.0.0.1"
    ingress_port: int = Field(8000, ge=1, le=65535)
    # How often the router asks every engine whether it is down (vLLM's health check through the
    # engine's actor: testbed/router/flow.py Liveness); a call that raised asks its engine at
    # once. 10 s: Kubernetes' livenessProbe periodSeconds default.
    engine_check_s: float = Field(10.0, gt=0)
    # Requests per run whose tokens are checked against a single-engine greedy reference computed
    # before the run (core/canary.py): a divergence that is not a near-tie ends the request as
    # "corrupt". Spread evenly over the run; each costs one decode of its output before the run
    # (they are decoded together). 4: a run of the shipped scenario has one in each quarter.
    canaries: int = Field(4, ge=0)
    # The first tokens of a canary's output that are checked. Each attends to the whole prompt's KV,
    # so KV that is not the prompt's shows from the first token on; 16 (the start-up PD probe's
    # length) bounds a reference to about half a second of decoding on the CPU engines.
    canary_tokens: int = Field(16, ge=1)
    # With executor "mp": how often an idle vLLM engine core and its worker re-check the
    # shared-memory queue between them, in ms: the most a lost wake-up of that queue costs
    # (testbed/engines/shm_wakeups.py).
    # None: vLLM's own, 5000 ms (shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS). Kept by default:
    # every run records its engines' missed wake-ups, and the twin scenario's runs at vLLM's
    # interval had none (docs/history/reliability-2026-11-27.md "A lead, tested and ruled out here: lost wake-ups"), so
    # nothing calls for changing the engine. 10 ms would be about one decode step of the CPU engines
    # (engine.decode_step_base_s, 9.1 ms calibrated), at 3 ms of CPU a second per idle reader
    # (measured on vLLM's queue here: 0 at 5000 ms, 15 ms at 1 ms).
    shm_recheck_ms: int | None = Field(None, ge=1)
    # Where each engine runs its model. "uni": in the engine core's process, which is what vLLM
    # does for an engine of one GPU (config/parallel.py: world size 1 -> the uni executor), so
    # the CPU engines have a GPU engine's processes. "mp": vLLM's CPU build's own choice, a worker
    # process that reads the engine core's calls from a shared-memory queue and busy-waits on it;
    # while a pull hangs the engine core steps every millisecond and that worker never stops
    # spinning, a cost a GPU node does not pay. Measured on this host: a prefill engine holding
    # KV for a pull that does not come used 1.58 cores with "mp" and 0.58 with "uni"
    # (docs/reliability.md "The worker process, removed"). Engine parallelism is one device.
    executor: Executor = "uni"
    # After a failed KV read, a decode engine handshakes with that prefill engine again (a fresh
    # UCX endpoint: testbed/engines/vllm_hooks.py install_rehandshake). vLLM 0.32 keeps the failed
    # endpoint, and every later read to that peer fails until the engines restart (docs/testbed.md
    # "The outage after the outage"). False: vLLM 0.32's behaviour, for measuring it.
    nixl_rehandshake: bool = True

    @field_validator("gpus_per_engine")
    @classmethod
    def _one_device(cls, v: int) -> int:
        # le=1 would say only "less than or equal to 1"; the user needs the reason
        if v > 1:
            raise ValueError(f"at most 1 GPU per engine, got {v}: an engine runs on one device (vLLM's uni "
                             "executor, no tensor parallelism), so the other GPUs would sit idle; use 1 and more "
                             "engines (topology.workers_per_pod)")
        return v


class PolicyEntry(_Spec):
    name: str
    weights: Weights | None = None  # overrides the spec-wide weights for this policy

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return check_policy_name(v)


class ExperimentSpec(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    topology: TopologySpec = TopologySpec()
    engine: EngineSpec = EngineSpec()
    workload: WorkloadSpec
    faults: list[FaultSpec] = Field(default_factory=list)
    health: HealthSpec = HealthSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    router: RouterSpec = RouterSpec()
    weights: Weights = Weights()
    policies: list[PolicyEntry] = Field(min_length=1)
    # The two limits clients and gateways put on a streaming request:
    # * the whole request: the OpenAI and Anthropic Python SDKs' default timeout is 600 s
    #   (httpx.Timeout(600.0, connect=5.0)); a request still running then is abandoned;
    # * time to first token: a streaming response sends nothing before its first token, and
    #   nginx's proxy_read_timeout (60 s between two reads from the upstream) and AWS ALB's idle
    #   timeout (60 s) close a connection that has been silent that long. None: no such limit.
    deadline_s: float = Field(600.0, gt=0)
    ttft_timeout_s: float | None = Field(60.0, gt=0)
    metrics: MetricsSpec = MetricsSpec()
    testbed: TestbedSpec = TestbedSpec()
    # The study's grid (core/spec/study.py; cells: study/grid.py): `testbed study` runs it; `sim` and `run` ignore it.
    study: StudySpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _trace_context(cls, data: Any) -> Any:
        # A trace's too_long rule without its own limit uses the testbed engines' context
        # (testbed.max_model_len): what vLLM would refuse there. Not filled without the rule,
        # so a simulated trace keeps every request unless the spec asks otherwise.
        if isinstance(data, dict):
            arrival = (data.get("workload") or {}).get("arrival") if isinstance(data.get("workload"), dict) else None
            if isinstance(arrival, dict) and arrival.get("kind") == "trace" and "too_long" in arrival \
                    and arrival.get("max_context_tokens") is None:
                t = data.get("testbed") or {}
                limit = t.get("max_model_len", TestbedSpec.model_fields["max_model_len"].default) \
                    if isinstance(t, dict) else TestbedSpec.model_fields["max_model_len"].default
                data = {**data, "workload": {**data["workload"], "arrival": {**arrival, "max_context_tokens": limit}}}
        return data

    @field_validator("policies", mode="before")
    @classmethod
    def _names_as_entries(cls, v: Any) -> Any:
        # `policies: [LC, OTF-R]` is the common case; a mapping adds per-policy weights.
        return [{"name": p} if isinstance(p, str) else p for p in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _pods_exist(self) -> "ExperimentSpec":
        t = self.topology
        if t.placement == "within_pod" and t.workers_per_pod < 2:
            raise ValueError("topology: placement within_pod needs workers_per_pod >= 2 (a prefill and a decode worker)")
        for i, f in enumerate(self.faults):
            bad = [p for p in f.pods if not 0 <= p < self.topology.pods]
            if bad:
                raise ValueError(f"faults[{i}] targets pod {bad[0]}, but the topology has pods 0..{self.topology.pods - 1}")
        if t.placement == "by_pod":  # whole pods are prefill or decode pods (core/topology.py)
            k = int(round(t.pods * t.prefill_fraction))
            for i, f in enumerate(self.faults):
                for p in (f.pods if f.kind == FAULT_ENGINE and f.role != ROLE_BOTH else []):
                    if (p < k) != (f.role == ROLE_PREFILL):
                        raise ValueError(f"faults[{i}] kills the {f.role} engines of pod {p}, which has none "
                                         f"(placement by_pod: pods 0..{k - 1} prefill, the rest decode)")
        restarts = [i for i, f in enumerate(self.faults) if f.kind == FAULT_ENGINE and f.restart_s is not None]
        if restarts and self.engine.engine_start_s is None:
            raise ValueError(f"faults[{restarts[0]}] restarts engines: set engine.engine_start_s (how long an engine "
                             "takes to start, measured: docs/reliability.md \"Engine death in both worlds\")")
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policies lists a name twice: {names}")
        links = [i for i, f in enumerate(self.faults) if f.kind == FAULT_LINK]
        if self.testbed.transport == "rdma" and links:
            if self.testbed.rdma_link_faults == "refuse":
                raise ValueError(f"faults[{links[0]}]: a link fault shapes with tc, which RDMA bypasses (the NIC reads "
                                 "and writes memory without the kernel's qdiscs); use testbed.transport: tcp")
            for i in links:
                self._dcb_fault(i, self.faults[i])
        return self

    @staticmethod
    def _dcb_fault(i: int, f: LinkFault) -> None:
        """A link fault as the NIC's rate limit of the KV's class (testbed.rdma_link_faults: dcb_maxrate)."""
        if f.downlink:
            raise ValueError(f"faults[{i}]: dcb_maxrate limits a NIC's egress only, and direction {f.direction} limits "
                             "traffic entering the pod (sent by its peers' NICs); use direction: uplink")
        if f.residual_bw == 0:
            raise ValueError(f"faults[{i}]: a link down (residual_bw 0) cannot be a dcb maxrate, where 0 means no "
                             "limit; use a residual_bw above 0")
        if f.delay_ms > 0 or f.loss > 0:
            raise ValueError(f"faults[{i}]: delay_ms and loss need netem, a qdisc RDMA bypasses; drop them with "
                             "rdma_link_faults dcb_maxrate")
        if not f.kv_only:
            raise ValueError(f"faults[{i}]: with rdma_link_faults dcb_maxrate a link fault limits the KV's traffic "
                             "class alone, not the whole link; set kv_only: true")

    @property
    def first_token_limit_s(self) -> float:
        """How long after its arrival a request may go without a first token (core/limits.py)."""
        return first_token_limit(self.deadline_s, self.ttft_timeout_s)

    def weights_for(self, policy: str) -> Weights:
        for p in self.policies:
            if p.name == policy and p.weights is not None:
                return p.weights
        return self.weights


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the file and field."""


def _one_line(e: ValidationError, source: str) -> str:
    loc, msg, value, more = first_error(e)
    kind = e.errors()[0]["type"]
    where = f" at {loc}" if loc else ""
    got = f" (got {value!r})" if kind not in ("missing", "value_error") and not isinstance(value, dict) else ""
    return f"{source}: invalid spec{where}: {msg.removeprefix('Value error, ')}{got}{more}".replace("\n", " ")


def parse_spec(data: Any, source: str = "<spec>") -> ExperimentSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a spec must be a YAML mapping, got {type(data).__name__}")
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_one_line(e, source)) from None


def _read_yaml(path: str | Path | None, embedded: str | None) -> tuple[Any, str, Path | None]:
    """(data, source, folder) of a spec file, or of the embedded spec ``embedded`` (core/defaults/)."""
    if path is None:
        try:
            text = resources.files("core.defaults").joinpath(str(embedded)).read_text()
        except (FileNotFoundError, IsADirectoryError):
            known = sorted(f.name for f in resources.files("core.defaults").iterdir()
                           if f.name.endswith(".yaml") and f.name != "fits.yaml")
            raise SpecError(f"no embedded spec {embedded!r} (known: {', '.join(known)})") from None
        source, folder = f"embedded spec {embedded}", None
    else:
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"{p}: spec file not found")
        text, source, folder = p.read_text(), str(p), p.resolve().parent
    try:
        return yaml.safe_load(text), source, folder
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{source}: not valid YAML{at}: {getattr(e, 'problem', e)}") from None


def merge_specs(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: mappings merged key by key, all else (lists included) replaced; a
    mapping of another ``kind`` (a fixed output where the base draws it uniformly) replaces the base's."""
    out = dict(base)
    for k, v in over.items():
        b = out.get(k)
        same_kind = isinstance(b, dict) and isinstance(v, dict) and v.get("kind", b.get("kind")) == b.get("kind")
        out[k] = merge_specs(b, v) if same_kind else v
    return out


def resolve_extends(data: Any, source: str, folder: Path | None, seen: tuple[str, ...] = ()) -> Any:
    """A spec's ``extends:`` resolved: the base it names, itself resolved, with the spec laid on it
    (:func:`merge_specs`). ``extends: testbed.yaml`` (a bare name) is an embedded spec of
    core/defaults/; a path (with a ``/``) is a file relative to the spec's folder. So shipped specs
    take the testbed's measured physics from one place (core/defaults/testbed.yaml)."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base = data["extends"]
    if not isinstance(base, str) or not base:
        raise SpecError(f"{source}: extends must name a spec (an embedded one such as testbed.yaml, or a path), "
                        f"got {base!r}")
    if "/" in base:
        path = (folder / base) if folder is not None and not Path(base).is_absolute() else Path(base)
        key = str(path.resolve())
        raw, src, fold = _read_yaml(path, None)
    else:
        key = f"embedded:{base}"
        raw, src, fold = _read_yaml(None, base)
    if key in seen:
        raise SpecError(f"{source}: extends {base} makes a circle ({' -> '.join([*seen, key])})")
    if not isinstance(raw, dict):
        raise SpecError(f"{src}: a spec must be a YAML mapping, got {type(raw).__name__}")
    resolved = resolve_extends(raw, src, fold, (*seen, key))
    return merge_specs(resolved, {k: v for k, v in data.items() if k != "extends"})


def load_spec(path: str | Path | None = None, default: str = "default.yaml") -> ExperimentSpec:
    """Load and validate a spec file (its ``extends:`` resolved); ``None`` loads the embedded
    ``default``."""
    data, source, folder = _read_yaml(path, default if path is None else None)
    data = resolve_extends(data, source, folder, ())
    arrival = (data.get("workload") or {}).get("arrival") if isinstance(data, dict) else None
    if folder is not None and isinstance(arrival, dict) and arrival.get("kind") == "trace" \
            and isinstance(arrival.get("path"), str) and not Path(arrival["path"]).expanduser().is_absolute():
        # A trace named relative to its spec is that file wherever the command runs: the simulator, the
        # testbed's driver (which runs elsewhere) and a study's cells all read the same one.
        data = {**data, "workload": {**data["workload"], "arrival": {**arrival, "path": str(folder / arrival["path"])}}}
    return parse_spec(data, source)
