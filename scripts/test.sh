#!/usr/bin/env bash
# The whole check: set-up, lint, format, types, then the tests. Arguments go to pytest
# (e.g. `scripts/test.sh -x tests/unit`). Every step runs; the exit status is non-zero when any
# step failed.
#
# `scripts/test.sh --fast` is the edit-test loop: set-up, ruff, then the pure and unit tier
# (tests/unit: no agent, store or worker process), in well under two minutes. The whole check
# (no --fast) is the CI command.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh

if [[ "${1:-}" == "--fast" ]]; then
    shift
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    exec .venv/bin/pytest -q -n 2 tests/unit "$@"
fi

failed=()
step() {
    local name=$1
    shift
    printf '== %s\n' "$name"
    "$@" || failed+=("$name")
}

step "ruff check" .venv/bin/ruff check .
step "ruff format" .venv/bin/ruff format --check .
step "mypy" .venv/bin/mypy

# Byte-compile the project's Python before the tests: a run starts ~1,000 Python processes (agents,
# `status`/`close`, zygotes, workers whose site hook imports elastic_run), and where
# PYTHONDONTWRITEBYTECODE is set (it is on this machine) each of them compiled every elastic_run
# module it imports from source again: 0.2 s of CPU an agent (0.52 s against 0.32 s to import the
# CLI and the agent, measured), on a run that is CPU-bound. Python checks each cached file
# against its source's mtime and size, so an edit made later is never run stale.
step "byte-compile" .venv/bin/python -m compileall -q -j 0 elastic_run tests scripts examples

# No test skips here. A test whose program (etcd, Slurm, tmux, openssl, ip) is missing fails with
# one `missing: ...` line, repeated once at the end of pytest's summary; and tests/conftest.py
# makes a run in which any test skipped exit non-zero. ELASTIC_RUN_ALLOW_SKIPS=1 lets a plain
# pytest run with skips pass on a developer's other platform; the whole check never allows them.
if [[ -n "${ELASTIC_RUN_ALLOW_SKIPS:-}" ]]; then
    echo "note: ELASTIC_RUN_ALLOW_SKIPS is ignored here: a skip fails the whole check" >&2
    unset ELASTIC_RUN_ALLOW_SKIPS
fi
# Independent tests run in parallel (pytest-xdist). Whole files go to one worker, so a module's
# fixtures (a Slurm cluster, an etcd cluster) start once.
# Five at a time on the two cores here. The run is CPU-bound: before 2026-11-29 it took 21-26
# CPU-minutes (12.8-15.2 minutes of wall time with three workers), most of it ~300 agents, ~80
# zygotes and ~40 `status`/`close` children each importing torch (1.4-2.5 s of CPU each; the
# host's speed varies by that much from hour to hour), and four workers then starved some tests
# into failing. Most agents are now forked from a template that imported torch and what every
# run imports once per pytest worker (tests/forked_agents.py, warm starts' zygote serving the
# console script; ELASTIC_RUN_TEST_FORK_AGENTS=0 execs them all again), and the tests' process
# accounting reads /proc once per poll (helpers.ProcessTable): 15-16 CPU-minutes. Four workers
# then kept the cores 176-184 % busy (8.6-8.9 minutes); the dips are tests waiting out a
# timeout, which a fifth worker fills (7.7 minutes, 193 %). The README's Development section has
# the runs. A gloo worker once died in torch's teardown abort under load; elastic_run.worker.exit_guard
# keeps a worker's exit from racing gloo's threads.
# ELASTIC_RUN_TEST_JOBS=N overrides; 0 runs them serially.
jobs=${ELASTIC_RUN_TEST_JOBS:-5}
parallel=()
if [[ "$jobs" != 0 ]]; then
    parallel=(-n "$jobs" --dist loadfile)
fi
step "pytest" .venv/bin/pytest "${parallel[@]}" "$@"  # -ra (pyproject) lists every skip

if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
    exit 1
fi
echo "all checks passed"
