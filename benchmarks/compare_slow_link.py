"""The table of benchmarks/slow_link_peers.sh: per way of training, each peer's median
tokens/s over the rounds, collie / PyTorch (the median of the rounds' ratios, and their
range), each peer's final loss (the job's mean loss of each of the last 8 steps, averaged:
median and range), and collie's tokens/s against its own DDP.
  compare_slow_link.py OUT ROUNDS RATE WAY...  (without ddp, no "÷ its DDP")"""

import json
import statistics
import sys

from compare_ddp import peer_result

WAYS = {
    "ddp": "float32 all-reduce every step (DDP)",
    "fp16": "fp16 (fp16_compress_hook)",
    "powersgd": "PowerSGD rank 4 from step 8 (powerSGD_hook)",
    "localsgd": "local SGD every 8 after 8 (PostLocalSGDOptimizer)",
}


def collie(out, way, rnd):
    with open(f"{out}/collie-{way}-{rnd}/summary.json") as f:
        return json.load(f)[0]


def tail(summary):
    """collie's job mean loss of each of the last 8 steps (summary.json's loss_curve), averaged."""
    curve = summary["loss_curve"][-8:]
    return sum(curve) / len(curve)


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main():
    out, rounds, rate, ways = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    print(f"2 lab hosts x 2 ranks at {rate}, {rounds} round(s); tokens/s: the mean of all steps "
          "but the first, slowest rank; medians (min-max over the rounds)")
    print()
    print("| way | collie tokens/s | PyTorch tokens/s | collie / PyTorch | collie ÷ its DDP | "
          "collie loss, last 8 steps | PyTorch loss, last 8 steps | collie sent MB/step |")
    print("|---|---|---|---|---|---|---|---|")
    base = ([collie(out, "ddp", r)["tokens_per_s"] for r in range(1, rounds + 1)]
            if "ddp" in ways else None)
    for way in ways:
        name = WAYS[way]
        mine = [collie(out, way, r) for r in range(1, rounds + 1)]
        peers = [peer_result(f"{out}/pytorch-{way}-{r}-h0.log") for r in range(1, rounds + 1)]
        ours = [m["tokens_per_s"] for m in mine]
        theirs = [p["tokens_per_s"] for p in peers]
        ratios = [a / b for a, b in zip(ours, theirs)]
        own = [a / b for a, b in zip(ours, base)] if base else None
        print(f"| {name} | {spread(ours, '{:,.0f}')} | {spread(theirs, '{:,.0f}')} | "
              f"{spread(ratios, '{:.2f}')} | {spread(own, '{:.2f}') if own else '-'} | "
              f"{spread([tail(m) for m in mine], '{:.3f}')} | "
              f"{spread([p['job_tail_loss'] for p in peers], '{:.3f}')} | "
              f"{spread([m['sent_bytes_per_step'] / 1e6 for m in mine], '{:.2f}')} |")
    p = peers[0]
    print()
    print(f"PyTorch {p['torch']} ({p['parameters']:,} parameters), BLAS {p['blas']}")


if __name__ == "__main__":
    main()
