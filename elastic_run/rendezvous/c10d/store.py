"""The c10d store calls of the c10d backend: typed views, error translation, clients, reads.

What one request costs decides how a round scales (every node makes these calls), so the
reads are chosen per key (see ``c10d.py``'s module docstring for why):

- ``read_checked``: ``check`` then ``get``, for a key that may be absent and that someone may
  wait for (a TCPStore ``get`` itself waits for an absent key, and answers in two requests).
- ``peek``: one ``compare_set(key, X, X)``, for a key nobody waits for while it is absent, or
  for a key known to exist (a wait for it returned, a seal names it): it returns the value, or
  ``X`` without creating the key.

A client's link gets its read deadline (``c10d_link.set_link_deadline``) on the socket its
connect made. Connects of one process run one at a time, so that socket takes the lowest free
descriptor number or one just above: only those few numbers are looked at after the connect,
and only the sockets among them that no earlier connect set (a set of their ``socket:[inode]``
names: no reading of the numbers before the connect); the whole table is scanned only when none
of them is a socket to the store (a process holding a thousand nodes listed two thousand descriptors
twice per connect before: 7.5 s to build 1,024 handlers in one process, now 0.9 s).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from elastic_run.rendezvous.c10d.link import set_link_deadline
from elastic_run.rendezvous.errors import RendezvousConnectionError

if TYPE_CHECKING:
    from torch.distributed import Store, TCPStore

__all__ = [
    "NEVER_STORED",
    "KeyValueStore",
    "connect",
    "connect_client",
    "peek",
    "prefixed",
    "read_checked",
    "read_present",
    "translate",
]

# What a one-request read sends as both the expected and the new value: no record holds it.
NEVER_STORED = b"\x00elastic-run: never stored\x00"
_T = TypeVar("_T")
# Client connects of this process, one at a time, so the socket a connect made is found.
_CONNECT_LOCK = threading.Lock()
# The sockets (``socket:[inode]``) this process's connects gave a deadline: an older one among
# the numbers a connect looks at is left as it is, without reading the numbers before it.
_DEADLINED: set[str] = set()


class KeyValueStore(Protocol):
    """The c10d Store calls the backend makes, typed as the bindings accept them.

    torch's stubs type values as ``str``; the bindings take and return bytes.
    """

    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...
    def set(self, key: str, value: bytes) -> None: ...
    def multi_set(self, keys: list[str], values: list[bytes]) -> None: ...
    def add(self, key: str, delta: int) -> int: ...
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


def prefixed(prefix: str, store: Store) -> tuple[Store, KeyValueStore]:
    """``store`` seen under ``prefix``: the torch view and the same view typed for our calls."""
    from torch.distributed import PrefixStore

    view = PrefixStore(prefix, store)
    return view, cast(KeyValueStore, view)


def translate(endpoint: str) -> Callable[[Callable[[], _T]], _T]:
    """A caller that turns torch's store errors into ``RendezvousConnectionError``."""

    def call(fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except (RuntimeError, ValueError) as exc:  # torch's DistError subclasses RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RendezvousConnectionError(
                f"the c10d rendezvous store at {endpoint} failed: {first}"
            ) from exc

    return call


def read_checked(store: KeyValueStore, key: str) -> bytes | None:
    """A key that may be absent and may be waited for: ``check``, then ``get`` (3 requests)."""
    return bytes(store.get(key)) if store.check([key]) else None


def read_present(store: KeyValueStore, keys: list[str]) -> list[bytes | None]:
    """Several keys, some maybe absent: ``check`` the lot, ``multi_get`` what is there.

    When some are absent the keys are halved until each part is all there (one
    ``multi_get``) or a single absent key: a few absent keys among thousands cost a few
    dozen requests, not one per key.
    """
    if not keys:
        return []
    if store.check(keys):
        return [bytes(v) for v in store.multi_get(keys)]
    if len(keys) == 1:
        return [None]
    half = len(keys) // 2
    return read_present(store, keys[:half]) + read_present(store, keys[half:])


def peek(store: KeyValueStore, key: str) -> bytes | None:
    """One request: a key nobody waits for while absent, or one known to exist."""
    value = bytes(store.compare_set(key, NEVER_STORED, NEVER_STORED))
    return None if value == NEVER_STORED else value


def connect(
    host: str, port: int, timeout_s: float, *, master: bool, use_libuv: bool | None = None
) -> TCPStore:
    """A TCPStore server (``master``) or client, torch's ``use_libuv`` passed when given."""
    from torch.distributed import TCPStore

    options: dict[str, Any] = {} if use_libuv is None else {"use_libuv": use_libuv}
    return TCPStore(
        host,
        port,
        is_master=master,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        **options,
    )


def _target(fd: int) -> str | None:
    """What descriptor ``fd`` names now (``socket:[inode]``, a path...), None when closed."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _lowest_free_descriptor() -> int | None:
    """The number the next descriptor this process opens gets (the lowest free one)."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
    os.close(fd)
    return fd


# How many numbers above the lowest free one a connect's socket may take: torch may open and
# close a descriptor or two on the way (name lookup, a first address family that failed).
_CONNECT_SPAN = 8


def connect_client(
    host: str,
    port: int,
    connect_s: float,
    *,
    timeout_s: float,
    deadline_s: float,
    use_libuv: bool | None = None,
) -> TCPStore:
    """A TCPStore client whose link carries the read deadline ``deadline_s``.

    The numbers from the lowest free descriptor up (``_CONNECT_SPAN``) are read after the
    connect; the deadline goes on the sockets to the store among them that no connect of this
    process set before (another thread may have opened one of them meanwhile: a socket to the
    store gets the same deadline, which is right for it too). When there is none, every
    descriptor is looked at.

    Args:
        connect_s: how long the connect may take.
        timeout_s: the client's timeout for each call afterwards.
    """
    with _CONNECT_LOCK:
        lowest = _lowest_free_descriptor()
        window = range(lowest, lowest + _CONNECT_SPAN) if lowest is not None else range(0)
        store = connect(host, port, connect_s, master=False, use_libuv=use_libuv)
        fresh = {
            fd: target
            for fd in window
            if (target := _target(fd)) is not None
            and target.startswith("socket:")
            and target not in _DEADLINED
        }
        done = set_link_deadline(host, port, deadline_s, fds=fresh) if fresh else []
        if not done:
            done = set_link_deadline(host, port, deadline_s)
        _DEADLINED.update(t for fd in done if (t := fresh.get(fd) or _target(fd)) is not None)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store
