"""Which commit of the project made a run: every run.json records it (core/records.py), so a figure
read from a run directory names the code that made it, not only the packages' versions.

Standard library only, read once per process (a study's clean child writes hundreds of run.json).
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

# The project's root: core/util/source.py is two folders below it.
ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def source_commit() -> dict[str, object] | None:
    """``{"commit": <HEAD's hash>, "dirty": <tracked files differ from it>}`` where the project runs
    from a git checkout of its own; None otherwise (an installed wheel, no git, or a folder inside some
    other repository, whose commit would not be the project's). Untracked files do not make it dirty."""
    try:
        # --no-optional-locks: a study's cells read this in parallel; none may take the index's lock.
        top = _git("rev-parse", "--show-toplevel", "HEAD")
        if top is None:
            return None
        lines = top.splitlines()
        if len(lines) != 2 or Path(lines[0]).resolve() != ROOT:
            return None
        status = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):  # no git, or it hung
        return None
    return {"commit": lines[1], "dirty": None if status is None else bool(status.strip())}


def _git(*args: str) -> str | None:
    done = subprocess.run(["git", "--no-optional-locks", "-C", str(ROOT), *args], capture_output=True,
                          text=True, timeout=30)
    return done.stdout if done.returncode == 0 else None
