# Sourced by demo.sh and test.sh: makes sure cargo and redis-server are there, installing
# redis-server from Debian's packages when it is missing and we may do so.
need_cargo() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo is not installed. Install Rust (https://rustup.rs), then run this again." >&2
        exit 1
    fi
}

need_redis() {
    if [ -n "${REDIS_SERVER:-}" ] || command -v redis-server >/dev/null 2>&1; then
        return 0
    fi
    if command -v apt-get >/dev/null 2>&1; then
        local sudo=""
        if [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
                sudo="sudo"
            else
                echo "error: redis-server is not installed. Install it with:" >&2
                echo "    sudo apt-get install -y redis-server" >&2
                echo "or set REDIS_SERVER=/path/to/redis-server, then run this again." >&2
                exit 1
            fi
        fi
        echo "redis-server is missing: installing Debian's package redis-server..." >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server
        # The package starts a system-wide server on port 6379; the harness starts its own
        # nodes on free ports and does not use it.
        return 0
    fi
    echo "error: redis-server is not installed and this is not a Debian-like system." >&2
    echo "Install Redis 6.2 or newer and put redis-server on PATH, or set REDIS_SERVER=/path/to/redis-server." >&2
    exit 1
}
