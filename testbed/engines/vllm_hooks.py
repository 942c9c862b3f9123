"""vLLM's in-process hooks: the module vLLM imports by path in each engine process.

An engine (testbed/engines/engine.py, `Engine.engine_args`) starts vLLM with
`KVTransferConfig(kv_connector="NixlConnector",
kv_connector_module_path="testbed.engines.vllm_hooks")`. vLLM then imports this
module in every engine process that resolves the connector (the front end, the
EngineCore, the worker) and takes `NixlConnector` from it as a plain attribute:
vLLM's own `NixlConnector` with a stage log and the CPUs given back (below).
Importing the module is the hook: at import it installs the NIXL progress delay
and the record of missed shared-memory wake-ups (shm_wakeups.py) in the importing
process, before vLLM builds a connector there. Only vLLM's processes import it
(and tests), so it imports vLLM at its top; engine.py names it by path and never
imports it, so importing engine.py imports no vLLM.

NIXL's progress thread. NIXL's Python agent hard-codes `pthrDelay=0`, and the
UCX backend's shared progress thread then polls with a zero timeout: it spins
a core per engine (two engines on two cores starve each other). Neither NIXL
(no config key or env var reaches `pthrDelay`) nor vLLM (its connector builds
`nixl_agent_config(num_threads=..., capture_telemetry=True)` itself) exposes
the delay. The narrowest supported hook is vLLM's `kv_connector_module_path`:
importing this module installs a subclass of NIXL's agent that sets `pthrDelay`
(from `TESTBED_NIXL_PROGRESS_DELAY_US`) before vLLM's worker builds its agent.
With a delay the thread sleeps in `poll()` on the UCX workers' event fds and still
wakes at once on traffic; the delay only bounds the periodic re-poll.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector as VllmNixlConnector

from testbed.engines import shm_wakeups
from testbed.engines.engine import PROGRESS_DELAY_ENV, REHANDSHAKE_ENV
from testbed.engines.stagelog import STAGE_LOG_ENV, event_line

_DELAY_LOCK = threading.Lock()


# --------------------------------------------------------------------------- NIXL progress delay


def install_nixl_progress_delay(delay_us: int | None = None) -> bool:
    """Make vLLM's NIXL worker build its agent with a progress-thread delay.

    Runs in each engine process when vLLM imports this module. Returns False
    when NIXL is missing or the delay is 0 (then nothing changes).
    """
    if delay_us is None:
        delay_us = int(os.environ.get(PROGRESS_DELAY_ENV, "0") or 0)
    if delay_us <= 0:
        return False
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    base = base_worker.NixlWrapper
    if base is None:
        return False
    if getattr(base, "testbed_pthr_delay_us", None) == delay_us:
        return True
    base = getattr(base, "testbed_base", base)
    api = sys.modules[base.__module__]  # nixl_cu12._api (or cu13/rocm)
    if not hasattr(api, "nixlBind"):  # NIXL's internals moved: fail loudly, not spin
        raise RuntimeError(f"{api.__name__} has no 'nixlBind': the NIXL progress-delay hook "
                           "needs updating for this NIXL version (tested: 1.5.1)")

    class _BindWithDelay:
        """Stands in for NIXL's binding module while one agent is built."""

        def __init__(self, real: Any) -> None:
            self._real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

        def nixlAgent(self, agent_name: str, config: Any) -> Any:  # noqa: N802 (NIXL's name)
            config.pthrDelay = delay_us
            return self._real.nixlAgent(agent_name, config)

    class DelayedNixlAgent(base):  # type: ignore[misc, valid-type]
        testbed_pthr_delay_us = delay_us
        testbed_base = base

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # NIXL's __init__ sets pthrDelay = 0 and builds the agent in one go;
            # swap its binding module for the constructor call only.
            with _DELAY_LOCK:
                real = api.nixlBind
                api.nixlBind = _BindWithDelay(real)
                try:
                    super().__init__(*args, **kwargs)
                finally:
                    api.nixlBind = real

    base_worker.NixlWrapper = DelayedNixlAgent
    return True


# --------------------------------------------------------------------------- CPU affinity


def restore_affinity(cpus: set[int]) -> list[int]:
    """Give every thread of this process the CPUs ``cpus`` back where something narrowed them;
    returns the threads changed.

    vLLM's NIXL worker on the CPU pins the thread that builds it to "one last core in each
    NUMA node", to keep KV transfer off the cores the forward pass's OpenMP threads are bound to
    (``NixlConnectorWorker.__init__``: ``os.sched_setaffinity(0, rsv_cores_for_kv)``). With
    ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (EngineConfig.omp_threads_bind: several engines share a
    few cores) there are no such bound threads: the pinned thread is the worker's main thread,
    which runs the forward pass, and every thread it starts after (NIXL's and UCX's) inherits the
    pin. Measured on the 2-core testbed: all four engines' workers on CPU 1, their forward passes
    and busy-waits sharing it while CPU 0 had room (docs/reliability.md "One core for four workers")."""
    changed = []
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.sched_getaffinity(int(tid)) != cpus:
                os.sched_setaffinity(int(tid), cpus)
                changed.append(int(tid))
        except OSError:  # a thread that ended meanwhile
            continue
    return changed


