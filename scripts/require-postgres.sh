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

# Needs install_package from require-redis.sh, sourced first.
need_postgres() {
    if have_postgres; then
        return 0
    fi
    # The package may start a system-wide cluster on port 5432; the harness runs its own
    # servers on free ports (as the package's `postgres` user when the tests run as root).
    install_package postgresql "PostgreSQL" \
        "set REDLOCK_PG_BIN to the directory holding initdb and postgres"
}
