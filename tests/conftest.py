"""What several test modules share: the faulted spec, the emulated cluster the slow
end-to-end tests share (brought up once a session: its engines take minutes to start), and how
the tests share the machine's cores (``-n auto``, below)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from builders import faulted_spec_dict


@pytest.fixture(scope="session")
def faulted_spec() -> dict[str, Any]:
    """A small run that takes every hot path of both worlds' shared code: KV flows on a throttled
    link (pod 1 at r = 0.01), requests failing at their deadline, health labels changing (the
    alert model), the price. A copy of its own."""
    return faulted_spec_dict(health={"model": "alert"})


@pytest.fixture(scope="session")
def testbed_runs(tmp_path_factory) -> tuple:
    """The emulated cluster's jobs, run once a session for every slow end-to-end test
    (tests/e2e_cluster.py, imported here only when a test asks: it needs Ray and vLLM):
    (out, leftovers before, leftovers after, the throttled job's spec, what each command saw)."""
    from e2e_cluster import run_on_cluster

    runs = run_on_cluster(tmp_path_factory.mktemp("testbed"))
    _E2E_PHASES.update(runs[-1].get("phases", {}))
    return runs


_E2E_PHASES: dict[str, float] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker's end-to-end phases, where the cluster ran on it."""
    _E2E_PHASES.update(getattr(node, "workeroutput", {}).get("e2e_phases", {}))


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the end-to-end cluster's time went (docs/performance.md "The test suite's time")."""
    if _E2E_PHASES:
        terminalreporter.write_line("e2e cluster, seconds per step: " + "; ".join(
            f"{name} {s:.0f}" for name, s in _E2E_PHASES.items()) + f"; total {sum(_E2E_PHASES.values()):.0f}")


# --- nothing left in /tmp (tests/tmp_leftovers.py) -------------------------------------------
_TMP_BEFORE: frozenset[str] = frozenset()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _TMP_BEFORE
    from tmp_leftovers import tmp_entries

    _TMP_BEFORE = tmp_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when it left something in /tmp that was not there before it."""
    if hasattr(session.config, "workerinput"):  # a worker of pytest-xdist: the controller checks
        if _E2E_PHASES:  # handed to the controller (pytest_testnodedown)
            session.config.workeroutput["e2e_phases"] = dict(_E2E_PHASES)
        return
    from tmp_leftovers import left_in_tmp, tmp_entries

    # pytest's own basetemp, where --basetemp put it in /tmp: pytest's to keep or remove
    basetemp = session.config.option.basetemp
    own = {Path(basetemp).resolve().relative_to("/tmp").parts[0]} if basetemp and \
        Path(basetemp).resolve().is_relative_to("/tmp") else set()
    left = [x for x in left_in_tmp(_TMP_BEFORE, tmp_entries()) if x not in own]
    if left:
        print(f"\nthe tests left {len(left)} entries in /tmp: {', '.join(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the machine's cores (pytest-xdist: `python -m pytest -n auto`, the README's test command) ---
# A test may start engines, Ray, namespaces or qdiscs, or judge time or CPU, unless its module or
# itself is marked `background`: such tests run one at a time, in order, on one worker at normal
# priority (one xdist group; pyproject.toml sets --dist loadgroup), as they would alone; the
# end-to-end cluster among them keeps its cores (its real-time jobs keep both about 1.5 busy, and a
# calibration check failed with other work beside it: docs/history/2026-11-28-suite-time.md).
# A `background` test judges no time or CPU and starts no engine or Ray: the other workers run
# those beside the group at SCHED_IDLE, which Linux runs only on a core nothing else wants, so
# they take the group's idle time and none of its CPU (docs/performance.md "The test suite's time").
MACHINE_GROUP = "machine"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("background") is None:
            item.add_marker(pytest.mark.xdist_group(MACHINE_GROUP))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not hasattr(item.config, "workerinput"):  # one process: every test as it would run alone
        return
    background = item.get_closest_marker("background") is not None
    # This thread's policy (the one that runs the test) and what it starts; a worker may run tests
    # of both kinds, so each test sets its own.
    os.sched_setscheduler(0, os.SCHED_IDLE if background else os.SCHED_OTHER, os.sched_param(0))
