"""Metrics a job publishes, torch's ``torch.distributed.elastic.metrics`` API: groups of named
values, each group sent to a pluggable handler.

A metric is ``(group, name, value)``; :func:`put_metric` stamps it with the wall-clock time and
hands it to the handler configured for its group, else to the default handler. The default is
:class:`NullMetricHandler` (metrics cost one call and go nowhere until someone configures a
handler). :func:`prof` wraps a function to publish its success, failure and duration.

Invariants: handlers are looked up at each call, so :func:`configure` takes effect at once;
an exception raised by a handler reaches the caller of :func:`put_metric` (never swallowed).
"""

from __future__ import annotations

import abc
import functools
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, ParamSpec, TypeVar, overload

__all__ = [
    "DEFAULT_GROUP",
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")

DEFAULT_GROUP = "torchelastic"


class MetricData(NamedTuple):
    """One published value: when (epoch seconds), its group, its name and the value."""

    timestamp: float
    group_name: str
    name: str
    value: int


class MetricsConfig:
    """Free-form settings for a metrics set-up (torch's shape: a ``params`` dict).

    Args:
        params: the settings; None: none.
    """

    __slots__ = ["params"]

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params: dict[str, str] = {} if params is None else params


class MetricHandler(abc.ABC):
    """Where a group's metric values go."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None:
        """Take one value.

        Args:
            metric_data: the value with its time, group and name.
        """


class ConsoleMetricHandler(MetricHandler):
    """Prints each value as ``[timestamp][group]: name=value`` on stdout."""

    def emit(self, metric_data: MetricData) -> None:
        print(
            f"[{metric_data.timestamp}][{metric_data.group_name}]: "
            f"{metric_data.name}={metric_data.value}"
        )


class NullMetricHandler(MetricHandler):
    """Drops every value (the default handler)."""

    def emit(self, metric_data: MetricData) -> None:
        return None


class MetricStream:
    """A group bound to its handler: :meth:`add_value` stamps and emits one value.

    Args:
        group_name: the group.
        handler: where its values go.
    """

    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int) -> None:
        """Emit ``metric_value`` under ``metric_name``, stamped with ``time.time()``.

        Args:
            metric_name: the metric's name within the group.
            metric_value: the value.
        """
        self.handler.emit(MetricData(time.time(), self.group_name, metric_name, metric_value))


class _Handlers:
    """The process's handler table: one per configured group, and the default."""

    def __init__(self) -> None:
        self.default: MetricHandler = NullMetricHandler()
        self.by_group: dict[str, MetricHandler] = {}


_HANDLERS = _Handlers()


def configure(handler: MetricHandler, group: str | None = None) -> None:
    """Send ``group``'s values to ``handler``; with no group, make it the default handler.

    Args:
        handler: the handler.
        group: the group it serves; None: every group without a handler of its own.
    """
    if group is None:
        _HANDLERS.default = handler
    else:
        _HANDLERS.by_group[group] = handler


def getStream(group: str) -> MetricStream:  # noqa: N802 (torch's name)
    """Return the stream of ``group``, bound to its handler as configured now.

    Args:
        group: the metric group.

    Returns:
        A :class:`MetricStream` on the group's handler, else on the default handler.
    """
    return MetricStream(group, _HANDLERS.by_group.get(group, _HANDLERS.default))


def put_metric(metric_name: str, metric_value: int, metric_group: str = DEFAULT_GROUP) -> None:
    """Publish one value of ``metric_name`` in ``metric_group``.

    Args:
        metric_name: the metric's name.
        metric_value: the value.
        metric_group: the group (torch's default ``"torchelastic"``).
    """
    getStream(metric_group).add_value(metric_name, metric_value)


def publish_metric(metric_group: str, metric_name: str, metric_value: int) -> None:
    """Publish one value (torch's deprecated spelling of :func:`put_metric`).

    Warns with a ``FutureWarning``, as torch's does.
    """
    warnings.warn(
        "publish_metric is deprecated, use put_metric instead", FutureWarning, stacklevel=2
    )
    getStream(metric_group).add_value(metric_name, metric_value)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Return the whole milliseconds from ``start_time_in_seconds`` (``time.time()``) to now."""
    return int((time.time() - start_time_in_seconds) * 1000)


def _metric_name(fn: Callable[..., Any]) -> str:
    """``Class.method`` for a method, ``<leaf module>.function`` for a function."""
    qualname: str = fn.__qualname__
    if "." in qualname:
        return qualname
    module = getattr(fn, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{qualname}" if module else qualname


def _timed(
    fn: Callable[_P, _R], group: str, name: str, publish: Callable[[str, str, int], None]
) -> Callable[_P, _R]:
    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        start = time.time()
        try:
            result = fn(*args, **kwargs)
            publish(group, f"{name}.success", 1)
        except Exception:
            publish(group, f"{name}.failure", 1)
            raise
        finally:
            publish(group, f"{name}.duration.ms", get_elapsed_time_ms(start))
        return result

    return wrapper


def _put(group: str, name: str, value: int) -> None:
    put_metric(name, value, group)


@overload
def prof(fn: Callable[_P, _R], group: str = DEFAULT_GROUP) -> Callable[_P, _R]: ...


@overload
def prof(
    fn: None = None, group: str = DEFAULT_GROUP
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def prof(
    fn: Callable[_P, _R] | None = None, group: str = DEFAULT_GROUP
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a function to publish ``<name>.success`` or ``<name>.failure`` (1) and
    ``<name>.duration.ms``, used bare (``@prof``) or with a group (``@prof(group="agent")``).

    The name is ``Class.method``, or ``<leaf module>.function``.

    Args:
        fn: the function, when used bare.
        group: the metric group.

    Returns:
        The wrapped function, or a decorator when ``fn`` is None.
    """

    def wrap(f: Callable[_P, _R]) -> Callable[_P, _R]:
        return _timed(f, group, _metric_name(f), _put)

    return wrap(fn) if fn is not None else wrap


def profile(group: str | None = None) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """torch's deprecated decorator: like :func:`prof` with the function's bare name.

    Warns with a ``FutureWarning`` when called, as torch's does.

    Args:
        group: the metric group (None: a group named ``None``, as torch's).
    """
    warnings.warn("profile is deprecated, use @prof instead", FutureWarning, stacklevel=2)

    def wrap(f: Callable[_P, _R]) -> Callable[_P, _R]:
        return _timed(f, str(group), f.__name__, _put)

    return wrap


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """Set up metrics from ``cfg`` (torch's hook; nothing to set up here).

    Args:
        cfg: the settings, unused: handlers are chosen with :func:`configure`.
    """
    del cfg
