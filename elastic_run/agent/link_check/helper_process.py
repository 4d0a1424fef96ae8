"""The link check's helper process: ``python -m elastic_run.agent.link_check.helper_process``.

The protocol, so that the agent may start it early (while its rendezvous runs) and pay
``import torch`` off the round's clock:

1. it imports torch's distributed package, then prints ``ready`` on stdout;
2. it reads one line on stdin, its arguments (``HelperArgs.to_json``); end of input without a
   line (the agent had no use for it) is a quiet exit 0;
3. it connects as a client to the TCPStore at ``store_addr:store_port``, joins the process group
   under ``prefix`` there, measures (``measure.py``) and prints one JSON line (``report.py``) on
   stdout, exit 0. On any failure it prints one line on stderr, ``link check on node R: ...``,
   and exits 1 (2 for arguments it cannot read).

The agent's side (``helper.py``) bounds it by a timeout and kills it when it outlives it. This is
a process entry, the one place of the package that catches every exception: whatever torch
raised becomes that one line.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from elastic_run.agent.link_check.report import encode_measurement

__all__ = ["READY", "HelperArgs", "main"]

READY = "ready"
"""The helper's first line: torch is imported, it waits for its arguments."""

_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class HelperArgs:
    """What one helper is told (see ``runner.run_link_check`` for each field)."""

    rank: int
    world_size: int
    store_addr: str
    store_port: int
    prefix: str
    backend: str
    size_bytes: int
    timeout_s: float
    factor: float
    repeats: int
    rounds: int
    device: str | None = None

    def to_json(self) -> str:
        """The helper's line of arguments (no newline)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> HelperArgs:
        """Parse and check the argument.

        Raises:
            ValueError: it is not an object of these fields with values in range.
        """
        raw = json.loads(text)
        if not isinstance(raw, dict) or set(raw) != {f for f in cls.__dataclass_fields__}:
            raise ValueError("the helper's argument is not an object of its fields")
        args = cls(**raw)
        ints = (args.rank, args.world_size, args.store_port, args.size_bytes, args.repeats)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in (*ints, args.rounds)):
            raise ValueError("the helper's argument holds a count that is not an integer")
        if not (0 <= args.rank < args.world_size and 0 < args.store_port < 65536):
            raise ValueError("the helper's rank or store port is out of range")
        if args.backend not in _BACKENDS or not isinstance(args.timeout_s, (int, float)):
            raise ValueError("the helper's backend or timeout is not one it knows")
        if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
            raise ValueError("the helper's timeout is not a positive number")
        if not isinstance(args.factor, (int, float)) or not (
            math.isfinite(args.factor) and args.factor > 1
        ):
            raise ValueError("the helper's factor is not a number above 1")
        return args


def _run(args: HelperArgs) -> str:
    from torch.distributed import PrefixStore, TCPStore

    from elastic_run.agent.link_check.measure import measure

    client = TCPStore(
        args.store_addr,
        args.store_port,
        is_master=False,
        timeout=timedelta(seconds=args.timeout_s),
    )
    store = PrefixStore(args.prefix, client)
    measured = measure(
        store,
        args.rank,
        args.world_size,
        args.backend,
        args.size_bytes,
        args.timeout_s,
        float(args.factor),
        device=args.device,
        repeats=args.repeats,
        rounds=args.rounds,
    )
    return encode_measurement(measured)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def main() -> int:
    """Run one helper; return its exit status (0 measured or unused, 1 failed, 2 bad argument)."""
    import torch.distributed  # noqa: F401  (the slow part, done before the round needs it)

    print(READY, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    try:
        args = HelperArgs.from_json(line)
    except (ValueError, TypeError) as exc:
        print(f"link check: bad helper argument: {_first_line(exc)}", file=sys.stderr, flush=True)
        return 2
    try:
        record = _run(args)
    except Exception as exc:  # the process's edge: every failure is one line
        reason: Any = _first_line(exc)
        print(f"link check on node {args.rank}: {reason}", file=sys.stderr, flush=True)
        return 1
    print(record, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
