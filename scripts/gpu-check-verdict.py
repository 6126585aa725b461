"""Verdicts for scripts/gpu-check.sh, from collie's summary.json files (and the PyTorch peer's
JSON line, and GPU memory samples). Each command prints one line, PASS or FAIL and what was
compared, then indented detail lines, and exits 0 on PASS, 1 on FAIL.

  throughput COLLIE_SUMMARY PEER_LOG
      the one-rank nccl training against PyTorch eager: tokens/s side by side; passes when
      collie's run moved device memory and its loss fell.
  devices SUMMARY --expect KIND [--loss-rtol R] [--weight-atol A]
      a run of the same training on the CPU (the first run of the file, the reference) and on
      the GPU (every run with a cuda device): passes when each GPU run reduced through KIND
      ("host-staged", "device memory"), its ranks agree, its first and last loss match the
      CPU run's (relative 1e-4 and R) and its sampled weights do too (max |dw| <= A).
  zero-memory NONE_SUMMARY NONE_SAMPLES THREE_SUMMARY THREE_SAMPLES --ranks N
      train.sharding none against parameters (ZeRO stage 3) on one GPU: the GPU memory the
      ranks took at their peak (nvidia-smi samples in MiB, the first line the idle baseline)
      set against the state formula; see zero_memory below.
"""

import argparse
import json
import math
import sys

MB = 1e6
MIB = 1 << 20


def load_runs(path):
    with open(path) as f:
        return json.load(f)


