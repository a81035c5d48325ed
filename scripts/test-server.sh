#!/usr/bin/env bash
# The suite against another server binary (REDIS_SERVER, e.g. Valkey's valkey-server): every
# test but the fault lab's full run, then the fault lab's must-pass scenarios once on the
# local backend (the docker node set is built from the host's redis-server, and the
# demonstrations, which break the algorithm's assumptions on purpose, say nothing new
# about the server). Tests that need TLS skip themselves, saying so, where the binary was
# built without it. With --quick, only the tests of what depends on the server (its health
# and identity, connections, ACL users, the CLI's node report and exit codes, the harness).
# Other arguments go to cargo test. See docs/servers.md.
#
#     REDIS_SERVER=/path/to/valkey-server ./scripts/test-server.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require-redis.sh
. scripts/require-postgres.sh
if [ -z "${REDIS_SERVER:-}" ]; then
    echo "error: set REDIS_SERVER to the server binary to test against (./scripts/fetch-server.sh valkey-9 fetches Valkey 9)" >&2
    exit 1
fi
need_cargo
need_postgres
"$REDIS_SERVER" --version
if [ "${1:-}" = --quick ]; then
    shift
    echo "== tests on $REDIS_SERVER: those of what depends on the server"
    cargo test --workspace --exclude redlock-lab --test production_health --test production \
        --test core_connect --test core_basics --test inspect_release_nodes \
        --test run_exit_codes --test harness "$@"
    echo "-- tests took ${SECONDS}s"
    exit 0
fi
# Every test target but the fault lab's (tests/fault_lab.rs), the lab crate's and the docker
# cluster's (its containers run the image built from Debian's redis-server, whatever
# REDIS_SERVER says), by name, in one cargo run: excluding a package instead would build the
# others with other features.
tests=()
for file in tests/*.rs crates/*/tests/*.rs; do
    case "$file" in
        tests/fault_lab.rs | tests/cluster_member_docker.rs | crates/redlock-lab/*) ;;
        *) tests+=(--test "$(basename "$file" .rs)") ;;
    esac
done
echo "== tests on $REDIS_SERVER: every test but the fault lab's"
cargo test --workspace --exclude redlock-lab --lib --bins "${tests[@]}" "$@"
cargo test --workspace --exclude redlock-lab --doc "$@"
echo "-- tests took ${SECONDS}s"
lab_started=$SECONDS
echo "== fault lab on $REDIS_SERVER: the must-pass scenarios, local backend"
REDLOCK_LAB_DOCKER= cargo test --test fault_lab -- --must-pass
echo "-- fault lab took $((SECONDS - lab_started))s"
