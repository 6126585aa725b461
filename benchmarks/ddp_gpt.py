"""The PyTorch DDP peer of collie's trainer (benchmarks/ddp_peers.sh): the same GPT as
models/gpt (pre-norm blocks, causal attention written with matmuls, GELU MLP, tied head,
GPT-2 initialisation), AdamW with the same hyperparameters and clipping, trained by
torch.nn.parallel.DistributedDataParallel over Gloo under torchrun. Prints one JSON line
with the measured throughput and every rank's peak RSS (rank 0). With --zero the optimizer
is torch.distributed.optim.ZeroRedundancyOptimizer over AdamW (ZeRO stage 1, the peer of
collie's train.sharding: optimizer; benchmarks/zero_peers.sh).

Run it the way Debian's torchrun works:
  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 --redirects 2 --tee 1 \
      benchmarks/ddp_gpt.py --steps 30

With --hook fp16 or powersgd, DDP compresses its buckets with its communication hooks
(fp16_compress_hook; powerSGD_hook with --powersgd-rank and --powersgd-start), and with
--local-sgd-every H it is post-local SGD (PostLocalSGDOptimizer over AdamW, averaging the
parameters every H steps after --local-sgd-warmup synchronous steps; between averages each
rank steps alone, its DDP hook all-reducing within a subgroup of itself): the peers of
collie's train.compression and train.sync (benchmarks/slow_link_peers.sh). --data reads
windows of a flat uint16 token file, as collie's data.source: tokens does.

Started without torchrun (no WORLD_SIZE), it is one process in plain eager PyTorch: the peer
of a one-rank collie run. With --device cuda --bf16 --checkpointing it is the GPU peer of
scripts/gpu-check.sh (bf16 autocast, each block's activations recomputed in backward).
"""

import argparse
import json
import math
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class Attention(nn.Module):
    def __init__(self, d, heads, seq_len):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        # A plain attribute, not a buffer: DDP would broadcast a buffer, and Gloo has no bool.
        self.future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.future[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, heads, seq_len, mlp_ratio):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, seq_len)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, mlp_ratio * d)
        self.fc_out = nn.Linear(mlp_ratio * d, d)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc_out(F.gelu(self.fc(self.ln2(h))))


