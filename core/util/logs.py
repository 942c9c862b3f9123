"""The project's log: configured once by the command that runs (``testbed -v``/``-q``), never by
library code, which only logs.

Levels: WARNING by default (what went wrong but did not stop the command), INFO with ``-v`` (what
each step did: a run closed, a cluster up, an engine restarted), DEBUG with ``-vv``; ``-q`` keeps
errors only. Processes the command starts (the testbed's driver in the head's namespace) inherit
the level through :data:`LEVEL_ENV` and call :func:`configure_from_env`; so do the Ray actors the
driver starts (the router, the engines, the fault agents): the driver hands :func:`child_env` to
its Ray job's ``runtime_env``, and each actor configures its log first thing. Their lines go where
Ray keeps its workers' output (``ray logs``, or /tmp/ray/session_latest/logs/ on each node;
on an emulated cluster /tmp/tb-<run id>/<node>/ray/session_latest/logs/).
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["LEVEL_ENV", "child_env", "configure_from_env", "configure_logging", "level_for"]

LEVEL_ENV = "TESTBED_LOG_LEVEL"
_FORMAT = "%(levelname)s %(name)s: %(message)s"


def level_for(verbose: int = 0, quiet: int = 0) -> int:
    """WARNING, one level down per ``-v`` and up per ``-q``, within DEBUG..CRITICAL."""
    return min(max(logging.WARNING - 10 * verbose + 10 * quiet, logging.DEBUG), logging.CRITICAL)


def configure_logging(level: int) -> None:
    """The project's loggers (and any without a handler of their own) to stderr at ``level``; the
    level passed on to the processes this one starts."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_testbed", False)]:
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._testbed = True  # type: ignore[attr-defined]  # ours to replace on a second call
    root.addHandler(handler)
    root.setLevel(level)
    os.environ[LEVEL_ENV] = logging.getLevelName(level)


def child_env() -> dict[str, str]:
    """The environment a process this one starts needs to log at this one's level."""
    return {LEVEL_ENV: os.environ.get(LEVEL_ENV, logging.getLevelName(logging.WARNING))}


def configure_from_env() -> None:
    """What :func:`configure_logging` set in the process that started this one (WARNING if nothing)."""
    level = logging.getLevelName(os.environ.get(LEVEL_ENV, "WARNING"))
    configure_logging(level if isinstance(level, int) else logging.WARNING)
