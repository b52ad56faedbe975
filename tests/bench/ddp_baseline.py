#!/usr/bin/python3
"""PyTorch DDP baseline for the throughput comparison (docs/benchmarks.md).

The same model (MLP 784-512-512-10), global batch, micro-batch and threads as the autoaccum run;
DistributedDataParallel over gloo with no_sync() on all but the last micro-batch, SGD with
momentum. Data is random and already in memory (the baseline reads no files).

    tests/bench/ddp_baseline.py --ranks 2 --global-batch 1024 --micro-batch 64 --steps 60
Prints "samples/s <median over steps after warm-up>".
"""
import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args, results):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    per_rank = args.global_batch // args.ranks
    x = torch.rand(per_rank, 784)
    y = torch.randint(0, 10, (per_rank,))
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        micro = [(x[i:i + args.micro_batch], y[i:i + args.micro_batch])
                 for i in range(0, per_rank, args.micro_batch)]
        for k, (xb, yb) in enumerate(micro):
            # no_sync() must cover the forward as well: DDP arms its all-reduce hooks in forward,
            # so a forward outside it all-reduces that micro-batch's gradients in backward.
            with ddp.no_sync() if k + 1 < len(micro) else contextlib.nullcontext():
                loss = torch.nn.functional.cross_entropy(ddp(xb), yb, reduction="sum") / args.global_batch
                loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        steady = times[args.steps // 4:]
        results.put(args.global_batch / statistics.median(steady))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--port", type=int, default=29581)
    args = parser.parse_args()
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(worker, args=(args, results), nprocs=args.ranks, start_method="spawn")
    print(f"samples/s {results.get():.0f}")


if __name__ == "__main__":
    main()
