"""The zygote process: torch imported once per node, workers forked from it (warm starts).

Run by path by the agent (``zygote.py``), with the environment every worker shares (the agent's,
OMP_NUM_THREADS and the other launcher settings, none of the per-worker ranks), it imports torch
and the ``--preload`` modules, checks that this left the process safe to fork, says whether it is
ready, then serves spawn requests over a ``SOCK_SEQPACKET`` socket (fd ``--sock``), one JSON
message each, the worker's stdout and stderr descriptors attached with ``SCM_RIGHTS``::

    zygote -> agent   {"ready": true, "tasks": 2}      or {"ready": false, "reason": "..."}
    agent  -> zygote  {"id": 7, "argv": [...], "env": {...}, "cwd": "...", "path0": "...",
                       "module": false, "unbuffered": true}              + fds [stdout, stderr]
    zygote -> agent   {"id": 7, "pid": 1234}                            or {"id": 7, "error": "..."}
    zygote -> agent   {"ended": 1234, "code": 0}   (the script of 1234 ended: returned, raised
                                                    or called sys.exit; the exit status it set)
    zygote -> agent   {"exit": 1234, "code": -9}   (exit status; ``-signum`` for a signal)

The script's end: each child gets the write end of a pipe of its own (close-on-exec); when the
script's code returns or raises, the child writes the exit status Python will exit with, before
the interpreter's own shutdown (joining non-daemon threads, atexit handlers, finalizers) begins.
The zygote forwards it as ``ended``: the agent can then bound how long a worker outlives its
script.

The forked child becomes the worker exactly as a cold ``python -u script`` would start: its own
session, parent-death signal SIGKILL (it dies with the zygote, which dies with the agent),
Python's default signal dispositions and an empty signal mask, stdin ``/dev/null``, the given
stdout and stderr, the worker's cwd and complete environment, ``sys.argv`` and ``sys.path[0]``,
fresh random seeds; then it leaves every frame of the zygote and runs the script in a new real
``__main__`` module, as ``python`` does (``-m``: with runpy's ``_run_module_as_main``, which
``python -m`` calls), so interpreter exit (atexit, thread joins, flushes, finalizers, exit status)
is Python's own.

Invariants:
- Standard library only, besides torch and the preloads: the zygote itself imports nothing of
  elastic_run (run by path); a forked worker, before its script, imports
  ``elastic_run.worker.exit_guard`` (always) and ``elastic_run.worker.auto_progress`` (when automatic progress
  beats are on, ``ELASTIC_RUN_AUTO_PROGRESS=1``).
- Safe to fork or not warm at all: no Python thread besides the main one, no more native
  threads than ``import torch`` alone starts, CUDA not initialized; otherwise it reports not
  ready with the reason and exits.
- It ignores the job's signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2): a signal
  meant for the step must not kill every worker through their parent-death signal. The agent
  ends it by closing the socket (EOF) or with SIGKILL.
- It reaps its children and reports each exit after the pid reply of that child, and a child's
  ``ended`` (when it wrote one) before its ``exit``.
- A worker's ``__main__`` stays in ``sys.modules`` to the end: the script's globals are freed
  in the interpreter's finalization, never before (a native destructor that needs the GIL from
  another thread deadlocks while the interpreter is fully alive; torch skips that at shutdown).
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import sys
import traceback
import types
from typing import Any

__all__ = ["IGNORED_SIGNALS", "main", "run_worker", "script_ended"]

IGNORED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_PR_SET_PDEATHSIG = 1
_PADDING_KEY = "ELASTIC_RUN_ZYGOTE_PADDING"  # the zygote's last variable: room for a worker's
_MAX_MESSAGE_BYTES = 1 << 20
_end_fd = -1  # in a worker: the write end of its script-end pipe


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _prepare(preload: list[str]) -> dict[str, Any]:
    """Import torch and the preloads; return the ready message (or why it is not ready)."""
    import threading

    # A preload's `torch.cuda.is_available()` (the common `device = "cuda" if ...` line) asks the
    # CUDA driver without marking CUDA initialized, and a process forked after that cannot use
    # CUDA ("poisons fork", torch's docs). NVML answers the same question without the driver.
    # Only the zygote's own environment: each worker gets its complete environment at the fork.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        import torch
    except Exception as exc:
        return {"ready": False, "reason": f"import torch failed: {exc!r}"}
    baseline = _tasks()
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a preload may even call sys.exit
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return {"ready": False, "reason": f"preloading {name!r} failed: {last}"}
    if threading.active_count() > 1:
        names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return {
            "ready": False,
            "reason": f"a preloaded module started a Python thread ({', '.join(names)})",
        }
    tasks = _tasks()
    if tasks > baseline:
        return {
            "ready": False,
            "reason": f"preloading started native threads ({tasks} threads, "
            f"{baseline} after import torch alone)",
        }
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return {"ready": False, "reason": "CUDA was initialized while preloading"}
    # Forked workers then never traverse (and so never copy) the zygote's objects in a GC pass.
    gc.collect()
    gc.freeze()
    return {"ready": True, "tasks": tasks}


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _stream(fd: int, *, unbuffered: bool, line: bool, like: Any) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    buffer: Any = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffer,
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
        line_buffering=line and not unbuffered,
        write_through=unbuffered,
    )


def _rewrite_environ_area(items: list[bytes], marker: bytes) -> None:
    """Rewrite the environment area that /proc/PID/environ shows, from ``marker`` on.

    The entries before the marker (the padding entry, the zygote's last) keep their bytes, so a
    native library that kept a ``getenv`` pointer into them still reads its value. What does
    not fit is cut at an item.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end
    except (OSError, IndexError, ValueError):
        return
    found = (b"\0" + ctypes.string_at(start, end - start)).find(b"\0" + marker)
    if found < 0:
        return
    start += found
    size = end - start
    text = b""
    for item in items:
        if len(text) + len(item) + 1 > size - 1:
            break
        text += item + b"\0"
    if size > 1 and text:
        ctypes.memmove(start, text.ljust(size, b"\0"), size)


def _set_command_line(argv: list[str]) -> None:
    """Show the worker's command in ps and /proc/PID/cmdline, as setproctitle(3) does.

    The argv area (padded at the zygote's start) gets the words joined by spaces, a NUL, then
    spaces to its end: a last byte that is not NUL makes the kernel show the area up to its
    first NUL, so no trailing empty arguments appear (psutil splits such a title at spaces).
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
    except (OSError, IndexError, ValueError):
        return
    size = end - start
    text = b" ".join(os.fsencode(a) for a in argv)[: size - 2] + b"\0"
    if size > 2:
        ctypes.memmove(start, text.ljust(size, b" "), size)


def _become_worker(request: dict[str, Any], fds: list[int], zygote_pid: int) -> None:
    """In the forked child: everything a cold start of the worker would have set up."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != zygote_pid:  # the zygote died before the signal was armed
        os._exit(128 + signal.SIGKILL)
    signal.set_wakeup_fd(-1)
    for sig in (*IGNORED_SIGNALS, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the interpreter sets it
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    devnull = os.open(os.devnull, os.O_RDWR)
    out, err = (fds[0], fds[1]) if len(fds) == 2 else (devnull, devnull)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {devnull, *fds} - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    inherited = dict(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(request["unbuffered"]) or bool(os.environ.get("PYTHONUNBUFFERED"))
    streams = {
        "stdin": io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "r", closefd=False)),
            encoding=getattr(sys.stdin, "encoding", None) or "utf-8",
        ),
        "stdout": _stream(1, unbuffered=unbuffered, line=False, like=sys.stdout),
        "stderr": _stream(2, unbuffered=unbuffered, line=True, like=sys.stderr),
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    # What ps, psutil and /proc/PID/{cmdline,environ} show: the worker's, as after a cold exec.
    # (libc no longer points into the environment area once os.environ was replaced.)
    _set_command_line(list(request["command"]))
    new = [f"{k}={v}" for k, v in request["env"].items() if inherited.get(k) != v]
    _rewrite_environ_area([os.fsencode(item) for item in new], _PADDING_KEY.encode() + b"=")
    sys.argv = list(request["argv"])
    sys.path[0] = request["path0"]
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # seeded once at import: every worker would share it
        numpy_random.seed()


def _forward_end(sock: socket.socket, pid: int, ends: dict[int, int]) -> None:
    """Forward what child ``pid`` wrote on its script-end pipe (if anything); close the pipe."""
    fd = ends.pop(pid, None)
    if fd is None:
        return
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 64)
    except OSError:
        data = b""
    os.close(fd)
    try:
        code = int(data.split(b"\n", 1)[0])
    except ValueError:
        return  # it ended without a word (killed, os._exit, exec)
    _send(sock, {"ended": pid, "code": code})


