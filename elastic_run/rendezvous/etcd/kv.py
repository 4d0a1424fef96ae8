"""What the etcd adapter hands out: a stored key (``KeyValue``) and a watch event.

Plain frozen dataclasses, built from pyetcd's protobuf messages by ``kv_from_proto`` and
``kv_from_meta``; nothing above the adapter sees a protobuf or a pyetcd object. The one message
the adapter builds itself, a range read, is made here too (``range_request``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyetcd

__all__ = ["KeyValue", "WatchEvent", "kv_from_meta", "kv_from_proto", "range_request"]


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease_id: int
    version: int = 0  # puts since the key was created (1 after the first)


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch: a put (``is_delete`` False) or a delete."""

    key: str
    value: bytes
    mod_revision: int
    is_delete: bool


def kv_from_proto(kv: Any) -> KeyValue:
    """A KeyValue from the protobuf ``mvccpb.KeyValue`` of a raw response."""
    return KeyValue(
        key=bytes(kv.key).decode(),
        value=bytes(kv.value),
        mod_revision=int(kv.mod_revision),
        create_revision=int(kv.create_revision),
        lease_id=int(kv.lease),
        version=int(kv.version),
    )


def kv_from_meta(value: bytes, meta: Any) -> KeyValue:
    """A KeyValue from pyetcd's ``(value, KVMetadata)`` pair (its transaction results)."""
    return KeyValue(
        key=bytes(meta.key).decode(),
        value=bytes(value),
        mod_revision=int(meta.mod_revision),
        create_revision=int(meta.create_revision),
        lease_id=int(meta.lease_id),
        version=int(meta.version),
    )


def range_request(
    key: str, *, limit: int = 0, revision: int = 0, serializable: bool = False
) -> Any:
    """etcd's RangeRequest for one key (0: no limit, the latest revision).

    Args:
        key: the key, as text.
        limit: the most keys to return (0: all).
        revision: the revision to read at (0: the latest).
        serializable: let any member answer, leader or not.

    Returns:
        The protobuf message, for a KV stub's ``Range`` or a transaction's ``RequestOp``.
    """
    return pyetcd.etcdrpc.RangeRequest(
        key=key.encode(), limit=limit, revision=revision, serializable=serializable
    )
