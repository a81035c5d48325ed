#!/usr/bin/env bash
# The whole test suite: unit tests, doc tests, and the integration tests that start real
# redis-server processes on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
need_cargo
need_redis
exec cargo test --workspace "$@"
