"""One vLLM engine (testbed/engines/engine.py) in a process of its own, driven through pipes,
without Ray: the engine tests' two engines (tests/test_runtime_engine.py) and the GPU check's
engine pair (benchmarks/gpu_check.py)."""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

from testbed.engines.engine import EngineConfig


def _serve(cmd_r, res_w, cfg: EngineConfig) -> None:
    """Child process: one Engine, answering (call id, method, kwargs) messages."""
    os.setsid()  # own process group: the test can kill the engine's whole tree
    asyncio.run(_serve_async(cmd_r, res_w, cfg))


async def _serve_async(cmd_r, res_w, cfg: EngineConfig) -> None:
    from testbed.engines.engine import Engine

    engine = Engine(cfg)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()

    async def handle(cid, method, kwargs):
        try:
            res = getattr(engine, method)(**kwargs)
            res_w.send((cid, True, await res if inspect.isawaitable(res) else res))
        except Exception as exc:  # reported to the test, which raises it
            res_w.send((cid, False, f"{type(exc).__name__}: {exc}"))

    while True:
        cid, method, kwargs = await loop.run_in_executor(None, cmd_r.recv)
        task = asyncio.create_task(handle(cid, method, kwargs))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if method == "shutdown":
            await task
            return


class EngineProcess:
    """A handle on one engine in a process of its own (two one-way pipes, calls may overlap):
    ``call(method, **kwargs)`` runs an :class:`~testbed.engines.engine.Engine` method there."""

    def __init__(self, cfg: EngineConfig) -> None:
        ctx = mp.get_context("spawn")
        cmd_r, self._cmd_w = ctx.Pipe(duplex=False)
        self._res_r, res_w = ctx.Pipe(duplex=False)
        # not daemonic: vLLM's engine spawns children of its own
        self.proc = ctx.Process(target=_serve, args=(cmd_r, res_w, cfg), daemon=False)
        self.proc.start()
        self._next = 0
        self._done: dict[int, tuple[bool, object]] = {}

    def submit(self, method: str, **kwargs) -> int:
        self._next += 1
        self._cmd_w.send((self._next, method, kwargs))
        return self._next

    def result(self, cid: int, timeout: float = 240.0):
        end = time.monotonic() + timeout
        while cid not in self._done:
            left = end - time.monotonic()
            if left <= 0 or not self._res_r.poll(left):
                raise TimeoutError(f"engine process {self.proc.pid}: no reply to call {cid} "
                                   f"in {timeout} s")
            c, ok, value = self._res_r.recv()
            self._done[c] = (ok, value)
        ok, value = self._done.pop(cid)
        if not ok:
            raise RuntimeError(value)
        return value

    def call(self, method: str, timeout: float = 240.0, **kwargs):
        return self.result(self.submit(method, **kwargs), timeout)

    def tree(self) -> list[int]:
        """PIDs in the engine's process group (front end, EngineCore, worker)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == self.proc.pid:
                        pids.append(int(entry))
                except ProcessLookupError:
                    pass
        return pids

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.tree():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += int(status.split("VmRSS:")[1].split()[0]) * 1024
        return total

    def cpu_seconds(self) -> float:
        ticks = 0
        for pid in self.tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def close_all(remotes: list["EngineProcess"]) -> None:
        """Shut the engines down together (each takes seconds), then kill what is left of each group."""
        asked = []
        for r in remotes:
            try:
                if r.proc.is_alive():
                    asked.append((r, r.submit("shutdown")))
            except Exception as exc:  # still kill the group below
                print(f"engine {r.proc.pid} shutdown failed: {exc}", file=sys.stderr)
        for r, cid in asked:
            try:
                r.result(cid, timeout=45)
            except Exception as exc:
                print(f"engine {r.proc.pid} shutdown failed: {exc}", file=sys.stderr)
        for r in remotes:
            r.proc.join(10)
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.proc.join(5)
