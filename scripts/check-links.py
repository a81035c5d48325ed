#!/usr/bin/env python3
"""Checks, offline, that every relative link and anchor in the documentation resolves.

The files: README.md, docs/*.md, each crate's README.md and bench-results' READMEs. For
every Markdown link or image whose target has no scheme (`docs/x.md`, `../y/README.md#z`,
`#anchor`), the file or folder must exist, and an anchor must name a heading of the target
Markdown file, as a code host renders it: lower case, punctuation but `-` and `_` dropped,
spaces as `-`, `-1`, `-2` ... after a heading seen before. Links to other sites (`https:`,
`mailto:`) are not followed. Code blocks and inline code are skipped.

Prints each broken link with its file and line and exits 1 if there is any.
Usage: scripts/check-links.py   (from anywhere; Python 3, standard library only)
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", "docs/*.md", "crates/*/README.md", "bench-results/README.md", "bench-results/*/README.md"]
FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) or ![alt](target "title"); the text may hold brackets of inline code.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files():
    found = []
    for pattern in FILES:
        found += sorted(glob.glob(os.path.join(ROOT, pattern)))
    return found


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    inside = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def slug(heading):
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        names = set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in prose_lines(text):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            names.add(base if count == 0 else f"{base}-{count}")
        names.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', text))
        _anchors[path] = names
    return _anchors[path]


def check(path):
    problems = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Whole paragraphs, so that a link whose text wraps onto the next line is found; each
    # link is reported at the line where it starts.
    lines = list(prose_lines(text))
    joined = "\n".join(INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line) for _, line in lines)
    starts = []
    offset = 0
    for number, line in lines:
        starts.append((offset, number))
        offset += len(line) + 1
    for m in LINK.finditer(joined):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue  # another site, or mailto:
        line = max(n for o, n in starts if o <= m.start())
        file_part, _, anchor = target.partition("#")
        resolved = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        where = f"{os.path.relpath(path, ROOT)}:{line}: {target}"
        if not os.path.exists(resolved):
            problems.append(f"{where}: no such file or folder")
            continue
        if anchor:
            if not resolved.endswith(".md") or os.path.isdir(resolved):
                problems.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with the anchor #{anchor} in {os.path.relpath(resolved, ROOT)}")
    return problems


def main():
    files = markdown_files()
    problems = [p for path in files for p in check(path)]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} broken link(s) in {len(files)} files")
        sys.exit(1)
    print(f"every relative link and anchor resolves ({len(files)} files)")


if __name__ == "__main__":
    main()
