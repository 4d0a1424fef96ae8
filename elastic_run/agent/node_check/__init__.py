"""The node check: is this node fit to join (its devices, its log disk, the user's own check)?

Issue 37's point 5. The agent runs it before its node's first join and before a suspect node
rejoins (:func:`run_node_check`); a node that fails does not join, prints
:func:`failure_line` and exits 6; one that passes prints :func:`startup_line`.

Owns the check's settings (``options.py``: :class:`NodeCheckOptions` and its parsers;
``flag_rows.py``: the three rows for the settings table), its result (``result.py``) and its
words (``lines.py``), all pure; which devices to try (``device_request.py``, pure); the checks
themselves (``disk.py``, ``command.py``, ``device_check.py`` with the child it starts,
``device_probe.py``); the bounded child process every check that runs something uses
(``bounded_process.py``); and the entry point that runs them in one budget (``node_check.py``).

May import: the top-level ``errors`` and ``parent_death`` (the children die with the agent), and
the rendezvous's ``settings`` (``check_seconds``, ``shown``: one set of bounds and one way to
show a bad value). Nothing of the run loop, the rules, the workers or the CLI: the agent calls
this package, never the other way. ``device_probe.py`` imports nothing of elastic-run at all
(it runs in the child by its file path).
"""

from elastic_run.agent.node_check.device_request import (
    CPU_SMOKE,
    NOTHING,
    DeviceRequest,
    device_request,
)
from elastic_run.agent.node_check.flag_rows import FLAG_ROWS, FlagRow
from elastic_run.agent.node_check.lines import failure_line, startup_line
from elastic_run.agent.node_check.node_check import run_node_check
from elastic_run.agent.node_check.options import (
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_TIMEOUT_S,
    NodeCheckOptions,
    parse_min_free_bytes,
    parse_node_check_cmd,
    parse_node_check_timeout,
)
from elastic_run.agent.node_check.result import CheckResult, CheckStatus, NodeCheckResult

__all__ = [
    "CPU_SMOKE",
    "DEFAULT_MIN_FREE_BYTES",
    "DEFAULT_TIMEOUT_S",
    "FLAG_ROWS",
    "NOTHING",
    "CheckResult",
    "CheckStatus",
    "DeviceRequest",
    "FlagRow",
    "NodeCheckOptions",
    "NodeCheckResult",
    "device_request",
    "failure_line",
    "parse_min_free_bytes",
    "parse_node_check_cmd",
    "parse_node_check_timeout",
    "run_node_check",
    "startup_line",
]
