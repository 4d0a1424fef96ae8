#!/usr/bin/env bash
# Set up a development checkout: the .venv with the package installed editable (with its dev
# extras), then every system program the tests start for real (etcd, Slurm, munge, tmux, openssl,
# iproute2, util-linux, chromium). A test whose program is missing fails, it never skips: this list and the
# tests' `require_program` calls (tests/machine.py) name the same programs.
#
# Idempotent and fast the second time: the pip step is skipped while the stamp in .venv matches
# a hash of pyproject.toml, constraints.txt and the interpreter; system packages are installed
# only when their programs are missing, and only as root (otherwise a one-line notice).
#
# Environment: PYTHON (default python3) builds the venv. ELASTIC_RUN_TORCH=system (on a GPU
# machine) uses the torch that PYTHON already imports, a CUDA build, instead of installing the
# pinned CPU one: the venv sees PYTHON's site-packages (after its own) through a .pth file, and
# constraints.txt's torch pin is left out. Output: one line per step; the full logs go to
# .cache/setup/ and are printed when a step fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
venv="$root/.venv"
logs="$root/.cache/setup"
stamp="$venv/.elastic-run-setup-stamp"
python=${PYTHON:-python3}
torch_mode=${ELASTIC_RUN_TORCH:-pinned}
mkdir -p "$logs"

say() { printf 'setup: %s\n' "$*"; }

# run LOG CMD...: run CMD quietly into LOG; on failure show the log's tail and stop.
run() {
    local log=$1
    shift
    if ! "$@" >"$log" 2>&1; then
        say "FAILED: $* (log: $log)"
        tail -n 40 "$log" >&2
        exit 1
    fi
}

# --- 1. the virtual environment --------------------------------------------------------------
if [[ ! -x "$venv/bin/python" ]]; then
    command -v "$python" >/dev/null || { say "FAILED: '$python' not found (set PYTHON)"; exit 1; }
    run "$logs/venv.log" "$python" -m venv "$venv"
    say "created .venv with $("$venv/bin/python" --version 2>&1)"
else
    say ".venv present ($("$venv/bin/python" --version 2>&1))"
fi

# --- 2. the package and its Python dependencies ------------------------------------------------
python_dependencies() {
    # torch: the CPU build pinned by constraints.txt, or (ELASTIC_RUN_TORCH=system) PYTHON's own.
    constraints=constraints.txt
    venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    torch_pth="$venv_site/elastic-run-system-torch.pth"
    case $torch_mode in
    pinned) rm -f "$torch_pth" ;;
    system)
        torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
            2>/dev/null) || { say "FAILED: ELASTIC_RUN_TORCH=system but $python cannot import torch"; exit 1; }
        version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
        if [[ "$(version "$python")" != "$(version "$venv/bin/python")" ]]; then
            say "FAILED: .venv has Python $(version "$venv/bin/python"), $python is $(version "$python") (remove .venv)"
            exit 1
        fi
        printf '%s\n' "$torch_site" >"$torch_pth"
        constraints="$logs/constraints-system-torch.txt"
        grep -v '^torch[=<>~! ]' constraints.txt >"$constraints" || true
        say "torch from $torch_site (ELASTIC_RUN_TORCH=system)"
        ;;
    *) say "FAILED: ELASTIC_RUN_TORCH=$torch_mode (use pinned or system)"; exit 1 ;;
    esac
    # The editable install is setuptools' "compat" mode: a .pth line that puts the checkout on
    # sys.path. The default mode's finder module costs every Python process ~30 ms of CPU at start
    # (42 ms against 13 ms for `python -c pass`, measured), and the test suite starts ~2,000 of them.
    editable=(--config-settings editable_mode=compat)
    key=$(cat pyproject.toml "$constraints" <("$venv/bin/python" -c 'import sys; print(sys.version)') \
        <([[ $torch_mode == pinned ]] || echo "torch: $torch_site") <(echo "${editable[*]}") |
        sha256sum | cut -d' ' -f1)
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]]; then
        say "python dependencies up to date"
    else
        run "$logs/pip.log" "$venv/bin/python" -m pip install --quiet -c "$constraints" "${editable[@]}" \
            -e '.[dev]'
        printf '%s\n' "$key" >"$stamp"
        say "installed elastic-run -e '.[dev]' (torch $("$venv/bin/python" -c \
            'import importlib.metadata as m; print(m.version("torch"))'))"
    fi
}

# --- 3. system programs the tests use -----------------------------------------------------------
system_programs() {
    # program -> Debian package. sbin is searched too: a non-root PATH often lacks it.
    #   etcd, etcdctl          the etcd tests (a real etcd; etcdctl sets up TLS users and auth)
    #   slurm*, s*, munged     the Slurm tests (a real two-node Slurm)
    #   tmux                   the live panel in a real terminal
    #   openssl                the etcd TLS tests make their certificates
    #   ip (iproute2)          the partition tests: hosts in network namespaces (root)
    #   unshare, setpriv       util-linux: worker spawning (--pdeathsig) and the benchmarks' netns
    #   chromium               the report test opens the page in a real headless browser
    programs=(etcd:etcd-server etcdctl:etcd-client slurmctld:slurmctld slurmd:slurmd
        sinfo:slurm-client sbatch:slurm-client munged:munge mungekey:munge tmux:tmux
        openssl:openssl ip:iproute2 unshare:util-linux setpriv:util-linux chromium:chromium)
    have() { PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin" command -v "$1" >/dev/null 2>&1; }

    missing=()
    for entry in "${programs[@]}"; do
        package=${entry#*:}
        if ! have "${entry%%:*}" && [[ " ${missing[*]} " != *" $package "* ]]; then
            missing+=("$package")
        fi
    done
    if ((${#missing[@]} == 0)); then
        say "system programs present ($(printf '%s\n' "${programs[@]%%:*}" | paste -sd, | sed 's/,/, /g'))"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        say "NOTICE: missing ${missing[*]}; the tests that need them will fail:" \
            "run scripts/setup.sh as root (or apt-get install them)"
        return 0
    fi

    # Packages such as slurmctld and munge start their services on install. A policy-rc.d that
    # answers 101 ("action forbidden") stops invoke-rc.d from doing so; it is removed afterwards
    # unless one was already there. Without a running systemd, deb-systemd-invoke starts nothing.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    cleanup_policy() { if ((own_policy)); then rm -f "$policy"; fi; }
    trap cleanup_policy EXIT

    export DEBIAN_FRONTEND=noninteractive
    daemons=(slurmctld slurmd munged etcd)
    daemon_pids() { for d in "${daemons[@]}"; do pgrep -x "$d" || true; done | sort; }
    before=$(daemon_pids)
    apt_install() {
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    }
    # Refresh the package lists only when the install cannot proceed without it.
    if ! apt_install >"$logs/apt.log" 2>&1; then
        run "$logs/apt-update.log" apt-get update -q
        run "$logs/apt.log" apt_install
    fi
    # Should a service have started anyway, stop it: only daemons (parent: init) that were not
    # running before the install, so a test's own etcd is never touched.
    for pid in $(comm -13 <(printf '%s\n' "$before") <(daemon_pids)); do
        [[ "$(ps -o ppid= -p "$pid" | tr -d ' ')" == 1 ]] && kill "$pid" 2>/dev/null || true
    done
    say "installed ${missing[*]}"
}

# The two are independent (pip fetches from the package index, apt from the distribution's
# mirrors), and on a fresh machine each takes tens of seconds: they run side by side. Each
# says its own lines; a failure of either fails the set-up.
python_dependencies &
python_pid=$!
system_programs
wait "$python_pid"
