"""elastic_run.worker: the error file of record(), the timer client's wire format, WorkerEnv."""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_run import worker
from elastic_run.errors import ElasticRunError
from elastic_run.worker import (
    FileTimerClient,
    TimerClientError,
    WorkerEnv,
    WorkerEnvError,
    configure,
    expires,
    record,
)

# ----------------------------------------------------------------------------- record


@pytest.fixture
def error_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "attempt_0" / "0" / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    return path


def test_record_writes_torchs_error_format(error_file: Path) -> None:
    @record
    def main() -> None:
        raise ValueError("bad\nthing")

    before = int(time.time())
    with pytest.raises(ValueError, match="bad"):
        main()
    after = int(time.time())

    data = json.loads(error_file.read_text())
    assert list(data) == ["message"]
    assert list(data["message"]) == ["message", "extraInfo"]
    assert data["message"]["message"] == "ValueError: bad\nthing"
    extra = data["message"]["extraInfo"]
    assert list(extra) == ["py_callstack", "timestamp"]
    assert isinstance(extra["timestamp"], str)
    assert before <= int(extra["timestamp"]) <= after
    assert extra["py_callstack"].startswith("Traceback (most recent call last):\n")
    assert extra["py_callstack"].endswith("ValueError: bad\nthing\n")
    assert ", in main\n" in extra["py_callstack"]
    assert os.listdir(error_file.parent) == ["error.json"], "no temporary file is left behind"


def test_record_matches_torchs_own_record(error_file: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    def main() -> None:
        raise KeyError("k")

    error_file.parent.mkdir(parents=True)  # the agent makes the directory; torch expects it
    with pytest.raises(KeyError):
        torch_record(main)()
    theirs = json.loads(error_file.read_text())
    error_file.unlink()
    with pytest.raises(KeyError):
        record(main)()
    ours = json.loads(error_file.read_text())

    assert ours["message"]["message"] == theirs["message"]["message"] == "KeyError: 'k'"
    assert sorted(ours["message"]["extraInfo"]) == sorted(theirs["message"]["extraInfo"])
    for key in ("py_callstack", "timestamp"):
        assert type(ours["message"]["extraInfo"][key]) is type(theirs["message"]["extraInfo"][key])
    assert ours["message"]["extraInfo"]["py_callstack"].endswith("KeyError: 'k'\n")


def test_record_overwrites_an_old_error_file(error_file: Path) -> None:
    error_file.parent.mkdir(parents=True)
    error_file.write_text("stale")

    @record
    def main() -> None:
        raise RuntimeError("new")

    with pytest.raises(RuntimeError):
        main()
    assert json.loads(error_file.read_text())["message"]["message"] == "RuntimeError: new"


@pytest.mark.parametrize("code", [0, None])
def test_clean_system_exit_is_not_an_error(error_file: Path, code: int | None) -> None:
    @record
    def main() -> None:
        sys.exit(code)

    with pytest.raises(SystemExit):
        main()
    assert not error_file.exists()


def test_failing_system_exit_is_recorded(error_file: Path) -> None:
    @record
    def main() -> None:
        sys.exit(3)

    with pytest.raises(SystemExit):
        main()
    assert json.loads(error_file.read_text())["message"]["message"] == "SystemExit: 3"


def test_keyboard_interrupt_is_not_recorded(error_file: Path) -> None:
    @record
    def main() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        main()
    assert not error_file.exists()


def test_record_passes_results_and_arguments(error_file: Path) -> None:
    @record
    def add(a: int, *, b: int) -> int:
        return a + b

    assert add(1, b=2) == 3
    assert add.__name__ == "add"
    assert not error_file.exists()


def test_record_without_error_file_only_reraises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)

    @record
    def main() -> None:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        main()


# ----------------------------------------------------------------------------- timer client


