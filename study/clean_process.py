"""A long-lived child interpreter that runs functions for a Ray worker, free of Ray's state.

Why: the simulator runs 15-20% slower in a process where Ray is initialised than in a fresh one,
for the same cell (benchmarks/bench_study_cell.py: inside a Ray task, in a driver after
``ray.init`` and in a process forked from either alike; cause not found: not GC, tracing, threads
or allocation counts). A study task therefore hands its cell to a child it started with a fresh
interpreter (``python -m study.clean_process``), once per Ray worker process, and reuses it.

The child dies with its parent (``PR_SET_PDEATHSIG`` on Linux: a Ray worker ended with its study
takes it along) and on end of input. It is told to die by SIGTERM, which it turns into
``SystemExit`` so that what it was running unwinds (``with`` and ``finally`` blocks: a cell removes
its scratch directory); :meth:`CleanProcess.stop` asks so, :meth:`CleanProcess.kill` does not ask.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection, Pipe
from typing import Any, Callable

__all__ = ["CleanProcess", "shared"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class CleanProcess:
    """``call(fn, *args)`` runs ``fn(*args)`` in the child and returns its result (or raises its
    exception). ``fn`` must be importable by name (a module-level function)."""

    def __init__(self) -> None:
        parent, child = Pipe()
        self._conn = parent
        self.proc = subprocess.Popen([sys.executable, "-m", "study.clean_process", str(child.fileno())],
                                     pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._conn.send((fn, args))
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the child process ended (exit status {self.proc.wait()})") from None
        if ok:
            return value
        raise value

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (the child unwinds what it runs), SIGKILL if it has not ended ``grace_s`` later."""
        self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._conn.close()


_shared: CleanProcess | None = None


def shared() -> CleanProcess:
    """This process's child (started on first use, replaced if it died)."""
    global _shared
    if _shared is None or not _shared.alive():
        _shared = CleanProcess()
    return _shared


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the end of input still ends the child
        pass


def _serve(fd: int) -> None:
    _die_with_parent()
    if os.getppid() == 1:  # the parent died before the line above took effect
        return
    conn = Connection(fd)
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = (True, fn(*args))
        except Exception as e:  # handed to the caller, which raises it
            reply = (False, e)
        conn.send(reply)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
