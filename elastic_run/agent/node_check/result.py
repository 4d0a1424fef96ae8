"""What a node check found: one result per check, and the node's verdict over them.

One concept: the frozen record the agent reads after the check (healthy or not, and why), which
also goes into an event (:meth:`NodeCheckResult.as_record`). Invariants: a node is healthy
exactly when no check failed; its reason is the first failed check's detail, one line; a check
that did not look (nothing requested, not run after an earlier failure) is ``skip``, never
``ok``.

Pure: no clock, files or processes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["CheckResult", "CheckStatus", "NodeCheckResult", "RECORD_VERSION"]

RECORD_VERSION = 1
"""The version of :meth:`NodeCheckResult.as_record`'s shape."""


class CheckStatus(str, enum.Enum):
    """How one check ended."""

    OK = "ok"
    """It looked and found the node fit."""
    FAIL = "fail"
    """It found the node unfit (or could not finish in its time)."""
    SKIP = "skip"
    """It did not look: nothing to check, or not run after an earlier failure."""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome.

    Attributes:
        name: the check (``devices``, ``disk``, ``command``).
        status: ok, fail or skip.
        detail: one line: what it found, or why it failed or did not look.
        duration_s: how long it took.
    """

    name: str
    status: CheckStatus
    detail: str
    duration_s: float

    @property
    def failed(self) -> bool:
        """Whether this check found the node unfit."""
        return self.status is CheckStatus.FAIL


@dataclass(frozen=True)
class NodeCheckResult:
    """The whole node check: each check's result, in the order they ran, and the total time.

    Attributes:
        checks: one result per check.
        duration_s: how long the whole check took.
        enabled: False when the check was turned off (``--no-node-check``): no checks, healthy.
    """

    checks: tuple[CheckResult, ...]
    duration_s: float
    enabled: bool = True

    @property
    def healthy(self) -> bool:
        """Whether the node may join: no check failed."""
        return not any(c.failed for c in self.checks)

    @property
    def reason(self) -> str | None:
        """The first failed check's detail (one line), or None when the node is healthy."""
        return next((c.detail for c in self.checks if c.failed), None)

    def check(self, name: str) -> CheckResult | None:
        """The result of the check called ``name``, or None when it is not among them."""
        return next((c for c in self.checks if c.name == name), None)

    def as_record(self) -> dict[str, Any]:
        """A JSON-ready record of the result, for an event (``node.check_failed``) or a log.

        Returns:
            ``{"version", "healthy", "reason", "duration_s", "checks": [{"name", "status",
            "detail", "duration_s"}]}``.
        """
        return {
            "version": RECORD_VERSION,
            "healthy": self.healthy,
            "enabled": self.enabled,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "checks": [
                {
                    "name": c.name,
                    "status": c.status.value,
                    "detail": c.detail,
                    "duration_s": round(c.duration_s, 3),
                }
                for c in self.checks
            ],
        }
