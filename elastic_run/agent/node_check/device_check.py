"""The device check: start the device probe in a child process, bound it, judge its answer.

One concept: the agent's side of :mod:`~elastic_run.agent.node_check.device_probe`. The probe
runs with the agent's interpreter (``python``, by default this one's) but never *in* it: a
wedged driver hangs the child, which :func:`~elastic_run.agent.node_check.bounded_process.
run_bounded` kills with its process group at the deadline. Its JSON lines
(:func:`parse_probe_output`) become one result (:func:`judge_probe`, pure):

- nothing requested (a CPU-only node): skip, ``no accelerator requested, nothing checked``;
- every device's matmul right and no NVML reading unfit: ok, ``2 CUDA devices ok (NVIDIA H200,
  1024x1024 matmul 0.03 s); NVML: no uncorrectable ECC errors, ...``;
- a device wrong or unreadable, an NVML failure, an error line, a child that died or was cut
  at its deadline (naming the step it was on): fail, naming the device.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_run.agent.node_check import device_probe
from elastic_run.agent.node_check.bounded_process import BoundedRun, run_bounded
from elastic_run.agent.node_check.device_request import DeviceRequest
from elastic_run.agent.node_check.lines import one_line, show_seconds
from elastic_run.agent.node_check.result import CheckResult, CheckStatus

__all__ = [
    "DEFAULT_MATMUL_SIZE",
    "NAME",
    "PROBE_PATH",
    "ProbeAnswer",
    "ProbeDevice",
    "check_devices",
    "judge_probe",
    "parse_probe_output",
    "probe_argv",
]

NAME = "devices"
DEFAULT_MATMUL_SIZE = 1024
"""The probe's matmul side: 4 MiB per matrix, microseconds on a GPU, tens of ms on a CPU core."""
PROBE_PATH = Path(device_probe.__file__).resolve()
"""The probe's file, run by its path so the child imports nothing of elastic-run."""


@dataclass(frozen=True)
class ProbeDevice:
    """One device as the probe found it (``status`` ok or fail; ``nvml_*`` empty: not read,
    else its NVML reading's status, ok, fail or skip, and words)."""

    device: str
    name: str
    status: str
    detail: str
    seconds: float
    nvml_status: str = ""
    nvml_detail: str = ""


@dataclass(frozen=True)
class ProbeAnswer:
    """What the probe said, folded from its lines.

    Attributes:
        devices: each device tried, in order, with its NVML reading where one came.
        error: the probe's own error line, if any.
        last_step: the last step it announced (where it was when it was killed).
        done: it said it was done.
        junk: the first line that was not one of its records (a crash's text), if any.
    """

    devices: tuple[ProbeDevice, ...] = ()
    error: str | None = None
    last_step: str | None = None
    done: bool = False
    junk: str | None = None


def probe_argv(request: DeviceRequest, python: str, size: int = DEFAULT_MATMUL_SIZE) -> list[str]:
    """The probe's command line for ``request``.

    Args:
        request: the devices to try (not empty).
        python: the interpreter to run it with.
        size: the matmul's side.

    Returns:
        ``[python, PROBE_PATH, --kind, ..., --count, ..., --size, ...]``.
    """
    count = "all" if request.count is None else str(request.count)
    return [
        python,
        str(PROBE_PATH),
        "--kind",
        request.kind or "cpu",
        "--count",
        count,
        "--size",
        str(size),
    ]


def parse_probe_output(text: str) -> ProbeAnswer:
    """Fold the probe's JSON lines into one answer (pure).

    A line that is not a JSON object of the probe's version is junk (the first is kept: a
    crash's words); a record of an unknown shape is ignored.

    Args:
        text: the probe's output.

    Returns:
        The answer.
    """
    devices: list[dict[str, Any]] = []
    nvml: dict[str, tuple[str, str]] = {}
    error = last_step = junk = None
    done = False
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or record.get("probe") != device_probe.PROBE_VERSION:
            junk = junk or one_line(line)
            continue
        if isinstance(record.get("step"), str):
            last_step = record["step"]
        elif isinstance(record.get("device"), dict):
            devices.append(record["device"])
        elif isinstance(record.get("nvml"), dict):
            reading = record["nvml"]
            nvml[str(reading.get("device"))] = (
                str(reading.get("status", "skip")),
                str(reading.get("detail", "")),
            )
        elif isinstance(record.get("error"), str):
            error = error or record["error"]
        elif record.get("done") is True:
            done = True
    return ProbeAnswer(
        devices=tuple(_device(d, nvml) for d in devices),
        error=error,
        last_step=last_step,
        done=done,
        junk=junk,
    )


