#!/usr/bin/env bash
# Each contender's own instructions per uncontended lock+unlock cycle at N = 5, counted by
# callgrind: a figure that other work on a shared machine does not move, unlike the bench's
# timings (the servers run outside valgrind and are not counted).
#
#   ./scripts/instructions.sh                      ours, floor, rslock
#   ./scripts/instructions.sh ours ours-fenced     the contenders named (see the bench's --help)
#
# Each contender runs twice under callgrind, 100 and 1,100 cycles; the difference over
# 1,000 cycles leaves out start-up and connection. Needs valgrind (Debian: apt-get install
# -y valgrind). Takes about ten seconds per contender once the bench is built.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
need_cargo
need_redis
if ! command -v valgrind >/dev/null 2>&1; then
    echo "error: valgrind is not on PATH (Debian: apt-get install -y valgrind)" >&2
    exit 1
fi
subjects=("$@")
if [ ${#subjects[@]} -eq 0 ]; then
    subjects=(ours floor rslock)
fi
# The bench's executable, as cargo names it once built ("Executable ... (PATH)").
if ! built=$(cargo bench --bench redlock --no-run 2>&1); then
    echo "$built" >&2
    echo "error: the bench did not build (cargo's output is above)" >&2
    exit 1
fi
bench=$(echo "$built" | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
count() { # subject cycles -> instructions
    valgrind --tool=callgrind --callgrind-out-file="$work/out" "$bench" \
        --subjects "$1" --cycles "$2" >/dev/null 2>"$work/log" || {
        cat "$work/log" >&2
        echo "error: $1 failed under callgrind (its output is above)" >&2
        exit 1
    }
    sed -n 's/^summary: //p' "$work/out"
}
printf '%-16s %s\n' contender "instructions per cycle"
for s in "${subjects[@]}"; do
    short=$(count "$s" 100)
    long=$(count "$s" 1100)
    printf '%-16s %s\n' "$s" $(((long - short) / 1000))
done
