"""The end-of-session check of /tmp (tests/conftest.py) fails on what a path of ours left, and
only on that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tmp_leftovers import kept_by_dependencies, left_in_tmp

HERE = Path(__file__).resolve().parent


def test_new_entries_are_leftovers_but_the_dependencies_caches():
    before = {"hsperfdata_root", "tmp.abc"}
    after = before | {"ray", "torchinductor_root", "tb-1234-core", "tmpq1w2e3r4", "testbed-netns-cgroup-x1",
                      "tmp.Xy12AbCdEf", "notes.md"}  # the last two: a shell's mktemp, a person's file
    assert left_in_tmp(before, after, kept_by_dependencies("root")) == ["tb-1234-core", "testbed-netns-cgroup-x1",
                                                                      "tmpq1w2e3r4"]
    assert left_in_tmp(after, after, kept_by_dependencies("root")) == []
    assert left_in_tmp(before, before - {"tmp.abc"}, kept_by_dependencies("root")) == []  # removed: fine


def test_a_session_that_leaves_a_file_in_tmp_fails(tmp_path):
    # a session of its own (this conftest), with one test that leaves a directory in /tmp
    (tmp_path / "test_leaves.py").write_text(
        "import tempfile\n\ndef test_leaves():\n    tempfile.mkdtemp(prefix='tb-leftover-check-', dir='/tmp')\n")
    (tmp_path / "conftest.py").write_text((HERE / "conftest.py").read_text().replace("from builders import faulted_spec_dict\n", ""))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"},
                         timeout=120)
    try:
        assert res.returncode == 1, res.stdout[-2000:]
        assert "1 passed" in res.stdout and "the tests left 1 entries in /tmp: tb-leftover-check-" in res.stdout
    finally:
        for p in Path("/tmp").glob("tb-leftover-check-*"):
            p.rmdir()
