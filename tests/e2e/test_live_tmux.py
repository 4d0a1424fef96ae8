"""The live panel in a real terminal: two agents in tmux panes, workers printing, one node lost.

After the loss the surviving pane holds exactly one panel, every row of it whole, and the
terminal's history holds no remnant of an earlier frame (worker lines scrolled above the panel;
the panel was redrawn in place). ``status`` without ``--nnodes`` shows the job's MIN:MAX.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_MARKER_VARIABLE
from tests.helpers import REPO_ROOT, free_port, is_alive, run_cli, wait_until
from tests.machine import require_program


@pytest.fixture(autouse=True)
def _tmux_installed() -> None:
    """Fail (not skip) every test here when tmux is missing."""
    require_program("tmux", "tmux")


TRAIN = Path(__file__).resolve().parent / "hang_scripts" / "train.py"
WIDTH, HEIGHT = 150, 60
TOP, BOTTOM, SIDE = "\u256d\u2500 elastic-run", "\u2570", "\u2502"


class Tmux:
    """A private tmux server (its own socket) with one window split in two panes."""

    def __init__(self, tmp: Path) -> None:
        self.socket = f"er-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp

    def __call__(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def start(self, command_a: str, command_b: str) -> None:
        self(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            command_a,
        )
        self("set-option", "-t", "t", "remain-on-exit", "on")
        self("set-option", "-t", "t", "history-limit", "5000")
        self("split-window", "-v", "-t", "t:0", command_b)

    def screen(self, pane: int) -> list[str]:
        return self("capture-pane", "-p", "-t", f"t:0.{pane}").splitlines()

    def history(self, pane: int) -> list[str]:
        return self("capture-pane", "-p", "-S", "-", "-t", f"t:0.{pane}").splitlines()

    def scrollback(self, pane: int) -> list[str]:
        """The lines above the visible screen only (one capture: no race with a redraw)."""
        return self("capture-pane", "-p", "-S", "-", "-E", "-1", "-t", f"t:0.{pane}").splitlines()

    def pane_pid(self, pane: int) -> int:
        return int(self("display-message", "-p", "-t", f"t:0.{pane}", "#{pane_pid}").strip())

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    server = Tmux(tmp_path)
    try:
        yield server
    finally:
        pids = []
        for pane in (0, 1):
            try:
                pids.append(server.pane_pid(pane))
            except (AssertionError, ValueError, subprocess.SubprocessError):
                pass
        for pid in pids:  # SIGTERM: the agents stop their workers and leave
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        wait_until(lambda: not any(is_alive(p) for p in pids), 60, message="agents left")
        server.kill()


def _agent(tmp: Path, port: int, run_id: str, host: bool) -> str:
    env = {
        TEST_MARKER_VARIABLE: os.environ.get(TEST_MARKER_VARIABLE, ""),
        "PYTHONPATH": str(REPO_ROOT),
        "STEPS": "100000",
        "STEP_S": "0.25",
        "PRINT_EVERY": "2",
        "TERM": "xterm-256color",
    }
    args = [
        sys.executable,
        "-m",
        "elastic_run",
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        f"last_call_timeout=1,is_host={'true' if host else 'false'}",
        "--local-addr",
        "127.0.0.1",
        "--live",
        "--log-dir",
        str(tmp / ("a" if host else "b")),
        str(TRAIN),
    ]
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"cd {shlex.quote(str(tmp))} && exec env {exports} {shlex.join(args)}"


def _panels(lines: list[str]) -> int:
    return sum(1 for line in lines if line.startswith(TOP))


@pytest.mark.timeout(600)  # its own waits (two agents starting, a loss, a restart) under load
def test_after_a_node_loss_one_whole_panel_and_no_remnants(tmux: Tmux, tmp_path: Path) -> None:
    port, run_id = free_port(), f"tmux-{uuid.uuid4().hex[:8]}"
    tmux.start(_agent(tmp_path, port, run_id, True), _agent(tmp_path, port, run_id, False))

    def both_train() -> bool:
        screens = [tmux.screen(0), tmux.screen(1)]
        return all(
            any("world 2" in line for line in s)
            and any(" step " in line and " total " in line for line in s)
            for s in screens
        )

    wait_until(both_train, 240, interval_s=0.5, message=lambda: "\n".join(tmux.screen(0)))
    os.kill(tmux.pane_pid(1), signal.SIGKILL)  # node b vanishes (its worker dies with it)

    def alone_and_training_again() -> bool:
        screen = tmux.screen(0)
        return any("node 0/1" in line and "world 1" in line for line in screen) and any(
            "rank 0 step" in line for line in tmux.history(0)[-5:] + screen
        )

    wait_until(
        alone_and_training_again, 180, interval_s=0.5, message=lambda: "\n".join(tmux.screen(0))
    )
    history = tmux.history(0)
    lost_at = max(i for i, line in enumerate(history) if "round 1" in line or "node 0/1" in line)
    # Worker lines printed after the loss, above the panel (from the start of the history when
    # the loss came early: a negative start would read only the panel at its end).
    wait_until(
        lambda: any("rank 0 step" in line for line in tmux.history(0)[max(0, lost_at - 40) :]),
        120,
        message=lambda: "\n".join(tmux.history(0)[-60:]),
    )
    # The panel redraws twice a second and tmux takes a frame from the pty in pieces: a capture
    # may fall inside a redraw (its lower rows not yet rewritten). Take the first capture that
    # holds a finished frame, then judge it: one panel, every row whole, nothing left behind.
    captured: list[list[str]] = []

    def a_finished_frame() -> bool:
        screen = tmux.screen(0)
        captured[:] = [screen]
        return sum(1 for line in screen if line.startswith(BOTTOM)) == 1

    wait_until(a_finished_frame, 60, interval_s=0.1, message=lambda: "\n".join(captured[0]))
    (screen,) = captured
    history = tmux.history(0)
    assert _panels(screen) == 1, "\n".join(screen)
    assert _panels(history) == 1, "\n".join(history)  # no frame left behind in the scrollback
    rows = [line for line in screen if line.startswith(SIDE)]
    assert rows and all(line.rstrip().endswith(SIDE) for line in rows), "\n".join(screen)
    assert all(len(line.rstrip()) == len(rows[0].rstrip()) for line in rows), "\n".join(screen)
    assert not any("\ufffd" in line for line in history)
    scrollback = tmux.scrollback(0)  # the panel redraws (its ages tick): compare one capture
    assert not any(line.startswith(SIDE) for line in scrollback), "\n".join(scrollback)

    status = run_cli(
        [
            "status",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--sample",
            "0",
        ],
        env={"COLUMNS": "200"},
    )
    assert status.returncode == 0, status.stderr
    assert "nnodes 1:2" in status.stdout, status.stdout
