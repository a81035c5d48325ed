#!/usr/bin/env bash
# The benchmark: this workspace's client beside the raw-command floor and the rslock crate,
# on redis-server nodes the harness starts itself (release build; not part of the tests).
#
#   ./scripts/bench.sh            full run (about ten minutes), outputs to bench-results/
#   ./scripts/bench.sh --quick    a few seconds per scenario, outputs to target/bench-quick/
#   ./scripts/bench.sh --help     every flag
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
need_cargo
need_redis
if ! command -v redis-benchmark >/dev/null 2>&1; then
    echo "warning: redis-benchmark is not on PATH (Debian: apt-get install -y redis-tools);" >&2
    echo "         P5 will run without the servers' limit beside it." >&2
fi
exec cargo bench --bench redlock -- "$@"
