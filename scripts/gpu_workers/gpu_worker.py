"""The worker of scripts/gpu_check.py: dumps its environment, or trains a small model on a GPU.

    gpu_worker.py env LABEL [--cuda-info] [--gpu-pids]
        writes ``$GPUCHECK_OUT/env-LABEL-<RANK>-<pid>.json``: the environment, the CPU affinity,
        whether the parent is elastic-run's zygote, (--cuda-info) the devices torch sees, and
        (--gpu-pids) the processes that hold GPU memory then.
    gpu_worker.py train [--steps N] [--step-sleep S] [--backend nccl|gloo|none] [--hang-at K]
                        [--gpu-pids-at-start] [--gpu-pids-at-end] [--device cuda|cpu]
        appends JSON lines to ``$GPUCHECK_RECORDS`` (one ``os.write`` each): ``start`` (before
        anything touches CUDA: is CUDA initialised, who is the parent, what the zygote holds,
        optionally which pids hold GPU memory), one ``step`` per step with its time stamp, and
        ``done``. With ``--hang-at K`` the first attempt (TORCHELASTIC_RESTART_COUNT 0) beats K
        steps, then loops in ``torch.cuda._sleep`` kernels forever (``stuck_in_cuda_sleep``).

``GPUCHECK_NODE`` (optional) labels the records of one agent's workers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

_ZYGOTE_PROGRAM = "zygote_process.py"


def record(**fields: Any) -> None:
    """Append one record, in one write (lines of several workers never interleave)."""
    fields.setdefault("t", time.time())
    fields.setdefault("pid", os.getpid())
    fields.setdefault("node", os.environ.get("GPUCHECK_NODE", ""))
    line = (json.dumps(fields) + "\n").encode()
    fd = os.open(os.environ["GPUCHECK_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def parent_is_zygote() -> bool | None:
    """Was this worker forked by elastic-run's zygote (a warm start)? None: the parent's
    /proc/PID/cmdline cannot be read here (a sandbox)."""
    try:
        cmdline = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    if not cmdline:
        return None
    return _ZYGOTE_PROGRAM.encode() in cmdline


def zygote_cuda_traces(pid: int) -> dict[str, Any]:
    """What of the CUDA driver the process ``pid`` holds: open /dev/nvidia* files (the driver
    was initialised) and whether libcuda is mapped."""
    fds = []
    try:
        for entry in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                fds.append(target)
    except OSError as exc:
        return {"error": str(exc)}
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError as exc:
        return {"error": str(exc)}
    return {"nvidia_fds": sorted(set(fds)), "libcuda": "libcuda.so" in maps}


def gpu_pids() -> list[list[int]] | str:
    """[[pid, used MiB], ...] of the processes holding GPU memory (NVML if importable, else
    nvidia-smi), or why they could not be read. Neither initialises CUDA in this process."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            out = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = proc.usedGpuMemory
                    out.append([int(proc.pid), int(used) >> 20 if used else -1])
            pynvml.nvmlShutdown()
            return out
        except Exception as exc:  # NVML's own errors: fall back to nvidia-smi
            fallback = f"NVML: {exc}; "
    else:
        fallback = ""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return fallback + "no nvidia-smi"
    done = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if done.returncode != 0:
        return fallback + f"nvidia-smi exit {done.returncode}"
    rows = []
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdecimal():
            rows.append([int(cells[0]), int(cells[1]) if cells[1].isdecimal() else -1])
    return rows


