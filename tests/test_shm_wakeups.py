"""Missed wake-ups of vLLM's shared-memory queue (testbed/engines/shm_wakeups.py), on vLLM's real
`MessageQueue`: a writer and a reader in this process, the reader on a thread."""

import tempfile
import threading
import time

import pytest

shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")

from testbed.engines import shm_wakeups  # noqa: E402


@pytest.fixture
def queue(monkeypatch):
    """A writer, its reader (idle after 50 ms without a read) and the reader's dequeues on a thread."""
    # The queue's zmq IPC socket lies in this folder: a short one, since a socket path holds 107
    # bytes at most and pytest-xdist's per-worker tmp_path with vLLM's socket name is longer.
    ipc = tempfile.TemporaryDirectory(prefix="tb-ipc-")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", ipc.name)
    monkeypatch.setattr(shm, "SHM_READER_RECHECK_INTERVAL_MS", shm.SHM_READER_RECHECK_INTERVAL_MS)
    monkeypatch.setattr(shm.SpinCondition, "wait", shm.SpinCondition.wait)
    monkeypatch.setattr(shm.SpinCondition, "record_read", shm.SpinCondition.record_read)
    writer = shm.MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=4)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", shm.MessageQueue.create_from_handle(writer.export_handle(), 0)))
    t.start()
    writer.wait_until_ready()
    t.join(10)
    reader = box["r"]
    reader.wait_until_ready()
    reader._spin_condition.busy_loop_s = 0.05
    got: list[tuple[str, float]] = []

    def read(n: int) -> threading.Thread:
        th = threading.Thread(target=lambda: [got.append((reader.dequeue(timeout=30), time.monotonic())) for _ in range(n)])
        th.start()
        return th

    try:
        yield writer, read, got
    finally:
        if hasattr(shm.SpinCondition, "testbed_wakeup_log"):
            del shm.SpinCondition.testbed_wakeup_log
        ipc.cleanup()


def test_a_lost_notification_is_recorded_and_costs_no_more_than_the_recheck(queue, tmp_path):
    writer, read, got = queue
    log = tmp_path / "wakeups.tsv"
    assert shm_wakeups.install(str(log), recheck_ms=300)
    assert shm.SHM_READER_RECHECK_INTERVAL_MS == 300
    th = read(2)
    # notified: the idle reader wakes at once and nothing is recorded
    time.sleep(0.4)
    sent = time.monotonic()
    writer.enqueue("notified")
    time.sleep(0.5)
    assert got and got[0][0] == "notified" and got[0][1] - sent < 0.2
    assert not log.exists() or log.read_text() == ""
    # the notification lost (what a dropped PUB message does): read at the next re-check, recorded
    time.sleep(0.4)
    notify = writer._spin_condition.notify
    writer._spin_condition.notify = lambda: None
    sent = time.monotonic()
    writer.enqueue("lost")
    writer._spin_condition.notify = notify
    th.join(5)
    assert [m for m, _ in got] == ["notified", "lost"]
    assert 0.0 < got[1][1] - sent < 0.3 + 0.2  # within one re-check, not vLLM's 5 s
    rows = shm_wakeups.read_missed_wakeups(log)
    assert len(rows) == 1, rows
    assert 0.25 < rows.waited_s.iloc[0] < 0.6 and rows.process.iloc[0]
    assert abs(rows.read_wall_s.iloc[0] - time.time()) < 5
    lost = shm_wakeups.LostSeconds(log)
    assert lost() == pytest.approx(rows.waited_s.iloc[0]) and lost.count == 1
    assert lost() == pytest.approx(rows.waited_s.iloc[0]) and lost.count == 1  # read once


def test_reads_of_a_busy_reader_are_never_recorded(queue, tmp_path):
    writer, read, got = queue
    log = tmp_path / "wakeups.tsv"
    assert shm_wakeups.install(str(log), recheck_ms=300)
    th = read(50)
    for i in range(50):  # faster than busy_loop_s: the reader spins, no poll, nothing to miss
        writer.enqueue(i)
        time.sleep(0.001)
    th.join(10)
    assert [m for m, _ in got] == list(range(50))
    assert shm_wakeups.read_missed_wakeups(log).empty
