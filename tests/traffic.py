"""A TCP stream between two nodes of an emulated fabric, for measuring what a link carries.

The rate over any window is read from the kernel's count of what arrived on the
connection (tcp_info's ``bytes_received``), sampled every few milliseconds,
not from when the test's reader thread got to it: under load the reader may
run late and read a backlog, which a window of read times counts as traffic
that arrived inside it (a CI run read 7.3 Mbit/s through a 5 Mbit/s shaping
that way). The socket buffers are the kernel's own, autotuned: forced to 64 MiB,
a downlink (ingress) shaping's drops left so much out of order behind each loss
that the in-order count read 0.3-2.6 of the limit in half-second windows, where
the shaper's own output was steady at 0.96 (docs/history/2026-11-29-steady-under-load.md).
Used by the shaping tests and ``benchmarks/bench_shaping.py``.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from testbed.faults import shaping
from testbed.faults.readings import busy_rate, step_rate
from testbed.machine.netns import Fabric, in_netns, link_stats

_IP_MTU, _IPV6_MTU = 14, 24  # linux/in.h, linux/in6.h: a connected socket's path MTU
_ETH_HLEN = 14  # linux/if_ether.h


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


SAMPLE_EVERY_S = 0.005  # the counter's time resolution: a GSO packet takes 6.5 ms at 80 Mbit/s


def bytes_received(sock: socket.socket) -> int:
    """Payload bytes the kernel has received in order on connection ``sock`` (tcp_info's
    bytes_received, a u64 at offset 128), whether or not the program has read them yet."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)
    return struct.unpack_from("Q", info, 128)[0]


def payload_share(sock: socket.socket) -> float:
    """The share of what a shaper counts that a TCP stream on ``sock`` delivers as payload: htb
    counts each segment's frame, the path's MTU and its 14-byte Ethernet header, and a segment
    carries the connection's MSS (options excluded) of payload; 1448 of 1514 on these veths."""
    mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    mtu = (sock.getsockopt(socket.IPPROTO_IPV6, _IPV6_MTU) if sock.family == socket.AF_INET6
           else sock.getsockopt(socket.IPPROTO_IP, _IP_MTU))
    return mss / (mtu + _ETH_HLEN)


@contextmanager
def link_counter(netns: str, ifname: str, field: str = "tx_bytes") -> Iterator[Callable[[], int]]:
    """A reader of interface ``ifname``'s counter ``field`` in ``netns``, for one thread
    (:func:`testbed.machine.netns.link_stats`). A veth counts what it transmits as the qdisc hands
    it over, so its ``tx_bytes`` is what left through any shaping, nothing still on the way."""
    with link_stats(netns, ifname) as read:
        yield lambda: int(read()[field])


@contextmanager
def shaped_counter(netns: str, ifname: str) -> Iterator[Callable[[], tuple[int, int | None]]]:
    """A reader of (bytes sent, bytes queued) of the project's limited class on ``ifname`` in
    ``netns`` (:func:`testbed.faults.shaping.counter`, what the fault agent reads), for one thread.
    The class counts each segment's frame, as htb charges it against the rate; an ifb's own
    transmit counter counts a packet GRO merged on the way in once, its segments' headers with it,
    and read 0.944 of the class over IPv6 and 0.962 over IPv4 (docs/verified.md "An ifb counts a
    merged packet once")."""
    with in_netns(netns), shaping.counter(ifname) as read:
        yield read


