"""RendezvousHandlerRegistry: backend name -> handler factory (as torch's registry).

Built in: ``c10d`` (the embedded TCPStore), ``etcd`` and ``etcd-v2`` (etcd v3 underneath:
the names torch users type), ``embedded-etcd`` (etcd members run by the agents of the listed
hosts), ``static``. A package can add a backend through the entry
point group ``elastic_run.rendezvous``: the entry point's name is the backend name and its
object a callable ``(RendezvousParameters) -> RendezvousHandler``.
The other direction, our handlers under plain ``torchrun`` (torch's group ``torchrun.handlers``),
is ``torchrun_plugin.py``.

As torch's registry: an unknown backend is a ``ValueError`` (our ``ConfigurationError``), and a
creator that returns a handler of another backend is a ``RuntimeError``
(``RendezvousBackendMismatchError``); ``etcd-v2`` builds an ``etcd`` handler, which matches.
``get_rendezvous_handler(params)`` builds one with the default registry.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousHandler, RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend

__all__ = [
    "ENTRY_POINT_GROUP",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "create_backend",
    "RendezvousBackendMismatchError",
    "create_rendezvous_handler",
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]

ENTRY_POINT_GROUP = "elastic_run.rendezvous"
RendezvousHandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]
# Backend names that build a handler of another name (torch users' etcd-v2 is etcd v3 here).
_BUILDS = {"etcd-v2": "etcd"}


class RendezvousBackendMismatchError(ConfigurationError, RuntimeError):
    """A creator built a handler of another backend than the one asked for (torch: RuntimeError)."""


def create_backend(
    params: RendezvousParameters, *, allow_hosting: bool = True
) -> RendezvousBackend:
    """Build the key-value backend named by ``params.backend`` (c10d, etcd or embedded-etcd).

    Args:
        allow_hosting: False for readers (``status``, ``close``): never host a c10d store
            or start an embedded etcd member.

    Raises:
        ConfigurationError: the backend has no key-value store (static) or is unknown.
    """
    name = params.backend
    if name == "c10d":
        from elastic_run.rendezvous.c10d.backend import create_c10d_backend

        return create_c10d_backend(params, allow_hosting=allow_hosting)
    if name in ("etcd", "etcd-v2"):
        from elastic_run.rendezvous.etcd.backend import create_etcd_backend

        return create_etcd_backend(params)
    if name == "embedded-etcd":
        from elastic_run.rendezvous.embedded.backend import create_embedded_backend

        return create_embedded_backend(params, allow_hosting=allow_hosting)
    raise ConfigurationError(
        f"the rendezvous backend '{name}' has no store to read (use c10d, etcd or embedded-etcd)"
    )


def _dynamic(params: RendezvousParameters) -> RendezvousHandler:
    from elastic_run.rendezvous.dynamic.handler import create_handler
    from elastic_run.rendezvous.settings import RendezvousSettings

    RendezvousSettings.from_params(params)  # reject bad values before touching the network
    backend = create_backend(params)
    try:
        return create_handler(None, backend, params)
    except BaseException:
        backend.close()
        raise


def _static(params: RendezvousParameters) -> RendezvousHandler:
    from elastic_run.rendezvous.static import create_rdzv_handler

    return create_rdzv_handler(params)


class RendezvousHandlerRegistry:
    """Maps backend names to the factories that build their handlers."""

    def __init__(self) -> None:
        self._creators: dict[str, RendezvousHandlerCreator] = {}
        self._plugins_loaded = False

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        """Register ``creator`` for ``backend``.

        Raises:
            ValueError: ``backend`` is registered already with another creator.
        """
        current = self._creators.get(backend)
        if current is not None and current is not creator:
            raise ValueError(f"the rendezvous backend '{backend}' is registered already")
        self._creators[backend] = creator

    def names(self) -> list[str]:
        """Return the registered backend names, plugins included."""
        self._load_plugins()
        return sorted(self._creators)

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Build the handler for ``params.backend``.

        Raises:
            ConfigurationError: no backend of that name (a ValueError), or the creator built no
                RendezvousHandler.
            RendezvousBackendMismatchError: the handler is of another backend (a RuntimeError).
            RendezvousError: the backend failed to start or connect.
        """
        creator = self._creators.get(params.backend)
        if creator is None:
            self._load_plugins()
            creator = self._creators.get(params.backend)
        if creator is None:
            raise ConfigurationError(
                f"unknown rendezvous backend '{params.backend}' (known: {', '.join(self.names())})"
            )
        handler = creator(params)
        if not isinstance(handler, RendezvousHandler):
            raise ConfigurationError(
                f"the rendezvous backend '{params.backend}' did not build a RendezvousHandler"
            )
        built = handler.get_backend()
        if built != _BUILDS.get(params.backend, params.backend):
            raise RendezvousBackendMismatchError(
                f"the rendezvous backend '{params.backend}' built a handler of the backend "
                f"'{built}'"
            )
        return handler

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in self._creators:
                continue
            try:
                self._creators[entry.name] = entry.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the CLI
                raise ConfigurationError(
                    f"the rendezvous plugin '{entry.name}' ({entry.value}) failed to load: {exc}"
                ) from exc


rendezvous_handler_registry = RendezvousHandlerRegistry()
rendezvous_handler_registry.register("c10d", _dynamic)
rendezvous_handler_registry.register("etcd", _dynamic)
rendezvous_handler_registry.register("etcd-v2", _dynamic)
rendezvous_handler_registry.register("embedded-etcd", _dynamic)
rendezvous_handler_registry.register("static", _static)


def create_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Build a handler with the default registry (torch's ``get_rendezvous_handler``)."""
    return rendezvous_handler_registry.create_handler(params)


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Build a handler with the default registry (torch's name for it).

    Raises:
        ConfigurationError: an unknown backend or a bad configuration (a ValueError).
        RendezvousBackendMismatchError: the handler is of another backend (a RuntimeError).
        RendezvousError: the backend failed to start or connect.
    """
    return rendezvous_handler_registry.create_handler(params)
