#!/usr/bin/env bash
# Build the local Redis image used by docker-compose.yml, without pulling
# anything: the image is FROM scratch and holds the host's Debian redis-server
# binary, the shared libraries ldd lists for it, and the clock shim.
#
# Usage: docker/build-image.sh [--force]
#   REDLOCK_REDIS_IMAGE  image tag to build (default: redlock-redis:local)
#   --force / REDLOCK_REBUILD=1  rebuild even if the image is up to date
#   CC  C compiler for the clock shim (default: cc)
#
# Idempotent: the inputs (Dockerfile, this script, the shim source, every file
# copied in) are hashed into the image label io.redlock.inputs-sha256; if an
# image with that tag and that label exists, the script exits without building.
set -euo pipefail
umask 022

IMAGE="${REDLOCK_REDIS_IMAGE:-redlock-redis:local}"
REDIS_BIN=/usr/bin/redis-server
LABEL_KEY=io.redlock.inputs-sha256
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
DOCKERFILE="$SCRIPT_DIR/Dockerfile"

force="${REDLOCK_REBUILD:-0}"
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "build-image.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
esac

die() { echo "build-image.sh: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found; install Docker Engine"
command -v ldd >/dev/null 2>&1 || die "ldd not found; install the Debian package libc-bin"
[ -f "$DOCKERFILE" ] || die "missing $DOCKERFILE"

# --- redis-server ----------------------------------------------------------
# On Debian, /usr/bin/redis-server (package redis-server) is a symlink to
# redis-check-rdb (package redis-tools): one binary that picks its mode from
# argv[0]. We copy the resolved file to /usr/bin/redis-server in the image.
if [ ! -x "$REDIS_BIN" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "build-image.sh: $REDIS_BIN missing, running: apt-get install -y redis-server" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server \
      || die "apt-get install -y redis-server failed (stale package lists? run apt-get update first)"
    [ -x "$REDIS_BIN" ] || die "$REDIS_BIN still missing after installing redis-server"
  else
    die "$REDIS_BIN not found. Install the Debian package redis-server (as root: apt-get install -y redis-server), then re-run."
  fi
fi
redis_real="$(readlink -f "$REDIS_BIN")"
redis_version="$("$REDIS_BIN" --version)"

# --- what goes into the image: "source<TAB>destination" lines ---------------
# Libraries keep the exact path ldd prints (e.g. /lib/x86_64-linux-gnu/libc.so.6,
# /lib64/ld-linux-x86-64.so.2), copied as regular files (symlinks resolved), so
# the loader finds them on its built-in search path without an ld.so.cache.
ldd_out="$(ldd "$redis_real" 2>&1)" || die "ldd $redis_real failed: $ldd_out"
if grep -q 'not found' <<<"$ldd_out"; then
  die "ldd reports missing libraries for $redis_real:"$'\n'"$ldd_out"
fi
manifest="$(printf '%s\t%s\n' "$redis_real" /usr/bin/redis-server)"
while read -r line; do
  case "$line" in
    *"=> /"*) lib="${line#*=> }"; lib="${lib%% (*}" ;;   # libfoo.so.1 => /path (0x...)
    /*)       lib="${line%% (*}" ;;                      # /lib64/ld-linux-x86-64.so.2 (0x...)
    *)        continue ;;                                # linux-vdso.so.1, etc.
  esac
  manifest+=$'\n'"$(printf '%s\t%s' "$(readlink -f "$lib")" "$lib")"
done <<<"$ldd_out"

# --- LD_PRELOAD clock shim ----------------------------------------------------
# crates/redlock-testkit/shim/clockshim.c fakes the wall clock of a process when
# REDLOCK_CLOCK_FILE names a readable control file ("OFFSET_NS RATE [ANCHOR_NS]")
# and leaves it real otherwise. docker-compose.yml preloads it into every node;
# its source is part of the inputs hash below.
SHIM_SRC="$REPO_ROOT/crates/redlock-testkit/shim/clockshim.c"
[ -f "$SHIM_SRC" ] || die "missing $SHIM_SRC (the clock shim source); check out the whole repository"
CC="${CC:-cc}"
command -v "${CC%% *}" >/dev/null 2>&1 \
  || die "C compiler '$CC' not found (needed for the clock shim); install gcc (apt-get install -y gcc) or set CC"
shim_dir="$(mktemp -d "${TMPDIR:-/tmp}/redlock-clockshim.XXXXXX")"
trap 'rm -rf "$shim_dir"' EXIT
shim_so="$shim_dir/libclockshim.so"
# Same flags as the harness uses for local nodes (ClockShim in crates/redlock-testkit).
# shellcheck disable=SC2086  # CC may carry arguments, e.g. "ccache gcc"
$CC -shared -fPIC -O2 -Wall -Wextra -Werror -o "$shim_so" "$SHIM_SRC" \
  || die "compiling $SHIM_SRC with '$CC' failed (see the compiler output above)"
manifest+=$'\n'"$(printf '%s\t%s' "$shim_so" /usr/lib/redlock/libclockshim.so)"
# Libraries the shim needs beyond redis-server's (normally none: glibc only).
while read -r line; do
  case "$line" in
    *"=> /"*) lib="${line#*=> }"; lib="${lib%% (*}" ;;
    /*)       lib="${line%% (*}" ;;
    *)        continue ;;
  esac
  case $'\n'"$manifest"$'\n' in
    *$'\t'"$lib"$'\n'*) ;;                               # already copied for redis-server
    *) manifest+=$'\n'"$(printf '%s\t%s' "$(readlink -f "$lib")" "$lib")" ;;
  esac
done <<<"$(ldd "$shim_so" 2>&1)"

# --- up to date? -------------------------------------------------------------
inputs_hash="$(
  {
    sha256sum "$DOCKERFILE" "${BASH_SOURCE[0]}" "$SHIM_SRC" | cut -d' ' -f1
    while IFS=$'\t' read -r src dst; do
      printf '%s %s\n' "$dst" "$(sha256sum "$src" | cut -d' ' -f1)"
    done <<<"$manifest"
  } | sha256sum | cut -d' ' -f1
)"
current="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL_KEY\" }}" "$IMAGE" 2>/dev/null || true)"
if [ "$force" != 1 ] && [ "$current" = "$inputs_hash" ]; then
  echo "build-image.sh: $IMAGE is up to date ($redis_version)"
  exit 0
fi

# --- stage the build context ----------------------------------------------------
stage="$(mktemp -d "${TMPDIR:-/tmp}/redlock-redis-image.XXXXXX")"
trap 'rm -rf "$stage" "$shim_dir"' EXIT
root="$stage/rootfs"
mkdir -p "$root/data" "$root/tmp"
chmod 0755 "$root" "$root/data"
chmod 1777 "$root/tmp"
while IFS=$'\t' read -r src dst; do
  mode=0644
  case "$dst" in /usr/bin/*|*/ld-linux*) mode=0755 ;; esac
  install -D -m "$mode" "$src" "$root$dst"   # -D: create parents; follows symlinks
done <<<"$manifest"
cp "$DOCKERFILE" "$stage/Dockerfile"

echo "build-image.sh: building $IMAGE from $redis_real ($redis_version)"
docker build \
  --label "$LABEL_KEY=$inputs_hash" \
  --label "io.redlock.redis-version=$redis_version" \
  -t "$IMAGE" "$stage"
echo "build-image.sh: built $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE") bytes)"
