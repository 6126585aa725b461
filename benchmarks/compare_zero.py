"""The tables of benchmarks/zero_peers.sh: tokens/s and the peak RSS of every rank for collie
(sharding none, optimizer, gradients, parameters) and PyTorch (DDP with AdamW, with
ZeroRedundancyOptimizer), medians over the rounds with their min-max; the training state
collie's ranks hold (measured in its buffers) beside ZeRO's formula for fp32 + AdamW; and
the ratios collie / PyTorch.
  compare_zero.py OUT ROUNDS"""

import json
import statistics
import sys

from compare_ddp import peer_result

STAGES = ("none", "optimizer", "gradients", "parameters")


def collie(out, sharding, rnd):
    with open(f"{out}/collie-{sharding}-{rnd}/summary.json") as f:
        return json.load(f)[0]


def pytorch(out, optimizer, rnd):
    return peer_result(f"{out}/pytorch-{optimizer}-{rnd}.log")


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def formula(sharding, psi, n):
    """ZeRO's bytes per rank for fp32 parameters, gradients and AdamW's two moments."""
    return {"none": 16 * psi, "optimizer": 8 * psi + 8 * psi / n,
            "gradients": 4 * psi + 12 * psi / n, "parameters": 16 * psi / n}[sharding]


def mb(v):
    return f"{v:,.0f}"


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    every = range(1, rounds + 1)
    runs = {f"collie, sharding: {s}": [collie(out, s, r) for r in every] for s in STAGES}
    runs["PyTorch DDP + AdamW"] = [pytorch(out, "ddp", r) for r in every]
    runs["PyTorch DDP + ZeroRedundancyOptimizer"] = [pytorch(out, "zero", r) for r in every]
    first = runs["collie, sharding: none"][0]
    peer = runs["PyTorch DDP + AdamW"][0]
    n, psi = first["ranks"], first["parameters"]
    print(f"{n} ranks; parameters: collie {psi:,}, PyTorch {peer['parameters']:,}; "
          f"medians over {rounds} round(s) (min-max)")
    print()
    print("| run | tokens/s | peak RSS, largest rank (MB) | peak RSS per rank (MB) |")
    print("|---|---|---|---|")
    tokens, rss = {}, {}
    for name, results in runs.items():
        tokens[name] = [r["tokens_per_s"] for r in results]
        rss[name] = [max(r["peak_rss_bytes"]) / 1e6 for r in results]
        per_rank = [statistics.median(r["peak_rss_bytes"][k] for r in results) / 1e6
                    for k in range(n)]
        print(f"| {name} | {spread(tokens[name], lambda v: f'{v:,.0f}')} | "
              f"{spread(rss[name], mb)} | {', '.join(mb(v) for v in per_rank)} |")
    print()
    print("State per rank between steps, collie's buffers (rank 0) against ZeRO's formula for "
          "fp32 + AdamW, and what peak RSS fell by against sharding: none:")
    print()
    print("| sharding | parameters (MB) | gradients (MB) | optimizer (MB) | total (MB) "
          "| formula (MB) | total / formula | peak RSS saved (MB) | formula saves (MB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in STAGES:
        r = runs[f"collie, sharding: {s}"][0]
        total = r["parameter_bytes"] + r["gradient_bytes"] + r["optimizer_bytes"]
        saved = [a - b for a, b in zip(rss["collie, sharding: none"],
                                       rss[f"collie, sharding: {s}"])]
        print(f"| {s} | {r['parameter_bytes'] / 1e6:,.1f} | {r['gradient_bytes'] / 1e6:,.1f} | "
              f"{r['optimizer_bytes'] / 1e6:,.1f} | {total / 1e6:,.1f} | "
              f"{formula(s, psi, n) / 1e6:,.1f} | {total / formula(s, psi, n):.4f} | "
              f"{spread(saved, mb)} | "
              f"{(formula('none', psi, n) - formula(s, psi, n)) / 1e6:,.0f} |")
    gathered = runs["collie, sharding: parameters"][0]["gathered_peak_bytes"]
    print()
    print(f"Stage 3 held at most {gathered / 1e6:,.1f} MB of gathered parameters at once during "
          f"a step (of {4 * psi / 1e6:,.1f} MB).")
    print()
    print("Peak RSS saved against the formula's saving: less stage 3's gathered peak, and less "
          "the buffers the buckets borrow (full gradients in flight, gathered values; the "
          "summary's pooled_bytes):")
    print()
    print("| sharding | saved / (formula - gathered peak) | borrowed buffers (MB) "
          "| saved / (formula - borrowed) |")
    print("|---|---|---|---|")
    for s in STAGES[1:]:
        r = runs[f"collie, sharding: {s}"][0]
        saving = formula("none", psi, n) - formula(s, psi, n)
        saved = [a - b for a, b in zip(rss["collie, sharding: none"],
                                       rss[f"collie, sharding: {s}"])]
        peak = r["gathered_peak_bytes"] if s == "parameters" else 0
        borrowed = r.get("pooled_bytes", 0)
        print(f"| {s} | {spread([v * 1e6 / (saving - peak) for v in saved], lambda v: f'{v:.2f}')} "
              f"| {borrowed / 1e6:,.1f} "
              f"| {spread([v * 1e6 / (saving - borrowed) for v in saved], lambda v: f'{v:.2f}')} |")
    print()
    zero = "PyTorch DDP + ZeroRedundancyOptimizer"
    for mine, theirs in (("collie, sharding: none", "PyTorch DDP + AdamW"),
                         ("collie, sharding: optimizer", zero),
                         ("collie, sharding: gradients", zero),
                         ("collie, sharding: parameters", zero)):
        ratio = [a / b for a, b in zip(tokens[mine], tokens[theirs])]
        memory = [a / b for a, b in zip(rss[mine], rss[theirs])]
        print(f"{mine} / {theirs}: tokens/s {spread(ratio, lambda v: f'{v:.2f}')}, "
              f"peak RSS {spread(memory, lambda v: f'{v:.2f}')}")
    theirs = [a - b for a, b in zip(rss["PyTorch DDP + AdamW"], rss[zero])]
    print(f"peak RSS saved by PyTorch's ZeroRedundancyOptimizer: {spread(theirs, mb)} MB")


if __name__ == "__main__":
    main()
