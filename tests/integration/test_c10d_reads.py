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
    _descriptors,
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


def test_descriptors_lists_only_open_ones() -> None:
    read_end, write_end = os.pipe()
    try:
        listed = _descriptors()
        assert {read_end, write_end} <= listed
        # Every one listed is open: not the listing's own descriptor, closed when it returned.
        assert [fd for fd in sorted(listed) if not _is_open(fd)] == []
    finally:
        os.close(read_end)
        os.close(write_end)
    after = _descriptors()
    assert read_end not in after and write_end not in after


def _deadlines_to(port: int) -> list[int]:
    """TCP_USER_TIMEOUT (ms) of this process's sockets whose peer is ``port``."""
    found = []
    for fd in _descriptors():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
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
