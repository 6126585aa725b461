#!/usr/bin/env python3
"""A run of collie's powersgd codec recomputed with NumPy alone, from its inputs.

The file (written by codec_test's PowerSgd test) holds the bucket's parameter shapes, the
codec's rank and min_compression_rate, each rank's share, the first Q, and per rank and step
the gradient it handed in, the sum it got back and the error feedback it kept. This script
recomputes every step in float64 with its own reading of PowerSGD (Vogels et al. 2019):

    M_k = G_k + E_k                 each rank's part, with what it owed
    P   = sum_k M_k Q               (n, r)
    B   = an orthonormal basis of P's columns (NumPy's QR, not Gram-Schmidt)
    Q'  = sum_k M_kᵀ B              (m, r), the next step's Q (warm start)
    sum = B Q'ᵀ;  E_k = M_k - share_k sum

for every matrix of at least min_compression_rate x r (n + m) elements, and the plain sum
for the other tensors. B Bᵀ is the same for any orthonormal basis of P's columns, so the
sum does not depend on the orthogonalisation's signs. Exit 0 when collie's sums and errors
are the reference's to float32's tolerance; 1 naming the first that is not.

    powersgd_reference.py RUN.json
"""
import json
import sys

import numpy as np


def layout(shapes, rank, rate):
    """Per tensor: (start, size, (n, m, r) when compressed, else None)."""
    out, at = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        matrix = None
        if len(shape) >= 2:
            n = shape[0]
            m = size // n
            r = min(rank, n, m)
            if r >= 1 and n * m >= rate * r * (n + m):
                matrix = (n, m, r)
        out.append((at, size, matrix))
        at += size
    return out, at


def close(what, got, expected):
    got = np.asarray(got, dtype=np.float64)
    scale = float(np.abs(expected).max()) or 1.0
    worst = float(np.abs(got - expected).max()) if expected.size else 0.0
    if worst > 2e-4 * scale:
        raise SystemExit(f"powersgd: {what} differs from the NumPy reference by {worst:.3g} "
                         f"(largest value {scale:.3g})")
    return worst / scale


def main(path):
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    shares = run["shares"]
    ranks, steps = len(shares), len(run["sent"][0])
    tensors, total = layout(run["shapes"], run["rank"], run["min_compression_rate"])
    matrices = [t for t in tensors if t[2] is not None]
    q0 = np.asarray(run["q0"], dtype=np.float64)
    qs, at = [], 0
    for _, _, (n, m, r) in matrices:
        qs.append(q0[at:at + m * r].reshape(m, r))
        at += m * r
    errors = [[np.zeros((n, m)) for _, _, (n, m, _) in matrices] for _ in range(ranks)]
    delivered = np.zeros(total)
    worst = 0.0
    for s in range(steps):
        sent = [np.asarray(run["sent"][k][s], dtype=np.float64) for k in range(ranks)]
        expected = np.zeros(total)
        j = 0
        for start, size, matrix in tensors:
            part = slice(start, start + size)
            if matrix is None:
                expected[part] = sum(g[part] for g in sent)
                continue
            n, m, _ = matrix
            parts = [sent[k][part].reshape(n, m) + errors[k][j] for k in range(ranks)]
            basis, _ = np.linalg.qr(sum(mk @ qs[j] for mk in parts))
            qs[j] = sum(mk.T @ basis for mk in parts)
            approx = basis @ qs[j].T
            expected[part] = approx.ravel()
            for k in range(ranks):
                errors[k][j] = parts[k] - shares[k] * approx
            j += 1
        delivered += expected
        for k in range(ranks):
            worst = max(worst, close(f"rank {k}'s sum at step {s}", run["result"][k][s], expected))
            owed = np.concatenate([e.ravel() for e in errors[k]])
            worst = max(worst, close(f"rank {k}'s error feedback after step {s}",
                                     run["error"][k][s], owed))
    # Error feedback loses nothing: what the sums delivered plus what the ranks still owe is
    # what they computed (on the compressed matrices; the rest is summed exactly).
    computed = sum(np.asarray(run["sent"][k][s], dtype=np.float64)
                   for k in range(ranks) for s in range(steps))
    owed = sum(np.concatenate([e.ravel() for e in errors[k]]) for k in range(ranks))
    j = 0
    for start, size, matrix in tensors:
        if matrix is None:
            continue
        part = slice(start, start + size)
        gap = np.abs(delivered[part] + owed[j:j + size] - computed[part]).max()
        if gap > 1e-9 * (np.abs(computed[part]).max() or 1.0):
            raise SystemExit(f"powersgd: the reference itself loses {gap:.3g} of a matrix")
        j += size
    print(f"powersgd: {steps} steps of {ranks} ranks match the NumPy reference "
          f"(largest difference {worst:.2g} of the largest value)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
