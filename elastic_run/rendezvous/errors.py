"""Rendezvous errors, named as torch.distributed.elastic names them."""

from __future__ import annotations

from elastic_run.errors import ElasticRunError

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousInterruptedError",
    "RendezvousNotFoundError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "RendezvousUnreachableError",
]


class RendezvousError(ElasticRunError):
    """Base of every rendezvous error."""

    exit_code = 3


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed: no new round can form."""


class RendezvousTimeoutError(RendezvousError):
    """The rendezvous did not complete within its time limit."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous backend cannot be reached."""

    exit_code = 4


class RendezvousUnreachableError(RendezvousConnectionError):
    """The backend did not answer (no refusal, no reset): a partition that may heal.

    The rendezvous keeps trying until its join timeout; a backend that refuses (its host is up
    and nothing listens) raises the parent class at once.
    """


class RendezvousStateError(RendezvousError):
    """The state under the job's keys is not what elastic-run wrote (garbage or a foreign value)."""


class RendezvousGracefulExitError(RendezvousError):
    """This node is leaving on purpose (not an error of the job)."""


class RendezvousNotFoundError(RendezvousError):
    """No rendezvous with this run id exists on the backend."""


class RendezvousInterruptedError(RendezvousGracefulExitError):
    """A blocking rendezvous call gave up because the agent asked it to (a signal arrived)."""
