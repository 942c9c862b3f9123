"""A TCP stream between two nodes of an emulated fabric, for measuring what a link carries.

The receiver time-stamps every read, so the goodput over any window (and the
moment a shaping took effect) can be read afterwards. Used by the shaping
tests and ``benchmarks/bench_shaping.py``.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from testbed.machine.netns import Fabric, in_netns


def retransmits(sock: socket.socket) -> int:
    """Segments a TCP sender has retransmitted so far (tcp_info's total_retrans): a packet a
    qdisc dropped shows up here once TCP has sent it again."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("8B24I", info)[-1]  # struct tcp_info: 8 u8, then u32s up to total_retrans


def rto_s(sock: socket.socket) -> float:
    """A TCP sender's retransmission timeout now (tcp_info's rto, in µs): how long a segment it
    sent waits for its acknowledgement before it is sent again."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("8BI", info)[-1] / 1e6


def receive_stamped(conn: socket.socket, got: list[tuple[float, int]], going: Callable[[], bool]) -> None:
    """Read ``conn`` while ``going()`` and the sender sends, appending (monotonic time, bytes) per
    read to ``got``; then close it. The goodput over any window is read from ``got`` afterwards."""
    conn.settimeout(0.5)
    while going():
        try:
            data = conn.recv(1 << 20)
        except socket.timeout:
            continue
        if not data:
            break
        got.append((time.monotonic(), len(data)))
    conn.close()


class TcpStream:
    """A TCP stream from one namespace to another; the receiver time-stamps what it reads."""

    def __init__(self, fab: Fabric, src: str, dst: str, port: int) -> None:
        dst_node = fab.node(dst)
        with in_netns(dst_node.netns):
            self.srv = socket.create_server((dst_node.address, port))
        self.got: list[tuple[float, int]] = []
        self.stop = threading.Event()
        threading.Thread(target=self._rx, daemon=True).start()
        with in_netns(fab.node(src).netns):
            self.cl = socket.create_connection((dst_node.address, port), timeout=5)
        threading.Thread(target=self._tx, daemon=True).start()

    def _rx(self) -> None:
        conn, _ = self.srv.accept()
        receive_stamped(conn, self.got, lambda: not self.stop.is_set())

    def _tx(self) -> None:
        buf = bytes(1 << 16)
        while not self.stop.is_set():
            try:
                self.cl.sendall(buf)
            except OSError:
                break

    def rate(self, t0: float, t1: float) -> float:
        """Goodput (bit/s) received in [t0, t1)."""
        return sum(n for t, n in list(self.got) if t0 <= t < t1) * 8 / (t1 - t0)

    def last(self, seconds: float) -> float:
        t = time.monotonic()
        return self.rate(t - seconds, t)

    def close(self) -> None:
        self.stop.set()
        self.cl.close()
        self.srv.close()


@contextmanager
def tcp_stream(fab: Fabric, src: str, dst: str, port: int) -> Iterator[TcpStream]:
    s = TcpStream(fab, src, dst, port)
    try:
        yield s
    finally:
        s.close()
