"""Progress beats without code: one beat per optimizer step, through torch's global step hooks.

elastic-run installs this in every Python worker before its script runs (unless
``--no-auto-progress``): a warm worker calls :func:`install_when_torch_optim_loads` in the zygote's
child, where torch is already imported; a cold worker does it from elastic-run's
``sitecustomize`` (:mod:`elastic_run.site_hook`). Nothing here imports torch: while
``torch.optim.optimizer`` is not imported, a finder on ``sys.meta_path`` waits for it, lets its
own loader execute it, then registers the hooks and leaves ``sys.meta_path``. A script that never
imports torch never gets it imported.

The hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` and ``..._post_hook``,
global: every optimizer of the process, whatever wraps it):

- the post hook beats (:meth:`elastic_run.beat_file.BeatWriter.auto_beat`) into the process's one
  writer, which ``elastic_run.worker.progress()`` shares: an explicit call after an optimizer
  step takes that step's beat over instead of adding one;
- the pre hook checks that the post hook ran after the previous step: when it did not (a script
  replaced or emptied torch's hook registry, or a hook that ran before it raised), it registers
  the post hook again and says so in one line on stderr. The post hook does the same for the
  pre hook.

Invariants: a hook never raises into the optimizer step (any error of its own turns automatic
beats off with one line on stderr); this module imports only ``sys`` and ``os`` at import time,
and ``elastic_run.beat_file`` when the hooks are installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, cast

__all__ = [
    "AUTO_PROGRESS_ENV",
    "OPTIMIZER_MODULE",
    "install",
    "install_when_torch_optim_loads",
    "is_installed",
]

AUTO_PROGRESS_ENV = "ELASTIC_RUN_AUTO_PROGRESS"
"""``1`` in a worker's environment: beat once per optimizer step (``--no-auto-progress``: unset)."""
OPTIMIZER_MODULE = "torch.optim.optimizer"

_PREFIX = "elastic_run: automatic progress beats"


def _say(text: str) -> None:
    try:
        print(f"{_PREFIX} {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: nothing to say it on
        pass


class _Hooks:
    """The pre and post hooks of one process, and their handles."""

    def __init__(self, module: ModuleType) -> None:
        from elastic_run.beat_file import shared_writer

        self._module = module
        self._writer = shared_writer
        self._pre: Any = None
        self._post: Any = None
        self._pre_seen = False
        self._post_seen = True
        self._off = False

    def register(self) -> None:
        self._pre = self._module.register_optimizer_step_pre_hook(self.before_step)
        self._post = self._module.register_optimizer_step_post_hook(self.after_step)

    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._off:
            return None
        try:
            if not self._post_seen:
                self._post.remove()
                self._post = self._module.register_optimizer_step_post_hook(self.after_step)
                _say(
                    "registered torch's optimizer post hook again: it did not run after the "
                    "last step (the script replaced torch's hook registry, or a hook that runs "
                    "before it raised)"
                )
            self._post_seen = False
            self._pre_seen = True
        except Exception as exc:  # never into the step
            self._turn_off(exc)
        return None

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._off:
            return
        try:
            self._post_seen = True
            if not self._pre_seen:
                self._pre.remove()
                self._pre = self._module.register_optimizer_step_pre_hook(self.before_step)
                _say(
                    "registered torch's optimizer pre hook again: it did not run before the "
                    "last step (the script replaced torch's hook registry)"
                )
            self._pre_seen = False
            writer = self._writer()
            if writer is not None:
                writer.auto_beat()
        except Exception as exc:  # never into the step
            self._turn_off(exc)

    def _turn_off(self, exc: BaseException) -> None:
        self._off = True
        _say(f"are off in this worker: {type(exc).__name__}: {exc}")


_hooks: _Hooks | None = None


def is_installed() -> bool:
    """Whether this process's optimizer steps beat."""
    return _hooks is not None


def install() -> bool:
    """Register the hooks now, when ``torch.optim.optimizer`` is imported. Idempotent.

    Returns:
        Whether the hooks are installed (False: torch's optimizer module is not imported yet, or
        it has no global step hooks, which was said on stderr).
    """
    global _hooks
    if _hooks is not None:
        return True
    module = sys.modules.get(OPTIMIZER_MODULE)
    if module is None:
        return False
    hooks = _Hooks(module)
    try:
        hooks.register()
    except Exception as exc:  # an old torch, or a registry the script broke
        _say(f"are off: torch's global optimizer step hooks cannot be registered ({exc})")
        return False
    _hooks = hooks
    return True


class _Loader:
    """Runs the real loader of ``torch.optim.optimizer``, then installs the hooks."""

    def __init__(self, loader: Any, finder: _OptimizerFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Whatever the script later reads of the module names its own loader, not this one.
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._finder.leave()
        self._loader.exec_module(module)
        install()


class _OptimizerFinder:
    """A ``sys.meta_path`` finder that waits for ``torch.optim.optimizer`` and nothing else.

    Args:
        leftover: a module to drop from ``sys.modules`` at the first import after this finder
            was placed (elastic-run's own ``sitecustomize`` when the environment has none).
    """

    def __init__(self, leftover: ModuleType | None) -> None:
        self._leftover = leftover

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if self._leftover is not None and name != "sitecustomize":
            if sys.modules.get("sitecustomize") is self._leftover:
                del sys.modules["sitecustomize"]
            self._leftover = None
        if name != OPTIMIZER_MODULE:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                loader = getattr(spec, "loader", None)
                if loader is not None and hasattr(loader, "exec_module"):
                    spec.loader = cast(Any, _Loader(loader, self))
                return spec
        return None

    def leave(self) -> None:
        """Step off ``sys.meta_path`` (once torch's module is found, nothing more to wait for)."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def invalidate_caches(self) -> None:
        """Nothing cached (``importlib.invalidate_caches`` calls every finder)."""


def install_when_torch_optim_loads(leftover: ModuleType | None = None) -> None:
    """Install the hooks now if ``torch.optim.optimizer`` is imported, else when it gets imported.

    Does nothing unless ``ELASTIC_RUN_AUTO_PROGRESS`` is ``1`` in the environment.

    Args:
        leftover: a module to drop from ``sys.modules`` at the first import that follows (see
            :class:`_OptimizerFinder`).
    """
    if os.environ.get(AUTO_PROGRESS_ENV) != "1":
        return
    if install():
        return
    sys.meta_path.insert(0, _OptimizerFinder(leftover))
