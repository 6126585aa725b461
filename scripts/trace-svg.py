#!/usr/bin/env python3
"""Draws a window of a collie job trace (train.trace's trace.json) as an SVG timeline: a row
per rank and track (compute, communication), a box per event, a line per flow between the
ranks' events of one collective. For documentation and quick looks where ui.perfetto.dev
cannot be reached; the trace itself is the record.

    scripts/trace-svg.py RUN/trace.json OUT.svg [--steps FIRST-LAST] [--width PIXELS]
"""
import argparse
import html
import json
import sys

COLOURS = {"forward": "#4e79a7", "backward": "#f28e2b", "optimizer": "#59a14f",
           "gradient sync": "#bab0ac", "step": "#e8e8e8"}
COLLECTIVE = "#e15759"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--steps", default="", help="FIRST-LAST (1-based), all when omitted")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    try:
        with open(args.trace) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"trace-svg: {args.trace} is not a trace-event JSON: {e}")
    first, last = 1, 1 << 62
    if args.steps:
        try:
            first, last = (int(x) for x in args.steps.split("-"))
        except ValueError:
            sys.exit(f"trace-svg: --steps {args.steps!r}: expected FIRST-LAST, e.g. 4-6")

    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    boxes = [e for e in events if e.get("ph") == "X"
             and first <= e.get("args", {}).get("step", 0) <= last]
    if not boxes:
        sys.exit(f"trace-svg: no events of steps {first}-{last} in {args.trace}")
    t0 = min(e["ts"] for e in boxes)
    t1 = max(e["ts"] + e["dur"] for e in boxes)
    rows = sorted({(e["pid"], e["tid"]) for e in boxes})
    label_w, row_h, top = 230, 26, 30
    scale = (args.width - label_w - 10) / (t1 - t0)
    height = top + row_h * len(rows) + 30
    x = lambda ts: label_w + (ts - t0) * scale
    y = {row: top + k * row_h for k, row in enumerate(rows)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{args.width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="8" y="18" font-weight="bold">{html.escape(trace.get("otherData", {}).get("experiment", ""))}'
           f" steps {first}-{min(last, max(e['args'].get('step', 0) for e in boxes))}, "
           f"{(t1 - t0) / 1e3:.0f} ms</text>"]
    for (pid, tid), top_y in y.items():
        track = "compute" if tid == 1 else "communication"
        out.append(f'<text x="8" y="{top_y + 17}">{html.escape(names.get(pid, str(pid)))} '
                   f"{track}</text>")
        out.append(f'<line x1="{label_w}" x2="{args.width - 10}" y1="{top_y + row_h - 1}" '
                   f'y2="{top_y + row_h - 1}" stroke="#ddd"/>')
    # Outer events first, so that the events inside a step are drawn over it.
    for e in sorted(boxes, key=lambda e: -e["dur"]):
        colour = COLLECTIVE if e.get("cat") == "collective" else COLOURS.get(e["name"], "#9c755f")
        inset = 2 if e["name"] == "step" else 5
        w = max(e["dur"] * scale, 0.5)
        tip = html.escape(f"{e['name']} {json.dumps(e.get('args', {}))} {e['dur'] / 1e3:.2f} ms")
        out.append(f'<rect x="{x(e["ts"]):.1f}" y="{y[(e["pid"], e["tid"])] + inset}" '
                   f'width="{w:.1f}" height="{row_h - 2 * inset}" fill="{colour}" stroke="white" '
                   f'stroke-width="0.4">'
                   f"<title>{tip}</title></rect>")
    ends = {}
    for e in events:
        if e.get("ph") in ("s", "t", "f") and t0 <= e["ts"] <= t1 and (e["pid"], e["tid"]) in y:
            ends.setdefault(e["id"], []).append(e)
    for chain in ends.values():
        chain.sort(key=lambda e: e["pid"])
        for a, b in zip(chain, chain[1:]):
            out.append(f'<line x1="{x(a["ts"]):.1f}" y1="{y[(a["pid"], a["tid"])] + row_h / 2}" '
                       f'x2="{x(b["ts"]):.1f}" y2="{y[(b["pid"], b["tid"])] + row_h / 2}" '
                       f'stroke="black" stroke-width="0.6" opacity="0.6"/>')
    legend = list(COLOURS.items())[:4] + [("collective", COLLECTIVE)]
    for k, (name, colour) in enumerate(legend):
        lx = label_w + k * 130
        out.append(f'<rect x="{lx}" y="{height - 20}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{height - 10}">{name}</text>')
    out.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
