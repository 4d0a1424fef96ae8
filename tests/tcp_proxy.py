"""A real TCP proxy between a client and a server, for tests that break the network on purpose.

``TcpProxy(upstream_port)`` listens on 127.0.0.1 and forwards every connection to the server,
byte for byte, with two pump threads per connection. A test then breaks the path:

- ``cut()``: every connection is reset and new ones are refused (the server dropped the client,
  or a firewall rejects it); ``restore()`` listens again on the same port.
- ``blackhole()``: connections stay open but nothing is forwarded any more (packets dropped
  silently, no reset: a partition); ``heal()`` resumes forwarding what was held back.

It counts the bytes and the connections it forwarded, and the requests (``stats``): for a
protocol where a client waits for each answer before it asks again (TCPStore, one request in
flight per connection), every burst of client bytes that follows server bytes (or opens the
connection) is one request. Every thread ends at ``close()``.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ProxyStats", "TcpProxy"]

_CHUNK = 65536
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


@dataclass
class ProxyStats:
    """What went through: connections accepted, bytes each way, client requests."""

    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    requests: int = 0


class TcpProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<upstream_port> (see the module docstring)."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self.stats = ProxyStats()
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop, self._listener)

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Reset every connection and refuse new ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            try:
                # Wakes the accept loop (a close alone leaves the port listening while an
                # accept() is blocked on it, so restore() could not bind it again).
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for a, b in conns:
            for sock in (a, b):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                    sock.close()
                except OSError:
                    pass

    def restore(self) -> None:
        """Accept connections again on the same port (after ``cut``)."""
        with self._lock:
            if self._listener is not None:
                return
            self._listener = self._listen(self.port)
            listener = self._listener
        self._start(self._accept_loop, listener)

    def blackhole(self) -> None:
        """Stop forwarding; connections stay open, nothing arrives either way."""
        self._flowing.clear()

    def heal(self) -> None:
        """Forward again what was held back, and everything after."""
        self._flowing.set()

    def close(self) -> None:
        """Close everything and join the threads."""
        self._closed = True
        self._flowing.set()
        self.cut()
        for thread in self._threads:
            thread.join(timeout=5)

    # -- threads -------------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        return sock

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut() or close()
            try:
                server = socket.create_connection(self._upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns.append((client, server))
                self.stats.connections += 1
            turn = [False]  # True while the client's last bytes have not been answered yet
            self._start(self._pump, client, server, True, turn)
            self._start(self._pump, server, client, False, turn)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool, turn: list[bool]) -> None:
        try:
            while True:
                readable, _, _ = select.select([src], [], [], 0.2)
                if not readable:
                    if self._closed:
                        return
                    continue
                self._flowing.wait()
                data = src.recv(_CHUNK)
                if not data:
                    break
                with self._lock:  # counted before forwarding: the answer cannot overtake it
                    if up:
                        self.stats.bytes_up += len(data)
                        if not turn[0]:
                            self.stats.requests += 1
                            turn[0] = True
                    else:
                        self.stats.bytes_down += len(data)
                        turn[0] = False
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
