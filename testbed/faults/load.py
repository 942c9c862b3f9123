"""The load a link fault is measured under: paced datagrams from several threads.

A fault's rate is read from the bytes the kernel counted through the shaper (the shaped class's
counter, testbed/faults/shaping.py) while this load offers more than the limit, so the counter
moves at the limit whatever the NIC's speed: the reading is the rate the link carried, never the
rate the agent configured. UDP, each send a GSO batch of MTU-sized datagrams (one system call, one
packet through the qdisc), paced in 5 ms slices by each of several threads: one thread offered 30
Gbit/s through a veth on the 2-core machine, all of it carried (docs/testbed.md "Measured, not
assumed"); the threads are for NICs faster than that, and slower cores. Datagrams rather than TCP: the two directions of a link are
measured at once, and a TCP stream's acknowledgements would queue behind the other direction's load
in the same shaped class (a ``kv_only`` fault shapes both ends' ports), holding the stream back by
that queue's delay, seconds at a few Mbit/s (measured: a downlink read 0.0062 of the baseline under
r = 0.01 with TCP, 2026-11-29).

The peer holds a :class:`Sink`: a UDP socket on a port of the KV range (testbed/machine/kv_ports.py),
so a ``kv_only`` fault shapes the load as it shapes KV traffic, and so no "port unreachable" comes
back; it never reads: the shaper has counted the bytes before they reach it.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from testbed.machine.kv_ports import KV_PORT_BASE

STREAMS = 4  # threads of one measurement, each a quarter of the offered rate
SNDBUF = 4 << 20  # a send buffer of several slices at tens of Gbit/s: the pacing, not the buffer, limits
SLICE_S = 0.005  # each thread sends a slice's worth, then sleeps to the next
_UDP_SEGMENT = 103  # linux/udp.h: UDP GSO, many MTU-sized datagrams per send call
_MAX_SEGMENTS = 40  # 40 x 1472 B = 58 KiB, under the 64 KiB a GSO packet may carry
# The sink's port: the top of the KV range downwards, a few tries where one is taken (UCX's
# listeners take ports of the same range, testbed/engines/engine.py).
_SINK_PORTS = range(KV_PORT_BASE + 0xFF, KV_PORT_BASE + 0xEF, -1)


_paused = 0  # probes of this process now running (collector_paused)
_paused_lock = threading.Lock()
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The interpreter's cyclic garbage collector off in this process while a probe runs. In a
    process with a large heap (a Ray actor; pytest) a full collection holds the GIL for tens of
    milliseconds: the paced load sends nothing meanwhile, its catch-up burst overflows the shaper's
    queue, and the link reads below its rate. Measured: both directions of a fresh link at 2 Gbit/s
    under pytest, the lower reading 1.72-1.95 Gbit/s in 8 runs (the sampler's reads up to 85 ms
    apart), 1.99-2.03 in 5 of 5 with the collector off (docs/history/2026-11-30-ten-gbit-downlink.md
    "Explained: the garbage collector"). Nested and concurrent probes count: the collector comes
    back, as it was before the first, when the last ends. A probe's window is under two seconds."""
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


class Sink:
    """A UDP socket on a port of the KV range where other agents' probe load is sent."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for port in _SINK_PORTS:
            try:
                self._sock.bind(("0.0.0.0", port))
                break
            except OSError:
                continue
        else:
            self._sock.close()
            raise OSError(f"no free UDP port in {_SINK_PORTS.stop + 1}-{_SINK_PORTS.start} (the top of the KV "
                          "range) for the link probe's sink")
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()


def fill(dst: str, port: int, rate_bps: float, duration_s: float, streams: int = STREAMS, mtu: int = 1500) -> int:
    """Offer ``rate_bps`` in all to ``dst:port`` from ``streams`` threads for ``duration_s``;
    returns the bytes handed to the kernel (a full queue or an ICMP error skips a slice's rest)."""
    sent = [0] * streams

    def one(i: int) -> None:
        seg = mtu - 28  # IPv4 and UDP headers
        rate = rate_bps / streams
        # a GSO send is one skb through the qdisc: at most a slice of the thread's rate, or a
        # shaper's byte counter moves in lumps as large as the window it is read over
        n_seg = int(min(_MAX_SEGMENTS, max(1, rate / 8 * SLICE_S // seg)))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            try:
                if n_seg > 1:
                    s.setsockopt(socket.SOL_UDP, _UDP_SEGMENT, seg)
                chunk = seg * n_seg
            except OSError:  # a kernel without UDP GSO: one datagram a call
                chunk = seg
            payload = bytes(chunk)
            t0 = time.monotonic()
            while (now := time.monotonic()) - t0 < duration_s:
                due = rate / 8 * (now - t0 + SLICE_S)
                while sent[i] < due:
                    try:
                        sent[i] += s.sendto(payload, (dst, port))
                    except OSError:  # queue full (ENOBUFS) or an ICMP error surfaced: keep pacing
                        break
                time.sleep(SLICE_S / 2)
        finally:
            s.close()

    threads = [threading.Thread(target=one, args=(i,), name=f"probe-fill-{i}", daemon=True) for i in range(streams)]
    with collector_paused():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sum(sent)
