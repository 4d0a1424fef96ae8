"""The c10d backend's cheap reads and client connects, on a real TCPStore (issue 19 part 1).

One-request reads must not create keys or wake waiters' keys; reads around absent keys must
put None where a key is missing; a new client's read deadline lands on its own socket.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest

from elastic_run.rendezvous.c10d.store import (
    KeyValueStore,
    _lowest_free_descriptor,
    connect_client,
    peek,
    read_present,
)


@pytest.fixture
def server() -> Iterator[Any]:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set_timeout(timedelta(seconds=10))
    yield store


def test_read_present_puts_none_where_keys_are_absent(server: Any) -> None:
    store = cast(KeyValueStore, server)
    keys = [f"k{i}" for i in range(40)]
    absent = {3, 17, 18, 39}
    for i, k in enumerate(keys):
        if i not in absent:
            store.set(k, f"v{i}".encode())
    values = read_present(store, keys)
    assert values == [None if i in absent else f"v{i}".encode() for i in range(40)]
    assert read_present(store, []) == []


def test_peek_reads_without_creating_the_key(server: Any) -> None:
    store = cast(KeyValueStore, server)
    assert peek(store, "nothing") is None
    assert not store.check(["nothing"])
    store.set("there", b"x")
    assert peek(store, "there") == b"x"


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _descriptors() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def test_the_lowest_free_descriptor_is_the_number_the_next_open_takes() -> None:
    read_end, write_end = os.pipe()
    try:
        os.close(read_end)  # a hole below write_end
        lowest = _lowest_free_descriptor()
        assert lowest is not None and lowest <= read_end
        assert not _is_open(lowest)  # the probe closed what it opened
        taken = os.open(os.devnull, os.O_RDONLY)
        os.close(taken)
        assert taken == lowest
    finally:
        os.close(write_end)


def _deadlines_to(port: int) -> list[int]:
    return [ms for _, ms in _sockets_to(port)]


def _sockets_to(port: int) -> list[tuple[int, int]]:
    """(descriptor, TCP_USER_TIMEOUT in ms) of this process's sockets whose peer is ``port``."""
    found = []
    for fd in _descriptors():
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue  # a duplicate of it would not make a socket object (and would leak)
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                found.append((fd, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)))
        except OSError:
            pass
        finally:
            sock.close()
    return found


# Kept as a skip: a platform without TCP_USER_TIMEOUT (not Linux) is a difference no set-up can
# fix, and the product runs there without the deadline. A run with the skip still fails unless
# ELASTIC_RUN_ALLOW_SKIPS=1 (tests/conftest.py).
@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="no TCP_USER_TIMEOUT")
def test_a_new_client_gets_its_read_deadline(server: Any) -> None:
    before = sorted(_deadlines_to(server.port))
    client = connect_client("127.0.0.1", server.port, 5.0, timeout_s=10.0, deadline_s=1.5)
    after = sorted(_deadlines_to(server.port))
    assert len(after) == len(before) + 1
    assert after.count(1500) == before.count(1500) + 1
    client.set("k", "v")  # the client works


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="no TCP_USER_TIMEOUT")
def test_a_client_opened_above_a_hole_among_many_descriptors_gets_its_read_deadline(
    server: Any,
) -> None:
    # Hundreds of descriptors open, and a hole low among them: the new socket takes the hole.
    pipes = [os.pipe() for _ in range(200)]
    os.close(pipes[3][0])
    try:
        before = sorted(_deadlines_to(server.port))
        client = connect_client("127.0.0.1", server.port, 5.0, timeout_s=10.0, deadline_s=2.5)
        after = sorted(_deadlines_to(server.port))
        assert after.count(2500) == before.count(2500) + 1
        client.set("k", "v")
    finally:
        os.close(pipes[3][1])
        for r, w in pipes[:3] + pipes[4:]:
            os.close(r)
            os.close(w)


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="no TCP_USER_TIMEOUT")
def test_an_older_socket_to_the_store_beside_the_hole_keeps_its_own_deadline(
    server: Any,
) -> None:
    # A hole at `low`, and a socket to the store that was open before the connect put at low + 1
    # (a duplicate of an older client's): the new client takes the hole and gets the deadline;
    # the older socket, inside the numbers looked at but unchanged, keeps its own.
    old = connect_client("127.0.0.1", server.port, 5.0, timeout_s=10.0, deadline_s=4.0)
    (old_fd,) = [fd for fd, ms in _sockets_to(server.port) if ms == 4000]
    low, high = os.pipe()
    os.dup2(old_fd, high)  # closes the pipe's write end: the old socket now sits at low + 1
    os.close(low)
    try:
        client = connect_client("127.0.0.1", server.port, 5.0, timeout_s=10.0, deadline_s=2.5)
        after = dict(_sockets_to(server.port))
        assert after[low] == 2500  # the new client's socket took the hole
        assert after[high] == after[old_fd] == 4000  # the older socket was left as it was
        assert sorted(after.values()).count(2500) == 1
        client.set("k", "v")
        old.set("k", "w")
    finally:
        os.close(high)