# --------------------------------------------------------------------------- a peer's fresh endpoint


def install_rehandshake() -> bool:
    """After a failed read from a remote engine, handshake with it again (a fresh UCX endpoint).

    vLLM 0.32's pull worker releases a remote engine's NIXL state, so that its next read
    handshakes anew, only when NIXL lost that engine's metadata locally
    (`NixlBaseConnectorWorker._cleanup_remote_engines` asks `check_remote_metadata`). A UCX
    endpoint the peer dropped keeps its metadata: NIXL then fails every later read to that peer
    at once (NIXL_ERR_REMOTE_DISCONNECT), for good, though removing the peer and adding it again
    makes a working endpoint at once (docs/testbed.md "A link down without vLLM: NIXL and UCX
    alone"). This marks an engine with a failed transfer as vLLM marks one whose metadata is gone
    (`_mark_remote_engine_invalid`), once no read of it is in flight: vLLM's own path then releases
    it in the same cleanup and handshakes on the next read, with its own backoff against a peer
    that keeps failing (1 s doubling to 60 s). Not before its reads have drained: vLLM rejects every
    new read of an invalid peer until it is released, and a read on a slow link can last minutes.
    Idempotent; False if it was installed already."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker as Worker

    if getattr(Worker, "_testbed_rehandshake", False):
        return False
    cleanup = Worker._cleanup_remote_engines

    def _cleanup_remote_engines(self: Any) -> None:
        if self._TRANSFER_MODE == "pull":
            # vLLM clears its failed set at every cleanup: the failed peers are kept here until drained
            due = self.__dict__.setdefault("_testbed_rehandshake_due", set())
            due |= self._failed_remote_engines - self._invalid_remote_engines
            with self._handshake_lock:
                handshaking = bool(self._handshake_futures)
            if due and not handshaking:  # vLLM's own cleanup defers then too
                busy, now = self._engines_with_inflight_transfers(), time.perf_counter()
                for engine_id in list(due):
                    if engine_id not in self._remote_agents:
                        due.discard(engine_id)  # released already
                    elif engine_id not in busy:
                        self._mark_remote_engine_invalid(engine_id, now)
                        due.discard(engine_id)
        cleanup(self)

    Worker._cleanup_remote_engines = _cleanup_remote_engines
    Worker._testbed_rehandshake = True
    Worker._vllm_cleanup_remote_engines = cleanup  # vLLM's own, for comparing the two
    return True


# --------------------------------------------------------------------------- the connector vLLM loads


class NixlConnector(VllmNixlConnector):
    """vLLM's `NixlConnector` unchanged, plus the stage log (testbed/engines/stagelog.py) and,
    with ``nobind``, the CPUs vLLM's KV-transfer core reservation took, given back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cpus = os.sched_getaffinity(0)
        super().__init__(*args, **kwargs)
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
            restore_affinity(cpus)  # vLLM's KV-transfer core reservation, undone (see there)
        path = os.environ.get(STAGE_LOG_ENV)
        # Only the scheduler's instance (in the EngineCore process) sees these events.
        self._testbed_log = (open(path, "a", buffering=1)
                             if path and getattr(self, "connector_scheduler", None) is not None else None)

    def _testbed_event(self, request_id: str, event: str) -> None:
        if self._testbed_log is not None:
            self._testbed_log.write(event_line(time.monotonic(), event, request_id))

    def on_new_request(self, request: Any) -> None:
        super().on_new_request(request)
        self._testbed_event(request.request_id, "queued")

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        out = super().update_state_after_alloc(request, blocks, num_external_tokens)
        self._testbed_event(request.request_id, "alloc_remote" if num_external_tokens > 0 else "alloc")
        return out

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        # A failed pull is "finished" too (NIXL's worker puts it in both sets): told apart, so
        # that the request's failure stays in kv_transfer rather than looking decoded.
        failed = set(getattr(connector_output, "failed_recving", None) or ())
        finished = set(connector_output.finished_recving or ())
        for rid in finished | failed:
            self._testbed_event(rid, "recv_failed" if rid in failed else "recv_done")


# Importing this module is the hook (vLLM imports it in each engine process before it builds a
# connector there): the progress delay, and the record of missed wake-ups of the queue between
# the engine core and its worker (shm_wakeups.py). Both read the engine's environment and are
# idempotent.
install_nixl_progress_delay()
if os.environ.get(REHANDSHAKE_ENV, "1") != "0":
    install_rehandshake()
shm_wakeups.install()
