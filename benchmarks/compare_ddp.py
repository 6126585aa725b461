"""The table of benchmarks/ddp_peers.sh: per rank count, the median tokens/s over the rounds
of collie (ring and native gloo all-reduce) and of PyTorch DDP, and the ratios.
  compare_ddp.py OUT "1 2" ROUNDS"""

import json
import statistics
import sys


def collie(out, scheduler, ranks, rnd):
    with open(f"{out}/collie-{scheduler}-{ranks}-{rnd}/summary.json") as f:
        return json.load(f)[0]


def peer_result(path):
    """The JSON line benchmarks/ddp_gpt.py prints (rank 0), from a torchrun log."""
    with open(path) as f:
        for line in f:
            if '"peer": "pytorch-' in line:
                return json.loads(line[line.index("{"):])
    raise SystemExit(f"no result in {path} (see its torchrun log)")


def pytorch(out, ranks, rnd):
    return peer_result(f"{out}/pytorch-{ranks}-{rnd}.log")


def main():
    out, ranks_list, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
    print(f"median tokens/s over {rounds} round(s), each the mean of all steps but the first, "
          "slowest rank")
    print()
    print("| ranks | collie ring | collie native | PyTorch DDP | collie ring / DDP | "
          "collie native / DDP |")
    print("|---|---|---|---|---|---|")
    peer = None
    for ranks in ranks_list:
        def median(values):
            return statistics.median(values)
        ring = median([collie(out, "ring", ranks, r)["tokens_per_s"] for r in range(1, rounds + 1)])
        native = median([collie(out, "native", ranks, r)["tokens_per_s"]
                         for r in range(1, rounds + 1)])
        peers = [pytorch(out, ranks, r) for r in range(1, rounds + 1)]
        ddp = median([p["tokens_per_s"] for p in peers])
        peer = peers[0]
        print(f"| {ranks} | {ring:,.0f} | {native:,.0f} | {ddp:,.0f} | {ring / ddp:.2f} | "
              f"{native / ddp:.2f} |")
    c = collie(out, "ring", ranks_list[-1], 1)
    print()
    print(f"parameters: collie {c['parameters']:,}, PyTorch {peer['parameters']:,}; "
          f"PyTorch {peer['torch']}, BLAS mapped: {', '.join(peer['blas'])}")


if __name__ == "__main__":
    main()
