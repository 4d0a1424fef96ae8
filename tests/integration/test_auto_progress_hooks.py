"""Automatic progress beats in real worker processes: one beat per optimizer step, installed
before the script runs, without changing what the script sees.

Each test starts ``python -u script`` with the environment a cold worker gets
(:func:`elastic_run.agent.workers.env.cold_python_env`: elastic-run's ``sitecustomize`` first on
``PYTHONPATH``) and a real beat file, then reads the worker's slot as the agent does. Covered:
a script that never imports torch (nothing imported early, the same ``sys.path``, ``PYTHONPATH``
and ``sitecustomize`` as a plain start, a user's ``sitecustomize`` still runs), a plain training
loop, explicit ``progress()`` calls that take a step's beat over, a script that replaces torch's
hook registry, a hook of the script's that raises, and optimizer steps on two threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic_run.agent.workers.env import SITE_HOOK_DIR, cold_python_env
from elastic_run.worker.auto_progress import AUTO_PROGRESS_ENV, WORK_MARK_PARAMS
from elastic_run.worker.beat_file import (
    PROGRESS_FILE_ENV,
    PROGRESS_SLOT_ENV,
    BeatFile,
    SlotReading,
    create_beat_file,
)

PROBE = textwrap.dedent(
    """
    import json, os, sys
    with open("/proc/self/environ", "rb") as f:
        block = dict(
            os.fsdecode(x).split("=", 1) for x in f.read().split(b"\\0") if b"=" in x
        )
    print("PROBE " + json.dumps({
        "proc_environ_is_os_environ": block == dict(os.environ),
        "path": sys.path[1:],
        "pythonpath": os.environ.get("PYTHONPATH"),
        "torch": "torch" in sys.modules,
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "user_site_ran": os.environ.get("USER_SITE_RAN"),
        "argv": sys.argv,
        "main": sys.modules["__main__"].__file__,
    }))
    """
)

LOOP = textwrap.dedent(
    """
    import sys, threading
    import torch
    import torch.optim.optimizer as torch_optimizer
    from elastic_run.worker import progress
    mode, steps = sys.argv[1], int(sys.argv[2])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()

    def own_loop():
        # Each thread trains its own model: two threads stepping one model race in torch itself
        # (zero_grad against backward), which crashes a plain start as often as ours.
        m = torch.nn.Linear(2, 1)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(steps):
            o.zero_grad()
            m(torch.ones(1, 2)).sum().backward()
            o.step()

    if mode == "threads":
        threads = [threading.Thread(target=own_loop) for _ in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for n in range(steps if mode != "threads" else 0):
        if mode == "raising-hook" and n == 2:
            def bad(optimizer, args, kwargs):
                raise RuntimeError("the script's own hook")
            handle = torch_optimizer.register_optimizer_step_post_hook(bad)
            try:
                step()
            except RuntimeError as exc:
                print("CAUGHT", exc)
            handle.remove()
            continue
        if mode == "replaced-registry" and n == 2:
            import collections
            torch_optimizer._global_optimizer_post_hooks = collections.OrderedDict()
        step()
        if mode == "explicit":
            progress(1000 + n)
        if mode == "explicit-every-5" and n % 5 == 4:
            progress()
    print("DONE")
    """
)


def _run(
    tmp_path: Path, code: str, *args: str, env: dict[str, str] | None = None, auto: bool = True
) -> tuple[subprocess.CompletedProcess[str], SlotReading | None]:
    """Run ``code`` as a cold worker with one beat slot; return it and its slot's last reading."""
    script = tmp_path / "script.py"
    script.write_text(code)
    beats = tmp_path / "w.beats"
    create_beat_file(beats, 1)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base.update({PROGRESS_FILE_ENV: str(beats), PROGRESS_SLOT_ENV: "0"})
    base.update(env or {})
    if auto:
        base[AUTO_PROGRESS_ENV] = "1"
    full = dict(cold_python_env(base, python=True))
    proc = subprocess.run(
        [sys.executable, "-u", str(script), *args],
        env=full,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    reader = BeatFile(beats)
    try:
        reading = reader.read(0)
    finally:
        reader.close()
    return proc, reading


def _probe(tmp_path: Path, proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    found: dict[str, object] = json.loads(line[len("PROBE ") :])
    return found


@pytest.mark.parametrize("pythonpath", [None, "", "/nonexistent/a"], ids=["unset", "empty", "set"])
def test_a_script_without_torch_sees_a_plain_start(tmp_path: Path, pythonpath: str | None) -> None:
    env = {} if pythonpath is None else {"PYTHONPATH": pythonpath}
    plain_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
    (tmp_path / "plain.py").write_text(PROBE)
    plain = subprocess.run(
        [sys.executable, "-u", str(tmp_path / "plain.py"), "x"],
        env=plain_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    hooked, reading = _run(tmp_path, PROBE, "x", env=env)
    expected, got = _probe(tmp_path, plain), _probe(tmp_path, hooked)
    assert got["torch"] is False  # never imported early
    assert got["proc_environ_is_os_environ"] is True and expected["proc_environ_is_os_environ"]
    assert got["pythonpath"] == pythonpath and got["path"] == expected["path"]
    assert got["sitecustomize"] == expected["sitecustomize"]  # ours removed at the first import
    assert got["argv"] == [str(tmp_path / "script.py"), "x"] and expected["argv"][1:] == ["x"]
    assert got["main"] == str(tmp_path / "script.py")
    assert SITE_HOOK_DIR not in str(got["path"])
    assert hooked.stderr == plain.stderr == ""
    assert reading is not None and reading.beats == 0


def test_a_users_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    proc, _ = _run(tmp_path, PROBE, env={"PYTHONPATH": str(own)})
    got = _probe(tmp_path, proc)
    assert (
        got["user_site_ran"] == "yes" and got["proc_environ_is_os_environ"] is False
    )  # it set one
    assert got["sitecustomize"] == str(own / "sitecustomize.py")
    assert got["pythonpath"] == str(own)


def test_each_optimizer_step_of_a_plain_loop_beats(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "plain", "12")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert reading is not None and (reading.beats, reading.step) == (12, 12)
    assert reading.pid > 0 and reading.last_gap_ns > 0


def test_no_auto_progress_means_no_beat(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "plain", "5", auto=False)
    assert proc.returncode == 0, proc.stderr
    assert reading is not None and reading.beats == 0


def test_an_explicit_progress_after_the_step_takes_its_beat_over(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "explicit", "7")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert reading is not None and (reading.beats, reading.step) == (7, 1006)


def test_an_explicit_progress_now_and_then_adds_no_beat(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "explicit-every-5", "12")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert reading is not None and (reading.beats, reading.step) == (12, 12)


def test_a_replaced_hook_registry_is_said_once_and_beats_go_on(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "replaced-registry", "10")
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "registered torch's optimizer post hook again" in lines[0], lines
    # Step 2's post hook was lost with the old registry; every other step beat.
    assert reading is not None and reading.beats == 9


def test_a_scripts_raising_hook_breaks_only_its_own_step(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "raising-hook", "8")
    assert proc.returncode == 0 and "CAUGHT the script's own hook" in proc.stdout, proc.stderr
    # torch runs global post hooks in registration order: ours (first) beat before it raised.
    assert proc.stderr == ""
    assert reading is not None and reading.beats == 8


def test_optimizer_steps_on_two_threads_are_said_once_and_all_count(tmp_path: Path) -> None:
    proc, reading = _run(tmp_path, LOOP, "threads", "20")
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "also come from another thread" in lines[0], lines
    assert reading is not None and reading.beats == 40


WORK = textwrap.dedent(
    """
    import sys, time
    import torch
    import torch.nn.modules.module as torch_module
    from elastic_run.worker import sync_point
    mode = sys.argv[1]
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    if mode == "deep":  # 61 parameter tensors
        layers = [torch.nn.Linear(2, 3)] + [torch.nn.Linear(3, 3) for _ in range(29)]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(3, 1, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(2):
        opt.zero_grad()
        time.sleep(0.05)  # this rank's own work (counted)
        model(torch.ones(1, 2)).sum().backward()
        time.sleep(0.5)  # a wait for the peers after the backward (not counted)
        if mode == "explicit-sync":
            sync_point()  # the script's own mark wins, even after the wait
        opt.step()
        print("GLOBAL_PRE_HOOKS", n, len(torch_module._global_forward_pre_hooks))
    hooked = [i for i, p in enumerate(model.parameters()) if p._post_accumulate_grad_hooks]
    print("HOOKED", hooked)
    """
)


@pytest.mark.parametrize("mode", ["auto", "deep", "explicit-sync"])
def test_the_last_gradient_marks_the_end_of_a_steps_work(tmp_path: Path, mode: str) -> None:
    proc, reading = _run(tmp_path, WORK, mode)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # Gradient hooks on the first parameters the forward uses only (their gradients come last).
    assert f"HOOKED {list(range(min(4, WORK_MARK_PARAMS)))}" in proc.stdout, proc.stdout
    # Discovery ends with the first optimizer step: torch's fast path for every later call.
    assert "GLOBAL_PRE_HOOKS 0 0" in proc.stdout and "GLOBAL_PRE_HOOKS 1 0" in proc.stdout
    assert reading is not None and (reading.beats, reading.busy_count) == (2, 1)
    # Step 2 ran from beat 1: 0.05 s of work, the backward, 0.5 s of waiting, beat 2.
    assert reading.busy_ns >= 50_000_000
    if mode != "explicit-sync":
        assert reading.busy_ns <= reading.last_gap_ns - 500_000_000  # the wait is not work
    else:
        assert reading.busy_ns >= 550_000_000  # the script's sync_point(), after its wait


def test_the_hook_folder_holds_only_the_start_up_hook() -> None:
    names = sorted(p.name for p in Path(SITE_HOOK_DIR).glob("*.py"))
    assert names == ["__init__.py", "sitecustomize.py"]  # nothing else a worker could import
