"""Counters on etcd: their wire format, and the transactions that move them.

A counter is stored as the JSON ``{"counter_base": B}`` and reads as ``B + version - 1``,
where ``version`` is etcd's count of puts since the key was created. A put that keeps the
value (``ignore_value``) bumps the version, so adding 1 is one transaction that never loses
a race (``add_one``, ``add_one_leased``); other deltas rewrite the base in a compare-and-swap
loop (``add_by_swap``). A plain ASCII integer at a key also counts (a value written by hand,
or by ``CounterClient.atomic_add``).

Invariants: a counter reads the same through any client (etcdctl shows readable JSON);
``stored_count`` raises ``RendezvousError`` for a value that is neither form; the operations
here go through ``CounterClient.call`` like every other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pyetcd

from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.etcd.kv import KeyValue, kv_from_proto, range_request

_T = TypeVar("_T")


class CounterClient(Protocol):
    """What the counter transactions need of a client (``client.EtcdClient`` has it): the
    counters are called by the client, so they name its shape, not its module."""

    def rpc_timeout_s(self, deadline_s: float | None) -> float: ...

    def call(
        self, what: str, fn: Callable[[Any], _T], *, deadline_s: float | None = None
    ) -> _T: ...

    def get(self, key: str) -> KeyValue | None: ...

    def put_if_mod_revision(
        self, key: str, mod_revision: int, value: bytes, lease_id: int | None = None
    ) -> tuple[bool, KeyValue]: ...


__all__ = [
    "CounterClient",
    "add_by_swap",
    "add_one",
    "add_one_leased",
    "counter_value",
    "encode_counter",
    "stored_count",
]

_COUNTER_PREFIX = b'{"counter_base":'


def encode_counter(base: int) -> bytes:
    """The stored form of a counter whose value is ``base`` at version 1 (readable JSON)."""
    return _COUNTER_PREFIX + str(base).encode() + b"}"


def counter_value(kv: KeyValue) -> int | None:
    """The value of a counter (see the module docstring); None for any other value."""
    if not kv.value.startswith(_COUNTER_PREFIX) or not kv.value.endswith(b"}"):
        return None
    try:
        base = int(kv.value[len(_COUNTER_PREFIX) : -1].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return base + kv.version - 1


def stored_count(key: str, kv: KeyValue | None) -> int:
    """The count at a key: 0 when absent, a counter's value, or a plain ASCII integer.

    Args:
        key: the key, for the message.
        kv: the key as read (None: absent).

    Returns:
        The count.

    Raises:
        RendezvousError: when the key holds anything else.
    """
    if kv is None:
        return 0
    counted = counter_value(kv)
    if counted is not None:
        return counted
    try:
        return int(kv.value.decode() or "0")
    except (UnicodeDecodeError, ValueError):
        raise RendezvousError(
            f"etcd key '{key}' holds {kv.value[:40]!r}, not a counter or an integer"
        ) from None


def add_by_swap(
    client: CounterClient, key: str, delta: int, lease_id: int | None, *, as_counter: bool
) -> int:
    """Read the count at ``key`` (a counter or a plain integer), write it plus ``delta``.

    A compare-and-swap loop on the key's mod revision: correct under any concurrency.

    Args:
        client: the client.
        key: the key.
        delta: what to add.
        lease_id: the lease to bind the key to (None: the lease it has, if any).
        as_counter: write the counter form (whose base accounts for the version this put
            brings) instead of a plain integer.

    Returns:
        The count after the call.

    Raises:
        RendezvousError: when the key holds something other than a counter or an integer.
    """
    while True:
        current = client.get(key)
        result = stored_count(key, current) + delta
        if as_counter:
            version_after = current.version + 1 if current is not None else 1
            value = encode_counter(result - (version_after - 1))
        else:
            value = str(result).encode()
        # A put without a lease would detach the key from its lease: keep it.
        lease = lease_id
        if lease is None and current is not None and current.lease_id:
            lease = current.lease_id
        written, _ = client.put_if_mod_revision(
            key, current.mod_revision if current is not None else 0, value, lease
        )
        if written:
            return result


def add_one(client: CounterClient, key: str) -> KeyValue:
    """Create ``key`` as a counter at 1, or put it again keeping value and lease (one txn).

    Returns:
        The key as stored after the call.
    """
    rpc = pyetcd.etcdrpc
    exists = rpc.Compare(
        result=rpc.Compare.GREATER, target=rpc.Compare.CREATE, key=key.encode(), create_revision=0
    )
    again = rpc.PutRequest(key=key.encode(), ignore_value=True, ignore_lease=True)
    anew = rpc.PutRequest(key=key.encode(), value=encode_counter(1))
    return _put_then_read(client, f"add to '{key}'", key, exists, again, anew, None)


def add_one_leased(
    client: CounterClient, key: str, lease_id: int, deadline_s: float | None = None
) -> int:
    """Add 1 to the counter at ``key``, bound to ``lease_id`` (one txn; see ``CounterClient``).

    Returns:
        The counter's value after the call.

    Raises:
        EtcdLeaseNotFoundError: when etcd no longer knows ``lease_id``.
        RendezvousConnectionError: when etcd does not answer by ``deadline_s``.
    """
    rpc = pyetcd.etcdrpc
    bound = rpc.Compare(
        result=rpc.Compare.EQUAL, target=rpc.Compare.LEASE, key=key.encode(), lease=lease_id
    )
    again = rpc.PutRequest(key=key.encode(), ignore_value=True, ignore_lease=True)
    anew = rpc.PutRequest(key=key.encode(), value=encode_counter(1), lease=lease_id)
    kv = _put_then_read(client, f"bump '{key}'", key, bound, again, anew, deadline_s)
    value = counter_value(kv)
    if value is None:
        raise RendezvousError(f"etcd key '{key}' holds {kv.value[:40]!r}, not a counter")
    return value


def _put_then_read(
    client: CounterClient,
    what: str,
    key: str,
    compare: Any,
    on_true: Any,
    on_false: Any,
    deadline_s: float | None,
) -> KeyValue:
    """One transaction: put ``on_true`` if ``compare`` holds, else ``on_false``; read ``key``."""
    rpc = pyetcd.etcdrpc

    def op(c: Any) -> Any:
        read = rpc.RequestOp(request_range=range_request(key))
        return c.kvstub.Txn(
            rpc.TxnRequest(
                compare=[compare],
                success=[rpc.RequestOp(request_put=on_true), read],
                failure=[rpc.RequestOp(request_put=on_false), read],
            ),
            client.rpc_timeout_s(deadline_s),
            credentials=c.call_credentials,
            metadata=c.metadata,
        )

    if deadline_s is None:
        resp = client.call(what, op)
    else:
        resp = client.call(what, op, deadline_s=deadline_s)
    kvs = resp.responses[1].response_range.kvs
    if not kvs:
        raise RendezvousError(f"etcd key '{key}' vanished while it was counted")
    return kv_from_proto(kvs[0])