def verdict(ok, line, details):
    print(("PASS " if ok else "FAIL ") + line)
    for d in details:
        print("    " + d)
    return 0 if ok else 1


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def last_json_line(path):
    """The last line of a log that is a JSON object (the peer prints one; warnings may follow)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    if not lines:
        raise ValueError(f"{path}: no JSON line")
    return json.loads(lines[-1])


def throughput(args):
    collie = load_runs(args.collie)[0]
    peer = last_json_line(args.peer)
    problems = []
    if collie["comm_memory"] != "device memory":
        problems.append(f"collie's gradients went through {collie['comm_memory']}, not device memory")
    if not (math.isfinite(collie["last_loss"]) and collie["last_loss"] < collie["first_loss"]):
        problems.append(f"collie's loss did not fall: {collie['first_loss']:.4f} -> {collie['last_loss']:.4f}")
    ratio = collie["tokens_per_s"] / peer["tokens_per_s"]
    line = (f"{collie['parameters'] / 1e6:.1f}M GPT on {collie['device']}, nccl {collie['scheduler']}, "
            f"bf16 + activation checkpointing: collie {collie['tokens_per_s']:,.0f} tokens/s "
            f"({collie['comm_memory']}), PyTorch eager {peer['tokens_per_s']:,.0f} tokens/s: "
            f"collie/eager {ratio:.2f}x")
    details = [f"{collie['world_batch_tokens']:,} tokens per step, {collie['timed_steps']} timed steps "
               f"(collie) / {args.steps} steps, the first untimed (PyTorch {peer.get('torch', '?')})",
               f"{'':22}{'tokens/s':>12}{'step (s)':>10}   loss first -> last"]
    for name, r in (("collie", collie), ("PyTorch eager", peer)):
        details.append(f"{name:22}{r['tokens_per_s']:>12,.0f}{r['step_s']:>10.3f}   "
                       f"{r['first_loss']:.4f} -> {r['last_loss']:.4f}")
    details += problems
    return verdict(not problems, line + ("" if not problems else "; " + "; ".join(problems)), details)


def devices(args):
    runs = load_runs(args.summary)
    ref = runs[0]
    gpu_runs = [r for r in runs if str(r.get("device", "")).startswith("cuda")]
    if ref.get("device") != "cpu" or not gpu_runs:
        return verdict(False, f"{args.summary}: expected a cpu run first and cuda runs after it, found "
                       + ", ".join(f"{r['run']} on {r.get('device')}" for r in runs), [])
    problems, details = [], []
    worst_loss, worst_dw = 0.0, 0.0
    for r in gpu_runs:
        name = f"[{r['run']}]"
        first, last = rel(r["first_loss"], ref["first_loss"]), rel(r["last_loss"], ref["last_loss"])
        spread = r.get("weights_vs") or {}
        dw = spread.get("max_abs_diff", float("nan"))
        worst_loss, worst_dw = max(worst_loss, last), max(worst_dw, dw)
        details.append(f"{name} {r['backend']} {r['scheduler']} sharding {r.get('sharding', 'none')} on "
                       f"{r['device']}, {r['comm_memory']}: loss {r['first_loss']:.6f} -> {r['last_loss']:.6f} "
                       f"(CPU {ref['first_loss']:.6f} -> {ref['last_loss']:.6f}), max |dw| {dw:.2e} "
                       f"over {spread.get('sampled', 0)} sampled weights")
        if r["comm_memory"] != args.expect:
            problems.append(f"{name} reduced through {r['comm_memory']}, expected {args.expect}")
        if not r["sync"]["identical"]:
            problems.append(f"{name} ranks ended with different weights (max spread {r['sync']['max_spread']})")
        if not first <= 1e-4:
            problems.append(f"{name} first loss differs from the CPU run's by {first:.2e} (relative; limit 1e-4)")
        if not last <= args.loss_rtol:
            problems.append(f"{name} last loss differs from the CPU run's by {last:.2e} "
                            f"(relative; limit {args.loss_rtol:g})")
        if spread.get("run") != ref["run"] or not dw <= args.weight_atol:
            problems.append(f"{name} weights differ from the CPU run's: max |dw| {dw:.2e} "
                            f"(limit {args.weight_atol:g}, against run '{spread.get('run')}')")
    ok = not problems
    names = ", ".join("[" + r["run"] + "]" for r in gpu_runs)
    line = (f"{ref['ranks']} ranks, {len(gpu_runs)} GPU run(s) ({names}) "
            f"{'end where' if ok else 'do not end where'} the CPU run ends after {ref['steps']} steps: "
            f"last loss within {worst_loss:.1e} relative (limit {args.loss_rtol:g}), weights max |dw| "
            f"{worst_dw:.1e} (limit {args.weight_atol:g}); reduced through {args.expect}")
    return verdict(ok, line + ("" if ok else "; " + "; ".join(problems)), details + problems)


def peak_mib(path):
    with open(path) as f:
        values = [int(v) for v in f.read().split() if v.strip().isdigit()]
    if len(values) < 2:
        raise ValueError(f"{path}: {len(values)} nvidia-smi sample(s), need the baseline and one more")
    return max(values[1:]) - values[0], len(values) - 1


def state_bytes(run):
    return run["parameter_bytes"] + run["gradient_bytes"] + run["optimizer_bytes"]


def zero_memory(args):
    """Per rank, in bytes. The state the formula gives (fp32 parameters 4 B, gradients 4 B and
    AdamW's two moments 8 B per parameter, divided by N under stage 3, plus the gathered units
    the summary reports) must be what the summaries print, and the measured peaks must follow
    it: the run without sharding measures the memory that is not state (CUDA context,
    activations, buckets, the allocator's cache); stage 3's peak may exceed its state plus
    that by 64 MiB and 10% of the unsharded state at most, and must lie at least half the
    formula's saving below the unsharded peak."""
    none, three = load_runs(args.none_summary)[0], load_runs(args.three_summary)[0]
    n, p = args.ranks, none["parameters"]
    problems = []
    for r, want in ((none, 16 * p), (three, 16 * p / n)):
        if rel(state_bytes(r), want) > 0.01:
            problems.append(f"sharding {r['sharding']}: the summary's state {state_bytes(r) / MB:.1f} MB per rank "
                            f"is not 16 B x {p:,} / {n if r is three else 1} = {want / MB:.1f} MB")
    gathered = three["gathered_peak_bytes"]
    # The buffers the buckets borrow from the pool hold the gathered units and the full
    # gradients in flight, kept between steps: the larger of the two figures (buckets that
    # take memory of their own are left to the slack below).
    borrowed = max(gathered, three.get("pooled_bytes", 0))
    formula3 = 16 * p / n + borrowed
    try:
        (peak_none, samples_none), (peak_three, samples_three) = (
            peak_mib(args.none_samples), peak_mib(args.three_samples))
    except ValueError as e:
        return verdict(False, f"no GPU memory readings: {e}", problems)
    m_none, m_three = peak_none * MIB / n, peak_three * MIB / n
    overhead = m_none - state_bytes(none)
    predicted = formula3 + overhead
    saving, saving_formula = m_none - m_three, state_bytes(none) - formula3
    slack = 64 * MIB + 0.1 * state_bytes(none)
    if m_three > predicted + slack:
        problems.append(f"stage 3's peak {m_three / MB:,.0f} MB per rank is above the {predicted / MB:,.0f} MB "
                        f"predicted by more than {slack / MB:,.0f} MB (64 MiB + 10% of the unsharded state)")
    if saving < 0.5 * saving_formula:
        problems.append(f"stage 3 saved {saving / MB:,.0f} MB per rank, under half the formula's "
                        f"{saving_formula / MB:,.0f} MB")
    ok = not problems
    line = (f"ZeRO-3 over {three['backend']}, {n} ranks on one GPU, {p / 1e6:.1f}M parameters: peak GPU memory "
            f"{m_three / MB:,.0f} MB per rank against {predicted / MB:,.0f} MB predicted: state 16 B x P / {n} = "
            f"{16 * p / n / MB:,.0f} MB, + gathered units and full gradients {borrowed / MB:,.1f} MB, + {overhead / MB:,.0f} MB that is "
            f"not state (the sharding: none run's peak {m_none / MB:,.0f} MB less its {state_bytes(none) / MB:,.0f} MB "
            f"state); saved {saving / MB:,.0f} MB per rank against none, formula {saving_formula / MB:,.0f} MB")
    details = [f"nvidia-smi memory.used, the busiest sample less the idle one, divided by the {n} ranks: "
               f"none {peak_none} MiB in all ({samples_none} samples), parameters {peak_three} MiB "
               f"({samples_three} samples)",
               f"summary state per rank: none {state_bytes(none) / MB:.1f} MB, parameters {state_bytes(three) / MB:.1f} MB "
               f"+ gathered {gathered / MB:.1f} MB; loss none {none['last_loss']:.6f}, parameters "
               f"{three['last_loss']:.6f}"]
    if rel(three["last_loss"], none["last_loss"]) > 1e-3:
        problems.append(f"the two runs end at different losses ({none['last_loss']:.6f}, {three['last_loss']:.6f})")
        ok = False
    return verdict(ok, line + ("" if ok else "; " + "; ".join(problems)), details + problems)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("collie")
    t.add_argument("peer")
    t.add_argument("--steps", type=int, default=0)
    d = sub.add_parser("devices")
    d.add_argument("summary")
    d.add_argument("--expect", required=True)
    d.add_argument("--loss-rtol", type=float, default=1e-3)
    d.add_argument("--weight-atol", type=float, default=5e-3)
    z = sub.add_parser("zero-memory")
    z.add_argument("none_summary")
    z.add_argument("none_samples")
    z.add_argument("three_summary")
    z.add_argument("three_samples")
    z.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    command = {"throughput": throughput, "devices": devices, "zero-memory": zero_memory}[args.command]
    try:
        return command(args)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        return verdict(False, f"{args.command}: could not read the results: {type(e).__name__}: {e}", [])


if __name__ == "__main__":
    sys.exit(main())
