#!/usr/bin/env bash
# busy_cpu.sh CMD...: run CMD; then print its wall time and the CPU-seconds the whole machine was
# busy meanwhile (user + system, from /proc/stat: the CPU of every process, including those a
# test suite's processes leave to others, which `time` does not see). Exits with CMD's status.
# Used for the README's figures of `bash .ci/run` (Development).
set -uo pipefail
busy() {
    local _ user nice system _idle _iowait irq softirq _rest
    read -r _ user nice system _idle _iowait irq softirq _rest </proc/stat
    echo $((user + nice + system + irq + softirq))
}
ticks=$(getconf CLK_TCK)
before=$(busy)
start=$(date +%s.%N)
"$@"
status=$?
end=$(date +%s.%N)
after=$(busy)
awk -v a="$start" -v b="$end" -v c="$(((after - before) / ticks))" -v s="$status" \
    'BEGIN { w = b - a; printf "busy_cpu: wall %.1f s (%.1f min), busy %d CPU-s, exit %d\n", w, w / 60, c, s }' >&2
exit "$status"