def _serve(sock: socket.socket) -> dict[str, Any] | None:
    """Serve spawn requests until EOF; in a forked child, return its request."""
    global _end_fd
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    ends: dict[int, int] = {}  # child pid -> read end of its script-end pipe
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r, *ends.values()], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        for pid in [pid for pid, fd in ends.items() if fd in readable]:
            _forward_end(sock, pid, ends)
        while True:  # reap every exited child, report it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _forward_end(sock, pid, ends)  # it may have written just before it exited
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE_BYTES, 2)
        if not data:
            return None
        request: dict[str, Any] = json.loads(data)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            end_r, end_w = os.pipe()  # close-on-exec: only the worker itself can say it ended
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            _send(sock, {"id": request["id"], "error": str(exc)})
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (*fds, end_r, end_w):
                os.close(fd)
            _send(sock, {"id": request["id"], "error": str(exc)})
            continue
        if pid == 0:
            sock.close()
            for fd in (wake_r, wake_w, end_r, *ends.values()):
                os.close(fd)
            _end_fd = end_w
            _become_worker(request, fds, me)
            return request
        for fd in (*fds, end_w):
            os.close(fd)
        ends[pid] = end_r
        _send(sock, {"id": request["id"], "pid": pid})


def script_ended(code: int) -> None:
    """In a worker: tell the zygote (and so the agent) that the script ended with ``code``.

    Called once, when the script's code returned or raised, before the interpreter's shutdown.
    """
    global _end_fd
    fd, _end_fd = _end_fd, -1
    if fd < 0:
        return
    try:
        os.write(fd, b"%d\n" % code)
    except OSError:
        pass  # the zygote is gone: the worker dies with it
    finally:
        os.close(fd)


