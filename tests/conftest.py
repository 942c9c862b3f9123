"""What several test modules share: the faulted spec, and the emulated cluster the slow
end-to-end tests share (brought up once a session: its engines take minutes to start)."""

from __future__ import annotations

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

    return run_on_cluster(tmp_path_factory.mktemp("testbed"))


# --- nothing left in /tmp (tests/tmp_leftovers.py) -------------------------------------------
_TMP_BEFORE: frozenset[str] = frozenset()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _TMP_BEFORE
    from tmp_leftovers import tmp_entries

    _TMP_BEFORE = tmp_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when it left something in /tmp that was not there before it."""
    if hasattr(session.config, "workerinput"):  # a worker of pytest-xdist: the controller checks
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
