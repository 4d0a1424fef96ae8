"""The device probe: a child process that tries each device and reports in JSON lines.

One concept: what runs *outside* the agent's interpreter to touch the devices, so that a wedged
driver hangs only this child, which the agent kills at its deadline
(:mod:`~elastic_run.agent.node_check.device_check` starts it, by its file path, with the
agent's interpreter). It imports nothing of elastic-run: only the standard library, torch and,
where it imports, nvidia-ml-py (``pynvml``).

It writes one JSON object per line on stdout, each with ``"probe": 1`` (the wire's version):

- ``{"step": "cuda:3: initialising, 1024x1024 matmul"}`` before each step, so that a parent
  that had to kill it can say where it hung;
- ``{"device": {"device", "name", "status", "detail", "seconds", "uuid"}}`` per device, after
  its matmul (``status`` ok or fail);
- ``{"nvml": {"device", "status", "detail"}}`` per CUDA device (ok, fail or skip);
- ``{"error": "..."}`` when it cannot go on (torch does not import, fewer devices than asked);
- ``{"done": true}`` last.

For each device: initialise it, multiply two ``size x size`` float32 matrices of ones and twos
on it, wait for the result, and compare every entry with ``2 * size`` (exact in float32, TF32
and bf16 accumulation alike). NVML, per CUDA device: uncorrectable ECC errors since the last
reset (volatile: fail when any) and over the device's life (aggregate: reported, not failed,
since a row remapped or a page retired after an old error leaves the count behind on a healthy
device), pages waiting to be retired and rows waiting to be remapped (fail: the device needs a
reset), a failed row remapping (fail). An NVML call that is not supported (a consumer GPU, ECC
off, a gVisor sandbox, an old driver or binding) is a skip with its reason, never a traceback;
only a lost GPU (``NVML_ERROR_GPU_IS_LOST``) is a failure.

Run as ``python device_probe.py --kind cuda|cpu --count N|all --size 1024``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

__all__ = ["PROBE_VERSION", "main", "nvml_reading", "probe"]

PROBE_VERSION = 1
_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST, where the binding does not name it
_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_VOLATILE_ECC = 0
_AGGREGATE_ECC = 1
_FEATURE_ENABLED = 1


def _say(**record: Any) -> None:
    print(json.dumps({"probe": PROBE_VERSION, **record}), flush=True)


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # an NVML error's text comes from the library, which may fail too
        text = ""
    return " ".join(text.split()) or type(exc).__name__


def _is_gpu_lost(nvml: Any, exc: BaseException) -> bool:
    lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST)
    return getattr(exc, "value", None) == lost


def _nvml_handle(nvml: Any, index: int, uuid: str | None, visible: str | None) -> Any:
    """The NVML handle of CUDA device ``index``: by its UUID (NVML counts devices in PCI order
    over the whole machine, CUDA in its own order over the visible ones), else by the entry of
    ``CUDA_VISIBLE_DEVICES`` that names it, else by the index itself."""
    if uuid:
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name.encode())
        except Exception:
            pass  # an old binding or driver: try the other ways
    entries = [e.strip() for e in visible.split(",")] if visible else []
    entry = entries[index] if index < len(entries) else str(index)
    if entry.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(entry.encode())
    return nvml.nvmlDeviceGetHandleByIndex(int(entry))


def nvml_reading(nvml: Any, device: str, handle: Any) -> dict[str, str]:
    """Read one CUDA device's memory health from NVML.

    Args:
        nvml: the ``pynvml`` module (initialised), or an object with its names.
        device: the device as the workers see it (``cuda:0``), for the words.
        handle: its NVML handle.

    Returns:
        ``{"device", "status", "detail"}``: ``fail`` when a reading shows the device unfit,
        ``ok`` when some reading answered and none did, ``skip`` when none answered (each
        unsupported call named with NVML's reason).
    """
    found: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []

    def read(what: str, function: str, *args: Any) -> Any:
        try:
            call = getattr(nvml, function)
        except AttributeError:
            skipped.append(f"{what}: this nvidia-ml-py has no {function}")
            return None
        try:
            return call(handle, *args)
        except Exception as exc:
            if _is_gpu_lost(nvml, exc):
                failed.append(f"NVML says the GPU is lost ({what})")
            else:
                skipped.append(f"{what}: {_error_text(exc)}")
            return None

    uncorrected = getattr(
        nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _MEMORY_ERROR_TYPE_UNCORRECTED
    )
    ecc = "nvmlDeviceGetTotalEccErrors"
    volatile = read(
        "volatile ECC", ecc, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", _VOLATILE_ECC)
    )
    if volatile is not None:
        if int(volatile) > 0:
            failed.append(f"{int(volatile)} uncorrectable ECC errors since the last reset")
        else:
            found.append("no uncorrectable ECC errors")
    aggregate = read(
        "aggregate ECC", ecc, uncorrected, getattr(nvml, "NVML_AGGREGATE_ECC", _AGGREGATE_ECC)
    )
    if aggregate is not None and int(aggregate) > 0:
        what = (
            "in its lifetime"
            if volatile is not None
            else "uncorrectable ECC errors in its lifetime"
        )
        found.append(f"{int(aggregate)} {what}")
    pending = read("retired pages", "nvmlDeviceGetRetiredPagesPendingStatus")
    if pending is not None:
        if int(pending) == getattr(nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED):
            failed.append("memory pages are waiting to be retired: reset the GPU")
        else:
            found.append("no pages waiting to be retired")
    rows = read("remapped rows", "nvmlDeviceGetRemappedRows")
    if rows is not None:
        try:
            _, _, is_pending, failure = (int(x) for x in rows)
        except (TypeError, ValueError):
            skipped.append(f"remapped rows: an answer of an unknown shape ({rows!r:.40})")
        else:
            if failure:
                failed.append("a row remapping failed: the GPU needs service")
            elif is_pending:
                failed.append("memory rows are waiting to be remapped: reset the GPU")
            else:
                found.append("no rows waiting to be remapped")
    if failed:
        return {"device": device, "status": "fail", "detail": "; ".join(failed)}
    if found:
        detail = ", ".join(found)
        if skipped:
            detail += f" (not supported: {', '.join(s.split(':')[0] for s in skipped)})"
        return {"device": device, "status": "ok", "detail": detail}
    return {"device": device, "status": "skip", "detail": "; ".join(skipped) or "nothing read"}


def _matmul(torch: Any, device: str, size: int) -> tuple[str, str]:
    """``(status, detail)`` of one ``size x size`` matmul on ``device``, checked entry by entry."""
    a = torch.ones((size, size), dtype=torch.float32, device=device)
    b = torch.full((size, size), 2.0, dtype=torch.float32, device=device)
    c = a @ b
    bad = c != 2.0 * size
    wrong = int(bad.sum().item())  # .item() waits for the device
    if wrong:
        sample = float(c[bad][0].item())
        return (
            "fail",
            f"{wrong} of {size * size} matmul results wrong (one is {sample:g}, not {2 * size})",
        )
    return "ok", f"{size}x{size} matmul ok"


def probe(kind: str, count: int | None, size: int) -> None:
    """Try the devices and say what was found, one JSON line at a time (see the module).

    Args:
        kind: ``cuda`` or ``cpu``.
        count: how many devices (0..count-1); None: every device found.
        size: the matmul's side.
    """
    _say(step="importing torch")
    try:
        torch: Any = importlib.import_module("torch")
    except Exception as exc:
        _say(error=f"torch does not import: {_error_text(exc)}")
        return
    if kind == "cpu":
        devices = ["cpu"]
    else:
        _say(step="counting CUDA devices")
        found = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        wanted = found if count is None else count
        if found == 0 or found < wanted:
            seen = "none" if found == 0 else str(found)
            asked = "at least 1 CUDA device" if count is None else f"{count} CUDA devices"
            if count == 1:
                asked = "1 CUDA device"
            _say(error=f"{asked} requested, {seen} visible")
            return
        devices = [f"cuda:{i}" for i in range(wanted)]
    uuids: dict[str, str | None] = {}
    for device in devices:
        _say(step=f"{device}: initialising, {size}x{size} matmul")
        started = time.monotonic()
        name, uuid = "CPU", None
        try:
            if device != "cpu":
                props = torch.cuda.get_device_properties(device)
                name, uuid = str(props.name), str(getattr(props, "uuid", "") or "") or None
            status, detail = _matmul(torch, device, size)
        except Exception as exc:
            status, detail = "fail", f"{type(exc).__name__}: {_error_text(exc)}"
        uuids[device] = uuid
        _say(
            device={
                "device": device,
                "name": name,
                "status": status,
                "detail": detail,
                "seconds": round(time.monotonic() - started, 4),
                "uuid": uuid,
            }
        )
    if kind == "cuda":
        _nvml_all(devices, uuids)
    _say(done=True)


def _nvml_all(devices: list[str], uuids: dict[str, str | None]) -> None:
    try:
        nvml: Any = importlib.import_module("pynvml")
    except Exception as exc:
        why = "nvidia-ml-py is not installed" if isinstance(exc, ImportError) else _error_text(exc)
        for device in devices:
            _say(nvml={"device": device, "status": "skip", "detail": why})
        return
    _say(step="NVML: starting")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        for device in devices:
            _say(
                nvml={
                    "device": device,
                    "status": "skip",
                    "detail": f"NVML does not start: {_error_text(exc)}",
                }
            )
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        for index, device in enumerate(devices):
            _say(step=f"{device}: NVML readings")
            try:
                handle = _nvml_handle(nvml, index, uuids.get(device), visible)
            except Exception as exc:
                reading = {
                    "device": device,
                    "status": "skip",
                    "detail": f"no NVML handle: {_error_text(exc)}",
                }
                if _is_gpu_lost(nvml, exc):
                    reading = {
                        "device": device,
                        "status": "fail",
                        "detail": "NVML says the GPU is lost",
                    }
            else:
                reading = nvml_reading(nvml, device, handle)
            _say(nvml=reading)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass  # nothing more to read; the process ends next


def main(argv: list[str] | None = None) -> int:
    """The probe's command line (``--kind``, ``--count``, ``--size``).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        0 (what was found is in the lines written, not in the exit status); 2 for bad arguments.
    """
    parser = argparse.ArgumentParser(prog="device_probe", add_help=False)
    parser.add_argument("--kind", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--count", default="all")
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args(argv)
    count = None if args.count == "all" else int(args.count)
    try:
        probe(args.kind, count, args.size)
    except BaseException as exc:  # anything at all: said in one line, never a traceback
        _say(error=f"the probe broke: {type(exc).__name__}: {_error_text(exc)}")
        return 1
    return 0


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # no sibling shadows
    sys.exit(main())
