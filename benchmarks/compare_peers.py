#!/usr/bin/env python3
"""Joins collie's results.csv files with the peers' rows and prints, per rank count and
size, the best busbw of each group and the ratios collie / peer (> 1: collie is faster).
With several rounds (one folder each, as allreduce_peers.sh --rounds writes them) every
figure is the median over the rounds and each ratio carries its min-max over them.

    compare_peers.py ROUND_DIR [ROUND_DIR ...]

A round folder holds peers.csv and collie-*/results.csv (and baseline-*/results.csv when
an older collie ran as a peer).
"""
import csv
import glob
import os
import statistics
import sys
from collections import Counter, defaultdict


def best_of_round(folder):
    """best[(ranks, bytes)][group] = (busbw, label) for one round."""
    best = defaultdict(dict)

    def offer(ranks, size, group, busbw, label):
        current = best[(ranks, size)].get(group)
        if current is None or busbw > current[0]:
            best[(ranks, size)][group] = (busbw, label)

    for name in ("collie", "baseline"):
        for path in glob.glob(os.path.join(folder, f"{name}-*/results.csv")):
            backend = "gloo" if f"{name}-gloo" in path else "ucx"
            with open(path) as f:
                for row in csv.DictReader(f):
                    if int(row["wrong"]) != 0:
                        sys.exit(f"{path}: {row['scheduler']} at {row['bytes']} B computed wrong results")
                    if backend == "gloo" and row["scheduler"] == "native":
                        if name != "collie":
                            continue  # the baseline's native is Gloo's algorithm again
                        group = "gloo native via collie"
                    else:
                        group = f"{name}/{backend}"
                    offer(int(row["ranks"]), int(row["bytes"]), group, float(row["busbw_gbps"]),
                          row["scheduler"])
    with open(os.path.join(folder, "peers.csv")) as f:
        for row in csv.DictReader(f):
            group = "Gloo direct" if row["peer"] == "gloo" else f"MPI {row['algorithm']}"
            offer(int(row["ranks"]), int(row["bytes"]), group, float(row["busbw_gbps"]),
                  row["algorithm"])
    return best


def main(folders):
    rounds = [best_of_round(f) for f in folders]
    keys = sorted(set().union(*[set(r) for r in rounds]))
    has_baseline = any("baseline/gloo" in cells for r in rounds for cells in r.values())
    groups = ["collie/gloo", "gloo native via collie", "Gloo direct", "collie/ucx",
              "MPI vader", "MPI tcp"]
    ratios = [("collie/gloo", "Gloo direct"), ("collie/ucx", "MPI vader"),
              ("collie/gloo", "MPI tcp")]
    if has_baseline:
        groups += ["baseline/gloo", "baseline/ucx"]
        ratios += [("collie/gloo", "baseline/gloo"), ("collie/ucx", "baseline/ucx")]
    spread = len(rounds) > 1
    print(f"# {len(rounds)} round(s)" +
          ("; busbw: median over rounds; ratio: median (min-max over rounds)" if spread else ""))
    for ranks in sorted({k[0] for k in keys}):
        print(f"\n## {ranks} ranks: best busbw (GB/s) per size, the winning algorithm in brackets")
        header = ["size"] + groups + [f"{a} / {b}" for a, b in ratios]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for size in sorted(s for r, s in keys if r == ranks):
            per_round = [r.get((ranks, size), {}) for r in rounds]
            row = [human(size)]
            for g in groups:
                seen = [c[g] for c in per_round if g in c]
                if not seen:
                    row.append("-")
                    continue
                label = Counter(label for _, label in seen).most_common(1)[0][0]
                row.append(f"{statistics.median(b for b, _ in seen):.3f} ({label})")
            for a, b in ratios:
                values = [c[a][0] / c[b][0] for c in per_round
                          if a in c and b in c and c[b][0] > 0]
                if not values:
                    row.append("-")
                elif spread:
                    row.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
                else:
                    row.append(f"{values[0]:.2f}")
            print("| " + " | ".join(row) + " |")


def human(size):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if size < 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} TiB"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
