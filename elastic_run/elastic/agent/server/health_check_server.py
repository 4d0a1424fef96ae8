"""torch.distributed.elastic.agent.server.health_check_server: the health-check server (it
answers over HTTP here; torch's open-source one only logs)."""

from __future__ import annotations

from elastic_run.agent.health.server import (
    HealthCheckServer,
    create_healthcheck_server,
)

__all__ = [
    "HealthCheckServer",
    "create_healthcheck_server",
]
