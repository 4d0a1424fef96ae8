"""What one worker process is given: its command and torchrun's environment.

The environment is the agent's, plus the launcher contract (see DESIGN.md and
shared/TORCHRUN-CONTRACT.md): ranks and world sizes, the workers' store, the restart count (the
job's, the same on every node), the error file, the timer file when the watchdog is on.
OMP_NUM_THREADS is set to 1 only when the node runs more than one worker and the user did not
set it, as torchrun does.

A cold Python worker with automatic progress beats (``ELASTIC_RUN_AUTO_PROGRESS=1``) also gets
elastic-run's start-up hook first on its ``PYTHONPATH`` (:func:`cold_python_env`); the hook takes
it off again before the script runs (:mod:`elastic_run.worker.site_hook`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from elastic_run.agent.api import WorkerGroup, WorkerSpec
from elastic_run.errors import ConfigurationError
from elastic_run.worker import site_hook
from elastic_run.worker.auto_progress import AUTO_PROGRESS_ENV

__all__ = [
    "RANK_VARIABLES",
    "EMPTY_PYTHONPATH_ENV",
    "SITE_HOOK_DIR",
    "build_worker_env",
    "cold_python_env",
    "shared_worker_env",
    "python_command",
    "worker_argv",
]


RANK_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""The per-worker, per-round variables of :func:`build_worker_env`, in that order (beside the
``TORCHELASTIC_*`` ones): they differ between workers and rounds, and nothing reads them at import
time, so a warm worker's zygote never holds them."""


EMPTY_PYTHONPATH_ENV = "ELASTIC_RUN_EMPTY_PYTHONPATH"
"""Set (and removed by the hook) when the worker's own ``PYTHONPATH`` was set but empty."""
SITE_HOOK_DIR = os.path.dirname(os.path.abspath(site_hook.__file__))
"""The folder of elastic-run's ``sitecustomize`` for cold Python workers."""


def cold_python_env(env: Mapping[str, str], *, python: bool) -> Mapping[str, str]:
    """The environment of a worker started cold: ``env``, with the start-up hook when it applies.

    Args:
        env: the worker's environment.
        python: the worker is the Python interpreter running a script or module (not
            ``--no-python``: a program's own Python children must not beat for it).

    Returns:
        ``env`` itself, or a copy whose ``PYTHONPATH`` starts with :data:`SITE_HOOK_DIR` (the
        hook restores the given value, unset or empty included, before the script runs) when
        ``env`` asks for automatic progress beats.
    """
    if not python or env.get(AUTO_PROGRESS_ENV) != "1":
        return env
    given = env.get("PYTHONPATH")
    hooked = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    # Last in the environment block: the hook rewrites those bytes of it, and only those.
    hooked["PYTHONPATH"] = SITE_HOOK_DIR + os.pathsep + given if given else SITE_HOOK_DIR
    if given == "":  # "DIR:" would put the cwd on sys.path: say it was empty instead
        hooked[EMPTY_PYTHONPATH_ENV] = "1"
    return hooked


def worker_argv(spec: WorkerSpec, local_rank: int) -> list[str]:
    """The command of one worker: the entrypoint and its arguments, ``${local_rank}`` replaced.

    Raises:
        ConfigurationError: the entrypoint is a Python callable (not run as a program here).
    """
    entry = spec.entrypoint
    if not isinstance(entry, str):
        raise ConfigurationError(
            f"the entrypoint {spec.get_entrypoint_name()} is a callable; this agent runs programs"
        )
    args = [str(a).replace("${local_rank}", str(local_rank)) for a in spec.args]
    return [entry, *args]


def python_command() -> str:
    """The interpreter workers run: ``$PYTHON_EXEC`` or this one (torchrun's rule)."""
    return os.environ.get("PYTHON_EXEC") or sys.executable


def build_worker_env(
    base: Mapping[str, str],
    *,
    group: WorkerGroup,
    local_rank: int,
    restart_count: int,
    max_restarts: int,
    run_id: str,
    use_agent_store: bool,
    timer_file: str | None,
    extra: Mapping[str, str] = {},
    virtual_local_rank: bool,
) -> dict[str, str]:
    """The environment of one worker (TORCHELASTIC_ERROR_FILE is added once the logs are placed).

    With ``virtual_local_rank`` (torchrun's --virtual-local-rank) every worker sees
    LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed to its own device: the ``local_rank``-th
    entry of the agent's CUDA_VISIBLE_DEVICES, or ``local_rank`` when that is unset.

    Raises:
        ConfigurationError: virtual local ranks and fewer visible devices than local ranks.
    """
    worker = group.workers[local_rank]
    spec = group.spec
    env = shared_worker_env(base, local_world_size=spec.local_world_size, extra=extra)
    ranks = (
        local_rank,
        worker.global_rank,
        group.group_rank,
        worker.role_rank,
        spec.role,
        spec.local_world_size,
        worker.world_size,
        group.group_world_size,
        worker.role_world_size,
        group.master_addr,
        group.master_port,
    )
    env.update(zip(RANK_VARIABLES, map(str, ranks), strict=True))
    env.update(
        {
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
        }
    )
    if virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = _own_device(base.get("CUDA_VISIBLE_DEVICES"), local_rank)
    if timer_file is not None:
        env["TORCHELASTIC_TIMER_FILE"] = timer_file
    return env


def _own_device(visible: str | None, local_rank: int) -> str:
    if visible is None:
        return str(local_rank)
    devices = visible.split(",")
    if local_rank >= len(devices):
        raise ConfigurationError(
            f"--virtual-local-rank: local rank {local_rank} has no device in "
            f"CUDA_VISIBLE_DEVICES={visible}"
        )
    return devices[local_rank].strip()


def shared_worker_env(
    base: Mapping[str, str], *, local_world_size: int, extra: Mapping[str, str] = {}
) -> dict[str, str]:
    """What every worker of the node gets besides its ranks: the zygote's environment too."""
    env = dict(base)
    env.update(extra)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if local_world_size > 1 and "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in extra:
        env["OMP_NUM_THREADS"] = "1"
    return env
