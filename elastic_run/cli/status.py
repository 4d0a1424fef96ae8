"""``elastic-run status`` and ``elastic-run close``: read or end a job's rendezvous from any host.

Both open the job's rendezvous as a reader (``rendezvous.job``: never hosting a c10d store, so
they work from a login node with or without a local agent). ``status`` never writes anything;
``close`` writes one record, the same one an agent writes when its job ends, so every agent
stops its workers and exits 3.

Heartbeat ages: a heartbeat is a counter, not a timestamp, so no two clocks are compared.
``status`` reads the counters for ``--sample`` seconds and reports, per node, how long ago its
counter was last seen moving (null when it did not move while sampled: stale, or gone).

Exit codes: 0 shown (or closed); 1 ``close --wait``: closed, but an agent still beat after
``--timeout``; 3 no such rendezvous (none of its keys exists); 4 the backend cannot be reached.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from elastic_run import clock
from elastic_run.cli.options.rdzv_options import (
    RendezvousTarget,
    explicit_options,
    rdzv_options,
    resolve_target,
)
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousError

if TYPE_CHECKING:
    from elastic_run.rendezvous.job import JobRendezvous

__all__ = [
    "EXIT_NO_RENDEZVOUS",
    "EXIT_UNREACHABLE",
    "close_command",
    "status_command",
]

EXIT_NO_RENDEZVOUS = 3
EXIT_UNREACHABLE = 4


class _Exit(Exception):
    """A one-line error with an exit code (caught at the command's edge)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _open(ctx: click.Context, values: dict[str, Any]) -> tuple[RendezvousTarget, JobRendezvous]:
    """Resolve the target and open its rendezvous as a reader: (target, job)."""
    # torch's C++ layer logs every failed connect attempt with a stack: one line is enough.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from elastic_run.rendezvous.job import open_job
    from elastic_run.rendezvous.settings import STATUS_READ_TIMEOUT_S

    target = resolve_target(values, explicit_options(ctx), os.environ)
    params = target.parameters(read_timeout_s=STATUS_READ_TIMEOUT_S)
    try:
        job = open_job(params)
    except RendezvousConnectionError as exc:
        raise _unreachable(target, exc) from exc
    return target, job


def _sample_ages(job: Any, node_ids: Sequence[str], sample_s: float) -> dict[str, float | None]:
    """Seconds since each node's heartbeat counter was seen moving, reading for ``sample_s``."""
    if not node_ids or sample_s <= 0:
        return {}
    start = time.monotonic()
    first = job.heartbeats(node_ids)
    moved_at: dict[str, float | None] = dict.fromkeys(node_ids)
    last = list(first)
    while True:
        now = time.monotonic()
        if now - start >= sample_s:
            break
        clock.sleep(min(0.1, sample_s - (now - start)))  # sampling: a pause is the point
        beats = job.heartbeats(node_ids)
        seen = time.monotonic()
        for node_id, old, new in zip(node_ids, last, beats, strict=True):
            if new is not None and new != old:
                moved_at[node_id] = seen
        last = beats
    end = time.monotonic()
    return {n: (None if t is None else end - t) for n, t in moved_at.items()}


def _say_members(members: Mapping[str, str] | None) -> None:
    if members is not None:
        shown = ", ".join(f"{endpoint} {state}" for endpoint, state in members.items())
        click.echo(f"embedded etcd members: {shown}", err=True)


def _no_rendezvous(target: Any) -> _Exit:
    return _Exit(
        f"no rendezvous '{target.run_id}' at the {target.backend} endpoint {target.endpoint}",
        EXIT_NO_RENDEZVOUS,
    )


def _unreachable(target: Any, exc: Exception) -> _Exit:
    return _Exit(
        f"cannot reach the {target.backend} endpoint {target.endpoint}: {exc}", EXIT_UNREACHABLE
    )


def _read(job: Any, target: Any, sample_s: float) -> tuple[Any, dict[str, Any], str | None]:
    snap = job.snapshot(target.min_nodes or 0, target.max_nodes or 0)
    if snap is None:
        raise _no_rendezvous(target)
    ids = [m.node_id for m in (*snap.members, *snap.waiting)]
    ages = _sample_ages(job, ids, sample_s)
    return snap, ages, snap.closed_reason


def _progress(job: Any, snap: Any) -> dict[str, Any] | None:
    """The members' published progress (one batch read), or None when none was published."""
    from elastic_run.cli.status_pictures import progress_picture

    records, summary, _ = job.progress([m.node_id for m in snap.members])
    return progress_picture(records, summary, snap.round) if records else None


def _goodput(job: Any, snap: Any) -> dict[str, Any] | None:
    """The nodes' published goodput accounts, merged (one batch read), or None when none was."""
    from elastic_run.cli.status_pictures import goodput_picture

    ids = [m.node_id for m in (*snap.members, *snap.waiting)]
    records, problems = job.goodput(ids)
    picture = goodput_picture(records)
    if picture is not None and problems:
        picture["problems"] = [*picture["problems"], *problems]
    return picture


def _run(fn: Any) -> None:
    """Call ``fn()``; turn our errors into one line on stderr and the documented exit code."""
    try:
        fn()
    except _Exit as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.code)
    except ConfigurationError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    except RendezvousError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)


