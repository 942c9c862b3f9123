"""Files written whole or not at all: a reader (a report, a resumed study, a crashed run's cleanup)
never sees half of one. Standard library only: the testbed's node helpers use it before the
project's dependencies are installed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path | str, data: Any, *, indent: int | None = None, default: Any = None,
                      allow_nan: bool = True) -> None:
    """``data`` as JSON at ``path``, through a temporary file beside it renamed into place (atomic on
    one filesystem). The temporary name carries the pid: processes writing the same file in
    parallel (a study's cells) never share one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=default, allow_nan=allow_nan))
    os.replace(tmp, path)
