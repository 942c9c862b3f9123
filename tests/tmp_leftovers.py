"""What a test session leaves in /tmp: every entry that was not there when it started and that a
path of the project or of the tests can make (tests/conftest.py fails the session on them). A path
of ours that leaves a file, a directory or a mount point in /tmp (a namespace shim's scratch mount
once did, and a later compute test failed on it) is caught here.

What the project makes in /tmp is named ``tb-*`` (an emulated cluster's root), ``testbed-*`` (state
and scratch) or ``ray_ssh_*`` (``ray up``'s ssh control paths); Python's anonymous temporary files and
directories are ``tmp`` and eight characters. Anything else new (a process beside the tests: a CI
harness's own files, a shell's ``mktemp`` ``tmp.XXXXXXXXXX``) is not the tests' to judge, and neither are
the caches the dependencies keep there on purpose (they match none of these names)."""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable

OURS = re.compile(r"(?:tb-|testbed-|ray_ssh_).*|tmp[a-z0-9_]{8}")

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
    """The entries of ``after`` not in ``before``, named as a path of ours names them and not kept by a
    dependency, sorted."""
    new = set(after) - set(before) - set(kept_by_dependencies() if kept is None else kept)
    return sorted(x for x in new if OURS.fullmatch(x))
