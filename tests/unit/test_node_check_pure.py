"""The node check's pure parts: its options and their one-line errors, the flag rows, which
devices a node is asked for, the lines the agent prints, and the judging of a command's end, of
the device probe's answer and of NVML's readings (against a stand-in of the pynvml module: the
one seam to a GPU, which this machine has not)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from elastic_run.agent.node_check import (
    CPU_SMOKE,
    FLAG_ROWS,
    NOTHING,
    CheckResult,
    CheckStatus,
    DeviceRequest,
    NodeCheckOptions,
    NodeCheckResult,
    device_request,
    failure_line,
    parse_min_free_bytes,
    parse_node_check_cmd,
    parse_node_check_timeout,
    run_node_check,
    startup_line,
)
from elastic_run.agent.node_check.bounded_process import BoundedRun
from elastic_run.agent.node_check.command import judge_command
from elastic_run.agent.node_check.device_check import judge_probe, parse_probe_output
from elastic_run.agent.node_check.device_probe import nvml_reading
from elastic_run.agent.node_check.device_request import visible_count
from elastic_run.agent.node_check.lines import one_line, show_bytes, show_seconds
from elastic_run.errors import ConfigurationError

# ---- options: a checked value or one line ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0", "--node-check-timeout 0 must be positive"),
        ("-1", "--node-check-timeout -1 must be positive"),
        ("abc", "--node-check-timeout 'abc' is not a number of seconds"),
        ("", "--node-check-timeout '' is not a number of seconds"),
        ("inf", "--node-check-timeout inf is not a finite number of seconds"),
        ("nan", "--node-check-timeout nan is not a finite number of seconds"),
        ("1e300", "is more than a year"),
        ("9" * 400, "--node-check-timeout inf is not a finite number of seconds"),
    ],
)
def test_a_bad_timeout_is_one_line_naming_the_flag(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_node_check_timeout(text)
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 200


def test_a_timeout_from_a_variable_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match=r"^PET_NODE_CHECK_TIMEOUT 'x' is not"):
        parse_node_check_timeout("x", "PET_NODE_CHECK_TIMEOUT")
    assert parse_node_check_timeout(" 2.5 ") == 2.5


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "--node-check-cmd must not be empty"),
        ("   ", "--node-check-cmd must not be empty"),
        ("true\0false", "holds a NUL character"),
        ("x" * 200_000, "characters long, more than"),
    ],
)
def test_a_bad_command_is_one_line(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_node_check_cmd(text)
    assert words in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1073741824", 1 << 30),
        ("512MiB", 512 << 20),
        (" 2 g ", 2 << 30),
        ("1TiB", 1 << 40),
    ],
)
def test_disk_bounds_in_bytes_or_binary_units(text: str, expected: int) -> None:
    assert parse_min_free_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("-1", "must not be negative"),
        ("abc", "is not a number of bytes"),
        ("inf", "is not a number of bytes"),
        ("nan", "is not a number of bytes"),
        ("1.5GiB", "is not a number of bytes"),
        ("3 PB", "is not a number of bytes"),
        ("2000000TiB", "is more than 1 EiB"),
        ("9" * 40, "is not a number of bytes"),
    ],
)
def test_a_bad_disk_bound_is_one_line(text: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_min_free_bytes(text)
    assert str(caught.value).startswith("min_free_bytes ") and words in str(caught.value)


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout_s": 0.0},
        {"timeout_s": -1.0},
        {"timeout_s": float("nan")},
        {"timeout_s": float("inf")},
        {"timeout_s": 1e300},
        {"command": ""},
        {"min_free_bytes": -1},
        {"min_free_bytes": 1 << 61},
        {"min_free_bytes": 1.5},
        {"min_free_bytes": float("nan")},
        {"min_free_bytes": True},
        {"enabled": "yes"},
    ],
)
def test_options_are_checked_when_made(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        NodeCheckOptions(**fields)
    assert "\n" not in str(caught.value)


def test_the_defaults() -> None:
    options = NodeCheckOptions()
    assert (options.enabled, options.timeout_s, options.command) == (True, 30.0, None)
    assert options.min_free_bytes == 1 << 30


def test_the_flag_rows_are_the_options_fields_with_their_defaults() -> None:
    defaults = NodeCheckOptions()
    fields = {f.name for f in dataclasses.fields(NodeCheckOptions)}
    assert [r.flag for r in FLAG_ROWS] == [
        "--node-check",
        "--node-check-timeout",
        "--node-check-cmd",
    ]
    for row in FLAG_ROWS:
        assert row.field in fields and row.flag == "--" + row.name.replace("_", "-")
        assert getattr(defaults, row.field) == row.default, row.name
        assert row.help.endswith(".") and row.takes
        assert (row.parse is None) == (row.form == "switch")
    timeout = next(r for r in FLAG_ROWS if r.name == "node_check_timeout")
    assert timeout.parse is not None and timeout.parse("30", "--node-check-timeout") == 30.0


# ---- which devices -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nproc", "count", "visible", "expected"),
    [
        ("cpu", 8, None, NOTHING),
        ("gpu", 8, None, DeviceRequest("cuda", None)),
        ("auto", 8, None, DeviceRequest("cuda", 8)),
        ("auto", 0, None, NOTHING),
        ("4", 8, None, DeviceRequest("cuda", 4)),
        ("16", 8, None, DeviceRequest("cuda", 8)),
        ("2", 0, None, NOTHING),
        ("2", 0, "", NOTHING),
        ("2", 0, "-1", NOTHING),
        ("2", 0, "0,1,2", DeviceRequest("cuda", 2)),  # given GPUs this node does not show
        ("auto", 0, "GPU-abc", DeviceRequest("cuda", 1)),
    ],
)
def test_the_devices_the_flags_ask_for(
    nproc: str, count: int, visible: str | None, expected: DeviceRequest
) -> None:
    got = device_request(nproc, cuda_device_count=count, cuda_visible_devices=visible)
    assert got == expected


def test_xpu_is_said_not_checked() -> None:
    got = device_request("xpu", cuda_device_count=0)
    assert got.is_empty and "XPU" in got.note


@pytest.mark.parametrize(
    ("value", "count"), [(None, None), ("", 0), ("0,1", 2), ("0,1,-1,2", 2), ("3", 1), ("-1", 0)]
)
def test_visible_count_reads_as_cuda(value: str | None, count: int | None) -> None:
    assert visible_count(value) == count


# ---- the lines -----------------------------------------------------------------------------


def _result(*checks: tuple[str, CheckStatus, str], duration_s: float = 1.2) -> NodeCheckResult:
    return NodeCheckResult(tuple(CheckResult(n, s, d, 0.1) for n, s, d in checks), duration_s)


def test_the_start_up_line() -> None:
    result = _result(
        ("devices", CheckStatus.SKIP, "no accelerator requested, nothing checked"),
        ("disk", CheckStatus.OK, show_bytes(120 << 30) + " free"),
        ("command", CheckStatus.OK, "ok"),
    )
    assert result.healthy and result.reason is None
    assert startup_line(result) == (
        "node check passed in 1.2 s: devices: no accelerator requested, nothing checked; "
        "disk: 120 GiB free; command: ok"
    )
    off = NodeCheckResult((), 0.0, enabled=False)
    assert off.healthy and startup_line(off) == "node check off (--no-node-check)"


def test_the_failure_line_gives_the_first_failures_reason() -> None:
    result = _result(
        ("devices", CheckStatus.OK, "cpu ok"),
        ("disk", CheckStatus.FAIL, "the log directory's disk (/x) has 3 MiB free"),
        ("command", CheckStatus.FAIL, "never shown: the first failure is the reason"),
    )
    assert not result.healthy
    assert failure_line("h3", result) == (
        "node h3 failed its node check: the log directory's disk (/x) has 3 MiB free"
    )
    assert startup_line(result).startswith("node check failed in 1.2 s: the log directory")
    record = json.loads(json.dumps(result.as_record()))
    assert record["healthy"] is False and record["checks"][1]["status"] == "fail"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (3_435_973_837, "3.2 GiB"),
        (120 << 30, "120 GiB"),
    ],
)
def test_show_bytes(count: int, text: str) -> None:
    assert show_bytes(count) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30.0, "30 s"),
        (2.5, "2.5 s"),
        (0.04, "0.04 s"),
        (1.25, "1.2 s"),
        (0.25, "0.25 s"),
        (0.0042, "0.004 s"),
        (0.0, "0 s"),
    ],
)
def test_show_seconds(seconds: float, text: str) -> None:
    assert show_seconds(seconds) == text


def test_one_line_escapes_control_characters_and_cuts() -> None:
    assert one_line("  a\tb\x1b[31mc  ") == "a?b?[31mc"
    assert one_line("x" * 300) == "x" * 197 + "..."


# ---- a command's end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "status", "detail"),
    [
        (BoundedRun(0, "anything\n", False, 0.1), CheckStatus.OK, "ok"),
        (
            BoundedRun(1, "\n  scratch disk full \nmore\n", False, 0.1),
            CheckStatus.FAIL,
            "scratch disk full",
        ),
        (
            BoundedRun(3, "", False, 0.1),
            CheckStatus.FAIL,
            "node check command exited 3 with no output",
        ),
        (
            BoundedRun(-9, "", False, 0.1),
            CheckStatus.FAIL,
            "node check command was killed by SIGKILL with no output",
        ),
        (
            BoundedRun(None, "partial", True, 30.0),
            CheckStatus.FAIL,
            "node check command timed out after 30 s",
        ),
        (
            BoundedRun(None, "", False, 0.0, "cannot start /bin/sh: gone"),
            CheckStatus.FAIL,
            "node check command did not run: cannot start /bin/sh: gone",
        ),
    ],
)
def test_judge_command(run: BoundedRun, status: CheckStatus, detail: str) -> None:
    got = judge_command(run, 30.0)
    assert (got.name, got.status, got.detail) == ("command", status, detail)


# ---- the device probe's answer -------------------------------------------------------------


def _lines(*records: dict[str, Any]) -> str:
    return "".join(json.dumps({"probe": 1, **r}) + "\n" for r in records)


def _dev(device: str, status: str = "ok", detail: str = "1024x1024 matmul ok") -> dict[str, Any]:
    return {
        "device": {
            "device": device,
            "name": "NVIDIA H200",
            "status": status,
            "detail": detail,
            "seconds": 0.03,
        }
    }


GPU2 = DeviceRequest("cuda", 2)


def test_a_healthy_answer_says_what_was_tried() -> None:
    text = _lines(
        {"step": "importing torch"},
        _dev("cuda:0"),
        _dev("cuda:1"),
        {"nvml": {"device": "cuda:0", "status": "ok", "detail": "no uncorrectable ECC errors"}},
        {"nvml": {"device": "cuda:1", "status": "ok", "detail": "no uncorrectable ECC errors"}},
        {"done": True},
    )
    got = judge_probe(GPU2, BoundedRun(0, text, False, 3.0), 30.0)
    assert got.status is CheckStatus.OK, got
    assert got.detail == (
        "2 CUDA devices ok (NVIDIA H200, 1024x1024 matmul 0.03 s at most); "
        "NVML: no uncorrectable ECC errors"
    )


def test_nvml_not_read_is_said_and_not_a_failure() -> None:
    text = _lines(
        _dev("cuda:0"),
        {"nvml": {"device": "cuda:0", "status": "skip", "detail": "nvidia-ml-py is not installed"}},
        {"done": True},
    )
    got = judge_probe(DeviceRequest("cuda", 1), BoundedRun(0, text, False, 3.0), 30.0)
    assert got.status is CheckStatus.OK
    assert got.detail.endswith("; NVML not read: nvidia-ml-py is not installed")


@pytest.mark.parametrize(
    ("text", "timed_out", "code", "detail"),
    [
        (
            _lines(
                {"step": "importing torch"},
                _dev("cuda:0"),
                {"step": "cuda:1: initialising, 1024x1024 matmul"},
            ),
            True,
            None,
            "device check timed out after 30 s at cuda:1: initialising, 1024x1024 matmul",
        ),
        (
            _lines(_dev("cuda:0"), _dev("cuda:1", "fail", "3 of 1048576 matmul results wrong")),
            False,
            0,
            "cuda:1 (NVIDIA H200): 3 of 1048576 matmul results wrong",
        ),
        (
            _lines(
                _dev("cuda:0"),
                {
                    "nvml": {
                        "device": "cuda:0",
                        "status": "fail",
                        "detail": "2 uncorrectable ECC errors since the last reset",
                    }
                },
                {"done": True},
            ),
            False,
            0,
            "cuda:0 (NVIDIA H200): 2 uncorrectable ECC errors since the last reset",
        ),
        (
            _lines({"error": "2 CUDA devices requested, 1 visible"}),
            False,
            0,
            "2 CUDA devices requested, 1 visible",
        ),
        (
            _lines({"step": "importing torch"}) + "Segmentation fault\n",
            False,
            -11,
            "the device probe was killed by SIGSEGV before its answer at importing torch: Segmentation fault",
        ),
        ("garbage\n", False, 1, "the device probe exited 1 before its answer: garbage"),
        (
            json.dumps({"probe": 99, "done": True}) + "\n",
            False,
            0,
            'the device probe exited 0 before its answer: {"probe": 99, "done": true}',
        ),
        (_lines({"done": True}), False, 0, "the device probe tried no device"),
    ],
)
def test_an_unfit_answer_names_the_device_or_the_step(
    text: str, timed_out: bool, code: int | None, detail: str
) -> None:
    got = judge_probe(GPU2, BoundedRun(code, text, timed_out, 30.0), 30.0)
    assert (got.status, got.detail) == (CheckStatus.FAIL, detail)


def test_records_of_unknown_shape_are_ignored() -> None:
    answer = parse_probe_output(_lines({"device": "not a dict"}, {"what": 1}, {"done": True}))
    assert answer.done and not answer.devices and answer.junk is None


# ---- NVML's readings, against a stand-in of the pynvml module ------------------------------


class _NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


NOT_SUPPORTED = _NVMLError(3, "Not Supported")


class FakeNVML:
    """The names of pynvml the probe reads; each answer given, or an error raised."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_FEATURE_ENABLED = 1
    NVML_ERROR_GPU_IS_LOST = 15

    def __init__(
        self, volatile: Any = 0, aggregate: Any = 0, pending: Any = 0, rows: Any = (0, 0, 0, 0)
    ) -> None:
        self._answers = {
            "volatile": volatile,
            "aggregate": aggregate,
            "pending": pending,
            "rows": rows,
        }

    def _give(self, what: str) -> Any:
        answer = self._answers[what]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int) -> Any:  # noqa: N802
        return self._give("volatile" if counter == self.NVML_VOLATILE_ECC else "aggregate")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> Any:  # noqa: N802
        return self._give("pending")

    def nvmlDeviceGetRemappedRows(self, handle: object) -> Any:  # noqa: N802
        return self._give("rows")


