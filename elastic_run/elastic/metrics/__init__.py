"""torch.distributed.elastic.metrics, mirrored: metric groups with a pluggable handler.

Owns nothing: the names are ``elastic_run.metrics``'s, resolved on first use. The module:
``api``."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "ConsoleMetricHandler": "elastic_run.metrics",
    "MetricData": "elastic_run.metrics",
    "MetricHandler": "elastic_run.metrics",
    "MetricsConfig": "elastic_run.metrics",
    "NullMetricHandler": "elastic_run.metrics",
    "configure": "elastic_run.metrics",
    "getStream": "elastic_run.metrics",
    "get_elapsed_time_ms": "elastic_run.metrics",
    "initialize_metrics": "elastic_run.metrics",
    "prof": "elastic_run.metrics",
    "profile": "elastic_run.metrics",
    "publish_metric": "elastic_run.metrics",
    "put_metric": "elastic_run.metrics",
}

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
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


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