class Gpt(nn.Module):
    def __init__(self, layers, d, heads, seq_len, vocab, mlp_ratio):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq_len, mlp_ratio) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        residual_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if "ln" in name:
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith("proj.weight") or name.endswith("fc_out.weight"):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    checkpointing = False

    def forward(self, idx):  # (B, T) -> (B, T, V)
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            if self.checkpointing and x.requires_grad:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def blas_in_use():
    """Every BLAS library mapped into this process (the first one wins symbol lookup)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in path and path not in found:
                found.append(path)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--mlp-ratio", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=25)
    parser.add_argument("--zero", action="store_true",
                        help="ZeroRedundancyOptimizer (optimizer state sharded over the ranks)")
    parser.add_argument("--bucket-view", action="store_true",
                        help="DDP's gradient_as_bucket_view (no second copy of the gradients)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the local rank's GPU)")
    parser.add_argument("--bf16", action="store_true", help="forward under bf16 autocast")
    parser.add_argument("--checkpointing", action="store_true",
                        help="recompute each block's activations in backward")
    parser.add_argument("--data", default="",
                        help="a flat uint16 token file to read windows of (default: uniform "
                             "random tokens)")
    parser.add_argument("--first-bucket-mb", type=float, default=None,
                        help="DDP's first bucket (PyTorch's default: 1 MB, whatever "
                             "--bucket-mb says); equal to --bucket-mb: buckets as collie's")
    parser.add_argument("--seed", type=int, default=1234,
                        help="the model's initial weights and each rank's sampling "
                             "(seed * 1000 + rank: runs of consecutive seeds share no rank's "
                             "windows)")
    parser.add_argument("--hook", default="none", choices=["none", "fp16", "powersgd"],
                        help="DDP's communication hook")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start", type=int, default=2,
                        help="PowerSGDState's start_powerSGD_iter")
    parser.add_argument("--local-sgd-every", type=int, default=0,
                        help="post-local SGD: average the parameters every H steps (0: off)")
    parser.add_argument("--local-sgd-warmup", type=int, default=0,
                        help="post-local SGD: synchronous steps first")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    distributed = "WORLD_SIZE" in os.environ
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)
    model = Gpt(args.layers, args.d_model, args.heads, args.seq_len, args.vocab, args.mlp_ratio)
    model.checkpointing = args.checkpointing
    model.to(device)
    for block in model.blocks:
        block.attn.future = block.attn.future.to(device)
    if distributed and args.hook == "powersgd" and args.first_bucket_mb != args.bucket_mb:
        # DDP's first bucket is 1 MB whatever bucket_cap_mb says; with two buckets
        # powerSGD_hook's future chains issue their all-reduces from Gloo's callback threads
        # in an order that differs from rank to rank, and Gloo aborts on a message of the
        # wrong size.
        raise SystemExit("--hook powersgd over Gloo needs one bucket: give --first-bucket-mb "
                         "equal to --bucket-mb")
    if args.first_bucket_mb is not None:
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.first_bucket_mb * 1024 * 1024)
    ddp = (nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb,
                                               gradient_as_bucket_view=args.bucket_view)
           if distributed else model)
    averager = None
    if distributed and args.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif distributed and args.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=args.powersgd_rank,
                                       start_powerSGD_iter=args.powersgd_start)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    if distributed and args.local_sgd_every > 0:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        # Every rank alone between averages: a subgroup of itself. Every rank makes every
        # group (new_group is collective); a CPU run must name its subgroup, since the
        # default one is made per CUDA device.
        alone = [dist.new_group([r]) for r in range(world)][rank]
        ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=alone,
                                                 start_localSGD_iter=args.local_sgd_warmup),
                               post_localSGD_hook)
        averager = PeriodicModelAverager(period=args.local_sgd_every,
                                         warmup_steps=args.local_sgd_warmup)
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                            lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3, betas=(0.9, 0.95),
                                      weight_decay=0.1)
    if averager is not None:
        from torch.distributed.optim import PostLocalSGDOptimizer
        optimizer = PostLocalSGDOptimizer(optim=optimizer, averager=averager)
    # seed + rank would give round k's rank 1 the windows of round k + 1's rank 0: rounds
    # of consecutive seeds would share most of their batches, and their losses would vary
    # less than independent runs do.
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    corpus = None
    if args.data:
        import numpy
        corpus = torch.from_numpy(numpy.fromfile(args.data, dtype=numpy.uint16).astype("int64"))
        if corpus.numel() <= args.seq_len + 1 or int(corpus.max()) >= args.vocab:
            raise SystemExit(f"{args.data}: expected more than {args.seq_len + 1} token ids, "
                             f"each below --vocab {args.vocab}")

    times, losses = [], []
    for step in range(args.steps):
        if corpus is None:
            tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1),
                                   generator=generator)
        else:  # windows at random offsets, as collie's data.source: tokens
            starts = torch.randint(0, corpus.numel() - args.seq_len - 1, (args.micro_batch,),
                                   generator=generator)
            tokens = torch.stack([corpus[s:s + args.seq_len + 1] for s in starts.tolist()])
        tokens = tokens.to(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = ddp(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(),
                                   tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())  # waits for the step's kernels on a GPU
        times.append(time.perf_counter() - start)

    timed = times[1:] if len(times) > 1 else times
    step_s = torch.tensor([sum(timed) / len(timed)], device=device)
    last_loss = torch.tensor([losses[-1]], dtype=torch.float64, device=device)
    # The last 8 steps' losses (fewer in a shorter run), the job's mean of each: a final
    # loss less at the mercy of one step's batch.
    tail_loss = torch.tensor(losses[-8:], dtype=torch.float64, device=device)
    rss = torch.zeros(world, dtype=torch.float64, device=device)  # ru_maxrss: KiB on Linux
    rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    if distributed:
        dist.all_reduce(step_s, op=dist.ReduceOp.MAX)  # the slowest rank, as collie reports
        dist.all_reduce(rss)
        dist.all_reduce(last_loss)  # the job's mean, as collie's progress line
        last_loss /= world
        dist.all_reduce(tail_loss)
        tail_loss /= world
    if rank == 0:
        world_tokens = world * args.micro_batch * args.seq_len
        peer = "pytorch-zero" if args.zero else "pytorch-ddp" if distributed else "pytorch-eager"
        print(json.dumps({
            "peer": peer,
            "device": str(device),
            "bf16": args.bf16,
            "checkpointing": args.checkpointing,
            "torch": torch.__version__,
            "blas": blas_in_use(),
            "ranks": world,
            "parameters": sum(p.numel() for p in model.parameters()),
            "step_s": step_s.item(),
            "tokens_per_s": world_tokens / step_s.item(),
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "job_last_loss": last_loss.item(),
            "job_tail_loss": tail_loss.mean().item(),  # over the last 8 steps
            "hook": args.hook,
            "local_sgd_every": args.local_sgd_every,
            "peak_rss_bytes": rss.tolist(),
        }), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
