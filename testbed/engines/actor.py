"""The engine's Ray actor: a thin adapter around one :class:`testbed.engines.engine.Engine`.

The driver (testbed/runs/driver.py) places one per topology worker on its pod's node (the pod's
node resource); the router actor (testbed/router/actor.py) calls it. It is an async actor, so
an abort reaches an engine while its decode call is still awaiting, and nothing blocks the event
loop. Every call's exception reaches the caller as :class:`EngineError` (``_plain_errors``).
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
from pathlib import Path
from typing import Any

import ray

from core.util.logs import configure_from_env
from testbed.engines.engine import Engine, EngineConfig, EngineError
from testbed.engines.tiny_model import ensure_tiny_model
from testbed.machine.procs import descendants as descendants_of


def _plain_errors(method: Any) -> Any:
    """An engine actor's method whose exceptions reach the caller as EngineError (engine.py):
    never a vLLM exception type, which the router would have to import vLLM to unpickle."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(*a: Any, **kw: Any) -> Any:
            try:
                async for item in method(*a, **kw):
                    yield item
            except EngineError:
                raise
            except Exception as e:
                raise EngineError.of(e) from None
        return stream

    @functools.wraps(method)
    async def call(*a: Any, **kw: Any) -> Any:
        try:
            return await method(*a, **kw)
        except EngineError:
            raise
        except Exception as e:
            raise EngineError.of(e) from None
    return call


def remove_engine_dir(engine_dir: Path, levels: int = 2) -> None:
    """Remove an engine's folder, then up to ``levels`` parents that it left empty (its generation's
    folder and the command's engine root; a parent still holding another engine's folder stays)."""
    shutil.rmtree(engine_dir, ignore_errors=True)
    for parent in list(engine_dir.parents)[:levels]:
        try:
            parent.rmdir()
        except OSError:  # not empty (another engine of the node), or already gone
            break


