"""The agent template's process: warm starts' zygote, serving ``elastic-run`` agents to the tests.

Run by path (``tests/forked_agents.py`` starts it as a :class:`~elastic_run.agent.warm.zygote.Zygote`
whose program is this file), with the zygote's arguments. It is
``elastic_run/agent/warm/zygote_process.py`` itself, loaded from its file: it imports torch once,
then forks each agent and turns it into what ``python <venv>/bin/elastic-run ARGS`` starts (own
session, default signals, the agent's stdio, cwd, environment, argv, ``sys.path[0]``, command line
and ``/proc`` environ), and runs the console script as ``__main__``. Only what a warm *worker* gets
before its script (the exit guard, the progress hooks: zygote_process's ``_arm_auto_progress``)
is left out: an agent never has them. Before the fork it imports what every run imports (the
``--preload`` list it is started with: ``forked_agents.PRELOADED``), as a warm zygote imports
a job's preloads.

torch is imported first with stdout and stderr in a file: an exec'd agent would show what that
import prints, a forked one cannot, so when it printed anything this template exits before it is
ready (with the words on its stderr) and the tests exec their agents.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

_ZYGOTE = Path(__file__).resolve().parent.parent / "elastic_run/agent/warm/zygote_process.py"


def _import_torch_quietly() -> bytes:
    """Import torch with fds 1 and 2 in a file; return what it wrote there."""
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as caught:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(caught.fileno(), 1)
        os.dup2(caught.fileno(), 2)
        try:
            import torch  # noqa: F401
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        caught.seek(0)
        return caught.read()


if __name__ == "__main__":
    printed = _import_torch_quietly()
    if printed:
        sys.stderr.write(
            f"agent template: import torch printed, not forking agents:\n{printed!r}\n"
        )
        sys.exit(3)
    spec = importlib.util.spec_from_file_location("zygote_process", _ZYGOTE)
    assert spec is not None and spec.loader is not None
    zygote_process = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zygote_process)
    request = zygote_process.main(sys.argv[1:])
    if request is None:
        sys.exit(0)
    del request["env"]
    zygote_process.run_worker(request)
