"""The round's store an agent is handed (``RendezvousInfo.store``), on the node's one link.

Our agent (its ranks' exchange, its exit barrier) and torch's (``RendezvousStoreInfo.build``,
its exit barrier: one wait of up to 300 s) block on this store. Were those waits one TCPStore
call each on the node's only connection (``shared_link.py``), its heartbeats would stand still
behind them and the other members would judge the node gone. So the store handed out is a torch
``Store`` written here: every call goes to the backend's client, and every call that may wait
(``wait``, and ``get``/``multi_get``, which wait on the server for an absent key) waits in the
link's slices first. Its errors are torch's, as a TCPStore's are (``DistStoreError`` when the
keys did not come in time), since torch's code catches those.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

from torch.distributed import DistStoreError, Store

from elastic_run.rendezvous.c10d.shared_link import SharedLink
from elastic_run.rendezvous.c10d.store import KeyValueStore

__all__ = ["LinkStore"]


class LinkStore(Store):
    """A torch ``Store`` over the backend's client whose waits are the link's slices.

    Args:
        client: the backend's client now (a link remade after a break is a new one).
        link: the client's link.
        timeout: the wait of a call that names none (the client's timeout).
    """

    def __init__(
        self, client: Callable[[], KeyValueStore], link: SharedLink, timeout: timedelta
    ) -> None:
        super().__init__()
        self._client = client
        self._link = link
        self.set_timeout(timeout)

    def _wait(self, keys: list[str], timeout: timedelta | None) -> None:
        limit = cast(Any, self).timeout if timeout is None else timeout  # stubs omit it

        def attempt(piece_s: float) -> bool:
            try:
                self._client().wait(keys, timedelta(seconds=piece_s))
            except DistStoreError:
                return False
            return True

        if not self._link.wait(attempt, limit.total_seconds()):
            ms = int(limit.total_seconds() * 1000)
            raise DistStoreError(f"wait timeout after {ms}ms, keys: {', '.join(keys)}")

    def set(self, key: str, value: Any) -> None:
        self._client().set(key, value)

    def get(self, key: str) -> bytes:
        self._wait([key], None)
        return self._client().get(key)

    def add(self, key: str, value: int) -> int:
        return self._client().add(key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._client().compare_set(key, expected_value, desired_value)

    def check(self, keys: list[str]) -> bool:
        return self._client().check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait(list(keys), timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._wait(list(keys), None)
        return self._client().multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._client().multi_set(keys, values)

    def delete_key(self, key: str) -> bool:
        return bool(cast(Any, self._client()).delete_key(key))

    def num_keys(self) -> int:
        return int(cast(Any, self._client()).num_keys())

    def append(self, key: str, value: Any) -> None:
        cast(Any, self._client()).append(key, value)
