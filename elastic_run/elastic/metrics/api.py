"""torch.distributed.elastic.metrics.api: metric groups, handlers and ``put_metric``."""

from __future__ import annotations

from elastic_run.metrics import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    configure,
    get_elapsed_time_ms,
    getStream,
    prof,
    profile,
    publish_metric,
    put_metric,
)

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
]
