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
exec cargo test --workspace "$@"
