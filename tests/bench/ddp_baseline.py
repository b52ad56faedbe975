#!/usr/bin/python3
"""PyTorch DDP baseline for the throughput comparisons (docs/benchmarks.md).

The same model, global batch, micro-batch and threads as the autoaccum run;
DistributedDataParallel over gloo with no_sync() on all but the last micro-batch.

- `--model mlp` (default): MLP 784-512-512-10, SGD with momentum, random data in memory.
- `--model gpt --data text-train.h5`: the example GPT of jobs/models/gpt.py, eager (the class
  itself, not its TorchScript file), AdamW, each rank's rows of the first global batch of the
  text file read into memory; cross-entropy summed over tokens and divided by the global batch's
  token count, as autoaccum computes it.

- `--documents text-docs-train.h5 --hf FOLDER`: the same loop with a transformers causal language
  model (eager, from_pretrained; input ids and the collator's attention mask), for
  `tests/bench/run.sh --only hf`.

- `--model gpt --documents text-docs-train.h5 --micro-batch K`: the GPT on document data
  (tokens + offsets) as a Hugging Face-style loop does it: batch s is documents [sB, (s+1)B) in
  file order, each rank takes an equal half of them, and every K consecutive documents form a
  micro-batch padded to its own longest (DataCollatorWithPadding), targets -100 on padding;
  the loss is summed over tokens and divided by the batch's counted tokens. Prints
  "tokens/s <real tokens per second over the steps after warm-up> padding <fraction>".

    tests/bench/ddp_baseline.py --ranks 2 --global-batch 1024 --micro-batch 64 --steps 60
Prints "samples/s <median over steps after warm-up>". With `--rank R` the process is rank R of
`--ranks` started elsewhere (srun on several nodes, MASTER_ADDR set); rank 0 prints.
"""
import argparse
import contextlib
import os
import statistics
import time

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def join_group(rank, args):
    """This process's gloo group, threads and seed."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    # PyTorch >= 2.4 asks for a libuv TCP store by default; Debian 13's torch is built without it.
    os.environ.setdefault("USE_LIBUV", "0")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)


def documents_worker(rank, args, results):
    """--documents: real tokens per second of DDP with per-micro-batch padding in file order."""
    join_group(rank, args)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "jobs", "models"))
    import gpt
    import h5py
    with h5py.File(args.documents, "r") as f:
        tokens = torch.from_numpy(f["tokens"][:].astype("int64"))
        offsets = f["offsets"][:].tolist()
    docs = [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    if args.hf:
        # The eager transformers model, called as a Hugging Face loop calls it: input ids and
        # the collator's attention mask.
        import transformers
        transformers.logging.set_verbosity_error()
        model = transformers.AutoModelForCausalLM.from_pretrained(args.hf, local_files_only=True)
        model.config.use_cache = False
        forward = lambda x, mask: ddp(input_ids=x, attention_mask=mask, return_dict=False)[0]
    else:
        model = gpt.GPT(256, args.context, args.width, args.layers, args.heads, 0.1)
        forward = lambda x, mask: ddp(x)
    # Constant bool buffers (causal masks) cannot go through gloo: DDP leaves them alone.
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [n for n, b in model.named_buffers() if not b.is_floating_point()])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=0.003, weight_decay=0.01)
    per_rank = args.global_batch // args.ranks
    times, real, padded, mine_real = [], [], [], 0
    for step in range(args.steps):
        batch = docs[step * args.global_batch:(step + 1) * args.global_batch]
        mine = batch[rank * per_rank:(rank + 1) * per_rank]
        counted = sum(len(d) - 1 for d in batch)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        groups = [mine[i:i + args.micro_batch] for i in range(0, len(mine), args.micro_batch)]
        step_padded = 0
        for k, group in enumerate(groups):
            width = max(len(d) for d in group)
            x = torch.zeros(len(group), width, dtype=torch.int64)
            y = torch.full((len(group), width), -100, dtype=torch.int64)
            mask = torch.zeros(len(group), width, dtype=torch.int64)
            for j, d in enumerate(group):
                x[j, :len(d)] = d
                y[j, :len(d) - 1] = d[1:]
                mask[j, :len(d)] = 1
            step_padded += len(group) * width
            with ddp.no_sync() if k + 1 < len(groups) else contextlib.nullcontext():
                out = forward(x, mask)
                loss = torch.nn.functional.cross_entropy(
                    out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum") / counted
                loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        real.append(sum(len(d) for d in batch))
        padded.append(step_padded)
        mine_real += sum(len(d) for d in mine)
    totals = torch.tensor([float(mine_real), float(sum(padded))])
    dist.all_reduce(totals)
    if rank == 0:
        skip = args.steps // 4
        rate = sum(real[skip:]) / sum(times[skip:])
        results.put((rate, 1.0 - float(totals[0]) / float(totals[1]) if args.steps else 0.0))
    dist.destroy_process_group()


def worker(rank, args, results):
    join_group(rank, args)
    per_rank = args.global_batch // args.ranks
    if args.model == "gpt":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "jobs", "models"))
        import gpt  # the example model's own class
        import h5py
        with h5py.File(args.data, "r") as f:
            rows = slice(rank * per_rank, (rank + 1) * per_rank)
            x = torch.from_numpy(f["x"][rows].astype("int64"))
            y = torch.from_numpy(f["y"][rows].astype("int64"))
        model = gpt.GPT(256, x.shape[1], args.width, args.layers, args.heads, 0.1)
        denominator = args.global_batch * x.shape[1]  # every token counts
    else:
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))
        x = torch.rand(per_rank, 784)
        y = torch.randint(0, 10, (per_rank,))
        denominator = args.global_batch
    if args.model == "gpt":
        # The causal mask is a constant bool buffer, which gloo cannot broadcast: DDP leaves it
        # alone (every rank builds the same one).
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, ["mask"])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if args.model == "gpt":
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=0.003, weight_decay=0.01)
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
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
                # --precision bf16: forward and loss under autocast, backward outside it.
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    out = ddp(xb)
                    loss = torch.nn.functional.cross_entropy(
                        out.reshape(-1, out.shape[-1]), yb.reshape(-1),
                        reduction="sum") / denominator
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
    parser.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: torch.autocast around forward and loss, as autoaccum's")
    parser.add_argument("--data", help="--model gpt: the text file (x, y [N, T])")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--documents", help="--model gpt on document data (tokens + offsets)")
    parser.add_argument("--context", type=int, default=256, help="--documents: the GPT's context")
    parser.add_argument("--hf", metavar="FOLDER",
                        help="--documents: a transformers causal LM folder instead of the GPT "
                             "(eager, input ids and attention mask; needs transformers)")
    parser.add_argument("--rank", type=int,
                        help="run this one rank in this process, of --ranks started elsewhere "
                             "(srun on several nodes; MASTER_ADDR names rank 0's host)")
    args = parser.parse_args()
    if args.rank is not None:
        class Printer:
            @staticmethod
            def put(value):
                print(f"samples/s {value:.0f}", flush=True)
        worker(args.rank, args, Printer())
        return
    results = mp.get_context("spawn").SimpleQueue()
    if args.documents:
        mp.start_processes(documents_worker, args=(args, results), nprocs=args.ranks,
                           start_method="spawn")
        rate, padding = results.get()
        print(f"tokens/s {rate:.0f} padding {padding:.4f}")
        return
    mp.start_processes(worker, args=(args, results), nprocs=args.ranks, start_method="spawn")
    print(f"samples/s {results.get():.0f}")


if __name__ == "__main__":
    main()