def test_a_healthy_device_reads_ok() -> None:
    got = nvml_reading(FakeNVML(), "cuda:0", object())
    assert got["status"] == "ok"
    assert got["detail"] == (
        "no uncorrectable ECC errors, no pages waiting to be retired, no rows waiting to be remapped"
    )


def test_a_sandbox_where_nvml_supports_nothing_skips_with_the_reasons() -> None:
    fake = FakeNVML(NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED)
    got = nvml_reading(fake, "cuda:0", object())
    assert got["status"] == "skip"
    assert got["detail"] == (
        "volatile ECC: Not Supported; aggregate ECC: Not Supported; retired pages: Not Supported; "
        "remapped rows: Not Supported"
    )


def test_what_is_supported_is_read_and_the_rest_named() -> None:
    got = nvml_reading(FakeNVML(pending=NOT_SUPPORTED, aggregate=4), "cuda:0", object())
    assert got["status"] == "ok"
    assert got["detail"] == (
        "no uncorrectable ECC errors, 4 in its lifetime, no rows waiting to be remapped "
        "(not supported: retired pages)"
    )


class _OldBinding:
    """An nvidia-ml-py without the remapped-rows call (older than the A100)."""

    NVML_FEATURE_ENABLED = 1

    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:  # noqa: N802
        return 0


