#!/usr/bin/env python3
"""Draws one fault-lab run log as an SVG timeline, with the checker's verdict.

The log is what `cargo run --example lab_timeline -- SCENARIO` writes: one JSON object a
line (the scenario, then every acquisition, release, extension, write and fault the lab
recorded, then the checker's violations and its verdict). One lane per client: each lock
is a bar from the start of its winning round to the end of its claim (the validity the
library reported, or the start of its release if that came first); a write is a line from
its read to its write, drawn red when the checker named it in a violation; faults are
dashed lines across every lane. The checker's findings are printed under the lanes as it
worded them.

Usage: scripts/lab-timeline.py RUN.jsonl OUT.svg   (Python 3, standard library only)
"""

import json
import re
import sys
from html import escape

WIDTH = 960
LEFT = 110  # the lanes' labels
RIGHT = 30
LANE = 70
TOP = 70
COLORS = ["#4878a8", "#5a9a5a", "#a87848", "#8a5aa8", "#a84860", "#4898a0"]
# "(token 9a5d46d5) wrote at 413.2ms" or "(token ab159753) wrote 2 at 727.4ms": the write a
# violation is about.
NAMED_WRITE = re.compile(r"\(token ([0-9a-f]+)\) wrote (?:\d+ )?at ([0-9.]+)ms")


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def draw(events):
    scenario = next(e for e in events if e["event"] == "scenario")
    verdict = next(e for e in events if e["event"] == "verdict")
    violations = [e for e in events if e["event"] == "violation"]
    acquired = [e for e in events if e["event"] == "acquired"]
    releases = {e["token"]: e["at_ms"] for e in events if e["event"] == "release"}
    writes = [e for e in events if e["event"] in ("write", "write_rejected")]
    faults = [e for e in events if e["event"] == "fault"]
    clients = sorted({e["client"] for e in acquired + writes})

    named = set()
    for v in violations:
        for token, at in NAMED_WRITE.findall(v["what"]):
            named.add((token, round(float(at), 1)))

    ends = [a["valid_until_ms"] for a in acquired] + [w.get("wrote_ms", w.get("rejected_ms")) for w in writes]
    ends += [f["at_ms"] for f in faults] + list(releases.values())
    span = max(ends) * 1.05 if ends else 1.0
    plot = WIDTH - LEFT - RIGHT

    def x(ms):
        return LEFT + plot * ms / span

    lanes_bottom = TOP + LANE * len(clients)
    verdict_lines = 3 + len(violations)
    height = lanes_bottom + 60 + 18 * verdict_lines
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">'
        f'{escape(scenario["name"])} ({escape(scenario["backend"])} nodes), expected: {escape(scenario["expect"])}</text>',
        f'<text x="{LEFT}" y="42" fill="#444">{escape(scenario["shows"][:140])}</text>',
    ]
    # Time axis, every 100 ms (or coarser for long runs).
    step = 100
    while span / step > 12:
        step *= 2
    t = 0
    while t <= span:
        out.append(f'<line x1="{x(t):.1f}" y1="{TOP - 8}" x2="{x(t):.1f}" y2="{lanes_bottom}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x(t):.1f}" y="{lanes_bottom + 16}" text-anchor="middle" fill="#666">{t} ms</text>')
        t += step
    for i, client in enumerate(clients):
        y = TOP + LANE * i
        color = COLORS[i % len(COLORS)]
        out.append(f'<text x="{LEFT - 10}" y="{y + 30}" text-anchor="end" font-weight="bold">{escape(client)}</text>')
        for a in (a for a in acquired if a["client"] == client):
            end = min(a["valid_until_ms"], releases.get(a["token"], a["valid_until_ms"]))
            x0, x1, x2 = x(a["started_ms"]), x(a["acquired_ms"]), x(end)
            out.append(f'<rect x="{x0:.1f}" y="{y + 14}" width="{max(x1 - x0, 1):.1f}" height="22" fill="{color}" opacity="0.35"/>')
            out.append(f'<rect x="{x1:.1f}" y="{y + 14}" width="{max(x2 - x1, 1):.1f}" height="22" fill="{color}" opacity="0.8"/>')
            label = a["token"][:8] + (f' fencing {a["fencing"]}' if a.get("fencing") else "")
            out.append(f'<text x="{x1 + 4:.1f}" y="{y + 29}" fill="white">{escape(label)}</text>')
            if a["token"] in releases and releases[a["token"]] <= a["valid_until_ms"]:
                out.append(f'<line x1="{x(releases[a["token"]]):.1f}" y1="{y + 10}" x2="{x(releases[a["token"]]):.1f}" y2="{y + 40}" stroke="black" stroke-width="2"/>')
            else:
                out.append(f'<text x="{x2 + 3:.1f}" y="{y + 12}" fill="#555">validity ends</text>')
        for w in (w for w in writes if w["client"] == client):
            done = w.get("wrote_ms", w.get("rejected_ms"))
            flagged = (w["token"][:8], round(done, 1)) in named
            stroke = "#c0392b" if flagged else "black"
            wy = y + 50
            out.append(f'<line x1="{x(w["read_ms"]):.1f}" y1="{wy}" x2="{x(done):.1f}" y2="{wy}" stroke="{stroke}" stroke-width="2"/>')
            out.append(f'<circle cx="{x(done):.1f}" cy="{wy}" r="4" fill="{stroke}"/>')
            what = f'write {w.get("read", "?")}&#8594;{w["wrote"]}' if w["event"] == "write" else "write rejected"
            if flagged:
                what += " (named by the checker)"
            out.append(f'<text x="{x(done) + 6:.1f}" y="{wy + 4}" fill="{stroke}">{what}</text>')
    for f in faults:
        out.append(f'<line x1="{x(f["at_ms"]):.1f}" y1="{TOP - 8}" x2="{x(f["at_ms"]):.1f}" y2="{lanes_bottom}" stroke="#c08000" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x(f["at_ms"]) + 3:.1f}" y="{TOP - 10}" fill="#c08000">{escape(f["what"])}</text>')
    # The checker's verdict, in its own words.
    y = lanes_bottom + 44
    passed = "as expected" if verdict["passed"] else "NOT as expected"
    out.append(
        f'<text x="{LEFT}" y="{y}" font-weight="bold">The checker: {verdict["violations"]} violation(s) in '
        f'{verdict["acquisitions"]} acquisitions and {verdict["writes"]} writes; {passed}</text>'
    )
    for v in violations:
        y += 18
        out.append(f'<text x="{LEFT + 10}" y="{y}" fill="#c0392b">{escape(v["what"])}</text>')
    y += 24
    out.append(
        f'<text x="{LEFT}" y="{y}" fill="#666">Bars: the winning round (light), then the claim until release (black tick) '
        f'or the end of validity. Lines: a write, from its read.</text>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    svg = draw(load(sys.argv[1]))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
