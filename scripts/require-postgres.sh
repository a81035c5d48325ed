# Sourced by test.sh: makes sure PostgreSQL's server binaries are there (the fenced resource
# of the tests, started by redlock_testkit::Postgres), installing Debian's postgresql package
# when they are missing and we may do so.

# Whether initdb and postgres can be found the way the harness looks for them.
have_postgres() {
    if [ -n "${REDLOCK_PG_BIN:-}" ]; then
        # The harness takes an explicit directory as final: check it, do not install around it.
        return 0
    fi
    command -v initdb >/dev/null 2>&1 && return 0
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && return 0
    fi
    # Debian keeps the server binaries off PATH, one directory per major version.
    for dir in /usr/lib/postgresql/*/bin; do
        [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && return 0
    done
    return 1
}

need_postgres() {
    if have_postgres; then
        return 0
    fi
    if command -v apt-get >/dev/null 2>&1; then
        local sudo=""
        if [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
                sudo="sudo"
            else
                echo "error: PostgreSQL is not installed. Install it with:" >&2
                echo "    sudo apt-get install -y postgresql" >&2
                echo "or set REDLOCK_PG_BIN=/path/to/dir/with/initdb/and/postgres, then run this again." >&2
                exit 1
            fi
        fi
        echo "PostgreSQL is missing: installing Debian's package postgresql..." >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
        # The package may start a system-wide cluster on port 5432; the harness runs its own
        # servers on free ports (as the package's `postgres` user when the tests run as root).
        return 0
    fi
    echo "error: PostgreSQL is not installed and this is not a Debian-like system." >&2
    echo "Install the PostgreSQL server (initdb and postgres), or set REDLOCK_PG_BIN to the directory holding them." >&2
    exit 1
}
