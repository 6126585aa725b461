"""The table of benchmarks/slow_link_peers.sh: per way of training, each peer's median
tokens/s over the rounds, collie / PyTorch (the median of the rounds' ratios, and their
range), each peer's final loss (the job's mean loss of each of the last 8 steps, averaged:
median and range), and collie's tokens/s against its own DDP under the same scheduler.
  compare_slow_link.py OUT ROUNDS RATE WAY...  (without ddp, no "÷ its DDP")
SCHEDULERS (ring): collie's schedulers, one row per way and scheduler, each against the same
PyTorch runs; for a scheduler that delegates (auto), what it ran (summary.json's
schedulers_ran). PYTORCH=0: collie ran
alone, the PyTorch columns are left out. EVERY and MICRO_BATCH: what the script ran with,
for the labels."""

import json
import os
import statistics
import sys

from compare_ddp import peer_result

EVERY = os.environ.get("EVERY", "8")
WAYS = {
    "ddp": "float32 all-reduce every step (DDP)",
    "fp16": "fp16 (fp16_compress_hook)",
    "powersgd": "PowerSGD rank 4 from step 8 (powerSGD_hook)",
    "localsgd": f"local SGD every {EVERY} after {EVERY} (PostLocalSGDOptimizer)",
}


def collie(out, way, scheduler, rnd):
    with open(f"{out}/collie-{way}-{scheduler}-{rnd}/summary.json") as f:
        return json.load(f)[0]




def tail(summary):
    """collie's job mean loss of each of the last 8 steps (summary.json's loss_curve), averaged."""
    curve = summary["loss_curve"][-8:]
    return sum(curve) / len(curve)


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main():
    out, rounds, rate, ways = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    pytorch = os.environ.get("PYTORCH", "1") != "0"
    micro_batch = os.environ.get("MICRO_BATCH", "8")
    schedulers = os.environ.get("SCHEDULERS", "ring").split()
    where = ("4 ranks on one host, no lab" if rate == "none"
             else f"2 lab hosts x 2 ranks at {rate}")
    print(f"{where}, micro-batch {micro_batch} per rank, {rounds} "
          "round(s); tokens/s: the mean of all steps but the first, slowest rank; medians "
          "(min-max over the rounds)")
    print()
    columns = ["way", "collie's scheduler", "collie tokens/s"]
    if pytorch:
        columns += ["PyTorch tokens/s", "collie / PyTorch"]
    columns += ["collie ÷ its DDP", "collie loss, last 8 steps"]
    if pytorch:
        columns += ["PyTorch loss, last 8 steps"]
    columns += ["collie sent MB/step"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    runs = {(way, s): [collie(out, way, s, r) for r in range(1, rounds + 1)]
            for way in ways for s in schedulers}
    for way, scheduler in runs:
        mine = runs[(way, scheduler)]
        ours = [m["tokens_per_s"] for m in mine]
        base = ([m["tokens_per_s"] for m in runs[("ddp", scheduler)]] if "ddp" in ways
                else None)
        row = [WAYS[way], scheduler, spread(ours, "{:,.0f}")]
        if pytorch:
            peers = [peer_result(f"{out}/pytorch-{way}-{r}-h0.log") for r in range(1, rounds + 1)]
            theirs = [p["tokens_per_s"] for p in peers]
            row += [spread(theirs, "{:,.0f}"),
                    spread([a / b for a, b in zip(ours, theirs)], "{:.2f}")]
        row += [spread([a / b for a, b in zip(ours, base)], "{:.2f}") if base else "-",
                spread([tail(m) for m in mine], "{:.3f}")]
        if pytorch:
            row += [spread([p["job_tail_loss"] for p in peers], "{:.3f}")]
        row += [spread([m["sent_bytes_per_step"] / 1e6 for m in mine], "{:.2f}")]
        print("| " + " | ".join(row) + " |")
    print()
    for (way, scheduler), mine in runs.items():
        # What a delegating scheduler (auto) chose, as the summary says it, once per wording.
        for chose in dict.fromkeys(m["schedulers_ran"] for m in mine if m["schedulers_ran"]):
            print(f"collie {way}: {chose}")
    if "ddp" in ways:
        # How far the runs went: the job's loss at the end against its first step's.
        for scheduler in schedulers:
            ddp = runs[("ddp", scheduler)]
            print(f"collie DDP's ({scheduler}) loss, last 8 steps ÷ first step: " +
                  spread([tail(m) / m["loss_curve"][0] for m in ddp], "{:.2f}"))
            for way in ways:
                if way != "ddp":
                    print(f"collie {way}'s ({scheduler}) loss, last 8 steps ÷ its DDP's "
                          "(same round): " + spread([tail(m) / tail(d) for m, d in
                                                     zip(runs[(way, scheduler)], ddp)], "{:.3f}"))
    if pytorch:
        print(f"PyTorch {peers[0]['torch']} ({peers[0]['parameters']:,} parameters), "
              f"BLAS {peers[0]['blas']}")


if __name__ == "__main__":
    main()
