"""How the suite shares the machine's cores under `-n` (tests/conftest.py): a test marked background
runs at SCHED_IDLE beside the others, every other test at normal priority in the one machine group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _under_xdist(request: pytest.FixtureRequest) -> None:
    if not hasattr(request.config, "workerinput"):
        pytest.skip("run without -n: every test runs alone, at normal priority (the README's command uses -n)")


@pytest.mark.background
def test_a_background_test_and_what_it_starts_run_at_idle_priority(request):
    _under_xdist(request)
    assert os.sched_getscheduler(0) == os.SCHED_IDLE
    child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) == os.SCHED_IDLE
    assert request.node.nodeid.rpartition("@")[2] != "machine"


def test_any_other_test_runs_at_normal_priority_in_the_machine_group(request):
    _under_xdist(request)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert request.node.nodeid.endswith("@machine")  # xdist's loadgroup: one worker, in order
