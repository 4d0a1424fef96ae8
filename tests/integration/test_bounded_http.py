"""The bounded HTTP server (bounded_http.py) over real sockets: deadlines, the cap, descriptors.

Descriptor pressure is real: a subprocess lowers its RLIMIT_NOFILE, serves the agent's health
server, and opens /dev/null until few (or no) descriptors are left, on command.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic_run.agent.health.bounded_http import BoundedHTTPServer
from tests.helpers import REPO_ROOT, wait_until

pytestmark = pytest.mark.timeout(90)

WAIT_S = 30.0
GET = b"GET /healthz HTTP/1.0\r\n\r\n"
OK = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"


def exchange(port: int, request: bytes = GET) -> bytes:
    """Send ``request`` and read the reply until the server closes (a reset ends it too)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        reply = b""
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        except ConnectionResetError:
            pass
        return reply


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock``; waits for it (the socket has a timeout)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def served() -> Iterator[list[BoundedHTTPServer]]:
    servers: list[BoundedHTTPServer] = []
    yield servers
    for server in servers:
        server.stop()


def start(served: list[BoundedHTTPServer], server: BoundedHTTPServer) -> BoundedHTTPServer:
    server.start()
    served.append(server)
    return server


def ok(request: bytes, client: tuple[str, int]) -> bytes:
    return OK


def test_a_client_that_does_not_finish_its_request_in_time_is_cut(
    served: list[BoundedHTTPServer],
) -> None:
    server = start(served, BoundedHTTPServer("127.0.0.1", 0, ok, read_deadline_s=0.2))
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    trickle = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    try:
        trickle.sendall(b"GET /hea")  # and then nothing
        assert closed_by_server(silent)
        assert closed_by_server(trickle)
        assert exchange(server.port) == OK
    finally:
        silent.close()
        trickle.close()


def test_at_the_cap_the_oldest_unfinished_request_makes_room(
    served: list[BoundedHTTPServer],
) -> None:
    server = start(served, BoundedHTTPServer("127.0.0.1", 0, ok, max_connections=4))
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) for _ in range(4)]
    try:
        wait_until(lambda: server.connections() == 4, WAIT_S)
        assert exchange(server.port) == OK
        assert closed_by_server(slow[0])  # the oldest was closed for the newcomer
        wait_until(lambda: server.connections() == 3, WAIT_S)  # the newcomer's is done too
    finally:
        for sock in slow:
            sock.close()


def test_when_every_connection_is_being_answered_a_newcomer_gets_503(
    served: list[BoundedHTTPServer],
) -> None:
    entered = threading.Semaphore(0)
    release = threading.Event()

    def held(request: bytes, client: tuple[str, int]) -> bytes:
        entered.release()
        release.wait(WAIT_S)
        return OK

    server = start(served, BoundedHTTPServer("127.0.0.1", 0, held, max_connections=2, workers=2))
    with ThreadPoolExecutor(max_workers=2) as pool:
        replies = [pool.submit(exchange, server.port) for _ in range(2)]
        for _ in range(2):
            assert entered.acquire(timeout=WAIT_S)
        busy = exchange(server.port)
        assert busy.startswith(b"HTTP/1.0 503 Service Unavailable\r\n"), busy
        assert b"busy" in busy
        release.set()
        assert [reply.result(WAIT_S) for reply in replies] == [OK, OK]


def test_a_failing_respond_closes_that_connection_and_serving_goes_on(
    served: list[BoundedHTTPServer],
) -> None:
    def respond(request: bytes, client: tuple[str, int]) -> bytes:
        if b"/boom" in request:
            raise RuntimeError("boom")
        return OK

    server = start(served, BoundedHTTPServer("127.0.0.1", 0, respond))
    assert exchange(server.port, b"GET /boom HTTP/1.0\r\n\r\n") == b""
    assert exchange(server.port) == OK


