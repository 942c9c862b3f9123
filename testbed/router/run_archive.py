"""A run directory brought to where the command runs.

The router actor writes each run's records on the node it runs on, Ray's head (it asks for the
``head`` resource). A driver started on another node of the cluster (``testbed run --address``
on a worker, say) would find nothing under its ``--out``: once the run is closed, the driver asks
the router for the directory as one gzip'd tar (a Ray object, so it crosses the cluster as Ray's
own traffic) and unpacks it in place. On one machine, or where the head writes to a filesystem
the driver's node shares, the router and the driver are on one node or read the same files: the
copy then only rewrites them.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def pack_dir(path: Path) -> bytes:
    """``path`` and everything under it as a gzip'd tar, names relative to its parent."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname=path.name)
    return buf.getvalue()


def unpack_dir(data: bytes, parent: Path) -> list[str]:
    """Unpack what :func:`pack_dir` made under ``parent``; returns the member names. Members that
    would land outside ``parent`` (absolute names, ``..``, links) are refused by tarfile's "data"
    filter, with a one-line ``tarfile.FilterError``."""
    parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(parent, filter="data")
    return names
