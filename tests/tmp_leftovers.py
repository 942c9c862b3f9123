"""What a test session leaves in /tmp: every entry that was not there when it started, but the
third-party caches the project's dependencies keep there on purpose (tests/conftest.py fails the
session on the rest). A path of ours that leaves a file, a directory or a mount point in /tmp (a
namespace shim's scratch mount once did, and a later compute test failed on it) is caught here."""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable

# Kept by the dependencies for the next process, not left behind: Ray's session directories
# (/tmp/ray, its own default temp root), PyTorch Inductor's compile cache, pytest's own basetemp
# root (which keeps the last three sessions), the JVM's perf data of a Java tool (Prometheus'
# promtool is Go; kept for machines with one).
def kept_by_dependencies(user: str | None = None) -> frozenset[str]:
    user = user or getpass.getuser()
    return frozenset({"ray", f"torchinductor_{user}", f"pytest-of-{user}", f"hsperfdata_{user}"})


def tmp_entries(root: str = "/tmp") -> frozenset[str]:
    return frozenset(os.listdir(root))


def left_in_tmp(before: Iterable[str], after: Iterable[str], kept: Iterable[str] | None = None) -> list[str]:
    """The entries of ``after`` not in ``before`` and not kept by a dependency, sorted."""
    return sorted(set(after) - set(before) - set(kept_by_dependencies() if kept is None else kept))