def test_a_request_larger_than_the_limit_is_answered_with_what_came(
    served: list[BoundedHTTPServer],
) -> None:
    sizes: list[int] = []

    def respond(request: bytes, client: tuple[str, int]) -> bytes:
        sizes.append(len(request))
        return OK

    server = start(served, BoundedHTTPServer("127.0.0.1", 0, respond, max_request_bytes=1024))
    assert exchange(server.port, b"GET /" + b"a" * 5000) == OK
    assert 1024 <= sizes[0] < 5000


def test_stop_frees_the_port_with_a_client_still_sending(
    served: list[BoundedHTTPServer],
) -> None:
    server = BoundedHTTPServer("127.0.0.1", 0, ok)
    server.start()
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    try:
        stalled.sendall(b"GET /st")
        wait_until(lambda: server.connections() == 1, WAIT_S)
        server.stop()
        assert closed_by_server(stalled)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    finally:
        stalled.close()


# -- descriptor pressure, in a process of its own -------------------------------------------

_PRESSURED_SCRIPT = """
import json, logging, os, resource, sys
from elastic_run.agent.health.server import AgentHealthServer
from elastic_run.descriptors import free_descriptors

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("elastic_run").addHandler(Keep())
logging.getLogger("elastic_run").setLevel(logging.INFO)

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
server = AgentHealthServer("127.0.0.1", 0, status_fn=dict, liveness_fn=lambda: (True, ""))
server.start()
print(server.port, flush=True)
hogs = []
for line in sys.stdin:
    command, *args = line.split()
    if command == "leave":  # open files until only N descriptors are free (0: until EMFILE)
        try:
            while int(args[0]) == 0 or (free_descriptors() or 0) > int(args[0]):
                hogs.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        print(free_descriptors(), flush=True)
    elif command == "release":
        for fd in hogs:
            os.close(fd)
        hogs.clear()
        print(free_descriptors(), flush=True)
    elif command == "log":
        print(json.dumps(records), flush=True)
"""


class PressuredServer:
    """The agent's health server in a subprocess whose descriptors the test can use up."""

    def __init__(self, nofile: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PRESSURED_SCRIPT, str(nofile)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.port = int(self._readline())

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the pressured server exited"
        return line.strip()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._readline()

    def log(self) -> list[str]:
        records: list[str] = json.loads(self.ask("log"))
        return records

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=WAIT_S)
        self.proc.stdout.close()


@pytest.fixture
def pressured() -> Iterator[PressuredServer]:
    server = PressuredServer(nofile=256)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.close()


def test_short_of_descriptors_new_connections_get_503_then_service_resumes(
    pressured: PressuredServer,
) -> None:
    assert exchange(pressured.port).startswith(b"HTTP/1.0 200 ")
    assert 0 < int(pressured.ask("leave 40")) <= 40
    refused = exchange(pressured.port)
    assert refused.startswith(b"HTTP/1.0 503 "), refused
    assert b"file descriptors" in refused
    assert int(pressured.ask("release")) > 64
    assert exchange(pressured.port).startswith(b"HTTP/1.0 200 ")


def test_out_of_descriptors_accepting_pauses_logs_once_and_resumes(
    pressured: PressuredServer,
) -> None:
    assert int(pressured.ask("leave 0")) == 0
    # These connect (the kernel completes the handshake into the backlog) but wait.
    waiting = [socket.create_connection(("127.0.0.1", pressured.port), timeout=WAIT_S)]
    waiting[0].sendall(GET)
    wait_until(
        lambda: any("cannot accept" in line for line in pressured.log()),
        WAIT_S,
        message=lambda: f"no accept error logged: {pressured.log()}",
    )
    waiting.append(socket.create_connection(("127.0.0.1", pressured.port), timeout=WAIT_S))
    waiting[1].sendall(GET)
    pressured.ask("release")
    try:
        for sock in waiting:
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
            assert reply.startswith(b"HTTP/1.0 200 "), reply
    finally:
        for sock in waiting:
            sock.close()
    assert exchange(pressured.port).startswith(b"HTTP/1.0 200 ")
    log = pressured.log()
    assert sum("cannot accept" in line for line in log) == 1, log
    assert sum("accepting connections again" in line for line in log) == 1, log