class CounterSampler:
    """A kernel byte counter read every ``every_s`` by a thread of its own. Each read is kept as
    (monotonic time just before it, the count, time just after it): a thread that waited for the
    CPU around a read widens that span, and never moves the read outside it. A reader may also
    return the bytes its shaper held queued then (:func:`shaped_counter`), kept in ``queued``."""

    def __init__(self, open_counter: Callable[[], AbstractContextManager[Callable[[], int | tuple[int, int | None]]]],
                 every_s: float = SAMPLE_EVERY_S) -> None:
        self.samples: list[tuple[float, int, float]] = []
        self.queued: list[int | None] = []  # per read, appended before its sample: None where not read
        self._open, self._every_s = open_counter, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._open() as read:
            while not self._stop.is_set():
                before = time.monotonic()
                try:
                    got = read()
                except OSError:  # the connection or namespace went: nothing more to count
                    return
                count, queued = got if isinstance(got, tuple) else (got, None)
                self.queued.append(queued)
                self.samples.append((before, count, time.monotonic()))
                self._stop.wait(self._every_s)

    def rate(self, t0: float, t1: float) -> float:
        """Bit/s over [t0, t1), step to step (:func:`step_rate`), each read at the middle of its span."""
        return step_rate([((a + b) / 2, n) for a, n, b in list(self.samples)], t0, t1)

    def busy(self, t0: float, t1: float) -> tuple[float, float]:
        """(bit/s, seconds busy) of a shaper over [t0, t1) read only while its queue held bytes
        (:func:`busy_rate`, as the fault agent reads it): a stream whose sender or reader waited for
        the CPU leaves the shaper idle below its rate, which says what was offered, not the limit."""
        samples = list(self.samples)  # first: each has its queue read, appended before it
        rows = [((a + b) / 2, n, q) for (a, n, b), q in zip(samples, self.queued)]
        return busy_rate([r for r in rows if t0 <= r[0] < t1])

    def last(self, seconds: float) -> float:
        """Bit/s over the ``seconds`` up to the latest read (:meth:`rate`): in three fresh-clone suites
        (04c49be, 16f3831, db106fa) no thread of the test's process read for 0.3 s while a stream ran
        at line rate, so a window ending now held no read."""
        samples = list(self.samples)
        if not samples:
            raise ValueError("no counter sample yet: the sampler did not run")
        t = (samples[-1][0] + samples[-1][2]) / 2 + 1e-9
        return self.rate(t - seconds, t)

    def most_ahead(self, since: float, until: float, bps: float) -> float:
        """The most bytes the counter ran ahead of ``bps`` in [since, until), counted from its first
        read begun at or after ``since``. The first read is taken as early and each later one as
        late as its span allows, so time lost to waiting for the CPU can only lower it."""
        after = [(a, n, b) for a, n, b in list(self.samples) if a >= since and b < until]
        if not after:
            raise ValueError(f"no counter sample in [{since:.3f}, {until:.3f}): the sampler did not run")
        start, first, _ = after[0]
        return max(n - first - bps / 8 * (b - start) for _, n, b in after)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class TcpStream:
    """A TCP stream from one namespace to another, sending as fast as the link lets it; the
    kernel's count of what arrived (``received``) is read every ``SAMPLE_EVERY_S``."""

    def __init__(self, fab: Fabric, src: str, dst: str, port: int, address: str | None = None) -> None:
        """``address``: ``dst``'s address to stream to (default its IPv4 one; an IPv6 one too)."""
        dst_node = fab.node(dst)
        address = address or dst_node.address
        with in_netns(dst_node.netns):
            self.srv = socket.create_server((address, port),
                                            family=socket.AF_INET6 if ":" in address else socket.AF_INET)
        self.stop = threading.Event()
        self._accepted = threading.Event()
        self._conn: socket.socket | None = None
        self._reader = threading.Thread(target=self._rx, daemon=True)
        self._reader.start()
        with in_netns(fab.node(src).netns):
            self.cl = socket.create_connection((address, port), timeout=5)
        # Then no timeout: a sender waits out an outage as long as TCP keeps the connection, as a KV
        # transfer's does. With the connect's 5 s, a link down that long under load (CI, 2026-11-30)
        # timed out the blocked send, its thread ended, and the stream stayed at 0 once cleared.
        self.cl.settimeout(None)
        self.tx_error: OSError | None = None  # why the sender stopped before close(), if it did
        self._sender = threading.Thread(target=self._tx, daemon=True)
        self._sender.start()
        if not self._accepted.wait(10):
            raise OSError(f"{dst}:{port} accepted no connection from {src} within 10 s")
        conn = self._conn
        self.received = CounterSampler(lambda: nullcontext(lambda: bytes_received(conn)))

    def _rx(self) -> None:
        conn, _ = self.srv.accept()
        self._conn = conn
        self._accepted.set()
        conn.settimeout(0.5)
        while not self.stop.is_set():  # drain only: the rate is read from the kernel's count
            try:
                if not conn.recv(1 << 20):
                    break
            except socket.timeout:
                continue
            except OSError:
                break

    def _tx(self) -> None:
        buf = bytes(1 << 16)
        while not self.stop.is_set():
            try:
                self.cl.sendall(buf)
            except OSError as exc:
                if not self.stop.is_set():
                    self.tx_error = exc
                break

    def rate(self, t0: float, t1: float) -> float:
        """Goodput (bit/s) that arrived in [t0, t1), step to step (:func:`step_rate`)."""
        return self.received.rate(t0, t1)

    def last(self, seconds: float) -> float:
        t = time.monotonic()
        return self.rate(t - seconds, t)

    def close(self) -> None:
        self.stop.set()
        try:  # wakes a send blocked on a link still down (it has no timeout): its thread ends
            self.cl.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.received.close()
        self._reader.join(timeout=5)
        self._sender.join(timeout=5)
        for sock in (self.cl, self._conn, self.srv):
            if sock is not None:
                sock.close()


@contextmanager
def tcp_stream(fab: Fabric, src: str, dst: str, port: int, address: str | None = None) -> Iterator[TcpStream]:
    s = TcpStream(fab, src, dst, port, address)
    try:
        yield s
    finally:
        s.close()
