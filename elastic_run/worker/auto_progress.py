"""Progress beats without code: one beat per optimizer step, through torch's global step hooks.

elastic-run installs this in every Python worker before its script runs (unless
``--no-auto-progress``): a warm worker calls :func:`install_when_torch_optim_loads` in the zygote's
child, where torch is already imported; a cold worker does it from elastic-run's
``sitecustomize`` (:mod:`elastic_run.worker.site_hook`). Nothing here imports torch: while
``torch.optim.optimizer`` is not imported, a finder on ``sys.meta_path`` waits for it, lets its
own loader execute it, then registers the hooks and leaves ``sys.meta_path``. A script that never
imports torch never gets it imported.

The hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` and ``..._post_hook``,
global: every optimizer of the process, whatever wraps it):

- the post hook beats (:meth:`elastic_run.worker.beat_file.BeatWriter.auto_beat`) into the process's one
  writer, which ``elastic_run.worker.progress()`` shares: an explicit call after an optimizer
  step takes that step's beat over instead of adding one;
- the pre hook checks that the post hook ran after the previous step: when it did not (a script
  replaced or emptied torch's hook registry, or a hook that ran before it raised), it registers
  the post hook again and says so in one line on stderr. The post hook does the same for the
  pre hook.

Work marks for straggler detection (:class:`_WorkMarks`): until the first optimizer step ends, a
global module forward pre hook (``torch.nn.modules.module.register_module_forward_pre_hook``)
registers a post-accumulate-grad hook on the parameters of every module that runs; the last
gradient accumulated before an optimizer step is where the rank's own work of the step ends and
its wait for its peers begins (DDP's all_reduce is asynchronous and waited for after the
backward). The optimizer's post hook writes it, just before its beat, to the slot as ``sync_point()`` would
(:meth:`elastic_run.worker.beat_file.BeatWriter.auto_sync_point`), unless the script calls
``sync_point()`` itself. The times are the CPU's: on a GPU they are when the work was queued.

Invariants: a hook never raises into the optimizer step (any error of its own turns automatic
beats off with one line on stderr); this module imports only ``sys``, ``os`` and ``threading`` at import time,
and ``elastic_run.worker.beat_file``, ``time`` and ``weakref`` when the hooks are installed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, cast

__all__ = [
    "AUTO_PROGRESS_ENV",
    "WORK_MARK_PARAMS",
    "MODULE_MODULE",
    "OPTIMIZER_MODULE",
    "install",
    "install_when_torch_optim_loads",
    "is_installed",
]

AUTO_PROGRESS_ENV = "ELASTIC_RUN_AUTO_PROGRESS"
"""``1`` in a worker's environment: beat once per optimizer step (``--no-auto-progress``: unset)."""
OPTIMIZER_MODULE = "torch.optim.optimizer"
MODULE_MODULE = "torch.nn.modules.module"

_PREFIX = "elastic_run: automatic progress beats"


