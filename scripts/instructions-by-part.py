#!/usr/bin/env python3
"""Where each contender's instructions per uncontended cycle go, by part (the crate or the
libc family a function belongs to), as a Markdown table: the per-part companion of
./scripts/instructions.sh, for finding what a contender spends beyond another.

    ./scripts/instructions-by-part.py ours floor     the parts of ours beside the floor's
    ./scripts/instructions-by-part.py --functions 15 ours floor
                                                     and the 15 functions whose difference
                                                     between the first two is largest

Each contender runs twice under callgrind (100 and 1,100 cycles, as instructions.sh does);
the difference of each function's own instructions over 1,000 cycles leaves start-up and
connection out. A function that the compiler inlined is counted in its caller, so a part's
figure is where the work runs, not always where it is written. Needs valgrind and the bench
built (cargo bench --bench redlock --no-run), and redis-server on PATH.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

# The first prefix that matches names a function's part; libc's functions by their name.
PARTS = [
    ("fred::", "fred"),
    ("redis_protocol", "redis_protocol (RESP frames)"),
    ("redlock_core", "redlock_core"),
    ("redlock_client", "redlock_client"),
    ("tokio_util", "tokio_util (codec)"),
    ("tokio::", "tokio"),
    ("futures", "futures"),
    ("tracing", "tracing"),
    ("bytes", "bytes"),
    ("alloc::", "alloc (Vec, Arc, String)"),
    ("core::", "core (polls, iterators, drops)"),
    ("std::", "std (time, sync)"),
    ("hashbrown", "hashbrown"),
    ("arc_swap", "arc_swap"),
    ("redlock::", "the bench itself"),
    ("redis::", "redis (the redis crate)"),
    ("rslock::", "rslock"),
    ("combine::", "combine (the redis crate's parser)"),
]
LIBC = [
    (("malloc", "free", "realloc", "unlink_chunk", "__rdl_alloc", "__rdl_dealloc"), "libc malloc/free"),
    (("memcpy", "memmove", "memset", "memcmp", "strlen", "bcmp"), "libc memcpy and kin"),
    (("log10", "log_", "pow_", "floattidf"), "libm (the bench's histograms)"),
]
LINE = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*?)(?: \[.*\])?$")


def part(function):
    name = function.lstrip("<")
    for prefix, label in PARTS:
        if name.startswith(prefix):
            return label
    for needles, label in LIBC:
        if any(n in function for n in needles):
            return label
    return "other"


def functions(path):
    counts = collections.Counter()
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in annotated.splitlines():
        m = LINE.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        where = m.group(2)
        counts[where.split(":", 1)[1] if ":" in where else where] += int(m.group(1).replace(",", ""))
    return counts


def per_cycle(bench, subject, work):
    runs = []
    for cycles in (100, 1100):
        out = os.path.join(work, f"{subject}-{cycles}.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", bench,
             "--subjects", subject, "--cycles", str(cycles)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        runs.append(functions(out))
    short, long = runs
    return {f: (long[f] - short[f]) / 1000 for f in set(short) | set(long)}


def main():
    args = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args.add_argument("--functions", type=int, default=0, metavar="N")
    args.add_argument("subjects", nargs="+")
    args = args.parse_args()
    built = subprocess.run(["cargo", "bench", "--bench", "redlock", "--no-run"],
                           capture_output=True, text=True)
    found = re.findall(r"Executable .*\((.*)\)", built.stderr + built.stdout)
    if built.returncode != 0 or not found:
        sys.exit(f"error: the bench did not build:\n{built.stderr}")
    with tempfile.TemporaryDirectory() as work:
        costs = {s: per_cycle(found[-1], s, work) for s in args.subjects}
    parts = {s: collections.Counter() for s in args.subjects}
    for s, by_function in costs.items():
        for function, count in by_function.items():
            parts[s][part(function)] += count
    print("| part | " + " | ".join(args.subjects) + " |")
    print("|---|" + "---:|" * len(args.subjects))
    order = sorted({p for c in parts.values() for p in c}, key=lambda p: -max(c[p] for c in parts.values()))
    for p in order:
        print(f"| {p} | " + " | ".join(f"{parts[s][p] / 1000:.1f}k" for s in args.subjects) + " |")
    print("| **total** | " + " | ".join(f"**{sum(costs[s].values()) / 1000:.1f}k**" for s in args.subjects) + " |")
    if args.functions and len(args.subjects) >= 2:
        a, b = args.subjects[:2]
        diff = sorted(((costs[a].get(f, 0) - costs[b].get(f, 0), f) for f in set(costs[a]) | set(costs[b])),
                      reverse=True)
        print(f"\nThe {args.functions} functions {a} spends most beyond {b} in (per cycle):\n")
        for d, f in diff[: args.functions]:
            print(f"- {d / 1000:+.1f}k `{f[:110]}`")


if __name__ == "__main__":
    main()
