"""Connecting to Ray without losing the process's SIGTERM handler.

``ray.init`` installs its own SIGTERM handler in the main thread, ``sys.exit(signum)``
(ray/_private/worker.py, ``init``, Ray 2.60), over whatever the caller set. The project's commands
map SIGTERM to Ctrl-C (cli/main.py, testbed/runs/driver.py) so that a scheduler's stop or a CI
timeout closes runs as interrupted and keeps what they recorded; after a plain ``ray.init`` a
SIGTERM instead unwound a study by SystemExit, without its "interrupted" line. Every ``ray.init``
of a driver goes through :func:`ray_init`, which puts the caller's handler back.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def ray_init(**kwargs: Any) -> Any:
    """``ray.init(**kwargs)``, the SIGTERM handler set before it restored after it (only the main
    thread may set one; Ray sets none elsewhere either). Returns what ``ray.init`` returns."""
    import ray

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        return ray.init(**kwargs)
    finally:
        if main and before is not None:  # None: a handler not set from Python, nothing to restore
            signal.signal(signal.SIGTERM, before)
