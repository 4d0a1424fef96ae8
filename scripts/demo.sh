#!/usr/bin/env bash
# Demo: a 2-worker DDP training on CPU under elastic-run's standalone rendezvous.
# Extra arguments go to examples/train.py (e.g. `scripts/demo.sh --fail-at-step 120`).
# A finished demo starts over; an interrupted one resumes from its last checkpoint.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh

checkpoints=.cache/demo/checkpoints
if [[ -f "$checkpoints/final.json" ]]; then
    rm -rf "$checkpoints"
fi
mkdir -p "$checkpoints"
exec .venv/bin/elastic-run --standalone --nproc-per-node 2 --max-restarts 1 \
    examples/train.py --steps 300 --checkpoint-dir "$checkpoints" "$@"
