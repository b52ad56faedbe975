#!/usr/bin/python3
"""Plots loss, micro-batch size and throughput against step for one or several run logs.

    jobs/plot-run.py RUN.h5 [RUN2.h5 ...] -o run.png

Uses h5py and matplotlib from Debian's packages (python3-h5py, python3-matplotlib).
"""
import argparse
import os
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="autoaccum run logs (HDF5)")
    parser.add_argument("-o", "--output", default="run.png", help="PNG file to write")
    args = parser.parse_args()

    figure, (loss_axis, micro_axis, rate_axis) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for path in args.logs:
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") not in ("autoaccum.runlog", b"autoaccum.runlog"):
                    sys.exit(f"plot-run: '{path}' is not an autoaccum run log")
                step = f["steps/step"][:]
                loss = f["steps/loss"][:]
                micro = f["steps/micro_batch"][:]
                rate = f["steps/samples_per_second"][:]
                oom_steps = f["oom/step"][:]
        except OSError as error:
            sys.exit(f"plot-run: cannot read '{path}': {error}")
        label = os.path.basename(path)
        loss_axis.plot(step, loss, label=label)
        micro_axis.step(step, micro, where="post", label=label)
        for s in sorted(set(oom_steps.tolist())):
            micro_axis.axvline(s, color="red", alpha=0.2)
        rate_axis.plot(step, rate, label=label)
    loss_axis.set_ylabel("loss")
    micro_axis.set_ylabel("micro-batch (per rank)")
    micro_axis.set_yscale("log", base=2)
    rate_axis.set_ylabel("samples / s")
    rate_axis.set_xlabel("optimizer step")
    loss_axis.legend()
    loss_axis.set_title("autoaccum run" + ("s" if len(args.logs) > 1 else "") + " (red: OOM retries)")
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
