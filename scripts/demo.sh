#!/usr/bin/env bash
# The main job: five local redis-server nodes, workers contending for one lock, a node
# killed and another paused part-way, and a check that no update was lost.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
need_cargo
need_redis
exec cargo run --release --quiet --bin redlock-demo