def _say(text: str) -> None:
    try:
        print(f"{_PREFIX} {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: nothing to say it on
        pass


class _Pairing(threading.local):
    """Whether this thread's last step ran the pre hook, and its post hook (per thread)."""

    def __init__(self) -> None:
        self.pre_seen = False
        self.post_seen = True


WORK_MARK_PARAMS = 4
"""How many parameters carry a gradient hook: the first ones the forward uses, whose gradients
the backward accumulates last. Each hook is a Python call per step (about 3 us here), so one on
every parameter cost a model of a few hundred tensors a millisecond per step."""


class _WorkMarks:
    """When this rank's own work of a step ends: the last gradient accumulated before the step.

    Discovery: a global module forward pre hook (torch's
    ``register_module_forward_pre_hook``) sees the modules that run a forward before the first
    optimizer step ends, and registers a post-accumulate-grad hook on the first
    ``WORK_MARK_PARAMS`` parameters that take a gradient, in the order the forward uses them,
    on the main thread only (registering on a tensor whose hooks another
    thread's backward runs is a data race in torch: it crashed a two-thread test). Then it leaves torch's registry (:meth:`stop_discovering`), so later
    module calls keep torch's fast path. Each gradient hook only stamps the clock; the optimizer's
    post hook hands the last stamp to the writer (:meth:`BeatWriter.auto_sync_point`), which
    counts the time from the last beat to it as the step's work.

    Why there: DDP launches its gradient all_reduce from the same accumulation, asynchronously,
    and waits for it only after the backward (in C++, where no hook reaches), and a script that
    all_reduces its gradients by hand does so after the backward too; the last gradient
    accumulated is the end of the rank's own work and the start of its wait, without touching
    the process group or DDP's one comm-hook slot.
    """

    def __init__(self, module_module: ModuleType) -> None:
        import time
        import weakref

        self._clock = time.monotonic_ns
        self._module_module = module_module
        self._ref = weakref.ref
        # id -> a weak reference: tensors compare elementwise, so no set or WeakSet of them.
        self._seen: dict[int, Any] = {}
        self._discovery: Any = None
        self._off = False
        self.last_grad_ns = 0

    def start_discovering(self) -> None:
        self._discovery = self._module_module.register_module_forward_pre_hook(self.discover)

    def stop_discovering(self) -> None:
        if self._discovery is not None:
            self._discovery.remove()
            self._discovery = None

    def discover(self, module: Any, args: Any) -> None:
        if self._off or threading.current_thread() is not threading.main_thread():
            return None  # a hook registered while another thread's backward runs could race
        try:
            for param in module.parameters(recurse=False):
                if len(self._seen) >= WORK_MARK_PARAMS:
                    self.stop_discovering()
                    return None
                known = self._seen.get(id(param))
                if (
                    param.requires_grad
                    and param.is_leaf
                    and (known is None or known() is not param)
                ):
                    self._seen[id(param)] = self._ref(param)
                    param.register_post_accumulate_grad_hook(self.grad_done)
        except Exception as exc:  # never into the forward
            self._off = True
            self.stop_discovering()
            _say(f"(the work marks for straggler detection) are off in this worker: {exc}")
        return None

    def grad_done(self, param: Any) -> None:
        self.last_grad_ns = self._clock()

    def take(self) -> int:
        """The last gradient's stamp since the last call (0: none)."""
        stamp, self.last_grad_ns = self.last_grad_ns, 0
        return stamp


class _Hooks:
    """The pre and post hooks of one process, and their handles."""

    def __init__(self, module: ModuleType, marks: _WorkMarks | None) -> None:
        from elastic_run.worker.beat_file import shared_writer

        self._module = module
        self._marks = marks
        self._writer = shared_writer
        self._pre: Any = None
        self._post: Any = None
        # Per thread: steps on two threads interleave, and each thread's steps pair up.
        self._paired = _Pairing()
        self._off = False

    def register(self) -> None:
        self._pre = self._module.register_optimizer_step_pre_hook(self.before_step)
        self._post = self._module.register_optimizer_step_post_hook(self.after_step)

    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._off:
            return None
        try:
            if not self._paired.post_seen:
                self._post.remove()
                self._post = self._module.register_optimizer_step_post_hook(self.after_step)
                _say(
                    "registered torch's optimizer post hook again: it did not run after the "
                    "last step (the script replaced torch's hook registry, or a hook that runs "
                    "before it raised)"
                )
            self._paired.post_seen = False
            self._paired.pre_seen = True
        except Exception as exc:  # never into the step
            self._turn_off(exc)
        return None

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._off:
            return
        try:
            self._paired.post_seen = True
            if not self._paired.pre_seen:
                self._pre.remove()
                self._pre = self._module.register_optimizer_step_pre_hook(self.before_step)
                _say(
                    "registered torch's optimizer pre hook again: it did not run before the "
                    "last step (the script replaced torch's hook registry)"
                )
            self._paired.pre_seen = False
            writer = self._writer()
            stamp = self._marks.take() if self._marks is not None else 0
            if writer is not None:
                if stamp:  # the step's work ended at its last gradient, before this step
                    writer.auto_sync_point(stamp)
                writer.auto_beat()
            if self._marks is not None:
                self._marks.stop_discovering()
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
    marks = _work_marks()
    hooks = _Hooks(module, marks)
    try:
        hooks.register()
    except Exception as exc:  # an old torch, or a registry the script broke
        _say(f"are off: torch's global optimizer step hooks cannot be registered ({exc})")
        if marks is not None:
            marks.stop_discovering()
        return False
    _hooks = hooks
    return True


def _work_marks() -> _WorkMarks | None:
    """The work marks, discovering already (None: torch has no global module hook, said once)."""
    module_module = sys.modules.get(MODULE_MODULE)
    if module_module is None:  # torch.optim imports torch.nn: only a broken torch lacks it
        return None
    marks = _WorkMarks(module_module)
    try:
        marks.start_discovering()
    except Exception as exc:
        _say(f"(the work marks for straggler detection) are off: {exc}")
        return None
    return marks


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
