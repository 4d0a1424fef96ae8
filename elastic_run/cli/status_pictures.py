"""What ``elastic-run status`` makes of the records the agents published: the pictures it shows.

The status command reads the store (``rendezvous.job``) and turns what it read into pictures
here, plain dictionaries that ``status --json`` prints and the views draw
(``cli/views/progress_view.py``, ``cli/views/goodput_view.py``), so that a view computes nothing:

- :func:`progress_picture`: every rank's progress (``pg/<node id>``), the job's median and
  slowest ranks computed from the records of the shown round (``status`` does not depend on node
  0 being alive), who node 0 reported a straggler (``pg/job``), and the job's hang picture
  merged from every node's stacks;
- :func:`goodput_picture`: the nodes' goodput accounts (``gp/<node id>``) merged: node-seconds
  summed per cause, each node's measured on its own clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from elastic_run.agent.loop.goodput import GoodputAccount, from_json, merge, summary_line
from elastic_run.agent.progress.hang_picture import merge as merge_hangs
from elastic_run.agent.progress.publisher import rank_times, slowest_rows
from elastic_run.agent.rules.progress.step_times import DEFAULT_FACTOR, summarize
from elastic_run.cli.views.goodput_view import GoodputPicture
from elastic_run.cli.views.progress_view import ProgressPicture

__all__ = ["MERGE_RULE", "goodput_picture", "progress_picture"]

MERGE_RULE = "node-seconds summed per cause over the nodes that published"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress_picture(
    records: Mapping[str, Mapping[str, Any]],
    job: Mapping[str, Any] | None,
    round_: int,
) -> ProgressPicture:
    """The progress of a job as ``status --json`` shows it (the ``progress`` object).

    Args:
        records: node id -> its published record.
        job: the published job summary (for the factor and who was reported a straggler).
        round_: the round shown; records of another round are marked ``stale``.

    Returns:
        ``median_step_s``, ``ranks_reporting``, ``factor``, ``slowest`` (each ``rank``,
        ``host``, ``node``, ``work_s``, ``ratio``, ``straggler``), ``ranks`` (each ``rank``,
        ``local_rank``, ``node``, ``host``, ``step``, ``beats``, ``step_s``, ``work_s``,
        ``ratio``, ``age_s``, ``timeout_s``, ``verdict``, ``where``, ``stale``) and ``nodes``
        (node id -> ``hang_rule``, ``last_hang``, ``attempt``, ``round``), and ``hang``: the
        job's silent ranks merged from every node's stacks (``summary``, ``stuck``, ``waiting``,
        ``unknown``; see :mod:`elastic_run.agent.progress.hang_picture`), or None.
    """
    factor = _num((job or {}).get("factor")) or DEFAULT_FACTOR
    reported = {
        s.get("rank")
        for s in (job or {}).get("slowest") or ()
        if isinstance(s, Mapping) and s.get("straggler") and (job or {}).get("round") == round_
    }
    steps = summarize(rank_times(records, round_))
    median = steps.median_s
    ranks: list[dict[str, Any]] = []
    nodes: dict[str, dict[str, Any]] = {}
    for node_id, record in records.items():
        stale = record.get("round") != round_
        nodes[node_id] = {
            "hang_rule": record.get("hang_rule"),
            "last_hang": record.get("last_hang"),
            "attempt": record.get("attempt"),
            "round": record.get("round"),
        }
        for entry in record.get("ranks") or ():
            if not isinstance(entry, Mapping):
                continue
            work = _num(entry.get("work_s"))
            ratio = work / median if work and median and not stale else None
            verdict = str(entry.get("verdict") or "")
            if not verdict and ratio is not None and entry.get("rank") in reported:
                verdict = "straggler"
            ranks.append(
                {
                    "rank": entry.get("rank"),
                    "local_rank": entry.get("local_rank"),
                    "node": node_id,
                    "host": record.get("host", ""),
                    "step": entry.get("step"),
                    "beats": entry.get("beats"),
                    "step_s": _num(entry.get("step_s")),
                    "work_s": work,
                    "ratio": None if ratio is None else round(ratio, 3),
                    "age_s": _num(entry.get("age_s")),
                    # A rank that never beat is never judged: no timeout to show.
                    "timeout_s": _num(entry.get("timeout_s")) if entry.get("beats") else None,
                    "verdict": verdict,
                    "where": str(entry.get("where") or ""),
                    "stale": stale,
                }
            )
    ranks.sort(key=lambda r: r["rank"] if isinstance(r["rank"], int) else 1 << 30)
    hang = merge_hangs(records, round_)
    return {
        "hang": hang.as_json() if hang is not None else None,
        "median_step_s": median,
        "ranks_reporting": steps.ranks,
        "factor": factor,
        "slowest": slowest_rows(steps, lambda rank, ratio: rank in reported or ratio >= factor),
        "ranks": ranks,
        "nodes": nodes,
    }


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
