"""Where a worker's stream goes (``plan_stream``): torchrun's ``--redirects`` / ``--tee`` table.

A teed stream goes to its file and to the console whether or not ``--redirects`` names it too
(torchrun adds the tee'd streams to the redirects and tails their files): ``-r 3 -t 3`` shows
both streams. A rank hidden by ``--local-ranks-filter`` reaches no console.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_run.agent.config import Std
from elastic_run.agent.workers.output import StreamName, plan_stream

LOG = Path("/logs/0")


@pytest.mark.parametrize(
    ("redirect", "tee", "shown", "to_file", "to_console"),
    [
        (Std.NONE, Std.NONE, True, False, True),
        (Std.NONE, Std.NONE, False, False, False),
        (Std.ALL, Std.NONE, True, True, False),
        (Std.NONE, Std.ALL, True, True, True),
        (Std.ALL, Std.ALL, True, True, True),  # -r 3 -t 3: teed, as torchrun
        (Std.ALL, Std.ALL, False, True, False),
        (Std.ERR, Std.OUT, True, True, True),  # stdout teed; its redirect is elsewhere
    ],
)
def test_a_stream_goes_where_torchrun_sends_it(
    redirect: Std, tee: Std, shown: bool, to_file: bool, to_console: bool
) -> None:
    plan = plan_stream(
        StreamName.STDOUT, redirect=redirect, tee=tee, show_on_console=shown, log_dir=LOG
    )
    assert (plan.to_file, plan.to_console) == (to_file, to_console)
    assert plan.file_path == (LOG / "stdout.log" if to_file else None)


def test_a_stream_with_a_file_needs_a_log_directory() -> None:
    with pytest.raises(ValueError, match="no log dir"):
        plan_stream(
            StreamName.STDERR, redirect=Std.ERR, tee=Std.NONE, show_on_console=True, log_dir=None
        )
