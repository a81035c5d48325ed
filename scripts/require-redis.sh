# Sourced by demo.sh and test.sh: makes sure cargo and redis-server are there, installing
# redis-server from Debian's packages when it is missing and we may do so.
need_cargo() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo is not installed. Install Rust (https://rustup.rs), then run this again." >&2
        exit 1
    fi
}

# Installs Debian's package $1 (described as $2 in messages) as root or with password-less
# sudo; otherwise stops with the exact command to run, and $3 as the other way out.
install_package() {
    local package="$1" what="$2" otherwise="$3"
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: $what is not installed and this is not a Debian-like system." >&2
        echo "Install it, or $otherwise." >&2
        exit 1
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo"
        else
            echo "error: $what is not installed. Install it with:" >&2
            echo "    sudo apt-get install -y $package" >&2
            echo "or $otherwise, then run this again." >&2
            exit 1
        fi
    fi
    echo "$what is missing: installing Debian's package $package..." >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package"
}

need_redis() {
    if [ -n "${REDIS_SERVER:-}" ] || command -v redis-server >/dev/null 2>&1; then
        return 0
    fi
    # Redis 6.2 or newer. The package starts a system-wide server on port 6379; the harness
    # starts its own nodes on free ports and does not use it.
    install_package redis-server redis-server "set REDIS_SERVER=/path/to/redis-server"
}
