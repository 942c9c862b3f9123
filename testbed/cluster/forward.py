"""A TCP port on the host that leads into a network namespace.

The emulated cluster's head lives in its own namespace, where the router actor's
ingress and metrics exporter listen on the namespace's localhost: outside clients on
the host (the ``openai`` client, ``vllm bench serve``, Prometheus) reach them through this forwarder, which
listens on the host and opens each upstream connection from a socket made inside
the head's namespace (a socket keeps the namespace it was created in).
A real cluster's head needs none: clients run there, or the ingress listens wider.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from testbed.machine.netns import in_netns

_CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class NetnsForwarder:
    """Forward ``listen`` (host, port) on the host to ``target`` inside namespace ``netns``,
    from a thread of its own; :meth:`start` binds (an occupied port raises OSError at once)."""

    def __init__(self, listen: tuple[str, int], netns: str, target: tuple[str, int], what: str = "ingress") -> None:
        self.listen, self.netns, self.target, self.what = listen, netns, target, what
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="netns-forwarder", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    async def _connect(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        with in_netns(self.netns):  # (this thread only, for the socket() call)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await self._loop.sock_connect(sock, self.target)
        except OSError:
            sock.close()
            client_w.close()  # nothing listens there (yet): the client sees a closed connection
            return
        up_r, up_w = await asyncio.open_connection(sock=sock)
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    def start(self) -> "NetnsForwarder":
        self._thread.start()
        try:
            self._server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(self._connect, *self.listen), self._loop).result()
        except OSError as e:
            self.stop()
            raise OSError(f"{self.what} forwarder: cannot listen on {self.listen[0]}:{self.listen[1]} on the host: "
                          f"{e.strerror} (choose another testbed.{self.what}_port)") from None
        return self

    def stop(self) -> None:
        async def _close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()