@ray.remote(num_cpus=0)
class EngineActor:
    """One engine as a Ray actor; the driver pins it to its pod through the pod's node resource."""

    def __init__(self, config: dict[str, Any], net_device: str | list[str] | None, build_model: bool = False) -> None:
        from ray.util import get_node_ip_address

        configure_from_env()  # the driver's level (core/util/logs.py)

        if build_model:
            ensure_tiny_model(config["model"], config.get("dtype"))

        if isinstance(net_device, list):  # an allowlist: the first interface this node has
            from testbed.machine.interfaces import pick_interface

            net_device = pick_interface(net_device, where=f"engine {config['name']}'s node")
        # The pod's own address: NIXL's side channel and UCX must use the pod's link.
        self.engine = Engine(EngineConfig(**config, host_ip=get_node_ip_address(), net_device=net_device))

    async def start(self) -> dict[str, Any]:
        seconds = await self.engine.start()
        from testbed.engines.hoststats import HostSampler
        from testbed.machine.procs import descendants
        from testbed.engines.shm_wakeups import LostSeconds

        # the engine's CPU and run-queue wait, and its node's CPU pressure (hoststats.py): the
        # actor (vLLM's front end) and its engine core and workers
        me = os.getpid()
        self.host = HostSampler(lambda: [me, *descendants(me)], self.engine.config.host_sample_s,
                                lost_wakeup_s=LostSeconds(self.engine.config.wakeup_log_path))
        return {"name": self.engine.config.name, "host_ip": self.engine.config.host_ip, "startup_s": seconds,
                "block_tokens": self.engine.block_tokens()}

    async def describe(self) -> dict[str, Any]:
        """Who a started engine is, for a command that finds it kept by an earlier one
        (testbed/engines/kept.py): what :meth:`start` returned, without starting it."""
        return {"name": self.engine.config.name, "host_ip": self.engine.config.host_ip, "startup_s": 0.0,
                "block_tokens": self.engine.block_tokens()}

    async def restart(self) -> dict[str, Any]:
        """A new engine core in place of a dead one (an engine fault's restart_s, as a supervisor
        restarts a crashed process): the dead one's client shut down, the same configuration
        started again in this actor, so its handle and node stay. Returns its start-up seconds."""
        import asyncio

        try:  # the dead core's client: vLLM's monitor began shutting it down already
            await asyncio.wait_for(self.engine.shutdown(), 30)
        except Exception:
            pass
        self.engine = Engine(self.engine.config)
        return {"name": self.engine.config.name, "startup_s": await self.engine.start()}

    async def host_samples(self, since_wall: float = 0.0) -> list[tuple[float, ...]]:
        """This engine's host samples (hoststats.HostSample) taken at or after ``since_wall``."""
        host = getattr(self, "host", None)
        return [tuple(s) for s in host.samples(since_wall)] if host is not None else []

    @_plain_errors
    async def prefill(self, request_id: str, prompt_token_ids: list[int]) -> Any:
        return await self.engine.prefill(request_id, prompt_token_ids)

    @_plain_errors
    async def decode(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                     kv_transfer_params: Any = None, logprobs: int | None = None) -> Any:
        return await self.engine.decode(request_id, prompt_token_ids, max_tokens, kv_transfer_params, logprobs=logprobs)

    @_plain_errors
    async def decode_stream(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                            kv_transfer_params: Any = None, sampling: dict[str, Any] | None = None) -> Any:
        """Call with ``.options(num_returns="streaming")``: Ray relays each chunk as it comes."""
        async for item in self.engine.decode_stream(request_id, prompt_token_ids, max_tokens, kv_transfer_params,
                                                    sampling=sampling):
            yield item

    @_plain_errors
    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    @_plain_errors
    async def health(self) -> dict[str, Any]:
        return await self.engine.health()

    @_plain_errors
    async def load(self) -> dict[str, Any]:
        return await self.engine.load()

    @_plain_errors
    async def stages(self, request_id: str) -> dict[str, float]:
        return await self.engine.stages(request_id)

    @_plain_errors
    async def pull_end(self, request_id: str, forget: bool = False) -> dict[str, float]:
        return await self.engine.pull_end(request_id, forget)

    async def compute_pids(self) -> list[int]:
        """The engine's worker processes (vLLM's engine core and its children): what a
        compute fault slows. The actor's own process (the API front end) is left alone."""
        from testbed.machine.procs import descendants

        return descendants(os.getpid())

    async def process(self, which: str) -> int:
        """The pid an engine fault kills (faults.spec.EngineFault.process): ``actor``, this actor's
        own process (vLLM's front end); ``core``, vLLM's engine core, the child the front end spawned
        (found by its parent, not its title: twice a serving core kept multiprocessing's
        ``spawn_main`` command line; multiprocessing's resource tracker is the other child)."""
        from testbed.machine.procs import cmdline, ppid

        me = os.getpid()
        if which == "actor":
            return me
        if which != "core":
            raise ValueError(f"unknown engine process {which!r} (known: actor, core)")
        for pid in descendants_of(me):
            cmd = cmdline(pid) if ppid(pid) == me else ""
            if "resource_tracker" not in cmd and ("EngineCore" in cmd or "spawn_main" in cmd):
                return pid
        raise RuntimeError(f"engine {self.engine.config.name}: no engine core process under pid {me}")

    @_plain_errors
    async def metrics(self) -> dict[str, Any]:
        return await self.engine.metrics()

    async def gpu_uuid(self) -> str | None:
        """NVML UUID of the GPU this engine uses (None on the CPU): what a GPU fault locks."""
        return self.engine.gpu_uuid()

    @_plain_errors
    async def reset_prefix_cache(self) -> bool:
        """Between runs: a later policy must not find the earlier one's prompts cached."""
        return await self.engine.reset_prefix_cache()

    async def shutdown(self) -> None:
        """The engine's end for good: it stops, and its folder on this node goes with it (its
        TMPDIR, IPC sockets and logs), then the folders above it that it leaves empty (the
        command's engine root, made on this node by its engines), so that a cluster's nodes keep
        nothing of a command but the caches the docs name (testbed/machine/cache_dirs.py)."""
        await self.engine.shutdown()
        remove_engine_dir(self.engine.config.engine_dir)
