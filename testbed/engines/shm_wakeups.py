"""Missed wake-ups in vLLM's shared-memory queue between an engine core and its worker.

The engine core hands each step to its worker, and the worker hands back the
step's output, through vLLM's `shm_broadcast.MessageQueue`. A reader that has read
nothing for `busy_loop_s` (1 s) stops spinning and sleeps in a zmq poll until the
writer's notification (a PUB socket with a send high-water mark of 1, which drops a
message silently when its pipe looks full) or until `SHM_READER_RECHECK_INTERVAL_MS`
(5000 in vLLM 0.32) runs out. A notification that is lost leaves a written message
unread until that re-check: an engine with work in it sits idle for up to 5 s.

`install` (run in the engine core and the worker when vLLM imports the connector module,
testbed/engines/vllm_hooks.py) records each such event: a read that completed right
after an idle poll that returned with no notification (and none pending after it):
the message was there but nothing woke the reader. One line per event in the
engine's folder, read back by `read_missed_wakeups` and `LostSeconds`. It can also
set the re-check interval (testbed.shm_recheck_ms), which bounds what a lost
notification costs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.engines.logtail import new_lines

if TYPE_CHECKING:
    import pandas as pd

#: Where the engine's processes append their missed wake-ups (set by EngineConfig.environment).
LOG_ENV = "TESTBED_SHM_WAKEUP_LOG"
#: The idle reader's re-check interval in ms; empty or unset: vLLM's own.
RECHECK_ENV = "TESTBED_SHM_RECHECK_MS"


def install(log_path: str | None = None, recheck_ms: int | None = None) -> bool:
    """Record missed wake-ups of this process's shared-memory queue readers; set the re-check.

    Idempotent. Returns False where vLLM's queue has moved (nothing is changed then).
    """
    from vllm.distributed.device_communicators import shm_broadcast as shm

    cond = getattr(shm, "SpinCondition", None)
    if cond is None or not hasattr(shm, "SHM_READER_RECHECK_INTERVAL_MS"):
        return False
    if log_path is None:
        log_path = os.environ.get(LOG_ENV) or None
    if recheck_ms is None:
        recheck_ms = int(os.environ.get(RECHECK_ENV) or 0) or None
    if recheck_ms is not None:
        # Read by the queue at every wait (ReadTimeoutWithWarnings.timeout_ms).
        shm.SHM_READER_RECHECK_INTERVAL_MS = int(recheck_ms)
    if log_path is None or getattr(cond, "testbed_wakeup_log", None) is not None:
        return True

    wait, record_read = cond.wait, cond.record_read
    import multiprocessing

    # vLLM names its spawned processes (EngineCore_DP0, VllmWorker-0): which side read late
    who = f"{os.getpid()}\t{multiprocessing.current_process().name}"

    def logged_wait(self, timeout_ms: int | None = None) -> None:
        self.testbed_missed = None  # only the last wait before a read matters
        start = time.monotonic()
        if not (self.is_reader and start > self.last_read + self.busy_loop_s):
            wait(self, timeout_ms)  # busy: a yield, no notification involved
            return
        # Idle: vLLM's wait polls once. See what that poll returned (nothing: no notification,
        # no cancel), without changing what it does.
        poller, answers = self.poller, []
        real_poll = poller.poll

        def poll(timeout: int | None = None) -> list:
            events = real_poll(timeout)
            answers.append(events)
            return events

        poller.poll = poll
        try:
            wait(self, timeout_ms)
        finally:
            del poller.poll
        # A poll that ran out while a notification was on its way (a reader descheduled past
        # its timeout) finds it pending now: late, not lost.
        if answers and not answers[0] and not self.local_notify_socket.poll(0):
            self.testbed_missed = time.monotonic() - start

    def logged_record_read(self) -> None:
        waited = getattr(self, "testbed_missed", None)
        if waited is not None:  # a message was there after a poll that no notification ended
            self.testbed_missed = None
            with open(log_path, "a", buffering=1) as f:
                f.write(f"{time.time():.6f}\t{waited:.6f}\t{who}\n")
        record_read(self)

    cond.wait, cond.record_read = logged_wait, logged_record_read
    cond.testbed_wakeup_log = log_path
    return True


def read_missed_wakeups(path: Path) -> "pd.DataFrame":
    """The engine's missed wake-ups: `read_wall_s` (time.time(), as host samples: when the message
    was finally read), `waited_s` (the idle poll that ran out), the reading process's `pid` and
    its multiprocessing `process` name."""
    import pandas as pd  # the engine's processes need not import it

    cols = ["read_wall_s", "waited_s", "pid", "process"]
    try:
        return pd.read_csv(path, sep="\t", names=cols, dtype={"pid": "int64", "process": str})
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame({"read_wall_s": pd.Series(dtype=float), "waited_s": pd.Series(dtype=float),
                             "pid": pd.Series(dtype="int64"), "process": pd.Series(dtype=str)})


class LostSeconds:
    """The engine's seconds lost to missed wake-ups so far, read from its log as it grows (the
    host sampler's cumulative counter: hoststats.py)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._pos = 0
        self.total_s = 0.0
        self.count = 0

    def __call__(self) -> float:
        lines, self._pos = new_lines(self.path, self._pos)
        for line in lines:
            self.total_s += float(line.split("\t")[1])
            self.count += 1
        return self.total_s
