"""Which standard streams of a worker go to files: ``--redirects`` and ``--tee`` as values.

One concept: torch's ``Std`` flags (none, stdout, stderr, both) and the per-local-rank form of
the two flags (:class:`StdSpec`: one ``Std`` for every local rank, or one per local rank), as
frozen values that the settings table parses into and the workers' output plan reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Std", "StdSpec"]


class Std(enum.IntFlag):
    """Which standard streams go to files (redirect) or to both files and console (tee)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def from_str(cls, vm: str) -> Std | dict[int, Std]:
        """Parse torch's form: ``3`` for every rank, or ``0:1,1:2`` per local rank.

        Raises:
            ValueError: the text is neither.
        """
        text = vm.strip()
        if not text:
            _bad_std(vm)  # torch's: an empty text is not a value either
        if ":" not in text:
            return cls(int(text)) if text in ("0", "1", "2", "3") else _bad_std(vm)
        out: dict[int, Std] = {}
        for item in text.split(","):
            rank, _, value = item.partition(":")
            if not rank.strip().isdigit() or value.strip() not in ("0", "1", "2", "3"):
                _bad_std(vm)
            out[int(rank)] = cls(int(value))
        return out


def _bad_std(vm: str) -> Std:
    raise ValueError(f"{vm!r} is not 0..3 or LOCAL_RANK:0..3 items separated by commas")


@dataclass(frozen=True)
class StdSpec:
    """A --redirects/--tee value: one Std for all local ranks, or one per local rank."""

    default: Std = Std.NONE
    per_rank: tuple[tuple[int, Std], ...] = ()

    def for_rank(self, local_rank: int) -> Std:
        """Return the Std that applies to ``local_rank``."""
        for rank, std in self.per_rank:
            if rank == local_rank:
                return std
        return self.default