def test_a_call_the_binding_lacks_is_skipped() -> None:
    got = nvml_reading(_OldBinding(), "cuda:0", object())
    assert got["status"] == "ok" and "not supported: remapped rows" in got["detail"]


@pytest.mark.parametrize(
    ("fake", "words"),
    [
        (FakeNVML(volatile=2), "2 uncorrectable ECC errors since the last reset"),
        (FakeNVML(pending=1), "memory pages are waiting to be retired: reset the GPU"),
        (FakeNVML(rows=(0, 1, 1, 0)), "memory rows are waiting to be remapped: reset the GPU"),
        (FakeNVML(rows=(0, 1, 0, 1)), "a row remapping failed: the GPU needs service"),
        (
            FakeNVML(volatile=_NVMLError(15, "GPU is lost")),
            "NVML says the GPU is lost (volatile ECC)",
        ),
    ],
)
def test_an_unfit_device_fails(fake: FakeNVML, words: str) -> None:
    got = nvml_reading(fake, "cuda:0", object())
    assert got["status"] == "fail" and words in got["detail"]


# ---- the shared budget ---------------------------------------------------------------------


def test_a_check_that_starts_with_no_time_left_fails_and_the_rest_are_not_run(
    tmp_path: Any,
) -> None:
    """A clock that jumps past the deadline after the start (no process runs: nothing asked)."""
    ticks = iter([0.0] + [100.0] * 10)
    result = run_node_check(
        NodeCheckOptions(timeout_s=30.0, min_free_bytes=0),
        NOTHING,
        tmp_path,
        clock=lambda: next(ticks),
    )
    assert [(c.name, c.status) for c in result.checks] == [
        ("devices", CheckStatus.FAIL),
        ("disk", CheckStatus.SKIP),
        ("command", CheckStatus.SKIP),
    ]
    assert result.reason == "no time left of the 30 s node check"
    assert result.checks[1].detail == "not run: an earlier check failed"


def test_cpu_smoke_is_a_cpu_request() -> None:
    assert (CPU_SMOKE.kind, CPU_SMOKE.count, CPU_SMOKE.is_empty) == ("cpu", 1, False)


def test_the_probe_imports_nothing_of_elastic_run_and_torch_only_when_it_runs() -> None:
    """It runs in the child by its file path: an import of the package would find it or not
    by the child's path, and torch at import would load in the agent, which imports it too."""
    import ast

    from elastic_run.agent.node_check.device_check import PROBE_PATH

    tree = ast.parse(PROBE_PATH.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"elastic_run", "torch", "pynvml"}, imported


def test_a_probe_that_does_not_die_on_sigkill_is_said_so() -> None:
    stuck = "python did not die on SIGKILL within 2 s (stuck in the kernel?)"
    text = _lines({"step": "cuda:0: initialising, 1024x1024 matmul"})
    got = judge_probe(DeviceRequest("cuda", 1), BoundedRun(None, text, True, 32.5, stuck), 30.0)
    assert got.detail == (
        "device check timed out after 30 s at cuda:0: initialising, 1024x1024 matmul; " + stuck
    )
