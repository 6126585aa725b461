#!/usr/bin/env python3
"""Joins collie's results.csv files with the peers' rows and prints, per rank count and
size, the best busbw of each group and the ratios collie / peer (> 1: collie is faster).

    compare_peers.py OUT PEERS_CSV
"""
import csv
import glob
import os
import sys
from collections import defaultdict


def main(out, peers_csv):
    # best[(ranks, bytes)][group] = (busbw, label)
    best = defaultdict(dict)

    def offer(ranks, size, group, busbw, label):
        current = best[(ranks, size)].get(group)
        if current is None or busbw > current[0]:
            best[(ranks, size)][group] = (busbw, label)

    for path in glob.glob(os.path.join(out, "collie-*/results.csv")):
        backend = "gloo" if "collie-gloo" in path else "ucx"
        with open(path) as f:
            for row in csv.DictReader(f):
                if int(row["wrong"]) != 0:
                    sys.exit(f"{path}: {row['scheduler']} at {row['bytes']} B computed wrong results")
                if backend == "gloo" and row["scheduler"] == "native":
                    group = "gloo native via collie"
                else:
                    group = f"collie/{backend}"
                offer(int(row["ranks"]), int(row["bytes"]), group, float(row["busbw_gbps"]),
                      row["scheduler"])
    with open(peers_csv) as f:
        for row in csv.DictReader(f):
            group = "Gloo direct" if row["peer"] == "gloo" else f"MPI {row['algorithm']}"
            offer(int(row["ranks"]), int(row["bytes"]), group, float(row["busbw_gbps"]),
                  row["algorithm"])

    groups = ["collie/gloo", "gloo native via collie", "Gloo direct", "collie/ucx",
              "MPI vader", "MPI tcp"]
    ratios = [("collie/gloo", "Gloo direct"), ("collie/ucx", "MPI vader"),
              ("collie/gloo", "MPI tcp")]
    for ranks in sorted({k[0] for k in best}):
        print(f"\n## {ranks} ranks: best busbw (GB/s) per size, the winning algorithm in brackets")
        header = ["size"] + groups + [f"{a} / {b}" for a, b in ratios]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for size in sorted(s for r, s in best if r == ranks):
            cells = best[(ranks, size)]
            row = [human(size)]
            for g in groups:
                row.append(f"{cells[g][0]:.3f} ({cells[g][1]})" if g in cells else "-")
            for a, b in ratios:
                row.append(f"{cells[a][0] / cells[b][0]:.2f}" if a in cells and b in cells and cells[b][0] > 0 else "-")
            print("| " + " | ".join(row) + " |")


def human(size):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if size < 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} TiB"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
