"""A backend that cannot be reached is said once per outage, not once per caller that meets it.

When the store's host dies, every part of an agent that talks to the store fails with the same
cause within a second: the heartbeat, the ring watch, the epoch read, the telemetry, the fault
ledger, the leave record. Each used to print its own WARNING line, again on every turn, until
the heartbeat budget ran out and the agent printed its one ``Error:`` line (a waiting spare
printed 49 lines over 30 s). Now the first failure of an outage is said (a warning: the agent
retries until its heartbeat budget), every later one goes to the debug log, and a call that
works again ends the outage, so a later one is said again.

One agent process talks to one rendezvous, so the outage is the process's
(:data:`BACKEND_OUTAGE`); only :class:`~elastic_run.rendezvous.errors.RendezvousConnectionError`
(the backend cannot be reached) is folded, every other failure is said as it comes.
"""

from __future__ import annotations

import logging
import threading

from elastic_run.rendezvous.errors import RendezvousConnectionError

__all__ = ["BACKEND_OUTAGE", "Outage"]


class Outage:
    """Whether this process already said that its backend cannot be reached."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said = False

    def warn(self, logger: logging.Logger, what: str, exc: Exception, then: str = "") -> None:
        """Say ``what: exc[; then]`` as a warning, unless it is an outage already said (then
        to the debug log)."""
        line = f"{what}: {exc}; {then}" if then else f"{what}: {exc}"
        if isinstance(exc, RendezvousConnectionError):
            with self._lock:
                said, self._said = self._said, True
            if said:
                logger.debug("%s", line)
                return
        logger.warning("%s", line)

    def over(self) -> bool:
        """A call to the backend worked: end the outage. Whether one had been said."""
        with self._lock:
            said, self._said = self._said, False
        return said


BACKEND_OUTAGE = Outage()
