"""The link check: after a round forms, time the links between its nodes, name the slow ones.

Each node's agent starts one helper process (never joining a process group itself); the
helpers meet under a key prefix of the round's workers' store, join a torch process group over
the workers' backend (gloo, NCCL on GPUs), exchange a few MB with a few partners each and
all-reduce the figures, so every node gets the same report. A node under ``1 /
--straggler-factor`` of the median is slow; ``--link-check`` says what happens then.

Owns: the flag (``mode.py``), who pairs with whom (``schedule.py``), the report and the helper's
record of it (``report.py``), the rule (``verdict.py``), the collectives inside the helper
(``measure.py``), the helper's entry (``helper_process.py``), the agent's handle on one helper
process (``helper.py``: start early, hand arguments, bound, read, reap) and the one call the
loop makes (``runner.py``). ``mode``, ``schedule``, ``report`` and ``verdict`` are pure.

May import: the top-level ``errors`` and ``parent_death``; nothing of the run loop, the
rendezvous or the CLI (the loop calls ``run_link_check`` and ``link_verdict``).
"""

from __future__ import annotations

from elastic_run.agent.link_check.helper import LinkHelper
from elastic_run.agent.link_check.mode import (
    DEFAULT_MODE,
    FLAG_ROW,
    LinkCheckMode,
    parse_link_check_mode,
)
from elastic_run.agent.link_check.report import LinkReport
from elastic_run.agent.link_check.runner import (
    DEFAULT_SIZE_BYTES,
    DEFAULT_TIMEOUT_S,
    LinkCheckError,
    run_link_check,
)
from elastic_run.agent.link_check.verdict import (
    LinkVerdict,
    link_verdict,
    slow_event_fields,
    slow_message,
    slow_nodes,
)

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_SIZE_BYTES",
    "DEFAULT_TIMEOUT_S",
    "FLAG_ROW",
    "LinkCheckError",
    "LinkCheckMode",
    "LinkHelper",
    "LinkReport",
    "LinkVerdict",
    "link_verdict",
    "parse_link_check_mode",
    "run_link_check",
    "slow_event_fields",
    "slow_message",
    "slow_nodes",
]
