"""Death notices (peerwatch.py) between real processes over real sockets on 127.0.0.1.

The listener runs in a subprocess, so its death is a real SIGKILL and its kernel closes its
sockets as it would on another host. Where a test says "no verdict", it waits for the watch to
report what it saw (``PeerWatch.state``) and then checks that ``on_dead`` was never called.
Descriptor exhaustion is real too: the listener's process lowers RLIMIT_NOFILE and opens
/dev/null until EMFILE, on command.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from elastic_run.rendezvous.liveness.peerwatch import (
    MAX_CONNECTIONS,
    AliveListener,
    PeerWatch,
    answers,
    greeting,
)
from tests.helpers import REPO_ROOT, free_port, freeze, wait_until

pytestmark = pytest.mark.timeout(60)

WAIT_S = 30.0

_LISTENER_SCRIPT = """
import sys
from elastic_run.rendezvous.liveness.peerwatch import AliveListener
listener = AliveListener(sys.argv[1], "127.0.0.1")
print(listener.port, flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        listener.close()
        print("closed", flush=True)
"""


class ListenerProcess:
    """An AliveListener in a process of its own."""

    def __init__(self, node_id: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.node_id = node_id
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LISTENER_SCRIPT, node_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def close_listener(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class Deaths:
    """What a PeerWatch reported dead, in order."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.any = threading.Event()

    def __call__(self, node_id: str) -> None:
        self.ids.append(node_id)
        self.any.set()


@pytest.fixture
def listeners() -> Iterator[list[ListenerProcess]]:
    started: list[ListenerProcess] = []
    yield started
    for listener in started:
        listener.kill()


@pytest.fixture
def deaths() -> Deaths:
    return Deaths()


@pytest.fixture
def watch(deaths: Deaths) -> Iterator[PeerWatch]:
    the_watch = PeerWatch(deaths)
    yield the_watch
    the_watch.close()


def start(listeners: list[ListenerProcess], node_id: str) -> ListenerProcess:
    listener = ListenerProcess(node_id)
    listeners.append(listener)
    return listener


def watching(watch: PeerWatch, node_id: str) -> None:
    assert watch.wait_state(lambda s: s == f"watching {node_id}", WAIT_S), watch.state


@pytest.mark.parametrize(
    "end",
    [
        ListenerProcess.kill,
        # A node that leaves on purpose closes its listener (and drops its heartbeat).
        ListenerProcess.close_listener,
    ],
    ids=["sigkilled", "left"],
)
def test_a_node_that_ends_is_reported_dead(
    listeners: list[ListenerProcess],
    watch: PeerWatch,
    deaths: Deaths,
    end: Callable[[ListenerProcess], None],
) -> None:
    peer = start(listeners, "node-a")
    watch.watch("node-a", "127.0.0.1", peer.port)
    watching(watch, "node-a")
    end(peer)
    assert deaths.any.wait(WAIT_S), watch.state
    assert deaths.ids == ["node-a"]
    assert watch.wait_state(lambda s: s == "idle", WAIT_S), watch.state  # watches nobody now


def test_a_new_target_replaces_the_old_one(
    listeners: list[ListenerProcess], watch: PeerWatch, deaths: Deaths
) -> None:
    a, b = start(listeners, "node-a"), start(listeners, "node-b")
    watch.watch("node-a", "127.0.0.1", a.port)
    watching(watch, "node-a")
    watch.watch("node-b", "127.0.0.1", b.port)
    watching(watch, "node-b")
    a.kill()  # no longer watched: no notice
    b.kill()
    assert deaths.any.wait(WAIT_S), watch.state
    assert deaths.ids == ["node-b"]


def test_answers_is_true_only_for_a_listener_greeting_as_the_node(
    listeners: list[ListenerProcess],
) -> None:
    # The one-off look a job-ending failure takes at its round's members.
    a = start(listeners, "node-a")
    assert answers("node-a", "127.0.0.1", a.port, 5.0) is True
    assert answers("node-b", "127.0.0.1", a.port, 5.0) is False  # the port greets as another
    a.kill()
    assert answers("node-a", "127.0.0.1", a.port, 5.0) is False  # refused
    stopped = start(listeners, "node-c")
    freeze(stopped.proc.pid)  # accepted by the kernel, never greeted
    assert answers("node-c", "127.0.0.1", stopped.port, 0.5) is False


def test_a_refused_port_never_greeted_is_no_verdict(watch: PeerWatch, deaths: Deaths) -> None:
    # A firewall rejecting the port looks like this: it must not make every peer dead.
    port = free_port()
    watch.watch("node-a", "127.0.0.1", port)
    assert watch.wait_state(lambda s: s == "no verdict node-a: refused", WAIT_S), watch.state
    assert deaths.ids == []


def test_a_port_that_greets_as_another_node_is_no_verdict(
    listeners: list[ListenerProcess], watch: PeerWatch, deaths: Deaths
) -> None:
    # The watched node's port was reused by another node's listener.
    other = start(listeners, "node-b")
    watch.watch("node-a", "127.0.0.1", other.port)
    assert watch.wait_state(lambda s: s.startswith("no verdict node-a: another"), WAIT_S)
    other.kill()
    assert watch.wait_state(lambda s: s == "no verdict node-a: refused", WAIT_S), watch.state
    assert deaths.ids == []


class CuttingProxy:
    """A TCP relay that can cut its connections while it keeps listening (a middlebox)."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.accepted = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                # The upstream is gone (the test's teardown stops it while a watch may still
                # be reconnecting): refuse this one as a middlebox would, keep listening.
                down.close()
                continue
            with self._lock:
                self._pairs.append((down, up))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(up, down), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(4096):
                dst.sendall(data)
        except OSError:
            return

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for down, up in pairs:
            for sock in (down, up):
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.cut()
        self._server.close()


def test_a_cut_connection_that_greets_again_is_no_verdict(
    listeners: list[ListenerProcess], watch: PeerWatch, deaths: Deaths
) -> None:
    peer = start(listeners, "node-a")
    proxy = CuttingProxy(peer.port)
    try:
        watch.watch("node-a", "127.0.0.1", proxy.port)
        watching(watch, "node-a")
        proxy.cut()
        wait_until(lambda: proxy.accepted == 2, WAIT_S, message="the watch did not reconnect")
        watching(watch, "node-a")
        assert deaths.ids == []
    finally:
        proxy.close()


def test_the_listener_holds_at_most_max_connections() -> None:
    listener = AliveListener("node-a", "127.0.0.1")
    clients: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            client = socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)
            clients.append(client)
            assert client.recv(256) == greeting("node-a")
        extra = socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)
        assert extra.recv(256) == b""  # closed without a greeting
        extra.close()
        clients.pop().close()
        wait_until(lambda: listener.connections() < MAX_CONNECTIONS, WAIT_S)
        again = socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)
        clients.append(again)
        assert again.recv(256) == greeting("node-a")
    finally:
        for client in clients:
            client.close()
        listener.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)


def test_clients_that_reset_at_once_do_not_end_the_listener() -> None:
    listener = AliveListener("node-a", "127.0.0.1")
    try:
        for _ in range(16):
            rude = socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S)
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            rude.close()  # a reset, maybe before the listener accepted it
        with socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S) as polite:
            assert polite.recv(256) == greeting("node-a")
    finally:
        listener.close()


# -- descriptor exhaustion: the attack that once made a live node dead ------------------------

_PRESSURED_LISTENER_SCRIPT = """
import json, logging, os, resource, sys
from elastic_run.rendezvous.liveness.peerwatch import AliveListener

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("elastic_run").addHandler(Keep())
logging.getLogger("elastic_run").setLevel(logging.INFO)

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
listener = AliveListener(sys.argv[1], "127.0.0.1")
print(listener.port, flush=True)
hogs = []
for line in sys.stdin:
    command = line.strip()
    if command == "exhaust":  # open files until EMFILE
        try:
            while True:
                hogs.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            print(exc.errno, flush=True)
    elif command == "release":
        for fd in hogs:
            os.close(fd)
        hogs.clear()
        print("released", flush=True)
    elif command == "log":
        print(json.dumps(records), flush=True)
"""


class PressuredListener:
    """An AliveListener in a process of its own, whose descriptors the test can use up."""

    def __init__(self, node_id: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PRESSURED_LISTENER_SCRIPT, node_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.port = int(self._readline())

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the pressured listener exited"
        return line.strip()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._readline()

    def log(self) -> list[str]:
        records: list[str] = json.loads(self.ask("log"))
        return records

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def test_descriptor_exhaustion_never_closes_the_port_nor_makes_a_live_node_dead(
    watch: PeerWatch, deaths: Deaths
) -> None:
    peer = PressuredListener("node-a")
    late_deaths = Deaths()
    late_watch = PeerWatch(late_deaths)
    strangers: list[socket.socket] = []
    try:
        watch.watch("node-a", "127.0.0.1", peer.port)
        watching(watch, "node-a")
        assert int(peer.ask("exhaust")) == errno.EMFILE
        # Strangers knock: the kernel queues them, and each accept() fails with EMFILE.
        for _ in range(4):
            strangers.append(socket.create_connection(("127.0.0.1", peer.port), timeout=WAIT_S))
        wait_until(
            lambda: any("cannot accept" in line for line in peer.log()),
            WAIT_S,
            message=lambda: f"no accept error logged: {peer.log()}",
        )
        # A watch that starts now connects (the port is open) but is not greeted: no verdict.
        late_watch.watch("node-a", "127.0.0.1", peer.port)
        assert late_watch.wait_state(lambda s: s.startswith("no verdict node-a"), WAIT_S)
        assert late_watch.state != "no verdict node-a: refused"

        assert peer.ask("release") == "released"
        assert late_watch.wait_state(lambda s: s == "watching node-a", WAIT_S), late_watch.state
        for stranger in strangers:  # queued during the pressure, greeted after it
            assert stranger.recv(256) == greeting("node-a")
        with socket.create_connection(("127.0.0.1", peer.port), timeout=WAIT_S) as fresh:
            assert fresh.recv(256) == greeting("node-a")
        assert watch.state == "watching node-a"
        assert deaths.ids == [] and late_deaths.ids == []
        log = peer.log()
        assert sum("cannot accept" in line for line in log) == 1, log
        assert sum("accepts again" in line for line in log) == 1, log
    finally:
        for stranger in strangers:
            stranger.close()
        late_watch.close()
        peer.kill()
    # And a node that really dies is still reported, at once.
    assert deaths.any.wait(WAIT_S), watch.state
    assert deaths.ids == ["node-a"]
