#!/usr/bin/env bash
# The whole check: set-up, lint, format, types, then the tests. Arguments go to pytest
# (e.g. `scripts/test.sh -x tests/unit`). Every step runs; the exit status is non-zero when any
# step failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh

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

# The etcd tests start a real etcd: without one they must fail, not skip.
etcd_binary=${ELASTIC_RUN_ETCD_BINARY:-$(command -v etcd || true)}
if [[ -z "$etcd_binary" || ! -x "$etcd_binary" ]]; then
    echo "error: no etcd binary: run scripts/setup.sh as root (installs etcd-server)," \
        "put etcd on PATH, or set ELASTIC_RUN_ETCD_BINARY" >&2
    failed+=("etcd binary")
else
    # Independent tests run in parallel (pytest-xdist): most of a test's time is spent waiting on
    # real processes, stores and timeouts, not on the CPU. Whole files go to one worker, so a
    # module's fixtures (a Slurm cluster, an etcd cluster) start once.
    # ELASTIC_RUN_TEST_JOBS=0 runs them serially.
    jobs=${ELASTIC_RUN_TEST_JOBS:-4}
    parallel=()
    if [[ "$jobs" != 0 ]]; then
        parallel=(-n "$jobs" --dist loadfile)
    fi
    step "pytest" .venv/bin/pytest "${parallel[@]}" "$@"
fi

if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
    exit 1
fi
echo "all checks passed"