@click.command("status")
@rdzv_options
@click.option("--json", "as_json", is_flag=True, default=False, help="Print one JSON object.")
@click.option("--watch", is_flag=True, default=False, help="Refresh live until interrupted.")
@click.option(
    "--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes."
)
@click.option(
    "--sample",
    type=click.FloatRange(min=0.0),
    default=1.5,
    show_default=True,
    help="Seconds to watch heartbeats for their ages (0: do not).",
)
@click.pass_context
def status_command(
    ctx: click.Context, /, as_json: bool, watch: bool, interval: float, sample: float, **values: Any
) -> None:
    """Show a job's rendezvous: round, state, members, waiting nodes, last events."""

    def show() -> None:
        from rich.console import Console
        from rich.live import Live

        from elastic_run.cli.views.lines import render_status, status_to_json

        target, job = _open(ctx, values)
        try:
            members = job.member_states()
            if not as_json:
                _say_members(members)
            if not watch:
                snap, ages, reason = _read(job, target, sample)
                progress = _progress(job, snap)
                goodput = _goodput(job, snap)
                if as_json:
                    body = status_to_json(snap, ages, reason, progress, goodput)
                    if members is not None:
                        body["etcd_members"] = dict(members)
                    click.echo(json.dumps(body, sort_keys=True))
                else:
                    Console().print(render_status(snap, ages, reason, progress, goodput))
                return
            snap, ages, reason = _read(job, target, 0)
            with Live(render_status(snap, ages, reason), refresh_per_second=4) as live:
                while True:
                    snap, ages, reason = _read(job, target, max(interval, 0.1))
                    progress = _progress(job, snap)
                    goodput = _goodput(job, snap)
                    if as_json:
                        body = status_to_json(snap, ages, reason, progress, goodput)
                        live.console.print_json(json.dumps(body))
                    else:
                        live.update(render_status(snap, ages, reason, progress, goodput))
        except KeyboardInterrupt:
            return
        except RendezvousConnectionError as exc:
            raise _unreachable(target, exc) from exc
        finally:
            job.release()

    _run(show)


@click.command("close")
@rdzv_options
@click.option(
    "--wait",
    is_flag=True,
    default=False,
    help="Return when every agent has left the rendezvous; exit 1 if one is still there after "
    "--timeout.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Seconds --wait waits (default 120).",
)
@click.pass_context
def close_command(ctx: click.Context, /, wait: bool, timeout: float | None, **values: Any) -> None:
    """Close a job's rendezvous: every agent stops its workers and exits 3; no round forms again."""

    def close() -> None:
        if timeout is not None and not wait:
            raise ConfigurationError("--timeout is how long --wait waits: pass --wait with it")
        target, job = _open(ctx, values)
        try:
            _say_members(job.member_states())
            # Nothing is decoded before the close is written: whatever the job's keys hold,
            # the operator's kill switch works. A job exists when any of its keys does.
            if not job.exists():
                raise _no_rendezvous(target)
            who = f"elastic-run close@{socket.gethostname()} pid {os.getpid()}"
            outcome = job.close(who)
            if outcome.replaced_epoch is not None:
                click.echo(
                    f"rendezvous '{target.run_id}': replaced what its 'epoch' key held: "
                    f"{outcome.replaced_epoch}",
                    err=True,
                )
            if outcome.replaced is not None:
                click.echo(
                    f"closed rendezvous '{target.run_id}', replacing what its 'closed' key "
                    f"held: {outcome.replaced}",
                    err=True,
                )
            elif outcome.wrote:
                click.echo(f"closed rendezvous '{target.run_id}'", err=True)
            else:
                click.echo(
                    f"rendezvous '{target.run_id}' was already closed ({outcome.reason})",
                    err=True,
                )
            if wait:
                _wait_until_left(job, target, _DEFAULT_WAIT_S if timeout is None else timeout)
        except RendezvousConnectionError as exc:
            if wait:
                # A c10d store lives in an agent: once that agent left, nobody is there.
                click.echo(
                    "the rendezvous store went away with its host: every agent left", err=True
                )
                return
            raise _unreachable(target, exc) from exc
        finally:
            job.release()

    _run(close)


_DEFAULT_WAIT_S = 120.0
_LEFT_AFTER_S = 3.0  # a heartbeat counter that did not move this long (or 3 beats): agent left


def _wait_until_left(job: JobRendezvous, target: RendezvousTarget, timeout_s: float) -> None:
    """Wait until no member's heartbeat is alive (dropped, or not moving for 3 s or 3 beats).

    The members are read again each window (a node waiting at the door counts too); the last
    window may end up to one window after ``timeout_s``.

    Raises:
        _Exit: (exit 1) an agent still beats after ``timeout_s``: named, with its host and pid.
    """
    from elastic_run.rendezvous.settings import RendezvousSettings

    interval_s = RendezvousSettings.from_params(target.parameters()).keep_alive_interval_s
    # Whole windows, never cut short: a counter judged in a shorter one would look stopped.
    window_s = max(_LEFT_AFTER_S, 3 * interval_s)
    deadline = time.monotonic() + timeout_s
    alive: list[Any] = []
    while True:
        snap = job.snapshot()
        if snap is None:
            raise _Exit(
                f"cannot tell whether the agents left: every key of rendezvous "
                f"'{target.run_id}' is gone",
                1,
            )
        nodes = {m.node_id: m for m in (*snap.members, *snap.waiting)}
        ages = _sample_ages(job, list(nodes), window_s)
        alive = [nodes[n] for n, age in ages.items() if age is not None]
        if not alive:
            click.echo("every agent left", err=True)
            return
        if time.monotonic() >= deadline:
            break
    named = ", ".join(f"{m.host} (agent pid {m.pid})" for m in alive)
    raise _Exit(
        f"rendezvous '{target.run_id}' is closed, but {len(alive)} agent"
        f"{'' if len(alive) == 1 else 's'} still ran {timeout_s:g} s later (--timeout): {named}",
        1,
    )
