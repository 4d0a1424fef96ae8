"""torch.distributed.elastic.agent.server.local_elastic_agent: the agent with subprocess
workers on this node, and the environment variables torchrun reads for it."""

from __future__ import annotations

from elastic_run.agent.config import (
    TORCHELASTIC_ENABLE_FILE_TIMER,
    TORCHELASTIC_HEALTH_CHECK_PORT,
    TORCHELASTIC_TIMER_FILE,
)
from elastic_run.agent.local import LocalElasticAgent

__all__ = [
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_TIMER_FILE",
    "LocalElasticAgent",
]
