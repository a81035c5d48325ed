#!/usr/bin/env python3
"""Checks that no paragraph of the README and the guide is written twice.

Every fact has one home: the README's sections or one chapter of the guide (docs/*.md).
This finds a paragraph, list item, table, table row or code block that appears twice,
across those files or within one, after folding whitespace and case (short pieces, under
60 characters, such as "License: MIT OR Apache-2.0.", are left out). Headings are not
compared.

Prints each repeat with the places it appears and exits 1 if there is any.
Usage: scripts/check-repeats.py   (from anywhere; Python 3, standard library only)
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", "docs/*.md"]
SHORTEST = 60
FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^(\s*)([-*+]|\d+\.)\s+")


def blocks(text):
    """(first line, kind, text) of each paragraph, list item, table row and code block."""
    out = []
    current, start, code = [], 0, None
    lines = text.split("\n")

    def flush():
        nonlocal current
        if current:
            out.extend(split(start, current))
        current = []

    for number, line in enumerate(lines, 1):
        if code is not None:
            code.append(line)
            if FENCE.match(line):
                out.append((code_start, "code block", "\n".join(code)))
                code = None
            continue
        if FENCE.match(line):
            flush()
            code, code_start = [line], number
            continue
        if not line.strip():
            flush()
            continue
        if not current:
            start = number
        current.append(line)
    flush()
    return out


def split(start, lines):
    """A block of lines: a table (whole, and each row), list items, or one paragraph."""
    if lines[0].lstrip().startswith("#"):
        rest = lines[1:]
        return split(start + 1, rest) if rest else []
    if all(line.lstrip().startswith("|") for line in lines):
        rows = [(start + i, "table row", line) for i, line in enumerate(lines) if not re.match(r"^\s*\|[\s:|-]*\|\s*$", line)]
        return [(start, "table", "\n".join(lines))] + rows[1:]  # the header row alone is no fact
    if ITEM.match(lines[0]):
        items, first = [], None
        for i, line in enumerate(lines):
            if ITEM.match(line) and len(ITEM.match(line).group(1)) == len(ITEM.match(lines[0]).group(1)):
                if first is not None:
                    items.append((start + first, "list item", "\n".join(lines[first:i])))
                first = i
        items.append((start + first, "list item", "\n".join(lines[first:])))
        return items
    return [(start, "paragraph", "\n".join(lines))]


def fold(text):
    return " ".join(text.split()).lower()


def main():
    files = []
    for pattern in FILES:
        files += sorted(glob.glob(os.path.join(ROOT, pattern)))
    seen = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, kind, block in blocks(text):
            key = fold(block)
            if len(key) < SHORTEST:
                continue
            seen.setdefault(key, []).append((os.path.relpath(path, ROOT), line, kind, block))
    repeats = [places for places in seen.values() if len(places) > 1]
    for places in repeats:
        where = ", ".join(f"{p}:{line}" for p, line, _, _ in places)
        first = places[0][3].strip().split("\n")[0]
        print(f"{places[0][2]} written {len(places)} times ({where}): {first[:100]}")
    if repeats:
        print(f"{len(repeats)} repeated piece(s): give each fact one home and link to it")
        sys.exit(1)
    print(f"no paragraph repeated across {len(files)} files")


if __name__ == "__main__":
    main()
