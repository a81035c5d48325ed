#!/usr/bin/env python3
"""Checks the workspace's declared MSRV (`rust-version` in Cargo.toml) against the
dependency graph in Cargo.lock: fails when a dependency of a published crate declares a
newer `rust-version` than the workspace does.

This is the lower bound the dependencies' own `rust-version` fields give; CI also builds the
published crates with that toolchain (`cargo +1.89 check`, see .ci/run), which catches what
this cannot (our own code, a dependency that declares no `rust-version`). It walks the
normal and build dependencies of every published workspace crate (all features, every
target platform: a Windows-only dependency counts too) and prints the highest requirement
and the path to it. Dev-dependencies (tests, benchmarks, examples) are reported, not
enforced: the MSRV promises that the crates build, not that the test suite does.

Usage: scripts/check-msrv.py   (from anywhere in the workspace; needs cargo and Python 3)
"""

import json
import subprocess
import sys


def version(text):
    """`1.85` or `1.85.0` as a comparable tuple (1, 85, 0)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(str(p) for p in v)


def main():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    members = set(meta["workspace_members"])
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    declared = {}
    for pid in members:
        rv = packages[pid].get("rust_version")
        if rv:
            declared[packages[pid]["name"]] = version(rv)
    if not declared:
        sys.exit("no workspace crate declares a rust-version")
    msrv = min(declared.values())
    if len(set(declared.values())) > 1:
        print(f"note: the crates declare different rust-versions: {declared}")

    def walk(roots, kinds):
        """The highest rust-version reachable from `roots` through `kinds` of dependency
        (dev-dependencies only from the roots), with the path that leads to it."""
        best = (None, None)
        seen = set()
        stack = [(r, [packages[r]["name"]], True) for r in roots]
        while stack:
            pid, path, is_root = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            for dep in nodes[pid]["deps"]:
                dep_kinds = {k["kind"] for k in dep["dep_kinds"]}
                wanted = {None, "build"} | (kinds if is_root else set())
                if not dep_kinds & wanted:
                    continue
                child = dep["pkg"]
                name = f'{packages[child]["name"]} {packages[child]["version"]}'
                # Workspace crates carry the declared version itself.
                rv = None if child in members else packages[child].get("rust_version")
                if rv and (best[0] is None or version(rv) > best[0]):
                    best = (version(rv), path + [name])
                stack.append((child, path + [name], False))
        return best

    # `publish = false` shows as an empty list of registries.
    published = [pid for pid in members if packages[pid].get("publish") is None]
    need, path = walk(published, set())
    dev_need, dev_path = walk(members, {"dev"})
    print(f"declared rust-version: {show(msrv)}")
    print("published crates: " + ", ".join(sorted(packages[p]["name"] for p in published)))
    if need:
        print(f"highest requirement of their dependencies: {show(need)} ({' -> '.join(path)})")
    if dev_need:
        print(
            f"with tests, benchmarks and examples (not enforced): {show(dev_need)} "
            f"({' -> '.join(dev_path)})"
        )
    if need and need > msrv:
        sys.exit(
            f"error: a dependency needs Rust {show(need)}, newer than the declared "
            f"rust-version {show(msrv)}: raise rust-version in Cargo.toml to {show(need)} "
            "(or pin the dependency to an older version in Cargo.lock)"
        )
    print("OK: no dependency of a published crate needs a newer Rust than declared")


if __name__ == "__main__":
    main()