def gpu_memory_used_mib() -> int | None:
    """The GPU memory in use on every GPU together, by nvidia-smi (None: not readable)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    done = subprocess.run(
        [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    cells = done.stdout.split()
    if done.returncode != 0 or not cells or not all(c.isdecimal() for c in cells):
        return None
    return sum(int(c) for c in cells)


def dump_env(label: str, cuda_info: bool, with_gpu_pids: bool) -> None:
    out = Path(os.environ["GPUCHECK_OUT"])
    doc: dict[str, Any] = {
        "env": dict(os.environ),
        "pid": os.getpid(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "parent_is_zygote": parent_is_zygote(),
    }
    if cuda_info:
        devices = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            domain, bus, dev = (
                int(getattr(props, name, 0))
                for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")
            )
            devices.append(
                {"pci_bus_id": f"{domain:04x}:{bus:02x}:{dev:02x}.0", "uuid": str(props.uuid)}
            )
        doc["devices"] = devices
    if with_gpu_pids:
        doc["gpu_pids"] = gpu_pids()
    rank = os.environ.get("RANK", "x")
    path = out / f"env-{label}-{rank}-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.rename(path)  # whole files only for the reader


def stuck_in_cuda_sleep(device: torch.device) -> None:
    """Loop in GPU kernels that never end: the launch queue fills, then this frame blocks."""
    while True:
        if device.type == "cuda":
            torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time per kernel
        else:  # the CPU rehearsal
            time.sleep(0.1)


def train(args: argparse.Namespace) -> None:
    from elastic_run.worker import progress

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    start: dict[str, Any] = {
        "kind": "start",
        "rank": rank,
        "world": world,
        "restart": restart,
        "ppid": os.getppid(),
        "parent_is_zygote": parent_is_zygote(),
        "cuda_initialized": bool(torch.cuda.is_initialized()),
        # Forked from a process that asked the CUDA driver anything (torch.cuda.is_available()
        # without PYTORCH_NVML_BASED_CUDA_CHECK=1): torch refuses CUDA here.
        "bad_fork": bool(torch.cuda._is_in_bad_fork()),
    }
    if start["parent_is_zygote"]:
        start["zygote"] = zygote_cuda_traces(os.getppid())
    if args.gpu_pids_at_start:
        start["gpu_pids"] = gpu_pids()
        start["memory_used_mib"] = gpu_memory_used_mib()
    record(**start)

    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist = None
    if args.backend != "none":
        import torch.distributed as dist

        dist.init_process_group(args.backend)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=gen).to(device)
    y = x.sum(dim=1, keepdim=True).to(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
    ).to(device)
    # 256 MiB on a GPU, plain to see in nvidia-smi (4 MiB in the CPU rehearsal)
    ballast = torch.ones(64 << 20 if device.type == "cuda" else 1 << 20, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if args.hang_at is not None and restart == 0 and step == args.hang_at:
            record(kind="hang", step=step, rank=rank, restart=restart)
            stuck_in_cuda_sleep(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if dist is not None:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)  # gloo with CUDA tensors, or NCCL
                p.grad /= world
        optimizer.step()
        value = float(loss.item())  # waits for the GPU: the step is done
        record(
            kind="step",
            step=step,
            rank=rank,
            world=world,
            restart=restart,
            loss=value,
            device=str(device),
        )
        progress()
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
    end: dict[str, Any] = {
        "kind": "done",
        "rank": rank,
        "world": world,
        "restart": restart,
        "finite": math.isfinite(value),
        "ballast": float(ballast[0].item()),
    }
    if args.gpu_pids_at_end:
        end["gpu_pids"] = gpu_pids()
    record(**end)
    if dist is not None:
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpu_worker.py")
    modes = parser.add_subparsers(dest="mode", required=True)
    env = modes.add_parser("env")
    env.add_argument("label")
    env.add_argument("--cuda-info", action="store_true")
    env.add_argument("--gpu-pids", action="store_true")
    tr = modes.add_parser("train")
    tr.add_argument("--steps", type=int, default=20)
    tr.add_argument("--step-sleep", type=float, default=0.0)
    tr.add_argument("--backend", choices=("nccl", "gloo", "none"), default="none")
    tr.add_argument("--hang-at", type=int, default=None)
    tr.add_argument("--gpu-pids-at-start", action="store_true")
    tr.add_argument("--gpu-pids-at-end", action="store_true")
    tr.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    if args.mode == "env":
        dump_env(args.label, args.cuda_info, args.gpu_pids)
    else:
        train(args)


if __name__ == "__main__":
    main(sys.argv[1:])