@pytest.fixture
def fifo_reader(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real FIFO with this test reading it (read-write, non-blocking)."""
    path = str(tmp_path / "timer.fifo")
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield path, fd
    finally:
        os.close(fd)


def read_requests(fd: int) -> list[dict[str, object]]:
    data = os.read(fd, 65536)
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_client_wire_format(fifo_reader: tuple[str, int]) -> None:
    path, fd = fifo_reader
    client = FileTimerClient(path)
    client.acquire("step", 1234.5)
    client.release("step")
    assert read_requests(fd) == [
        {
            "version": 1,
            "pid": os.getpid(),
            "scope_id": "step",
            "expiration_time": 1234.5,
            "signal": int(signal.SIGKILL),
        },
        {"version": 1, "pid": os.getpid(), "scope_id": "step", "expiration_time": -1, "signal": 0},
    ]


def test_client_refuses_a_bad_request_before_writing(fifo_reader: tuple[str, int]) -> None:
    path, fd = fifo_reader
    client = FileTimerClient(path)
    for scope, at in [("s", float("nan")), ("s", "soon"), (5, 1.0)]:
        with pytest.raises(TimerClientError, match="finite number|must be a string"):
            client.acquire(scope, at)  # type: ignore[arg-type]
    with pytest.raises(BlockingIOError):
        os.read(fd, 1)  # nothing was written


def test_client_matches_torchs_client(fifo_reader: tuple[str, int]) -> None:
    from torch.distributed.elastic.timer.api import expires as torch_expires
    from torch.distributed.elastic.timer.file_based_local_timer import (
        FileTimerClient as TorchFileTimerClient,
    )

    path, fd = fifo_reader
    with torch_expires(after=30, scope="s", client=TorchFileTimerClient(path)):
        pass
    theirs = read_requests(fd)
    with expires(after=30, scope="s", client=FileTimerClient(path)):
        pass
    ours = read_requests(fd)
    assert [list(r) for r in ours] == [list(r) for r in theirs]
    for mine, torchs in zip(ours, theirs, strict=True):
        assert {k: v for k, v in mine.items() if k != "expiration_time"} == {
            k: v for k, v in torchs.items() if k != "expiration_time"
        }


def test_expires_arms_for_the_block_with_the_callers_scope(
    fifo_reader: tuple[str, int],
) -> None:
    path, fd = fifo_reader
    before = time.time()
    with expires(after=30, client=FileTimerClient(path, signal=signal.SIGTERM)):
        line = sys._getframe().f_lineno - 1
        [armed] = read_requests(fd)
    [released] = read_requests(fd)
    assert armed["scope_id"] == f"{__file__}#{line}"
    assert isinstance(armed["expiration_time"], float)
    assert before + 30 <= armed["expiration_time"] <= time.time() + 30
    assert armed["signal"] == signal.SIGTERM
    assert released["scope_id"] == armed["scope_id"]
    assert released["expiration_time"] == -1


def test_expires_releases_on_exception(fifo_reader: tuple[str, int]) -> None:
    path, fd = fifo_reader
    with pytest.raises(ZeroDivisionError), expires(1, "s", FileTimerClient(path)):
        1 / 0  # noqa: B018
    assert [r["expiration_time"] for r in read_requests(fd)][-1] == -1


def test_expires_uses_the_timer_file_env(
    fifo_reader: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, fd = fifo_reader
    monkeypatch.setenv("TORCHELASTIC_TIMER_FILE", path)
    with expires(after=5, scope="env"):
        pass
    assert [r["scope_id"] for r in read_requests(fd)] == ["env", "env"]


@pytest.fixture
def configured() -> Iterator[None]:
    """Forget the client a test configured."""
    try:
        yield
    finally:
        configure(None)


def test_expires_uses_the_configured_client(
    fifo_reader: tuple[str, int], monkeypatch: pytest.MonkeyPatch, configured: None
) -> None:
    path, fd = fifo_reader
    monkeypatch.setenv("TORCHELASTIC_TIMER_FILE", str(Path(path).with_name("nothing.fifo")))
    configure(FileTimerClient(path, signal=signal.SIGTERM))
    with expires(after=5, scope="configured"):
        pass
    armed, released = read_requests(fd)
    assert (armed["scope_id"], armed["signal"]) == ("configured", signal.SIGTERM)
    assert released["expiration_time"] == -1


def test_a_client_given_to_expires_wins_over_the_configured_one(
    fifo_reader: tuple[str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    configured: None,
) -> None:
    path, fd = fifo_reader
    configure(FileTimerClient(str(tmp_path / "missing.fifo")))
    with expires(after=5, scope="given", client=FileTimerClient(path)):
        pass
    assert [r["scope_id"] for r in read_requests(fd)] == ["given", "given"]
    configure(None)
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    with pytest.raises(TimerClientError, match="is not set"):
        expires(after=5, scope="forgotten")


def test_expires_takes_any_client_with_acquire_and_release(configured: None) -> None:
    calls: list[tuple[str, str, float | None]] = []

    class Recorder:
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            calls.append(("acquire", scope_id, expiration_time))

        def release(self, scope_id: str) -> None:
            calls.append(("release", scope_id, None))

    configure(Recorder())
    before = time.time()
    with expires(after=7, scope="any"):
        assert len(calls) == 1
    [(kind, scope, at), released] = calls
    assert (kind, scope) == ("acquire", "any")
    assert at is not None and before + 7 <= at <= time.time() + 7
    assert released == ("release", "any", None)


def test_expires_without_a_watchdog(monkeypatch: pytest.MonkeyPatch, configured: None) -> None:
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    with pytest.raises(TimerClientError, match="TORCHELASTIC_TIMER_FILE is not set"):
        expires(after=5)


def test_client_errors_are_clear(tmp_path: Path) -> None:
    missing = FileTimerClient(str(tmp_path / "missing.fifo"))
    with pytest.raises(TimerClientError, match="does not exist"):
        missing.acquire("s", time.time() + 5)

    unread = tmp_path / "unread.fifo"
    os.mkfifo(unread)
    with pytest.raises(TimerClientError, match="no watchdog is reading"):
        FileTimerClient(str(unread)).acquire("s", time.time() + 5)
    assert issubclass(TimerClientError, ElasticRunError)


def test_oversized_scope_is_refused(fifo_reader: tuple[str, int]) -> None:
    path, fd = fifo_reader
    with pytest.raises(TimerClientError, match="PIPE_BUF|atomic"):
        FileTimerClient(path).acquire("x" * select.PIPE_BUF, time.time() + 5)
    with pytest.raises(BlockingIOError):
        os.read(fd, 1)  # nothing was written


# ----------------------------------------------------------------------------- WorkerEnv

FULL_ENV = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "5",
    "ROLE_WORLD_SIZE": "8",
    "ROLE_NAME": "default",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "TORCHELASTIC_RUN_ID": "job42",
}


def test_worker_env_reads_the_contract() -> None:
    env = WorkerEnv.from_environ(FULL_ENV)
    assert env == WorkerEnv(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=4,
        group_rank=1,
        group_world_size=2,
        role_rank=5,
        role_world_size=8,
        role_name="default",
        master_addr="10.0.0.5",
        master_port=29500,
        restart_count=2,
        max_restarts=3,
        run_id="job42",
    )
    with pytest.raises(AttributeError):
        env.rank = 0  # type: ignore[misc]


def test_worker_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FULL_ENV.items():
        monkeypatch.setenv(key, value)
    assert WorkerEnv.from_environ().run_id == "job42"


@pytest.mark.parametrize("missing", sorted(FULL_ENV))
def test_worker_env_names_a_missing_variable(missing: str) -> None:
    env = {k: v for k, v in FULL_ENV.items() if k != missing}
    with pytest.raises(WorkerEnvError, match=rf"\b{missing}\b is not set"):
        WorkerEnv.from_environ(env)


def test_worker_env_rejects_a_non_integer() -> None:
    with pytest.raises(WorkerEnvError, match="MASTER_PORT must be an integer, got 'http'"):
        WorkerEnv.from_environ({**FULL_ENV, "MASTER_PORT": "http"})


def test_worker_module_imports_nothing_of_the_agent() -> None:
    tree = ast.parse((Path(worker.__file__).parent / "api.py").read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    banned = ("elastic_run.agent", "elastic_run.cli", "elastic_run.rendezvous", "torch", "psutil")
    assert not [name for name in imported if name.startswith(banned)]
    ours = {name for name in imported if name.startswith("elastic_run")}
    assert ours == {
        "elastic_run.worker.beat_file",
        "elastic_run.errors",
        "elastic_run.worker.timer_wire",
    }
