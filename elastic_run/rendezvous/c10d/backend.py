"""C10dRendezvousBackend: the rendezvous key-value seam on a c10d TCPStore (or FileStore).

The embedded default. One agent hosts the TCPStore at ``--rdzv-endpoint`` (the first to
bind the port when ``is_host`` is left to chance); the others connect as clients. Keys
live under ``elastic-run/<run id>/`` so several jobs can share one store.

Two client connections per agent: TCPStore serialises the calls of one client, so the
blocking waits (``wait_for`` and the round store the agent blocks on) use their own
connection and never hold up the heartbeat thread. A process holding many nodes of one store
(a benchmark's simulated nodes) gives its first few nodes a short-call link each and shares
those between the rest (``short_links``): about one connection a node there. Their links carry
read deadlines and are remade after they broke (``c10d_link``; the call raises
``RendezvousUnreachableError``).

No key is ever deleted. A TCPStore ``get`` or ``multi_get`` waits (up to the store's timeout)
for a key that does not exist, so a read that checks first and fetches second would block for
a minute when a delete lands in between. A node that leaves therefore overwrites its heartbeat
counter with ``HEARTBEAT_GONE`` (a negative counter, read as "gone").

A read is ``check`` then ``get`` (or ``multi_get``): three requests, as a TCPStore ``get`` waits
for its key first. Keys that nobody ever waits for while absent (heartbeats, the epoch, the
round, the closed and lost records) and keys known to exist (a seal whose wait returned, the
records a seal names) are read in one request that never blocks and never parses the value on
the server (``get_unwaited``, ``read_counter``): ``compare_set(key, X, X)`` returns the value,
or ``X`` (a value no record holds) without creating the key. It is not used for keys that may
be absent while someone waits for them (a seal, an arrival count, a record being written): on
a missing key the server wakes every client waiting for it, so a waiter would see a seal that
does not exist. The helpers live in ``c10d_store.py``.

Heartbeats are written as ``compare_set(previous, next)`` of this node's own counter (a
``set`` when something else stood there), never ``add``: the TCPStore server parses the stored
value on ``add`` and drops the client's connection when it is not an integer, so a garbage
value under a node's key would cut that node off its store. Only the node itself writes its
heartbeat key, so no atomic increment is needed. Nor a bare ``set``: it is never answered, so
over a silent partition it "succeeds" into the socket's buffer; a compare_set that returned
was stored. The values are one rising sequence of the process, so a node's value changes at each
beat whoever writes it. A process holding many nodes of one job beats them together
(``heartbeat_many``, through one of their clients): one ``multi_set`` and one read after it on
the same connection, whose answer says the batch landed (a connection's requests are served in
order): two requests a second for a thousand nodes instead of a thousand.

``store_type=file`` (as torch allows) puts the store in a torch FileStore at the path
given as the endpoint (a shared file system for several hosts); nobody hosts anything.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend, heartbeat_values
from elastic_run.rendezvous.c10d.descriptors import raise_for_store
from elastic_run.rendezvous.c10d.link import (
    is_link_failure,
    is_local_host,
    is_unreachable,
    probe_link,
)
from elastic_run.rendezvous.c10d.short_links import LinkLease, take_short_link
from elastic_run.rendezvous.c10d.store import (
    KeyValueStore,
    connect,
    connect_client,
    peek,
    prefixed,
    read_checked,
    read_present,
    translate,
)
from elastic_run.rendezvous.endpoints import C10D_DEFAULT_PORT, parse_rendezvous_endpoint
from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousUnreachableError
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import HEARTBEAT_GONE, decode_int
from elastic_run.rendezvous.settings import BACKEND_KEYS, DEFAULT_READ_TIMEOUT_S, RendezvousSettings

if TYPE_CHECKING:
    from torch.distributed import Store, TCPStore

__all__ = [
    "CONF_KEYS",
    "DEFAULT_PORT",
    "C10dRendezvousBackend",
    "create_backend",
    "create_c10d_backend",
    "is_local_host",
]

DEFAULT_PORT = C10D_DEFAULT_PORT
CONF_KEYS = BACKEND_KEYS["c10d"]
_T = TypeVar("_T")
log = logging.getLogger(__name__)
# Heartbeat values of this process: one rising sequence, so a node's value changes at every
# beat whichever of the process's backends writes it (its own, or a batch's: heartbeat_many).
_BEAT_SEQUENCE = itertools.count(1)
# The value each node of this process wrote last, by (endpoint, prefix, node id): what its next
# compare_set expects.
_LAST_BEATS: dict[tuple[str, str, str], bytes] = {}


def _next_beat() -> bytes:
    return str(next(_BEAT_SEQUENCE)).encode()


class C10dRendezvousBackend(RendezvousBackend):
    """The rendezvous backend on a c10d store (TCPStore).

    Args:
        store: a client (or the server's own store) for short calls.
        run_id: the job id; keys live under ``elastic-run/<run_id>/``.
        endpoint: ``host:port`` for messages (None, as torch's two-argument form: taken from
            ``store``, whose clone then serves the blocking waits).
        waiter: a second client for blocking waits, or a factory for one (made on first use).
        read_timeout_s: how long one store call may take.
        server: the TCPStore object this agent hosts, kept alive with the backend.
        reconnect: makes a fresh client after a call failed on a broken link (a partition);
            None: a broken link stays broken.
        on_close: called once by ``close`` (gives a shared short-call link back).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        endpoint: str | None = None,
        *,
        waiter: Store | Callable[[], Store] | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        server: Store | None = None,
        reconnect: Callable[[], Store] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        if not run_id:
            raise ConfigurationError("the rendezvous id (--rdzv-id) must not be empty")
        if endpoint is None:
            endpoint, waiter = _from_store(store, waiter)
        self._prefix = f"elastic-run/{run_id}/"
        self._store_view, self._store = prefixed(self._prefix, store)
        self._waiter_source = waiter
        self._waiter: tuple[Store, KeyValueStore] | None = None
        self._waiter_lock = threading.Lock()
        self._endpoint = endpoint
        self._read_timeout_s = read_timeout_s
        self._server = server
        self._is_file = endpoint.startswith("file:")
        self._translate = translate(endpoint)
        self._beats: dict[str, int] = {}
        self._reconnect = reconnect
        self._on_close = on_close
        self._generation = 0
        self._remake_lock = threading.Lock()

    def _call(self, fn: Callable[[], _T]) -> _T:
        generation = self._generation
        try:
            return self._translate(fn)
        except RendezvousConnectionError as exc:
            if self._reconnect is None or not is_link_failure(exc.__cause__ or exc):
                raise
            self._remake(generation)
            raise RendezvousUnreachableError(f"{exc}; connected again") from exc

    def _remake(self, generation: int) -> None:
        """Replace a client whose link broke (once per break, whichever thread sees it)."""
        with self._remake_lock:
            if generation != self._generation or self._reconnect is None:
                return
            try:
                store = self._reconnect()
            except (RuntimeError, ValueError, OSError) as exc:
                why = f"the c10d rendezvous store at {self._endpoint} cannot be reached: {exc}"
                if is_unreachable(exc):
                    raise RendezvousUnreachableError(why.splitlines()[0]) from exc
                raise RendezvousConnectionError(why.splitlines()[0]) from exc
            self._store_view, self._store = prefixed(self._prefix, store)
            with self._waiter_lock:
                self._waiter = None
            self._generation += 1

    CONF_KEYS = CONF_KEYS

    @property
    def store(self) -> Store:
        """The torch store under the backend's prefix (what torch's ``create_backend`` hands
        out beside the backend)."""
        view = self._store_view
        return cast("Store", getattr(view, "underlying_store", view))

    @property
    def name(self) -> str:
        return "c10d"

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def is_hosting(self) -> bool:
        """Whether this process hosts the TCPStore (it must outlive the job's other agents)."""
        return self._server is not None

    def open_waiter(self) -> None:
        """Open the connection for blocking waits now rather than at the first wait.

        Raises:
            RendezvousConnectionError: the store cannot be reached.
        """
        self._waiting_store()

    def _waiting_store(self) -> tuple[Store, KeyValueStore]:
        with self._waiter_lock:
            if self._waiter is None:
                source = self._waiter_source
                if source is None:
                    self._waiter = (self._store_view, self._store)
                else:
                    raw = self._call(source) if callable(source) else source
                    self._waiter = prefixed(self._prefix, raw)
            return self._waiter

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: read_checked(self._store, key))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return self._call(lambda: read_present(self._store, list(keys)))

    def get_unwaited(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._call(lambda: [peek(self._store, k) for k in keys])

    def read_counter(self, key: str) -> int:
        raw = self._call(lambda: peek(self._store, key))
        return decode_int(key, raw) if raw is not None else 0

    def set(self, key: str, value: bytes) -> None:
        self._call(lambda: self._store.set(key, value))

    def set_many(self, items: Mapping[str, bytes]) -> None:
        if items:
            self._call(lambda: self._store.multi_set(list(items), list(items.values())))

    def add(self, key: str, delta: int) -> int:
        return int(self._call(lambda: self._store.add(key, delta)))

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        # TCPStore's compare_set treats an empty expected value as "absent". It returns the
        # value stored after the call, so "did I write it" reads as "is it what I wrote";
        # every caller writes values that name their writer, so two writers never collide.
        stored = bytes(self._call(lambda: self._store.compare_set(key, expected or b"", desired)))
        if expected is not None and stored == expected and expected != desired:
            return stored, False
        return stored, stored == desired

    def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        from torch.distributed import DistNetworkError, DistStoreError

        _, waiter = self._waiting_store()

        def wait() -> bool:
            try:
                waiter.wait(list(keys), timedelta(seconds=max(timeout_s, 0.001)))
            except DistNetworkError:
                raise
            except DistStoreError:
                return False  # TCPStore: the keys did not come in time
            except RuntimeError:
                if self._is_file:
                    return False  # a FileStore's only failure to wait is its timeout
                raise
            return True

        return self._call(wait)

    def heartbeat(self, node_id: str) -> None:
        # compare_set, not set: the store answers it, so a cut-off node learns it (docstring).
        key, value = keys.heartbeat(node_id), _next_beat()
        expected = _LAST_BEATS.get((self._endpoint, self._prefix, node_id), b"")
        if bytes(self._call(lambda: self._store.compare_set(key, expected, value))) != value:
            self.set(key, value)  # garbage, the gone mark or a batch's beat stood there
        _LAST_BEATS[(self._endpoint, self._prefix, node_id)] = value

    def beat_batch_key(self) -> Hashable | None:
        return None if self._is_file else ("c10d", self._endpoint, self._prefix)

    def heartbeat_many(self, node_ids: Sequence[str]) -> None:
        # One multi_set (never answered) and one read after it on the same connection: the
        # store serves a connection's requests in order, so the answer says the beats landed.
        if len(node_ids) <= 1:
            for node_id in node_ids:
                self.heartbeat(node_id)
            return
        hb_keys = [keys.heartbeat(n) for n in node_ids]
        values = [_next_beat() for _ in node_ids]

        def beat() -> None:
            self._store.multi_set(hb_keys, values)
            peek(self._store, hb_keys[-1])

        self._call(beat)
        for node_id, value in zip(node_ids, values, strict=True):
            _LAST_BEATS[(self._endpoint, self._prefix, node_id)] = value

    def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        hb_keys = [keys.heartbeat(n) for n in node_ids]
        if len(hb_keys) <= 2:
            values = self._call(lambda: [peek(self._store, k) for k in hb_keys])
        else:
            values = self.get_many(hb_keys)
        return heartbeat_values(node_ids, values, f"c10d {self._endpoint}")

    def forget_node(self, node_id: str) -> None:
        # Overwrite, never delete: see the module docstring.
        self.set(keys.heartbeat(node_id), str(HEARTBEAT_GONE).encode())

    def round_store(self, prefix: str) -> Store:
        view, _ = self._waiting_store()
        return prefixed(prefix, view)[0]

    def close(self) -> None:
        # TCPStore objects close their sockets when collected; drop our references.
        self._waiter = None
        self._waiter_source = None
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


def _create_file_backend(params: RendezvousParameters, timeout_s: float) -> C10dRendezvousBackend:
    """A backend on a torch FileStore at the endpoint path (torch's ``store_type=file``)."""
    import tempfile

    from torch.distributed import FileStore

    path = params.endpoint
    if not path:
        try:
            handle, path = tempfile.mkstemp(prefix="elastic-run-rdzv-")
        except OSError as exc:
            raise RendezvousConnectionError(
                f"cannot create a file for the c10d file store: {exc}"
            ) from exc
        os.close(handle)
    try:
        # -1: no fixed number of users, so the file is never deleted under a late joiner.
        store = FileStore(path, -1)
        store.set_timeout(timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as exc:
        raise RendezvousConnectionError(
            f"cannot open the c10d file store at {path}: {exc}"
        ) from exc
    return C10dRendezvousBackend(
        store,
        params.run_id,
        f"file:{path}",
        waiter=lambda: FileStore(path, -1),
        read_timeout_s=timeout_s,
    )


def _port_in_use(exc: BaseException) -> bool:
    text = str(exc)
    return (
        "EADDRINUSE" in text
        or "address already in use" in text.lower()
        or (isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE)
    )


def create_c10d_backend(
    params: RendezvousParameters, *, allow_hosting: bool = True
) -> C10dRendezvousBackend:
    """Build a ``C10dRendezvousBackend`` from ``--rdzv-endpoint`` and ``--rdzv-conf``.

    The endpoint is ``host[:port]`` (port 29400 when none is named; no endpoint at all is
    ``localhost:29400``, as torch reads it).
    Config keys: ``is_host`` (true: host the store, fail if the port is taken; false:
    connect only; unset: host when the endpoint is this machine and its port is free),
    ``read_timeout`` (s, default 60; 300 for a file store, as torch's), ``use_libuv`` (the TCPStore's server loop, default
    torch's), ``store_type`` (``tcp``, or ``file``: a FileStore at the path given as
    the endpoint, or at a new temporary file when the endpoint is empty).

    Args:
        params: the rendezvous parameters.
        allow_hosting: False for readers such as ``elastic-run status``.

    Raises:
        ConfigurationError: a bad endpoint or config value.
        RendezvousConnectionError: the store cannot be hosted or reached.
    """
    settings = RendezvousSettings.from_params(params)
    store_type = settings.store_type
    timeout_s = settings.read_timeout_s
    if store_type == "file":
        return _create_file_backend(params, timeout_s)
    if store_type != "tcp":
        raise ConfigurationError(
            f"the c10d rendezvous supports store_type=tcp or file, not '{store_type}'"
        )
    # torch's rule: no endpoint is localhost at the default port.
    host, port = parse_rendezvous_endpoint(params.endpoint, C10D_DEFAULT_PORT)
    use_libuv = settings.use_libuv
    is_host = settings.is_host if allow_hosting else False
    if port == 0 and is_host is not True:
        if is_host is False or not allow_hosting:
            raise ConfigurationError("--rdzv-endpoint port 0 (pick a free port) needs to host")
        is_host = True
    want_host = is_host if is_host is not None else is_local_host(host)

    server: TCPStore | None = None
    if want_host:
        # Before the server starts: its clients' connections are this process's descriptors.
        budget = raise_for_store(params.max_nodes)
        try:
            server = connect(host, port, timeout_s, master=True, use_libuv=use_libuv)
        except (RuntimeError, OSError) as exc:
            if not _port_in_use(exc):
                raise RendezvousConnectionError(
                    f"cannot host the c10d rendezvous store on {host}:{port}: {exc}"
                ) from exc
            if is_host is True:
                raise RendezvousConnectionError(
                    f"cannot host the c10d rendezvous store on {host}:{port}: "
                    "the port is in use (is_host=true)"
                ) from exc
    # Data unacknowledged for heartbeat_timeout (at most the heartbeat budget and the read
    # timeout) resets a link (see c10d_link): a heartbeat completes, or fails, within it.
    deadline_s = settings.heartbeat_deadline_s

    def client_of(connect_s: float, probe: bool = False) -> TCPStore:
        if probe:
            probe_link(host, port, connect_s)
        return connect_client(
            host, port, connect_s, timeout_s=timeout_s, deadline_s=deadline_s, use_libuv=use_libuv
        )

    port = port if server is None else server.port
    endpoint = f"{host}:{port}"
    if server is not None:
        shortfall = budget.shortfall(endpoint)
        if shortfall is not None:
            log.warning("%s", shortfall)  # one line, before any round
    client: Store | None = server
    lease: LinkLease | None = None
    if client is None:
        try:
            # The short calls' link: this node's own, or one its process's nodes share
            # (short_links). A link that broke is remade with short connects: a healed
            # partition is seen at once.
            lease = take_short_link(
                (host, port, use_libuv, timeout_s, deadline_s),
                lambda: client_of(timeout_s),
                lambda: client_of(deadline_s, probe=True),
            )
        except (RuntimeError, OSError) as exc:
            raise RendezvousConnectionError(
                f"cannot reach the c10d rendezvous store at {endpoint} within {timeout_s:g} s"
                " (is the first node up, and is that port a rendezvous store?)"
            ) from exc
        client = lease.client
    backend = C10dRendezvousBackend(
        client,
        params.run_id,
        endpoint,
        waiter=lambda: client_of(timeout_s),
        read_timeout_s=timeout_s,
        server=server,
        reconnect=None if lease is None else lease.renew,
        on_close=None if lease is None else lease.release,
    )
    if allow_hosting:  # an agent: both connections now, so joining a round connects nothing
        backend.open_waiter()
    return backend


# -- torch's module-level API (torch.distributed.elastic.rendezvous.c10d_rendezvous_backend) --


def _from_store(
    store: Store, waiter: Store | Callable[[], Store] | None
) -> tuple[str, Store | Callable[[], Store] | None]:
    """The endpoint of a store given alone, and a second client for the blocking waits."""
    from torch.distributed import FileStore, TCPStore

    if isinstance(store, TCPStore):
        timeout_s = cast(Any, store).timeout.total_seconds()  # torch's stubs omit it
        if waiter is None:
            waiter = functools.partial(connect, store.host, store.port, timeout_s, master=False)
        return f"{store.host}:{store.port}", waiter
    if isinstance(store, FileStore):
        path = str(cast(Any, store).path)  # torch's stubs omit it
        return f"file:{path}", waiter if waiter is not None else (lambda: FileStore(path, -1))
    return type(store).__name__, waiter


def create_backend(params: RendezvousParameters) -> tuple[C10dRendezvousBackend, Store]:
    """Build a c10d backend and its store from ``params`` (torch's ``create_backend``).

    Reads ``store_type`` (``tcp`` or ``file``), ``read_timeout`` (positive seconds, default
    60) and ``is_host``, as :func:`create_c10d_backend` does.

    Args:
        params: the rendezvous parameters.

    Returns:
        The backend, and the whole store it runs on (a TCPStore or a FileStore, not the
        backend's prefixed view).

    Raises:
        ConfigurationError: a bad ``store_type``, ``read_timeout`` or endpoint (a ValueError).
        RendezvousConnectionError: the store cannot be hosted, reached or opened.
    """
    backend = create_c10d_backend(params)
    return backend, backend.store
