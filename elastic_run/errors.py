"""The one error tree of elastic-run.

Every error the library raises on purpose derives from :class:`ElasticRunError`.
The CLI catches that base once, prints one ``Error: ...`` line and exits with the
error's ``exit_code`` (see DESIGN.md, "Exit codes").
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "ConfigurationError",
    "ElasticRunError",
]


class ElasticRunError(Exception):
    """Base of every error elastic-run raises on purpose.

    Attributes:
        exit_code: the process exit code the CLI uses for this error.
    """

    exit_code: int = 1


class ConfigurationError(ElasticRunError, ValueError):
    """Bad user input: a flag, a config key, a path. The CLI exits 2.

    Also a ``ValueError``, as torch raises for bad rendezvous parameters, so code written
    against torch.distributed.elastic that catches ``ValueError`` keeps working.
    """

    exit_code = 2


class AgentError(ElasticRunError):
    """The elastic agent could not do its work (spawn, supervise, report)."""

    exit_code = 1
