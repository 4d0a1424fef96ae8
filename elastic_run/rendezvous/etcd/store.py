"""EtcdStore: a ``torch.distributed.Store`` kept in etcd v3 under a key prefix.

It follows torch's Store semantics: ``get``/``wait``/``multi_get`` block until the
keys exist or the store's timeout passes (by etcd watches, not polling), ``add``
keeps ASCII integers (atomic: a compare-and-swap on the key's revision),
``compare_set`` with an empty ``expected`` sets only an absent key. It is enough
for ``init_process_group(backend, store=EtcdStore(...), rank, world_size)``.

Invariant: every key this store touches lies under its prefix.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from torch.distributed import DistStoreError, Store
from typing_extensions import Unpack

from elastic_run.rendezvous.errors import RendezvousTimeoutError
from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.etcd.connection import ConnectionOptions
from elastic_run.rendezvous.etcd.kv import KeyValue

__all__ = [
    "DEFAULT_TIMEOUT",
    "EtcdStore",
    "EtcdStoreTimeoutError",
]

DEFAULT_TIMEOUT = timedelta(seconds=300)


class EtcdStoreTimeoutError(RendezvousTimeoutError, DistStoreError):
    """A blocking store call timed out (also a torch ``DistStoreError``, as torch's stores raise)."""


def _to_bytes(value: str | bytes | bytearray | Sequence[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class EtcdStore(Store):
    """A torch Store on etcd v3.

    The parameters are torch's, named and ordered as torch's ``EtcdStore`` (which takes an
    etcd v2 client); ``owns_client`` is ours.

    Args:
        etcd_client: the etcd client (shared; closed by ``close()`` only when ``owns_client``).
        etcd_store_prefix: the key prefix of this store (a trailing ``/`` is added when
            missing).
        timeout: how long blocking calls wait (torch's store timeout; None: 300 s).
        owns_client: whether ``close()`` closes ``etcd_client``.
    """

    def __init__(
        self,
        etcd_client: EtcdClient,
        etcd_store_prefix: str,
        timeout: timedelta | None = None,
        owns_client: bool = False,
    ) -> None:
        super().__init__()
        prefix = etcd_store_prefix
        self._client = etcd_client
        self._prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._owns_client = owns_client
        self._timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.set_timeout(self._timeout)

    @classmethod
    def connect(
        cls,
        endpoints: Sequence[str],
        prefix: str,
        timeout: timedelta = DEFAULT_TIMEOUT,
        **client_kwargs: Unpack[ConnectionOptions],
    ) -> EtcdStore:
        """Open a store with its own client on ``endpoints`` (closed with the store).

        Args:
            endpoints: ``host:port`` strings.
            prefix: the key prefix.
            timeout: the store timeout.
            **client_kwargs: TLS, credentials and timeouts for ``EtcdClient``.

        Returns:
            The store.
        """
        client = EtcdClient(list(endpoints), **client_kwargs)
        return cls(client, prefix, timeout, owns_client=True)

    @property
    def prefix(self) -> str:
        """The key prefix of this store."""
        return self._prefix

    @property
    def timeout(self) -> timedelta:
        """How long blocking calls wait."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set how long blocking calls wait."""
        super().set_timeout(timeout)
        self._timeout = timeout

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _timeout_s(self, timeout: timedelta | None = None) -> float:
        value = timeout if timeout is not None else self.timeout
        return float(value.total_seconds())

    # -- torch Store API ---------------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key``."""
        self._client.put(self._key(key), _to_bytes(value))

    def get(self, key: str) -> bytes:
        """Return the value of ``key``, waiting until it exists (up to the timeout).

        Raises:
            EtcdStoreTimeoutError: when the key does not appear in time.
        """
        return self._wait_values([key], self._timeout_s())[0]

    def add(self, key: str, num: int) -> int:
        """Atomically add ``num`` to the integer at ``key`` (0 when absent); return the result."""
        return self._client.atomic_add(self._key(key), int(num))

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` ("" : absent).

        Returns:
            The value after the call; for an absent key with a non-empty
            ``expected_value``, ``expected_value`` (as torch's stores answer).
        """
        expected = _to_bytes(expected_value)
        desired = _to_bytes(desired_value)
        full = self._key(key)
        while True:
            current = self._client.get(full)
            if current is None:
                if expected:
                    return expected
                written, now = self._client.create_if_absent(full, desired)
                if written:
                    return desired
                current = now
            if current.value != expected:
                return current.value
            written, now = self._client.put_if_mod_revision(full, current.mod_revision, desired)
            if written:
                return desired

    def wait(self, keys: Sequence[str], override_timeout: timedelta | None = None) -> None:
        """Block until every key in ``keys`` exists.

        Args:
            keys: the keys to wait for.
            override_timeout: how long to wait (None: the store's timeout), torch's name.

        Raises:
            EtcdStoreTimeoutError: when they do not all exist within the timeout.
        """
        self._wait_values(list(keys), self._timeout_s(override_timeout))

    def check(self, keys: Sequence[str]) -> bool:
        """Return whether every key in ``keys`` exists (never blocks)."""
        values, _ = self._client.get_many([self._key(k) for k in keys])
        return all(v is not None for v in values)

    def num_keys(self) -> int:
        """Return the number of keys in this store."""
        return self._client.count_prefix(self._prefix)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        return self._client.delete(self._key(key))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """Return the values of ``keys``, waiting until all exist (up to the timeout)."""
        return self._wait_values(list(keys), self._timeout_s())

    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None:
        """Store several values in one transaction."""
        self._client.put_many(
            [(self._key(k), _to_bytes(v)) for k, v in zip(keys, values, strict=True)]
        )

    def append(self, key: str, value: str | bytes) -> None:
        """Append ``value`` to the bytes at ``key`` (creating it when absent), atomically."""
        full = self._key(key)
        extra = _to_bytes(value)
        while True:
            current = self._client.get(full)
            base = current.value if current is not None else b""
            revision = current.mod_revision if current is not None else 0
            written, _ = self._client.put_if_mod_revision(full, revision, base + extra)
            if written:
                return

    def list_keys(self) -> list[str]:
        """Return every key of this store (without the prefix)."""
        found, _ = self._client.get_prefix(self._prefix)
        return [kv.key[len(self._prefix) :] for kv in found]

    def has_extended_api(self) -> bool:
        """Return True: ``append``, ``multi_get`` and ``multi_set`` are implemented."""
        return True

    def close(self) -> None:
        """Close the client when this store owns it. Idempotent."""
        if self._owns_client:
            self._client.close()

    # -- blocking reads by watches -----------------------------------------------------

    def _wait_values(self, keys: list[str], timeout_s: float) -> list[bytes]:
        full = [self._key(k) for k in keys]
        deadline = time.monotonic() + timeout_s
        while True:
            found, revision = self._client.get_many(full)
            missing = [k for k, kv in zip(full, found, strict=True) if kv is None]
            if not missing:
                return [kv.value for kv in found if isinstance(kv, KeyValue)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = ", ".join(k[len(self._prefix) :] for k in missing[:5])
                raise EtcdStoreTimeoutError(
                    f"etcd store {self._client.endpoint}{self._prefix}: timed out after "
                    f"{timeout_s:g} s waiting for key(s) {names}"
                )
            # Any change to the first missing key wakes us; then everything is re-read.
            self._client.watch(missing[0], start_revision=revision + 1, timeout_s=remaining)
