"""The study tasks' child interpreter (study/clean_process.py): runs functions in another process,
hands back results and exceptions, is reused, and never outlives the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from study.clean_process import CleanProcess

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone once reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_it_runs_functions_elsewhere_and_hands_back_results_and_errors():
    child = CleanProcess()
    try:
        pid = child.call(os.getpid)
        assert pid != os.getpid() and child.call(os.getpid) == pid  # one child, reused
        assert child.call(sorted, [3, 1, 2]) == [1, 2, 3]
        with pytest.raises(ValueError, match="invalid literal"):
            child.call(int, "x")
        assert child.alive() and child.call(os.getppid) == os.getpid()
    finally:
        child.kill()
    assert not child.alive() and _gone(pid)


def test_it_dies_with_the_process_that_started_it():
    # A parent that starts a child, says its pid, and is killed without any cleanup.
    code = ("import os, sys, time\n"
            "from study.clean_process import CleanProcess\n"
            "c = CleanProcess()\n"
            "print(c.call(os.getpid), flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert not _gone(child_pid, within_s=0.2)
        parent.kill()
        parent.wait()
        assert _gone(child_pid), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
