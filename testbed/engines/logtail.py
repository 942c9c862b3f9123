"""Reading a log another process appends to: only what is new, only whole lines."""

from __future__ import annotations

from pathlib import Path


def new_lines(path: Path, pos: int) -> tuple[list[str], int]:
    """The complete lines written to ``path`` from byte ``pos`` on, and where the next read starts
    (a line still being written is left for it). A file not there yet has none."""
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return [], pos
    end = data.rfind(b"\n") + 1
    return data[:end].decode().splitlines(), pos + end