def _exit_status(exc: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(code)``: None 0, an int itself, anything else 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _fresh_main() -> types.ModuleType:
    """A new ``__main__`` module as the interpreter makes it at its start, put in sys.modules.

    It replaces the zygote's own and is never dropped: the script's globals then live until the
    interpreter's finalization, as in a cold start. (runpy.run_path ran the script in a
    temporary module and freed its globals the moment it returned, with the interpreter fully
    alive: a DDP model's gloo process group then joined its worker thread while holding the
    GIL, and that thread waited for the GIL to free a tensor: a deadlock, issue 28.)
    """
    main = types.ModuleType("__main__")
    vars(main).update(__annotations__={}, __builtins__=builtins)
    sys.modules["__main__"] = main
    return main


def _run_module(name: str, *, alter_argv: bool) -> None:
    """Run module ``name`` in ``sys.modules["__main__"]``, as ``python -m`` does.

    With runpy's ``_run_module_as_main``: the function the interpreter itself calls for ``-m``
    (and for a directory or zip file), so the globals, ``sys.argv[0]``, the errors and the
    traceback's frames are a cold start's.
    """
    runpy._run_module_as_main(name, alter_argv)  # type: ignore[attr-defined]


def _run_file(main: types.ModuleType, path: str) -> None:
    """Run the script file at ``path`` (absolute) in ``main``, as ``python script`` does.

    A compiled file runs its code; any other file is compiled from source (its coding cookie
    honoured, none of the zygote's ``__future__`` flags).
    """
    try:
        with io.open_code(path) as stream:
            code = pkgutil.read_code(stream)
    except OSError as exc:  # as python says it, with its exit status
        message = f"can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}"
        print(f"{sys.executable}: {message}", file=sys.stderr)
        sys.exit(2)
    loader: importlib.abc.FileLoader
    if code is None:
        with io.open_code(path) as stream:
            code = compile(stream.read(), path, "exec", dont_inherit=True)
        loader = importlib.machinery.SourceFileLoader("__main__", path)
    else:
        loader = importlib.machinery.SourcelessFileLoader("__main__", path)
    vars(main).update(__loader__=loader, __file__=path, __cached__=None)
    exec(code, vars(main))


def _forget_file(main: types.ModuleType) -> None:
    """Drop ``__file__`` and ``__cached__`` after the script's end, as ``python script`` does."""
    vars(main).pop("__file__", None)
    vars(main).pop("__cached__", None)


def _print_uncaught(exc: BaseException) -> None:
    """Print an uncaught exception as Python does, without the zygote's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    exc.__traceback__ = tb  # the default hook prints the exception's own traceback
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.excepthook(type(exc), exc, tb)


def _exit_after_uncaught(exc: BaseException) -> None:
    """Exit as Python does after an uncaught exception: by SIGINT after KeyboardInterrupt, else 1."""
    if isinstance(exc, KeyboardInterrupt):
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)


def _arm_auto_progress() -> None:
    """In a worker, before its script: the exit guard, and one beat per optimizer step if asked.

    The imports of elastic_run here, in the worker only (the zygote never runs them): torch is
    imported already, so the hooks are registered at once (see elastic_run.worker.auto_progress). The
    exit guard (elastic_run.worker.exit_guard) is armed in every warm worker.
    """
    try:
        from elastic_run.worker.exit_guard import arm

        arm()
    except Exception as exc:
        print(f"elastic_run: the exit guard is off: {type(exc).__name__}: {exc}", file=sys.stderr)
    if os.environ.get("ELASTIC_RUN_AUTO_PROGRESS") != "1":
        return
    try:
        from elastic_run.worker.auto_progress import install_when_torch_optim_loads

        install_when_torch_optim_loads()
    except Exception as exc:
        print(
            f"elastic_run: automatic progress beats are off: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )


def run_worker(request: dict[str, Any]) -> None:
    """In a worker: run its script (or ``-m`` module) as ``__main__``, as a cold start does.

    The script's code runs in a real ``__main__`` module (:func:`_fresh_main`), so nothing of it
    is freed before the interpreter's shutdown. :func:`script_ended` is called the moment its
    code is over (returned, raised, or called ``sys.exit``), before anything else runs.
    Returns after a normal end; raises SystemExit otherwise (or ends by SIGINT after an
    uncaught KeyboardInterrupt), so that the interpreter's exit is Python's own.
    """
    module = bool(request["module"])
    main = _fresh_main()
    path = os.path.abspath(sys.argv[0])  # as the interpreter makes its run_filename absolute
    from_file = not module and pkgutil.get_importer(path) is None
    try:
        if module:
            _run_module(sys.argv[0], alter_argv=True)
        elif from_file:
            _run_file(main, path)
        else:  # a directory or a zip file: its __main__ module, from there, as python runs it
            sys.path[0] = path
            _run_module("__main__", alter_argv=False)
    except SystemExit as exc:
        script_ended(_exit_status(exc))
        raise
    except BaseException as exc:  # shown as a cold start shows it: from the script's frame
        script_ended(-int(signal.SIGINT) if isinstance(exc, KeyboardInterrupt) else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        _print_uncaught(exc)
        if from_file:
            _forget_file(main)
        _exit_after_uncaught(exc)
    script_ended(0)
    if from_file:
        _forget_file(main)


def main(argv: list[str]) -> dict[str, Any] | None:
    """The zygote: ``zygote_process.py SOCK_FD PATH0 [PRELOAD,...]``; returns in a worker only."""
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    sys.path[0] = argv[1]
    preload = [name for name in (argv[2] if len(argv) > 2 else "").split(",") if name]
    ready = _prepare(preload)
    _send(sock, ready)
    if not ready["ready"]:
        return None
    return _serve(sock)


if __name__ == "__main__":
    _worker = main(sys.argv[1:])
    if _worker is None:
        sys.exit(0)
    del _worker["env"]
    _arm_auto_progress()
    run_worker(_worker)
