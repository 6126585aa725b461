"""The table of benchmarks/zero_peers.sh: tokens/s and the largest peak RSS of a rank for
collie (sharding none, optimizer) and PyTorch (DDP with AdamW, with ZeroRedundancyOptimizer),
medians over the rounds with their min-max, and the ratios collie / PyTorch.
  compare_zero.py OUT ROUNDS"""

import json
import statistics
import sys

from compare_ddp import peer_result


def collie(out, sharding, rnd):
    with open(f"{out}/collie-{sharding}-{rnd}/summary.json") as f:
        return json.load(f)[0]


def pytorch(out, optimizer, rnd):
    return peer_result(f"{out}/pytorch-{optimizer}-{rnd}.log")


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    runs = {
        "collie, sharding: none": [collie(out, "none", r) for r in range(1, rounds + 1)],
        "collie, sharding: optimizer": [collie(out, "optimizer", r) for r in range(1, rounds + 1)],
        "PyTorch DDP + AdamW": [pytorch(out, "ddp", r) for r in range(1, rounds + 1)],
        "PyTorch DDP + ZeroRedundancyOptimizer": [pytorch(out, "zero", r)
                                                   for r in range(1, rounds + 1)],
    }
    first = runs["collie, sharding: none"][0]
    peer = runs["PyTorch DDP + AdamW"][0]
    print(f"{first['ranks']} ranks; parameters: collie {first['parameters']:,}, "
          f"PyTorch {peer['parameters']:,}; medians over {rounds} round(s) (min-max)")
    print()
    print("| run | tokens/s | peak RSS of the largest rank (MB) |")
    print("|---|---|---|")
    tokens, rss = {}, {}
    for name, results in runs.items():
        tokens[name] = [r["tokens_per_s"] for r in results]
        rss[name] = [max(r["peak_rss_bytes"]) / 1e6 for r in results]
        print(f"| {name} | {spread(tokens[name], lambda v: f'{v:,.0f}')} | "
              f"{spread(rss[name], lambda v: f'{v:,.0f}')} |")
    print()
    for mine, theirs in (("collie, sharding: none", "PyTorch DDP + AdamW"),
                         ("collie, sharding: optimizer", "PyTorch DDP + ZeroRedundancyOptimizer")):
        ratio = [a / b for a, b in zip(tokens[mine], tokens[theirs])]
        memory = [a / b for a, b in zip(rss[mine], rss[theirs])]
        print(f"{mine} / {theirs}: tokens/s {spread(ratio, lambda v: f'{v:.2f}')}, "
              f"peak RSS {spread(memory, lambda v: f'{v:.2f}')}")
    saved = [a - b for a, b in zip(rss["collie, sharding: none"], rss["collie, sharding: optimizer"])]
    theirs = [a - b for a, b in zip(rss["PyTorch DDP + AdamW"],
                                    rss["PyTorch DDP + ZeroRedundancyOptimizer"])]
    print(f"peak RSS saved by sharding: collie {spread(saved, lambda v: f'{v:,.0f}')} MB, "
          f"PyTorch {spread(theirs, lambda v: f'{v:,.0f}')} MB")


if __name__ == "__main__":
    main()
