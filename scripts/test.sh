#!/usr/bin/env bash
# The whole test suite: unit tests, doc tests, and the integration tests that start real
# redis-server processes (and, for the fenced resource, PostgreSQL) on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
. scripts/require-postgres.sh
need_cargo
need_redis
need_postgres
cargo test --workspace "$@"
# The runnable examples (the tutorials, then fencing at the resource), unless a subset of tests was asked for.
if [ $# -eq 0 ]; then
    for example in lock_release with_lock fenced_redis fenced_sql metrics; do
        echo "== example $example"
        cargo run -q --example "$example"
    done
fi
