"""Which devices the node check must try: what the flags ask of this node.

One concept: from ``--nproc-per-node``, the CUDA devices the agent can count and
``CUDA_VISIBLE_DEVICES`` (as the agent read it once at its edge), the kind and number of devices
the workers will use, so the check tries those and nothing else. The rules:

- ``cpu``: no accelerator; ``xpu``: XPU devices, which the check does not try (it says so);
- ``gpu``: every CUDA device this node shows (the probe counts them itself: at least one);
- ``auto`` or a number N, with CUDA devices counted: those the workers take (all for ``auto``,
  the first N for N);
- ``auto`` or N with no CUDA device counted but ``CUDA_VISIBLE_DEVICES`` naming some: the job
  was given GPUs that this node does not show, so the check tries them and fails saying so;
- otherwise: nothing (a CPU-only node: ``no accelerator requested, nothing checked``).

A ``cpu`` request (:data:`CPU_SMOKE`) runs the probe's matmul on the CPU: the probe's harness
in a rehearsal or a test, on a node without a GPU.

Pure: the values are passed in; nothing here reads the environment or touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CPU_SMOKE", "NOTHING", "DeviceKind", "DeviceRequest", "device_request", "visible_count"]

DeviceKind = Literal["cuda", "cpu"]

_NOTHING_NOTE = "no accelerator requested, nothing checked"


@dataclass(frozen=True)
class DeviceRequest:
    """The devices to try.

    Attributes:
        kind: ``cuda``, ``cpu`` (the probe's matmul on the CPU) or None (nothing to try).
        count: how many (devices 0..count-1 as the workers see them); None: every device the
            probe finds (at least one).
        note: for ``kind=None``, why nothing is tried (the check's detail).
    """

    kind: DeviceKind | None = None
    count: int | None = None
    note: str = _NOTHING_NOTE

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise ValueError(f"a device request of {self.count} devices: at least 1, or None")

    @property
    def is_empty(self) -> bool:
        """Whether there is nothing to try."""
        return self.kind is None


NOTHING = DeviceRequest()
"""No accelerator requested: the device check skips."""
CPU_SMOKE = DeviceRequest("cpu", 1)
"""The probe on the CPU: its harness (spawn, bound, answer) without a GPU."""


def visible_count(cuda_visible_devices: str | None) -> int | None:
    """How many devices ``CUDA_VISIBLE_DEVICES`` names, as CUDA reads it.

    CUDA takes the entries up to the first one that is not a device (``-1``, an empty entry),
    so ``0,1,-1,2`` shows two.

    Args:
        cuda_visible_devices: the variable's value; None: unset.

    Returns:
        None when unset (every device is visible), else the number named (0: none).
    """
    if cuda_visible_devices is None:
        return None
    count = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def device_request(
    nproc_per_node: str,
    *,
    cuda_device_count: int,
    cuda_visible_devices: str | None = None,
) -> DeviceRequest:
    """The devices the flags ask of this node (see the module's rules).

    Args:
        nproc_per_node: ``--nproc-per-node`` as given (``gpu``, ``auto``, ``cpu``, ``xpu``, N).
        cuda_device_count: the CUDA devices the agent counted (0 if none or not counted).
        cuda_visible_devices: the agent's ``CUDA_VISIBLE_DEVICES`` (None: unset).

    Returns:
        The request.
    """
    value = nproc_per_node.strip().lower()
    if value == "cpu":
        return NOTHING
    if value == "xpu":
        return DeviceRequest(note="XPU devices requested: the node check tries CUDA devices only")
    if value == "gpu":
        return DeviceRequest("cuda", None)
    is_number = value.isascii() and value.isdigit() and len(value) <= 9
    wanted = int(value) if is_number and int(value) > 0 else None
    available = cuda_device_count if cuda_device_count > 0 else visible_count(cuda_visible_devices)
    if not available:
        return NOTHING
    return DeviceRequest("cuda", available if wanted is None else min(wanted, available))
