#!/usr/bin/env python3
"""Draws every run's loss against wall time from a collie training summary (summary.json's
loss_curve: the job's mean loss after each step, and loss_curve_s: rank 0's seconds from
the first step's start to that step's end) as one SVG plot, with train.target_loss as a
dashed line where the runs set one. For comparing ways of training over a slow link: the
run whose curve is lowest at a time has learnt the most by then.

    scripts/loss-svg.py RUN/summary.json OUT.svg [--exclude TEXT] [--width PIXELS]
                        [--height PIXELS]
"""
import argparse
import html
import json
import math
import sys

COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 60, 140, 20, 45


def load(path):
    try:
        with open(path) as f:
            runs = json.load(f)
        if not isinstance(runs, list):
            raise ValueError("expected a list of runs")
        curves = []
        for i, run in enumerate(runs):
            loss, seconds = run["loss_curve"], run["loss_curve_s"]
            if len(loss) != len(seconds):
                raise ValueError(f"run {i + 1}: loss_curve and loss_curve_s differ in length")
            label = str(run.get("run") or run.get("name") or f"run {i + 1}")
            if label.startswith("name="):  # a matrix point that names itself
                label = label[len("name="):].split(",")[0]
            curves.append((label, [float(s) for s in seconds], [float(v) for v in loss],
                           float(run.get("target_loss", 0))))
        return curves
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"loss-svg: {path}: not a collie training summary with loss curves ({e}). "
                 "HINT: a summary.json written by `collie run` on a train: experiment")


def ticks(low, high, count=5):
    """Round values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    span = high - low if high > low else 1.0
    magnitude = 10 ** math.floor(math.log10(span / count))
    step = next(magnitude * f for f in (1, 2, 5, 10) if span / (magnitude * f) <= count)
    first = math.ceil(low / step - 1e-9)
    return [round(k * step, 10) for k in range(first, math.floor(high / step + 1e-9) + 1)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=900)
    parser.add_argument("--height", type=int, default=420)
    parser.add_argument("--exclude", default="",
                        help="leave out the runs whose label holds this text")
    args = parser.parse_args()
    curves = [c for c in load(args.summary)
              if c[1] and not (args.exclude and args.exclude in c[0])]
    if not curves:
        sys.exit(f"loss-svg: {args.summary}: no run took a step")
    x_max = max(max(c[1]) for c in curves)
    losses = [v for c in curves for v in c[2]]
    targets = sorted({c[3] for c in curves if c[3] > 0})
    y_low, y_high = min(losses + targets), max(losses + targets)
    pad = (y_high - y_low) * 0.05 or 0.5
    y_low, y_high = y_low - pad, y_high + pad
    plot_w = args.width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = args.height - MARGIN_TOP - MARGIN_BOTTOM

    def x(seconds):
        return MARGIN_LEFT + plot_w * seconds / x_max

    def y(loss):
        return MARGIN_TOP + plot_h * (y_high - loss) / (y_high - y_low)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{args.width}" '
           f'height="{args.height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{args.width}" height="{args.height}" fill="white"/>']
    for t in ticks(0, x_max):
        out.append(f'<line x1="{x(t):.1f}" y1="{MARGIN_TOP}" x2="{x(t):.1f}" '
                   f'y2="{MARGIN_TOP + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{x(t):.1f}" y="{MARGIN_TOP + plot_h + 16}" '
                   f'text-anchor="middle">{t:g}</text>')
    for t in ticks(y_low, y_high):
        out.append(f'<line x1="{MARGIN_LEFT}" y1="{y(t):.1f}" x2="{MARGIN_LEFT + plot_w}" '
                   f'y2="{y(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{MARGIN_LEFT - 6}" y="{y(t) + 4:.1f}" '
                   f'text-anchor="end">{t:g}</text>')
    out.append(f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" '
               'fill="none" stroke="#888"/>')
    out.append(f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{args.height - 8}" '
               'text-anchor="middle">seconds since the first step began (rank 0)</text>')
    out.append(f'<text transform="translate(14 {MARGIN_TOP + plot_h / 2}) rotate(-90)" '
               'text-anchor="middle">the job\'s mean loss</text>')
    for t in targets:
        out.append(f'<line x1="{MARGIN_LEFT}" y1="{y(t):.1f}" x2="{MARGIN_LEFT + plot_w}" '
                   f'y2="{y(t):.1f}" stroke="#444" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{MARGIN_LEFT + plot_w - 4}" y="{y(t) - 4:.1f}" '
                   f'text-anchor="end" fill="#444">target {t:g}</text>')
    for i, (label, seconds, loss, _) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(seconds, loss))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                   'stroke-width="1.5"/>')
        legend_y = MARGIN_TOP + 10 + 18 * i
        out.append(f'<line x1="{MARGIN_LEFT + plot_w + 12}" y1="{legend_y}" '
                   f'x2="{MARGIN_LEFT + plot_w + 32}" y2="{legend_y}" stroke="{colour}" '
                   'stroke-width="3"/>')
        out.append(f'<text x="{MARGIN_LEFT + plot_w + 38}" y="{legend_y + 4}">'
                   f'{html.escape(label[:28])}</text>')
    out.append("</svg>")
    try:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    except OSError as e:
        sys.exit(f"loss-svg: cannot write {args.out}: {e}")


if __name__ == "__main__":
    main()
