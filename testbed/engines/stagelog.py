"""The stage log: when an engine's scheduler queued a request, allocated its blocks and received its KV.

vLLM's front end learns of a request's scheduling only with its next output, and
its scheduler exports KV-fetch stages as counts, not per request. What the router
needs per request (is it still waiting for decode admission, pulling KV, or
decoding?) is known to the scheduler's side of the KV connector, which vLLM calls
when it queues a request (`on_new_request`), allocates its blocks
(`update_state_after_alloc`: with external tokens that is decode admission, and the
NIXL read starts) and when the worker reports the pull done (`update_connector_output`,
`finished_recving`). The connector vLLM loads (testbed/engines/vllm_hooks.py) is vLLM's
`NixlConnector` unchanged, plus one line per such event (`event_line`) in a file of the
engine's own folder (`STAGE_LOG_ENV`, set by EngineConfig.environment); the front end
(same node, same monotonic clock) reads it back (`StageLog`). Nothing here imports vLLM.
"""

from __future__ import annotations

from pathlib import Path

from testbed.engines.logtail import new_lines

#: Environment variable read in the engine core: the stage log's path (EngineConfig.stage_log_path).
STAGE_LOG_ENV = "TESTBED_STAGE_LOG"

# The stage log's events that end a KV pull (NIXL reports a failed read as finished too).
PULL_ENDS = frozenset({"recv_done", "recv_failed"})


def event_line(t: float, event: str, request_id: str) -> str:
    """One event as the scheduler's connector writes it (time.monotonic(), event, vLLM's request id)."""
    return f"{t:.6f}\t{event}\t{request_id}\n"


class StageLog:
    """The front end's reader of its engine's stage log: first time of each event per request.

    vLLM makes its internal request id by appending ``-`` and 8 random characters to
    ours (``InputProcessor.assign_request_id``); that suffix is dropped here.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._pos = 0
        self._events: dict[str, dict[str, float]] = {}

    def _catch_up(self) -> None:
        lines, self._pos = new_lines(self.path, self._pos)
        for line in lines:
            t, event, rid = line.split("\t")
            ours = rid.rsplit("-", 1)[0]
            self._events.setdefault(ours, {}).setdefault(event, float(t))

    def get(self, request_id: str) -> dict[str, float]:
        self._catch_up()
        return dict(self._events.get(request_id, {}))

    def pop(self, request_id: str) -> dict[str, float]:
        self._catch_up()
        return self._events.pop(request_id, {})

    def forget(self, request_id: str) -> None:
        """Drop what was logged for the request since it was popped (an aborted pull's end)."""
        self._catch_up()
        self._events.pop(request_id, None)