def _device(record: dict[str, Any], nvml: dict[str, tuple[str, str]]) -> ProbeDevice:
    device = str(record.get("device", "?"))
    nvml_status, nvml_detail = nvml.get(device, ("", ""))
    seconds = record.get("seconds", 0.0)
    return ProbeDevice(
        device=device,
        name=str(record.get("name", "")),
        status=str(record.get("status", "fail")),
        detail=one_line(str(record.get("detail", ""))),
        seconds=float(seconds) if isinstance(seconds, (int, float)) else 0.0,
        nvml_status=nvml_status,
        nvml_detail=one_line(nvml_detail),
    )


def _died(run: BoundedRun) -> str:
    code = run.exit_code
    if code is None:
        return run.error or "did not run"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited {code}"


def judge_probe(request: DeviceRequest, run: BoundedRun, timeout_s: float) -> CheckResult:
    """Judge how the probe ended and what it said (pure).

    Args:
        request: what was asked (its kind names the devices in the words).
        run: how the probe ended.
        timeout_s: the time it was given.

    Returns:
        The device check's result.
    """
    answer = parse_probe_output(run.output)
    took = run.duration_s

    def fail(detail: str) -> CheckResult:
        return CheckResult(NAME, CheckStatus.FAIL, detail, took)

    for dev in answer.devices:
        named = f"{dev.device} ({dev.name})" if dev.name and dev.name != "CPU" else dev.device
        if dev.status != "ok":
            return fail(f"{named}: {dev.detail}")
        if dev.nvml_status == "fail":
            return fail(f"{named}: {dev.nvml_detail}")
    if answer.error:
        return fail(one_line(answer.error))
    where = f" at {answer.last_step}" if answer.last_step else ""
    if run.timed_out:
        stuck = f"; {run.error}" if run.error else ""
        return fail(f"device check timed out after {show_seconds(timeout_s)}{where}{stuck}")
    if not answer.done:
        said = f": {answer.junk}" if answer.junk else ""
        return fail(f"the device probe {_died(run)} before its answer{where}{said}")
    if not answer.devices:
        return fail("the device probe tried no device")
    return CheckResult(NAME, CheckStatus.OK, _summary(request, answer.devices), took)


def _summary(request: DeviceRequest, devices: tuple[ProbeDevice, ...]) -> str:
    slowest = max(d.seconds for d in devices)
    names = sorted({d.name for d in devices if d.name})
    matmul = devices[0].detail.removesuffix(" ok")
    if request.kind == "cpu":
        return f"cpu ok ({matmul} {show_seconds(slowest)})"
    count = len(devices)
    kind = f"{count} CUDA device{'s' if count != 1 else ''}"
    text = f"{kind} ok ({', '.join(names)}, {matmul} {show_seconds(slowest)} at most)"
    readings = {d.nvml_status: d.nvml_detail for d in devices if d.nvml_status}
    if "ok" in readings:
        text += f"; NVML: {readings['ok']}"
    elif "skip" in readings:
        text += f"; NVML not read: {readings['skip']}"
    return text


def check_devices(
    request: DeviceRequest,
    timeout_s: float,
    *,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    size: int = DEFAULT_MATMUL_SIZE,
) -> CheckResult:
    """Try the requested devices in a bounded child process.

    Args:
        request: the devices (empty: skip with its note).
        timeout_s: the child's time limit.
        python: the interpreter that runs the probe (the agent's by default; it must import
            torch, and nvidia-ml-py where NVML is to be read).
        env: the child's environment (``CUDA_VISIBLE_DEVICES`` as the workers will have it);
            None: the agent's.
        clock: monotonic seconds.
        size: the matmul's side.

    Returns:
        The device check's result (see :func:`judge_probe`).
    """
    if request.is_empty:
        return CheckResult(NAME, CheckStatus.SKIP, request.note, 0.0)
    run = run_bounded(probe_argv(request, python, size), timeout_s, env=env, clock=clock)
    return judge_probe(request, run, timeout_s)
