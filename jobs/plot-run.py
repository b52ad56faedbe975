#!/usr/bin/python3
"""Plots loss (training and evaluation), micro-batch size and throughput against step for one or
several run logs; the micro-batch sizes that ran out of memory are marked where they failed.
When ranks ran different micro-batches (--micro-batch-scope rank) each rank gets its own line,
and when their parts of the global batch differ a fourth panel shows each rank's rows.

    jobs/plot-run.py RUN.h5 [RUN2.h5 ...] -o run.png

Uses h5py and matplotlib from Debian's packages (python3-h5py, python3-matplotlib). Exits 1 with
one line, writing nothing, when a file is not a run log or no log has a step yet.
"""
import argparse
import os
import sys

import numpy as np

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def group(f, name, columns):
    """The group's columns cut to the rows every one of them has (logs written before schema 2
    could end a killed flush with columns of unequal length)."""
    values = [f[f"{name}/{c}"][:] if f"{name}/{c}" in f else [] for c in columns]
    rows = min(len(v) for v in values)
    return [v[:rows] for v in values]


def read(path):
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") not in ("autoaccum.runlog", b"autoaccum.runlog"):
                sys.exit(f"plot-run: '{path}' is not an autoaccum run log")
            steps = group(f, "steps", ("step", "loss", "micro_batch", "samples_per_second"))
            ooms = group(f, "oom", ("step", "micro_batch"))
            evals = group(f, "eval", ("step", "loss"))
            sizes = group(f, "rank_sizes", ("step", "rank", "micro_batch", "rows"))
            # Document data (schema 6): real and padded tokens per step; None otherwise.
            tokens = None
            if f.attrs.get("micro_batch_unit") in ("tokens", b"tokens"):
                tokens = group(f, "steps", ("tokens", "padded_tokens", "step_seconds"))
    except OSError as error:
        sys.exit(f"plot-run: cannot read '{path}': {error}")
    return steps, ooms, evals, per_rank(steps[0], sizes), tokens


def per_rank(steps, sizes):
    """{rank: (micro-batch at every step, rows at every step)} from the rank_sizes changes (schema
    3); empty for older logs."""
    size_step, size_rank, size_micro, size_rows = sizes
    out = {}
    for r in sorted(set(int(r) for r in size_rank)):
        mine = size_rank == r
        at = np.searchsorted(size_step[mine], steps, side="right") - 1
        valid = at >= 0
        micro = np.where(valid, size_micro[mine][np.maximum(at, 0)], np.nan)
        rows = np.where(valid, size_rows[mine][np.maximum(at, 0)], np.nan)
        out[r] = (micro, rows)
    return out


def varies(ranks, index):
    """Whether the ranks' values (index 0: micro-batch, 1: rows) differ anywhere."""
    columns = [v[index] for v in ranks.values()]
    return len(columns) > 1 and any(not np.array_equal(columns[0], c, equal_nan=True)
                                    for c in columns[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="autoaccum run logs (HDF5)")
    parser.add_argument("-o", "--output", default="run.png", help="PNG file to write")
    args = parser.parse_args()

    runs = [(path, *read(path)) for path in args.logs]
    if not any(len(steps[0]) for _, steps, _, _, _, _ in runs):
        sys.exit("plot-run: no step in " + ", ".join(f"'{p}'" for p in args.logs) +
                 " yet: nothing to plot")

    show_rows = any(varies(ranks, 1) for *_, ranks, _ in runs)
    documents = any(tokens is not None for *_, tokens in runs)
    figure, axes = plt.subplots(4 if show_rows else 3, 1, figsize=(9, 12 if show_rows else 9),
                                sharex=True)
    loss_axis, micro_axis, rate_axis = axes[:3]
    styles = ["-", "--", ":", "-."]
    padding_axis = rate_axis.twinx() if documents else None
    for index, (path, (step, loss, micro, rate), (oom_step, oom_micro), (eval_step, eval_loss),
                ranks, tokens) in enumerate(runs):
        color = f"C{index % 10}"
        label = os.path.basename(path)
        loss_axis.plot(step, loss, color=color, label=f"{label} (train)")
        if len(eval_step):
            loss_axis.plot(eval_step, eval_loss, "o--", color=color, label=f"{label} (eval)")
        if varies(ranks, 0):
            for r, (rank_micro, _) in ranks.items():
                micro_axis.step(step, rank_micro, where="post", color=color,
                                linestyle=styles[r % len(styles)], label=f"{label} rank {r}")
        else:
            micro_axis.step(step, micro, where="post", color=color, label=label)
        if show_rows:
            for r, (_, rank_rows) in ranks.items():
                axes[3].step(step, rank_rows, where="post", color=color,
                             linestyle=styles[r % len(styles)], label=f"{label} rank {r}")
        # Each size that ran out of memory, at the step where it did.
        micro_axis.scatter(oom_step, oom_micro, marker="x", color="red", zorder=3,
                           label="ran out of memory" if index == 0 and len(oom_step) else None)
        if tokens is not None:
            real, padded, seconds = tokens
            n = len(real)
            rate_axis.plot(step[:n], real / np.maximum(seconds, 1e-9), color=color, label=label)
            padding_axis.plot(step[:n], 100 * (1 - real / np.maximum(padded, 1)), ":",
                              color=color, label=f"{label} padding")
        else:
            rate_axis.plot(step, rate, color=color, label=label)
    loss_axis.set_ylabel("loss")
    micro_axis.set_ylabel("token budget (per rank)" if documents else "micro-batch (per rank)")
    micro_axis.set_yscale("log", base=2)
    rate_axis.set_ylabel("tokens / s" if documents else "samples / s")
    if padding_axis is not None:
        padding_axis.set_ylabel("padding % (dotted)")
    rate_axis.set_xlabel("optimizer step")
    if show_rows:
        axes[3].set_ylabel("rows of the global batch")
        axes[3].set_xlabel("optimizer step")
        axes[3].legend()
    loss_axis.legend()
    micro_axis.legend()
    loss_axis.set_title("autoaccum run" + ("s" if len(args.logs) > 1 else "") +
                        " (red x: a micro-batch that ran out of memory)")
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
