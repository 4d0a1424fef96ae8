"""The goodput part of ``elastic-run status``: the job's training share and its lost time.

Reads the accounts the agents published (``gp/<node id>``, see
``rendezvous/dynamic/telemetry.py``) and merges them
(:func:`~elastic_run.agent.loop.goodput.merge`): node-seconds summed per cause, so the job's
share is its nodes' training time over their wall time, each node's measured on its own clock;
one node's account is the job's. Each node's own account is shown beside, with its age.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from elastic_run.agent.loop.goodput import GoodputAccount, from_json, merge, summary_line

__all__ = ["MERGE_RULE", "GoodputPicture", "goodput_picture", "render_goodput"]

GoodputPicture = dict[str, Any]
MERGE_RULE = "node-seconds summed per cause over the nodes that published"


def goodput_picture(
    records: Mapping[str, Mapping[str, Any]], now_s: float | None = None
) -> GoodputPicture | None:
    """The ``goodput`` object of ``status --json`` (None when no node published an account).

    Args:
        records: node id -> its published record (``account``, ``ts``).
        now_s: the wall clock now, for each record's age (default: read it).

    Returns:
        ``job`` (the merged account: ``wall_s``, ``training_s``, ``share``, ``lost_s``, ``lost``
        by cause, ``restart_count``, ``nodes``, ``ended``), ``merge`` (how the nodes' accounts
        were merged), ``nodes`` (node id -> its account with ``age_s``, the seconds since it was
        written) and ``problems`` (a sentence per record that is not an account).
    """
    now = time.time() if now_s is None else now_s
    accounts: dict[str, GoodputAccount] = {}
    nodes: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for node_id, record in sorted(records.items()):
        body = record.get("account")
        try:
            if not isinstance(body, Mapping):
                raise ValueError("no 'account' object")
            account = from_json(body)
        except ValueError as exc:
            problems.append(f"gp/{node_id}: {exc}")
            continue
        accounts[node_id] = account
        ts = record.get("ts")
        age = round(now - ts, 3) if isinstance(ts, (int, float)) else None
        nodes[node_id] = {**account.to_json(with_restarts=False), "age_s": age}
    job = merge(accounts)
    if job is None:
        return (
            {"job": None, "merge": MERGE_RULE, "nodes": {}, "problems": problems}
            if (problems)
            else None
        )
    return {
        "job": job.to_json(with_restarts=False),
        "summary": summary_line(job),
        "merge": MERGE_RULE,
        "nodes": nodes,
        "problems": problems,
    }


def render_goodput(picture: GoodputPicture | None) -> Text | None:
    """One line for the status table (None: nothing published)."""
    if picture is None or picture.get("job") is None:
        return None
    return Text.assemble(("goodput ", "dim"), str(picture.get("summary", "")))
