#!/usr/bin/python3
"""The performance benchmarks of docs/benchmarks.md (issue 8), run side by side on one machine.

Every figure is a ratio of two things measured in the same run, interleaved, repeated; the
report gives the median and the spread (min-max) over repetitions. Called by tests/bench/run.sh,
which builds the binaries first; this script writes build/bench/results.json and replaces the
generated part of docs/benchmarks.md (between the bench:begin/end markers).

    tests/bench/bench.py [--reps 5] [--quick] [--no-docs]
"""
import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "build", "autoaccum")
BENCH = os.path.join(ROOT, "build", "tests", "bench")
MPI = ["mpirun", "--oversubscribe", "-np", "2"]
RANKS = 2
GLOBAL_BATCH = 1024
PER_RANK = GLOBAL_BATCH // RANKS
# MLP 784-512-512-10: forward 2*sum(in*out); backward the same for the weight gradients and again
# for the input gradients of every layer but the first (the data needs no gradient).
LAYERS = [(784, 512), (512, 512), (512, 10)]
FLOP_PER_SAMPLE = 3 * 2 * sum(i * o for i, o in LAYERS) - 2 * LAYERS[0][0] * LAYERS[0][1]


def log(*args):
    print(*args, flush=True)


def run(cmd, check=True, **kwargs):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if check and r.returncode != 0:
        sys.exit(f"bench: failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    return r


def spread(values):
    values = [v for v in values if v is not None]
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def fmt(s, digits=2, scale=1.0, suffix=""):
    return (f"{s['median'] * scale:.{digits}f}{suffix} "
            f"({s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f})")


class Runner:
    def __init__(self, work, steps):
        self.work = work
        self.steps = steps
        self.data = os.path.join(work, "synth784.h5")
        self.count = 0

    def train(self, micro_batch, steps=None, limit=None, extra=(), data=None, check=True,
              global_batch=GLOBAL_BATCH, env=None):
        """One autoaccum run; returns the run log's steps group as arrays (None if it failed)."""
        self.count += 1
        path = os.path.join(self.work, f"run{self.count}.h5")
        cmd = MPI + [BIN, "train", "--data", data or self.data, "--global-batch", global_batch,
                     "--micro-batch", micro_batch, "--steps", steps or self.steps, "--threads", 1,
                     "--log-every", 0, "--run-log", path, *extra]
        if limit:
            cmd += ["--memory-limit", limit]
        r = run(cmd, check=check, env={**os.environ, **(env or {})})
        if r.returncode != 0:
            return None
        with h5py.File(path, "r") as f:
            out = {k: f["steps"][k][:] for k in f["steps"]}
            out["oom_rows"] = len(f["oom/step"])
            out["final_micro_batch"] = int(f.attrs["final_micro_batch"])
            out["gemm_speedup"] = float(f.attrs.get("lower_precision_gemm_speedup", 0))
        os.remove(path)
        return out

    @staticmethod
    def steady(steps, skip=3):
        """Median samples/s over steps after warm-up and without OOM retries."""
        keep = (np.arange(len(steps["step"])) >= skip) & (steps["oom_retries"] == 0)
        return float(np.median(steps["samples_per_second"][keep]))


def ddp(micro_batch, steps, port, global_batch=GLOBAL_BATCH, extra=()):
    r = run(["/usr/bin/python3", os.path.join(ROOT, "tests", "bench", "ddp_baseline.py"),
             "--ranks", RANKS, "--global-batch", global_batch, "--micro-batch", micro_batch,
             "--steps", steps, "--threads", 1, "--port", port, *extra])
    return float(re.search(r"samples/s (\S+)", r.stdout).group(1))


def sgemm():
    r = run(MPI + [os.path.join(BENCH, "bench_sgemm"), 0.4])
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_throughput(runner, reps, results):
    """Targets 1 and 2: autoaccum vs DDP at micro-batch 8/64/512; MFU against sgemm."""
    log("== throughput: autoaccum vs PyTorch DDP (gloo, no_sync), and MFU against sgemm")
    sizes = [8, 64, 512]
    raw = {m: {"autoaccum": [], "ddp": [], "ratio": [], "mfu": [], "unfused": [], "fused_gain": []}
           for m in sizes}
    peaks = []
    for rep in range(reps):
        gemm = sgemm()
        peaks.append(gemm["peak"])
        for m in sizes:
            a = runner.steady(runner.train(m))
            d = ddp(m, runner.steps, 29600 + rep * 10 + sizes.index(m))
            u = runner.steady(runner.train(m, env={"AUTOACCUM_FUSED_LINEAR": "0"}))
            raw[m]["unfused"].append(u)
            raw[m]["fused_gain"].append(a / u)
            per_rank_flops = a / RANKS * FLOP_PER_SAMPLE
            raw[m]["autoaccum"].append(a)
            raw[m]["ddp"].append(d)
            raw[m]["ratio"].append(a / d)
            raw[m]["mfu"].append(per_rank_flops / (gemm["peak"] * 1e9))
            log(f"  rep {rep + 1}/{reps} m={m}: autoaccum {a:.0f}/s (plain nn::Linear {u:.0f}/s), "
                f"DDP {d:.0f}/s, "
                f"ratio {a / d:.2f}, MFU {per_rank_flops / (gemm['peak'] * 1e9):.2f} "
                f"(sgemm peak {gemm['peak']:.1f} GFLOP/s per rank)")
    results["throughput"] = {str(m): {k: spread(v) for k, v in raw[m].items() if v} for m in sizes}
    results["sgemm_peak_gflops"] = spread(peaks)
    results["sgemm_last"] = gemm


def bench_memory(runner, results):
    """Target 6: peak bytes against the micro-batch; live bytes over 1000 steps."""
    log("== memory: peak bytes against the micro-batch")
    peaks = {}
    for m in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]:
        steps = runner.train(m, steps=4 if m < 4 else 6)
        peaks[m] = int(steps["peak_bytes"].max())
        log(f"  m={m}: peak {peaks[m] / 2**20:.2f} MiB")
    results["peak_bytes"] = {str(m): v for m, v in peaks.items()}
    log("== memory: live bytes over 1000 steps (m=64)")
    steps = runner.train(64, steps=1000)
    live = steps["live_bytes"]
    results["live_1000"] = {"first": int(live[0]), "min": int(live[1:].min()),
                            "max": int(live[1:].max()), "last": int(live[-1]),
                            "steps": int(len(live)),
                            "peak_first": int(steps["peak_bytes"][0]),
                            "peak_last": int(steps["peak_bytes"][-1])}
    log(f"  live bytes: step 0 {live[0]}, steps 1-999 min {live[1:].min()} max {live[1:].max()}")
    return peaks


def limit_between(peaks, m):
    """A memory limit under which m fits and 2m does not."""
    return (peaks[m] + peaks[2 * m]) // 2


def bench_auto(runner, peaks, reps, results):
    """Target 3: --micro-batch auto under a limit against the best fixed micro-batch under it.

    Every candidate runs once per repetition, interleaved with the automatic run; the best fixed
    size is the one with the highest median over the repetitions (taking the best single run of
    several would favour whichever got lucky)."""
    log("== automatic against hand-tuned (limit between the peaks of 64 and 128)")
    limit = limit_between(peaks, 64)
    candidates = [32, 48, 64, 80, 96, 112, 128]
    steps = max(runner.steps, 40)
    autos, finals, fixed, refines, refine_finals = [], [], {}, [], []
    fits = {}
    for rep in range(reps):
        auto = runner.train("auto", limit=limit, steps=steps)
        autos.append(runner.steady(auto))
        finals.append(auto["final_micro_batch"])
        refined = runner.train("auto", limit=limit, steps=steps,
                               extra=["--micro-batch-search", "refine"])
        refines.append(runner.steady(refined, skip=8))
        refine_finals.append(refined["final_micro_batch"])
        for m in candidates:
            if fits.get(m) is False:
                continue
            run_ = runner.train(m, limit=limit, check=False, steps=steps)
            fits[m] = run_ is not None
            if run_ is not None:
                fixed.setdefault(m, []).append(runner.steady(run_))
        log(f"  rep {rep + 1}/{reps}: auto settled at {finals[-1]}: {autos[-1]:.0f}/s; refine at "
            f"{refine_finals[-1]}: {refines[-1]:.0f}/s; fixed: "
            + ", ".join(f"{m}: {v[-1]:.0f}" for m, v in fixed.items()))
    best = max(fixed, key=lambda m: statistics.median(fixed[m]))
    same = finals[-1]
    results["auto"] = {"limit": int(limit), "final": int(same),
                       "fits": {str(m): v for m, v in fits.items()},
                       "auto": spread(autos), "best_m": best,
                       "best_fixed": spread(fixed[best]),
                       "ratio": {"median": statistics.median(autos) /
                                 statistics.median(fixed[best]),
                                 "min": min(autos) / max(fixed[best]),
                                 "max": max(autos) / min(fixed[best]), "n": reps},
                       "same_m": spread(fixed[same]) if same in fixed else None,
                       "ratio_same_m": (statistics.median(autos) / statistics.median(fixed[same])
                                        if same in fixed else None),
                       "fixed": {str(m): spread(v) for m, v in fixed.items()},
                       "refine": spread(refines), "refine_finals": refine_finals,
                       "refine_ratio": {"median": statistics.median(refines) /
                                        statistics.median(fixed[best]),
                                        "min": min(refines) / max(fixed[best]),
                                        "max": max(refines) / min(fixed[best])}}
    log(f"  best fixed (by median) {best}: auto/best {results['auto']['ratio']['median']:.3f}, "
        f"refine/best {results['auto']['refine_ratio']['median']:.3f}")

    log("== cost of the search against log2(per-rank batch / final micro-batch)")
    search = {}
    for final in [256, 64, 16, 4]:
        costs, retries = [], []
        for rep in range(max(2, reps // 2)):
            # The halving search's cost (predict, the default, starts where the memory model
            # says and rarely retries: docs/benchmarks.md, "Predicting what fits").
            steps = runner.train("auto", steps=12, limit=limit_between(peaks, final),
                                 extra=["--micro-batch-search", "halve"])
            searched = steps["oom_retries"] > 0
            normal = float(np.median(steps["step_seconds"][~searched][1:]))
            costs.append(float(steps["retry_seconds"].sum()))
            retries.append(int(steps["oom_retries"].sum()))
            got = steps["final_micro_batch"]
        search[str(final)] = {"log2": int(np.log2(PER_RANK / final)), "retries": retries,
                              "final": got, "seconds": spread(costs),
                              "step_seconds": normal}
        log(f"  -> {final}: final {got}, retries {retries}, extra seconds "
            f"{statistics.median(costs):.3f} (a normal step {normal:.3f} s)")
    results["search"] = search


# The example GPT of jobs/models/gpt.py at the sizes jobs/lm.sh trains (byte-level, context 64,
# width 64, 2 layers, 4 heads, tied head), on Debian's fortunes imported by `autoaccum import
# text`. Global batch 256: 128 rows per rank, so micro-batch 64 accumulates two.
LM = {"context": 64, "width": 64, "layers": 2, "heads": 4}
LM_BATCH = 256
LM_STEPS = 30


def bench_lm(work, reps, results):
    """Issue 14: the GPT on autoaccum against the same eager model in PyTorch DDP at micro-batch
    8 and 64 (target >= 1.2), and auto against the best fixed micro-batch (within 2%)."""
    log("== language model: the example GPT, autoaccum against PyTorch DDP (gloo, no_sync)")
    data = os.path.join(work, "lm", "text-train.h5")
    if not os.path.exists(data):
        run(MPI[:-1] + ["1", BIN, "import", "text", "--out", os.path.dirname(data),
                        "--context", LM["context"]])
    model = os.path.join(work, "lm", "gpt.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", model]
        + [a for k, v in LM.items() for a in (f"--{k}", v)])
    runner = Runner(work, LM_STEPS)
    extra = ["--model-file", model, "--optimizer", "adamw", "--lr", 0.003,
             "--weight-decay", 0.01]
    train = lambda m, **kw: runner.train(m, data=data, global_batch=LM_BATCH, extra=extra
                                         + kw.pop("more", []), **kw)
    sizes = [8, 64]
    raw = {m: {"autoaccum": [], "ddp": [], "ratio": []} for m in sizes}
    for rep in range(reps):
        for m in sizes:
            a = runner.steady(train(m))
            d = ddp(m, LM_STEPS, 29700 + rep * 10 + sizes.index(m), global_batch=LM_BATCH,
                    extra=["--model", "gpt", "--data", data, "--width", LM["width"],
                           "--layers", LM["layers"], "--heads", LM["heads"]])
            raw[m]["autoaccum"].append(a)
            raw[m]["ddp"].append(d)
            raw[m]["ratio"].append(a / d)
            log(f"  rep {rep + 1}/{reps} m={m}: autoaccum {a:.0f}/s, DDP {d:.0f}/s, "
                f"ratio {a / d:.2f}")
    out = {"throughput": {str(m): {k: spread(v) for k, v in raw[m].items()} for m in sizes}}

    log("== language model: automatic against hand-tuned (limit 0.4 of the way from the peak "
        "of 32 to that of 64)")
    peaks = {}
    for m in [16, 32, 64]:
        peaks[m] = int(train(m, steps=4)["peak_bytes"].max())
        log(f"  m={m}: peak {peaks[m] / 2**20:.2f} MiB")
    # Peak memory is linear in the micro-batch, so the midpoint would be the peak of 48 itself,
    # a limit on a knife's edge; 0.4 of the way lets 44 fit and 48 not.
    limit = peaks[32] + (peaks[64] - peaks[32]) * 2 // 5
    candidates = [16, 24, 32, 40, 44, 48, 56]
    autos, finals, refines, refine_finals, fixed, fits = [], [], [], [], {}, {}
    for rep in range(reps):
        auto = train("auto", limit=limit)
        autos.append(runner.steady(auto))
        finals.append(auto["final_micro_batch"])
        refined = train("auto", limit=limit, more=["--micro-batch-search", "refine"])
        refines.append(runner.steady(refined, skip=8))
        refine_finals.append(refined["final_micro_batch"])
        for m in candidates:
            if fits.get(m) is False:
                continue
            got = train(m, limit=limit, check=False)
            fits[m] = got is not None
            if got is not None:
                fixed.setdefault(m, []).append(runner.steady(got))
        log(f"  rep {rep + 1}/{reps}: auto settled at {finals[-1]}: {autos[-1]:.0f}/s; refine at "
            f"{refine_finals[-1]}: {refines[-1]:.0f}/s; fixed: "
            + ", ".join(f"{m}: {v[-1]:.0f}" for m, v in fixed.items()))
    best = max(fixed, key=lambda m: statistics.median(fixed[m]))
    ratio = lambda xs: {"median": statistics.median(xs) / statistics.median(fixed[best]),
                        "min": min(xs) / max(fixed[best]), "max": max(xs) / min(fixed[best])}
    out["auto"] = {"limit": int(limit), "peaks": {str(m): v for m, v in peaks.items()},
                   "finals": finals, "auto": spread(autos), "refine_finals": refine_finals,
                   "refine": spread(refines), "best_m": best, "best_fixed": spread(fixed[best]),
                   "fits": {str(m): v for m, v in fits.items()},
                   "fixed": {str(m): spread(v) for m, v in fixed.items()},
                   "ratio": ratio(autos), "refine_ratio": ratio(refines)}
    log(f"  best fixed (by median) {best}: auto/best {out['auto']['ratio']['median']:.3f}, "
        f"refine/best {out['auto']['refine_ratio']['median']:.3f}")
    out["reps"] = reps
    results["lm"] = out


def render_lm(results):
    lm = results["lm"]
    lines = [f"Generated by `tests/bench/run.sh` on {results['date']} ({results['machine']}); "
             f"{lm['reps']} repetitions, interleaved; medians (min-max). 2 ranks x 1 thread, "
             f"the example GPT of `jobs/models/gpt.py` (context {LM['context']}, width "
             f"{LM['width']}, {LM['layers']} layers, {LM['heads']} heads, tied head) on Debian's "
             f"fortunes, AdamW, global batch {LM_BATCH} ({LM_BATCH // RANKS} rows per rank), "
             f"{LM_STEPS} steps per run (the first 3 and any with OOM retries left out). DDP runs "
             "the same model class eagerly with `no_sync` on the same rows held in memory; "
             "autoaccum runs its TorchScript file and reads each batch from the HDF5 file.", "",
             "| micro-batch | autoaccum samples/s | DDP samples/s | autoaccum / DDP | met (>= 1.2) |",
             "|---|---|---|---|---|"]
    for m, row in lm["throughput"].items():
        ok = "yes" if row["ratio"]["median"] >= 1.2 else "**no**"
        lines.append(f"| {m} | {fmt(row['autoaccum'], 0)} | {fmt(row['ddp'], 0)} | "
                     f"{fmt(row['ratio'])} | {ok} |")
    a = lm["auto"]
    lines += ["", f"Automatic against hand-tuned: memory limit {a['limit'] / 2**20:.2f} MiB per "
              "rank (0.4 of the way from the peak of micro-batch 32 to that of 64; peaks: " + ", ".join(
                  f"{m}: {v / 2**20:.2f} MiB" for m, v in a["peaks"].items()) + "). Fixed "
              "micro-batches under the same limit: " + ", ".join(
                  f"{m} ({'fits' if ok else 'OOM'})" for m, ok in a["fits"].items()) + ".", "",
              "| search | settled at | samples/s | best fixed m | its samples/s | auto / best "
              "(range) | met (>= 0.98) |", "|---|---|---|---|---|---|---|"]
    for name, key, finals in (("predict (default)", "ratio", a["finals"]),
                              ("refine", "refine_ratio", a["refine_finals"])):
        r = a[key]
        value = a["auto"] if key == "ratio" else a["refine"]
        lines.append(f"| {name} | {', '.join(map(str, finals))} | {fmt(value, 0)} | "
                     f"{a['best_m']} | {fmt(a['best_fixed'], 0)} | {r['median']:.3f} "
                     f"({r['min']:.3f}-{r['max']:.3f}) | "
                     f"{'yes' if r['median'] >= 0.98 else '**no**'} |")
    lines += ["", "Every fixed size that fits, medians (min-max): " + "; ".join(
        f"{m}: {fmt(v, 0)}" for m, v in a["fixed"].items()) + "."]
    return "\n".join(lines) + "\n"


DOCS = {"context": 256, "width": 64, "layers": 2, "heads": 4}
DOCS_BATCH, DOCS_STEPS, DOCS_LIMIT = 256, 16, 48 * 2**20


def train_documents(work, data, model, budget, steps=DOCS_STEPS, limit=DOCS_LIMIT, extra=(),
                    batch=DOCS_BATCH):
    """One autoaccum run on document data; the run log's steps (None if it failed)."""
    path = os.path.join(work, f"docs-{time.monotonic_ns()}.h5")
    cmd = MPI + [BIN, "train", "--data", data, "--model-file", model, "--steps", steps,
                 "--threads", 1, "--log-every", 0, "--shuffle", "none", "--optimizer", "adamw",
                 "--lr", 0.003, "--weight-decay", 0.01, "--memory-limit", limit,
                 "--run-log", path, *extra]
    if budget is not None:
        cmd += ["--global-batch", batch, "--micro-batch-tokens", budget]
    r = run(cmd, check=False)
    if r.returncode != 0:
        return None
    with h5py.File(path, "r") as f:
        out = {k: f["steps"][k][:] for k in f["steps"]}
        out["final"] = int(f.attrs["final_micro_batch"])
    os.remove(path)
    return out


def token_rate(steps, skip=3, per_row=None):
    """Real tokens per second over the steps after warm-up without OOM retries (rows of
    `per_row` tokens for window data)."""
    keep = (np.arange(len(steps["step"])) >= skip) & (steps["oom_retries"] == 0)
    if per_row:
        return float(np.median(steps["samples_per_second"][keep])) * per_row
    return float(steps["tokens"][keep].sum() / steps["step_seconds"][keep].sum())


def work_bounds(lengths, batch, per_micro, steps, ranks=RANKS):
    """DDP's plan on the first `steps` batches (each rank's equal share in file order,
    `per_micro` documents per micro-batch padded to their longest) against the documents' own,
    unpadded: its work over theirs, once as tokens x width (what linear layers cost) and once as
    tokens x width^2 (what attention's scores cost), and its micro-batches per step on a rank.
    A cost per micro-batch that mixes the two gives a ratio between them, whatever the mix:
    beyond that only fewer micro-batches help."""
    ddp_linear = ddp_square = own_linear = own_square = pieces = 0
    share = batch // ranks
    for s in range(steps):
        docs = lengths[s * batch:(s + 1) * batch].astype(np.float64)
        own_linear += docs.sum()
        own_square += (docs ** 2).sum()
        for r in range(ranks):
            mine = docs[r * share:(r + 1) * share]
            for i in range(0, len(mine), per_micro):
                group = mine[i:i + per_micro]
                ddp_linear += len(group) * group.max()
                ddp_square += len(group) * group.max() ** 2
                pieces += 1
    return ddp_linear / own_linear, ddp_square / own_square, pieces / (steps * ranks)


TIMED = ["--micro-batch-cost", "auto"]
PIECES = ["--micro-batch-cost", "pieces"]
TAIL = {"context": 1024, "width": 64, "layers": 2, "heads": 4}
TAIL_BATCH, TAIL_STEPS, TAIL_LIMIT = 48, 14, 384 * 2**20


def compute_ratio(steps, skip=3):
    """Rank 0's measured compute over what its time fit predicted, median over the steps after
    warm-up without OOM retries (None without a fit)."""
    keep = ((np.arange(len(steps["step"])) >= skip) & (steps["oom_retries"] == 0)
            & (steps["predicted_compute_seconds"] > 0))
    if not keep.any():
        return None
    return float(np.median(steps["compute_seconds"][keep]
                           / steps["predicted_compute_seconds"][keep]))


def padding_of(steps):
    return 1 - steps["tokens"].sum() / steps["padded_tokens"].sum()


def bench_documents(work, reps, results):
    """Issues 25 and 47: documents of every length. The GPT on Debian's fortunes as documents (up
    to 256 bytes), 2 ranks x 1 thread, one memory limit: autoaccum's automatic token budget, cut
    by predicted time (--micro-batch-cost auto), against DDP with per-micro-batch padding in file
    order at the most documents per micro-batch whose worst case fits the budget autoaccum settled
    on (target >= 2x real tokens/s), its padding (target <= 3%), auto against the best fixed
    budget of a sweep cut the same way (>= 0.98), the fewest-pieces cut (--micro-batch-cost
    pieces, the default), and the same GPT on fixed windows of the longest length (reported).
    Then the heavier-tailed corpus (bench_documents_tail)."""
    log("== documents: token budgets against DDP with per-micro-batch padding")
    folder = os.path.join(work, "docs")
    data = os.path.join(folder, "text-docs-train.h5")
    windows = os.path.join(folder, "text-train.h5")
    if not os.path.exists(data):
        run([BIN, "import", "text", "--out", folder, "--documents", "fortune", "--max-length",
             DOCS["context"]])
        run([BIN, "import", "text", "--out", folder, "--context", DOCS["context"]])
    model = os.path.join(folder, "gpt.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", model]
        + [a for k, v in DOCS.items() for a in (f"--{k}", v)])
    with h5py.File(data, "r") as f:
        lengths = np.diff(f["offsets"][:])
    longest = int(lengths.max())
    raw = {k: [] for k in ("auto", "ddp", "ratio", "padding", "ddp_padding", "windows",
                           "bound_linear", "bound_square", "ddp_pieces",
                           "windows_ratio", "memory", "memory_ratio",
                           "memory_padding", "pieces", "memory_pieces", "fewest",
                           "fewest_ratio", "fewest_padding", "fewest_pieces", "compute_ratio")}
    finals, per_micro, fixed_fits, fixed_rates = [], [], {}, {}
    for rep in range(reps):
        auto = train_documents(work, data, model, "auto", extra=TIMED)
        budget = auto["final"]
        a = token_rate(auto)
        fewest = train_documents(work, data, model, "auto", extra=PIECES)
        f_rate = token_rate(fewest)
        k = max(1, budget // longest)
        r = run(["/usr/bin/python3", os.path.join(ROOT, "tests", "bench", "ddp_baseline.py"),
                 "--ranks", RANKS, "--model", "gpt", "--documents", data, "--global-batch",
                 DOCS_BATCH, "--micro-batch", k, "--steps", DOCS_STEPS, "--threads", 1,
                 "--port", 29800 + rep, "--context", DOCS["context"], "--width", DOCS["width"],
                 "--layers", DOCS["layers"], "--heads", DOCS["heads"]])
        fields = r.stdout.split()
        d, d_padding = float(fields[1]), float(fields[3])
        padding = padding_of(auto)
        bound_linear, bound_square, ddp_pieces = work_bounds(lengths, DOCS_BATCH, k, DOCS_STEPS)
        win = train_documents(work, windows, model, None,
                              extra=["--global-batch", DOCS_BATCH // 2, "--micro-batch", "auto"])
        w = token_rate(win, per_row=DOCS["context"])
        # --token-cost memory: the same automatic budget spent by memory across widths.
        mem = train_documents(work, data, model, "auto", extra=["--token-cost", "memory"] + TIMED)
        m = token_rate(mem)
        # The sweep: fixed budgets around the one auto found, under the same limit, cut the same
        # way. The best is chosen by its median over the repetitions, not per repetition: the
        # largest of a few noisy rates would favour the sweep.
        fixed = {}
        for b in sorted({budget // 2, budget * 3 // 4, budget, budget * 3 // 2, budget * 2}):
            if b < longest or fixed_fits.get(b) is False:
                continue
            got = train_documents(work, data, model, b, extra=TIMED)
            fixed_fits[b] = got is not None
            if got is not None:
                fixed[b] = token_rate(got)
                fixed_rates.setdefault(b, []).append(fixed[b])
        finals.append(budget)
        per_micro.append(k)
        for key, value in (("auto", a), ("ddp", d), ("ratio", a / d), ("padding", padding),
                           ("ddp_padding", d_padding), ("windows", w), ("windows_ratio", a / w),
                           ("memory", m), ("memory_ratio", m / a),
                           ("memory_padding", padding_of(mem)),
                           ("bound_linear", bound_linear), ("bound_square", bound_square),
                           ("ddp_pieces", ddp_pieces),
                           ("pieces", float(auto["accumulation"].mean())),
                           ("memory_pieces", float(mem["accumulation"].mean())),
                           ("fewest", f_rate), ("fewest_ratio", a / f_rate),
                           ("fewest_padding", padding_of(fewest)),
                           ("fewest_pieces", float(fewest["accumulation"].mean())),
                           ("compute_ratio", compute_ratio(auto))):
            raw[key].append(value)
        log(f"  rep {rep + 1}/{reps}: auto settled at {budget} tokens: {a:.0f} tokens/s, "
            f"padding {100 * padding:.1f}% (fewest pieces: {f_rate:.0f} tokens/s, padding "
            f"{100 * padding_of(fewest):.1f}%); DDP at {k} documents per micro-batch: {d:.0f} "
            f"tokens/s (padding {100 * d_padding:.1f}%), ratio {a / d:.2f}; fixed budgets: "
            + ", ".join(f"{b}: {v:.0f}" for b, v in fixed.items())
            + f"; windows of {DOCS['context']}: {w:.0f} tokens/s; --token-cost memory {m:.0f} "
            f"tokens/s (x{m / a:.3f}); compute measured / predicted {compute_ratio(auto):.2f}")
    best = max(fixed_rates, key=lambda b: statistics.median(fixed_rates[b]))
    raw["best"] = fixed_rates[best]
    results["documents"] = {k: spread(v) for k, v in raw.items()}
    results["documents"]["best_ratio"] = {
        "median": statistics.median(raw["auto"]) / statistics.median(fixed_rates[best]),
        "min": min(raw["auto"]) / max(fixed_rates[best]),
        "max": max(raw["auto"]) / min(fixed_rates[best])}
    results["documents"].update({"finals": finals, "per_micro": per_micro, "reps": reps,
                                 "longest": longest, "limit": DOCS_LIMIT, "best_budget": best,
                                 "fits": {str(b): ok for b, ok in sorted(fixed_fits.items())}})
    bench_documents_tail(work, reps, results)


def bench_documents_tail(work, reps, results):
    """Issue 47's second corpus, with a heavier tail than fortunes: the paragraphs of the licenses
    in /usr/share/common-licenses (Debian's base-files, on every Debian system), split at 1024
    bytes, for the GPT at context 1024. Their median is a quarter of the longest (fortunes': 0.43),
    so a rank's share holds many short documents beside a few long ones. The time cut against the
    fewest pieces at the same automatic budget: tokens/s and padding."""
    log("== documents, heavier tail: common-licenses paragraphs up to 1024 bytes")
    folder = os.path.join(work, "docs-licenses")
    data = os.path.join(folder, "text-docs-train.h5")
    if not os.path.exists(data):
        run([BIN, "import", "text", "--out", folder, "--documents", "paragraph", "--max-length",
             TAIL["context"], "/usr/share/common-licenses"])
    model = os.path.join(folder, "gpt.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", model]
        + [a for k, v in TAIL.items() for a in (f"--{k}", v)])
    with h5py.File(data, "r") as f:
        lengths = np.diff(f["offsets"][:])
    raw = {k: [] for k in ("timed", "fewest", "ratio", "timed_padding", "fewest_padding",
                           "timed_pieces", "fewest_pieces", "compute_ratio")}
    finals = []
    for rep in range(reps):
        common = dict(steps=TAIL_STEPS, limit=TAIL_LIMIT, batch=TAIL_BATCH)
        timed = train_documents(work, data, model, "auto", extra=TIMED, **common)
        fewest = train_documents(work, data, model, "auto", extra=PIECES, **common)
        t, f_rate = token_rate(timed), token_rate(fewest)
        finals.append(timed["final"])
        for key, value in (("timed", t), ("fewest", f_rate), ("ratio", t / f_rate),
                           ("timed_padding", padding_of(timed)),
                           ("fewest_padding", padding_of(fewest)),
                           ("timed_pieces", float(timed["accumulation"].mean())),
                           ("fewest_pieces", float(fewest["accumulation"].mean())),
                           ("compute_ratio", compute_ratio(timed))):
            raw[key].append(value)
        log(f"  rep {rep + 1}/{reps}: budget {timed['final']}: by predicted time {t:.0f} tokens/s, "
            f"padding {100 * padding_of(timed):.1f}%; fewest pieces {f_rate:.0f} tokens/s, "
            f"padding {100 * padding_of(fewest):.1f}%")
    results["documents"]["tail"] = {k: spread(v) for k, v in raw.items()}
    results["documents"]["tail"].update({
        "finals": finals, "documents": int(len(lengths)), "longest": int(lengths.max()),
        "p50": float(np.median(lengths)), "p95": float(np.percentile(lengths, 95)),
        "limit": TAIL_LIMIT})


def render_documents(results):
    r = results["documents"]
    met = lambda ok: "yes" if ok else "**no**"
    lines = [f"Generated by `tests/bench/run.sh --only documents` on {results['date']} "
             f"({results['machine']}); {r['reps']} repetitions, medians (min-max). 2 ranks x 1 "
             f"thread, the GPT of `jobs/models/gpt.py` (context {DOCS['context']}, width "
             f"{DOCS['width']}, {DOCS['layers']} layers, {DOCS['heads']} heads) on Debian's "
             f"fortunes as documents (`import text --documents fortune --max-length "
             f"{DOCS['context']}`: longest {r['longest']} bytes), AdamW, global batch "
             f"{DOCS_BATCH} documents, {DOCS_STEPS} steps per run (the first 3 and any with OOM "
             f"retries left out), memory limit {r['limit'] / 2**20:.0f} MiB per rank. autoaccum "
             "runs its automatic token budget with documents cut by predicted time "
             "(`--micro-batch-cost auto`) and settled at "
             f"{', '.join(map(str, r['finals']))} padded tokens per micro-batch. DDP "
             "(gloo, `no_sync`) takes each rank's half of every batch in file order and pads each "
             "micro-batch to its own longest document, as Hugging Face's DataCollatorWithPadding "
             "does, at the most documents per micro-batch whose worst case (that many documents "
             "of the longest length) fits the budget autoaccum settled on: "
             f"{', '.join(map(str, r['per_micro']))}. Rates are real (unpadded) tokens per "
             "second.", "",
             "| comparison | value | target | met |", "|---|---|---|---|",
             f"| autoaccum `--micro-batch-cost pieces` tokens/s | {fmt(r['auto'], 0)} | | |",
             f"| DDP tokens/s | {fmt(r['ddp'], 0)} | | |",
             f"| autoaccum / DDP | {fmt(r['ratio'])} | >= 2 | {met(r['ratio']['median'] >= 2)} |",
             f"| autoaccum padding | {fmt(r['padding'], 1, 100, '%')} | <= 3% | "
             f"{met(r['padding']['median'] <= 0.03)} |",
             f"| DDP padding | {fmt(r['ddp_padding'], 1, 100, '%')} | | |",
             f"| DDP's work over the documents' own, as tokens x width / as tokens x width^2 | "
             f"{fmt(r['bound_linear'])} / {fmt(r['bound_square'])} | reported | |",
             f"| micro-batches per step on rank 0, autoaccum / DDP | {fmt(r['pieces'], 1)} / "
             f"{fmt(r['ddp_pieces'], 0)} | reported | |",
             f"| auto / best fixed budget (both cut by predicted time) | "
             f"{fmt(r['best_ratio'], 3)} | >= 0.98 | {met(r['best_ratio']['median'] >= 0.98)} |",
             f"| rank 0's compute, measured / predicted by its time fit | "
             f"{fmt(r['compute_ratio'])} | reported | |",
             f"| fewest pieces (`--micro-batch-cost pieces`) tokens/s | "
             f"{fmt(r['fewest'], 0)} | | |",
             f"| by predicted time / fewest pieces | {fmt(r['fewest_ratio'], 3)} | reported | |",
             f"| padding / micro-batches per step on rank 0 with the fewest pieces | "
             f"{fmt(r['fewest_padding'], 1, 100, '%')} / {fmt(r['fewest_pieces'], 1)} | reported "
             "| |",
             f"| autoaccum on documents / on windows of {DOCS['context']} | "
             f"{fmt(r['windows_ratio'])} | reported | |",
             f"| `--token-cost memory` tokens/s | {fmt(r['memory'], 0)} | | |",
             f"| `--token-cost memory` / flat (the default) | {fmt(r['memory_ratio'], 3)} | "
             "reported | |",
             f"| micro-batches per step on rank 0, flat / memory | {fmt(r['pieces'], 1)} / "
             f"{fmt(r['memory_pieces'], 1)} | reported | |",
             f"| padding with `--token-cost memory` | {fmt(r['memory_padding'], 1, 100, '%')} | "
             "reported | |", "",
             "Fixed budgets tried under the same limit, cut by predicted time: " + ", ".join(
                 f"{b} ({'fits' if ok else 'OOM'})" for b, ok in r["fits"].items()) +
             f"; the best by its median: {r['best_budget']}, {fmt(r['best'], 0)} tokens/s."]
    t = r.get("tail")
    if t:
        lines += ["", "A heavier tail: the paragraphs of `/usr/share/common-licenses` (Debian's "
                  f"base-files) split at {TAIL['context']} bytes, {t['documents']} documents, "
                  f"median {t['p50']:.0f}, p95 {t['p95']:.0f}, longest {t['longest']} (fortunes' "
                  "median is 0.43 of their longest; these 0.24), the GPT at context "
                  f"{TAIL['context']}, global batch {TAIL_BATCH} documents, {TAIL_STEPS} steps, "
                  f"{t['limit'] / 2**20:.0f} MiB per rank; the automatic budget settled at "
                  f"{', '.join(map(str, t['finals']))} tokens.", "",
                  "| comparison | value |", "|---|---|",
                  f"| by predicted time tokens/s | {fmt(t['timed'], 0)} |",
                  f"| fewest pieces tokens/s | {fmt(t['fewest'], 0)} |",
                  f"| by predicted time / fewest pieces | {fmt(t['ratio'], 3)} |",
                  f"| padding, by predicted time / fewest pieces | "
                  f"{fmt(t['timed_padding'], 1, 100, '%')} / "
                  f"{fmt(t['fewest_padding'], 1, 100, '%')} |",
                  f"| micro-batches per step on rank 0, by predicted time / fewest pieces | "
                  f"{fmt(t['timed_pieces'], 1)} / {fmt(t['fewest_pieces'], 1)} |",
                  f"| rank 0's compute, measured / predicted | {fmt(t['compute_ratio'])} |"]
    return "\n".join(lines) + "\n"


HF = {"width": 256, "layers": 6, "heads": 4, "context": 256}
HF_BATCH, HF_STEPS, HF_LIMIT = 64, 12, 512 * 2**20


def hf_python():
    """The Python with transformers (jobs/models/hf-env.sh installs it)."""
    r = run([os.path.join(ROOT, "jobs", "models", "hf-env.sh")])
    return r.stdout.strip().splitlines()[-1]


def bench_hf(work, reps, results):
    """Issue 45: a GPT-2 architecture from transformers (6 layers x 256, exported by
    jobs/models/hf.py) on fortunes as documents, 2 ranks x 1 thread, one memory limit: autoaccum's
    automatic token budget against what a Hugging Face user runs instead (DDP with no_sync, the
    eager transformers model, DataCollatorWithPadding-style micro-batches in file order at the
    most documents per micro-batch whose worst case fits autoaccum's budget): target >= 1.5x real
    tokens/s; padding of both; export and import times."""
    log("== hf: a transformers GPT-2 through autoaccum against DDP with the eager model")
    python = hf_python()
    hf = os.path.join(ROOT, "jobs", "models", "hf.py")
    folder = os.path.join(work, "hf")
    data = os.path.join(folder, "text-docs-train.h5")
    if not os.path.exists(data):
        run([BIN, "import", "text", "--out", folder, "--documents", "fortune", "--max-length",
             HF["context"]])
    model_dir = os.path.join(folder, "gpt2")
    run([python, hf, "tiny", "--arch", "gpt2", "--out", model_dir, "--vocab", 256,
         "--context", HF["context"], "--width", HF["width"], "--layers", HF["layers"],
         "--heads", HF["heads"], "--dropout", 0.1])
    model = os.path.join(folder, "gpt2.pt")
    started = time.monotonic()
    run([python, hf, "export", "--from", model_dir, "--out", model])
    export_seconds = time.monotonic() - started
    with h5py.File(data, "r") as f:
        lengths = np.diff(f["offsets"][:])
    longest = int(lengths.max())
    raw = {k: [] for k in ("auto", "ddp", "ratio", "padding", "ddp_padding", "pieces",
                           "ddp_pieces", "timed", "timed_ratio", "timed_padding", "timed_pieces")}
    finals, per_micro, import_seconds = [], [], []
    for rep in range(reps):
        ckpt = os.path.join(folder, f"ck{rep}.h5")
        auto = train_documents(work, data, model, "auto", steps=HF_STEPS, limit=HF_LIMIT,
                               extra=["--checkpoint", ckpt] + PIECES, batch=HF_BATCH)
        budget = auto["final"]
        a = token_rate(auto)
        k = max(1, budget // longest)
        r = run([python, os.path.join(ROOT, "tests", "bench", "ddp_baseline.py"),
                 "--ranks", RANKS, "--documents", data, "--hf", model_dir, "--global-batch",
                 HF_BATCH, "--micro-batch", k, "--steps", HF_STEPS, "--threads", 1,
                 "--port", 29900 + rep])
        fields = r.stdout.split()
        d, d_padding = float(fields[1]), float(fields[3])
        padding = 1 - auto["tokens"].sum() / auto["padded_tokens"].sum()
        _, _, ddp_pieces = work_bounds(lengths, HF_BATCH, k, HF_STEPS)
        # The same run with documents cut by predicted time (--micro-batch-cost auto).
        timed = train_documents(work, data, model, "auto", steps=HF_STEPS, limit=HF_LIMIT,
                                extra=["--micro-batch-cost", "auto"], batch=HF_BATCH)
        t = token_rate(timed)
        t_padding = 1 - timed["tokens"].sum() / timed["padded_tokens"].sum()
        started = time.monotonic()
        run([python, hf, "import", "--checkpoint", ckpt, "--model-file", model, "--out",
             os.path.join(folder, f"trained{rep}"), "--autoaccum", BIN])
        import_seconds.append(time.monotonic() - started)
        finals.append(budget)
        per_micro.append(k)
        for key, value in (("auto", a), ("ddp", d), ("ratio", a / d), ("padding", padding),
                           ("ddp_padding", d_padding), ("ddp_pieces", ddp_pieces),
                           ("pieces", float(auto["accumulation"].mean())), ("timed", t),
                           ("timed_ratio", t / d), ("timed_padding", t_padding),
                           ("timed_pieces", float(timed["accumulation"].mean()))):
            raw[key].append(value)
        log(f"  rep {rep + 1}/{reps}: auto settled at {budget} tokens: {a:.0f} tokens/s, "
            f"padding {100 * padding:.1f}%; DDP at {k} documents per micro-batch: {d:.0f} "
            f"tokens/s (padding {100 * d_padding:.1f}%), ratio {a / d:.2f}; cost auto {t:.0f} "
            f"tokens/s, padding {100 * t_padding:.2f}%, ratio {t / d:.2f}; import "
            f"{import_seconds[-1]:.1f} s")
    results["hf"] = {k: spread(v) for k, v in raw.items()}
    results["hf"].update({"finals": finals, "per_micro": per_micro, "reps": reps,
                          "longest": longest, "limit": HF_LIMIT,
                          "export_seconds": export_seconds,
                          "import_seconds": spread(import_seconds),
                          "transformers": run([python, "-c", "import transformers; "
                                               "print(transformers.__version__)"]).stdout.strip(),
                          "parameters": int(sum(np.prod(f[n].shape) for f in [h5py.File(
                              os.path.join(folder, "ck0.h5"), "r")] for n in
                              [f"params/{p}" for p in f.attrs["params_names"]]
                              if "lm_head" not in n))})


def render_hf(results):
    r = results["hf"]
    met = lambda ok: "yes" if ok else "**no**"
    lines = [f"Generated by `tests/bench/run.sh --only hf` on {results['date']} "
             f"({results['machine']}); {r['reps']} repetitions, medians (min-max). 2 ranks x 1 "
             f"thread; transformers {r['transformers']}'s `GPT2LMHeadModel` ({HF['layers']} "
             f"layers x {HF['width']}, {HF['heads']} heads, context {HF['context']}, vocabulary "
             f"256, dropout 0.1, {r['parameters']} parameters, head tied) exported by "
             "`jobs/models/hf.py export`, on Debian's fortunes as documents of bytes (longest "
             f"{r['longest']}), AdamW, global batch {HF_BATCH} documents, {HF_STEPS} steps per "
             "run (the first 3 left out), memory limit "
             f"{r['limit'] / 2**20:.0f} MiB per rank. autoaccum runs the TorchScript file with its "
             f"automatic token budget; it settled at {', '.join(map(str, r['finals']))} padded "
             "tokens per micro-batch. The Hugging Face way: DDP (gloo, `no_sync`) over the eager "
             "transformers model, called with input ids and the attention mask; each rank's half "
             "of every batch in file order, each micro-batch padded to its own longest "
             "document (DataCollatorWithPadding), at the most documents per micro-batch whose "
             "worst case (that many of the longest) fits the budget autoaccum settled on: "
             f"{', '.join(map(str, r['per_micro']))}. Rates are real (unpadded) tokens per "
             "second.", "",
             "| comparison | value | target | met |", "|---|---|---|---|",
             f"| autoaccum `--micro-batch-cost pieces` tokens/s | {fmt(r['auto'], 0)} | | |",
             f"| DDP + eager transformers tokens/s | {fmt(r['ddp'], 0)} | | |",
             f"| autoaccum `--micro-batch-cost pieces` / DDP (the fewest micro-batches) | {fmt(r['ratio'])} | "
             f">= 1.5 | {met(r['ratio']['median'] >= 1.5)} |",
             f"| autoaccum `--micro-batch-cost auto` tokens/s | {fmt(r['timed'], 0)} | | |",
             f"| autoaccum `--micro-batch-cost auto` / DDP | {fmt(r['timed_ratio'])} | >= 1.5 | "
             f"{met(r['timed_ratio']['median'] >= 1.5)} |",
             f"| padding: autoaccum pieces / cost auto / DDP | "
             f"{fmt(r['padding'], 1, 100, '%')} / {fmt(r['timed_padding'], 2, 100, '%')} / "
             f"{fmt(r['ddp_padding'], 1, 100, '%')} | reported | |",
             f"| micro-batches per step on a rank: pieces / cost auto / DDP | "
             f"{fmt(r['pieces'], 1)} / {fmt(r['timed_pieces'], 1)} / "
             f"{fmt(r['ddp_pieces'], 0)} | reported | |",
             f"| `hf.py export` (trace twice, check at other shapes, save) | "
             f"{r['export_seconds']:.1f} s | reported | |",
             f"| `hf.py import` from a checkpoint (autoaccum export, save_pretrained, "
             f"from_pretrained and compare) | {fmt(r['import_seconds'], 1, suffix=' s')} | "
             "reported | |"]
    return "\n".join(lines) + "\n"


# Issue 27: predicting what fits. Each model trains under limits placed at random (seeded)
# between the peaks of two powers of two; per placement: the prediction against the largest
# fixed micro-batch that fits (bisection with fixed runs), out-of-memory events with predict and
# with halve, the time to the first counted step, and predict's samples/s against the fixed run
# at the largest size that fits.
MM_STEPS = 20  # throughput: the median over steps 3-19


def mm_train(work, data, args, micro_batch, global_batch, steps, limit=None, extra=(),
             unit="rows"):
    """One run: the run log's steps, OOM rows and memory_model group (None if it failed).
    `unit` "tokens": document data, `micro_batch` is a token budget."""
    path = os.path.join(work, f"mm-{time.monotonic_ns()}.h5")
    option = "--micro-batch-tokens" if unit == "tokens" else "--micro-batch"
    cmd = MPI + [BIN, "train", "--data", data, *args, "--global-batch", global_batch,
                 option, micro_batch, "--steps", steps, "--threads", 1,
                 "--log-every", 0, "--shuffle", "none", "--run-log", path, *extra]
    if limit:
        cmd += ["--memory-limit", limit]
    r = run(cmd, check=False)
    if r.returncode != 0:
        return None
    with h5py.File(path, "r") as f:
        out = {k: f["steps"][k][:] for k in f["steps"]}
        out["ooms"] = int(f["steps/oom_retries"][:].sum())  # agreed events, not rank rows
        out["peak"] = int(f["ranks/peak_bytes"][:].max())
        out["model"] = {k: f["memory_model"][k][:] for k in f["memory_model"]}
    os.remove(path)
    return out


def bench_memory_model(work, reps, results):
    log("== memory model: predicted micro-batch against the largest that fits")
    rng = np.random.default_rng(27)
    runner_data = synth784(work)
    fashion = os.path.join(work, "fashion-mnist-train.h5")
    if not os.path.exists(fashion):
        run([BIN, "import", "fashion-mnist", "--out", work])
    text = os.path.join(work, "lm", "text-train.h5")
    if not os.path.exists(text):
        run([BIN, "import", "text", "--out", os.path.join(work, "lm"), "--context",
             LM["context"]])
    gpt = os.path.join(work, "mm-gpt.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", gpt]
        + [a for k, v in LM.items() for a in (f"--{k}", v)])
    # torchvision's resnet18 (11.2M parameters, BatchNorm), scripted, on 3x32x32 images.
    import torch
    import torchvision
    torch.manual_seed(0)
    resnet = os.path.join(work, "mm-resnet18.pt")
    torch.jit.script(torchvision.models.resnet18(num_classes=10)).save(resnet)
    images = os.path.join(work, "mm-images.h5")
    draw = np.random.default_rng(5)
    with h5py.File(images, "w") as f:
        f["x"] = draw.standard_normal((2048, 3, 32, 32)).astype(np.float32)
        f["y"] = draw.integers(0, 10, 2048).astype(np.int64)
        f.attrs["num_classes"] = 10
    # The GPT of the documents benchmark on fortunes as documents, cut by a token budget.
    folder = os.path.join(work, "docs")
    docs = os.path.join(folder, "text-docs-train.h5")
    if not os.path.exists(docs):
        run([BIN, "import", "text", "--out", folder, "--documents", "fortune", "--max-length",
             DOCS["context"]])
    dmodel = os.path.join(folder, "mm-gpt-docs.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", dmodel]
        + [a for k, v in DOCS.items() for a in (f"--{k}", v)])
    adamw = ["--optimizer", "adamw", "--lr", "0.003"]
    models = {  # name: data, arguments, global batch, placements, unit, lowest power of two
        "mlp 784-256-10": (runner_data, ["--model", "mlp", "--hidden", "256"], 512, 10, "rows", 1),
        "cnn (Fashion-MNIST)": (fashion, ["--model", "cnn"], 256, 10, "rows", 1),
        "resnet18 (torchvision, scripted, 3x32x32)": (images, ["--model-file", resnet, *adamw],
                                                      128, 10, "rows", 1),
        "GPT rows (context 64)": (text, ["--model-file", gpt, *adamw], 256, 10, "rows", 1),
        # Budgets from the longest document (256 tokens) to a whole share's padded size.
        "GPT documents (fortunes, tokens)": (docs, ["--model-file", dmodel, *adamw], 64, 10,
                                             "tokens", 8),
    }
    out = {}
    for name, (data, args, batch, placements, unit, lowest) in models.items():
        # The largest power of two: the share's rows, or for documents its padded size at the
        # longest width (32 documents x 256 tokens).
        top = int(np.log2(batch // RANKS)) + (lowest if unit == "tokens" else 0)
        # Rows: sizes are the same at every step, 2 steps say what fits. Documents: each step
        # cuts other pieces, so every run is as long as the measured ones.
        probe_steps = 2 if unit == "rows" else MM_STEPS
        peaks = {}
        for k in range(lowest, top + 1):
            got = mm_train(work, data, args, 2 ** k, batch, probe_steps, unit=unit)
            peaks[k] = got["peak"]
        rows = []
        for p in range(placements):
            k = int(rng.integers(lowest, top))  # 2^k fits, 2^(k+1) <= the share does not
            limit = int(peaks[k] + rng.uniform(0.05, 0.95) * (peaks[k + 1] - peaks[k]))
            low, high = 2 ** k, 2 ** (k + 1)
            # Rows: to the row. Tokens: to 1/64 of the size (about 1.5%).
            resolution = 1 if unit == "rows" else max(1, low // 64)
            while high - low > resolution:
                middle = (low + high) // 2
                if mm_train(work, data, args, middle, batch, probe_steps, limit=limit,
                            unit=unit) is not None:
                    low = middle
                else:
                    high = middle
            truth = low
            predict = mm_train(work, data, args, "auto", batch, MM_STEPS, limit=limit, unit=unit)
            halve = mm_train(work, data, args, "auto", batch, MM_STEPS, limit=limit,
                             extra=["--micro-batch-search", "halve"], unit=unit)
            fixed = mm_train(work, data, args, truth, batch, MM_STEPS, limit=limit, unit=unit)
            if predict is None or halve is None or fixed is None:
                log(f"  {name} placement {p + 1}: a run failed (predict {predict is not None}, "
                    f"halve {halve is not None}, fixed {fixed is not None}); skipped")
                continue
            model = predict["model"]
            predicted = int(model["predicted"].min())
            used = int(model["micro_batch"].min())
            probe = float(model["probe_seconds"][0]) if len(model["probe_seconds"]) else 0.0
            first_predict = probe + float(predict["step_seconds"][0])
            first_halve = float(halve["step_seconds"][0])
            row = {"limit": limit, "k": k, "truth": truth, "predicted": predicted, "used": used,
                   "ratio": predicted / truth, "ooms_predict": predict["ooms"],
                   "ooms_halve": halve["ooms"], "halve_final": int(halve["micro_batch"][-1]),
                   "first_predict": first_predict, "first_halve": first_halve,
                   "rate_predict": Runner.steady(predict, skip=3),
                   "rate_fixed": Runner.steady(fixed, skip=3)}
            row["rate_ratio"] = row["rate_predict"] / row["rate_fixed"]
            rows.append(row)
            log(f"  {name} placement {p + 1}/{placements}: limit {limit / 2**20:.2f} MiB, fits "
                f"{truth}, predicted {predicted} ({row['ratio']:.3f}), used {used}; OOMs predict "
                f"{row['ooms_predict']}, halve {row['ooms_halve']} (-> {row['halve_final']}); "
                f"first step {first_predict:.2f} s vs {first_halve:.2f} s; samples/s "
                f"{row['rate_ratio']:.3f} of fixed {truth}")
        out[name] = rows
    # Documents: a whole epoch of fortunes with the GPT of the documents benchmark.
    with h5py.File(docs, "r") as f:
        epoch = (len(f["offsets"]) - 1) // DOCS_BATCH
    path = os.path.join(work, "mm-docs.h5")
    run(MPI + [BIN, "train", "--data", docs, "--model-file", dmodel, "--global-batch",
               DOCS_BATCH, "--steps", epoch, "--threads", 1, "--log-every", 0, "--optimizer",
               "adamw", "--lr", 0.003, "--memory-limit", "24MiB", "--run-log", path])
    with h5py.File(path, "r") as f:
        oom_steps = [int(s) for s in f["oom/step"][:]]
        budget = int(f["memory_model/micro_batch"][:].min())
        padding = 1 - f["steps/tokens"][:].sum() / f["steps/padded_tokens"][:].sum()
    out["documents"] = {"steps": epoch, "oom_steps": oom_steps, "budget": budget,
                        "limit": 24 * 2**20, "padding": float(padding)}
    log(f"  documents: {epoch} steps (an epoch), budget {budget} tokens, out-of-memory at "
        f"steps {oom_steps or 'none'}")
    results["memory_model"] = out


def bench_regrow(work, reps, results):
    """Issue 27 item 4: --micro-batch-regrow after a transient out-of-memory (rank 1 runs out
    above 128 rows at step 5 only) and after a lasting one (above 128 at every step), against
    --micro-batch-regrow 0: samples/s over the steps after the lowering, and out-of-memory
    events."""
    log("== memory model: growing back after an out-of-memory (--micro-batch-regrow)")
    data = synth784(work)
    args = ["--model", "mlp", "--hidden", "256"]
    steps = 80
    out = {"steps": steps, "reps": reps}
    for case, injection in (("transient", "rank=1,above=128,step=5"),
                            ("lasting", "rank=1,above=128")):
        raw = {"off": [], "regrow": [], "ratio": [], "ooms_off": [], "ooms_regrow": [],
               "final_off": [], "final_regrow": []}
        for rep in range(reps):
            got = {}
            for name, n in (("off", 0), ("regrow", 20)):
                run_ = mm_train(work, data, args, "auto", 512, steps,
                                extra=["--inject-oom", injection, "--micro-batch-regrow", n])
                keep = (np.arange(steps) > 5) & (run_["oom_retries"] == 0)
                got[name] = float(np.median(run_["samples_per_second"][keep]))
                raw[f"ooms_{name}"].append(run_["ooms"])
                got[f"final_{name}"] = int(run_["micro_batch"][-1])
                raw[f"final_{name}"].append(got[f"final_{name}"])
            raw["off"].append(got["off"])
            raw["regrow"].append(got["regrow"])
            raw["ratio"].append(got["regrow"] / got["off"])
            log(f"  rep {rep + 1}/{reps} {case}: off {got['off']:.0f}/s (ends at "
                f"{got['final_off']}, {raw['ooms_off'][-1]} OOM), regrow 20 {got['regrow']:.0f}/s "
                f"(ends at {got['final_regrow']}, {raw['ooms_regrow'][-1]} OOM)")
        out[case] = {k: spread(v) for k, v in raw.items()}
    results["regrow"] = out


def render_regrow(results):
    r = results["regrow"]
    lines = [f"Generated by `tests/bench/run.sh --only regrow` on {results['date']} "
             f"({results['machine']}); {r['reps']} repetitions, medians (min-max). 2 ranks x 1 "
             f"thread, MLP 784-256-10, global batch 512 (256 rows per rank, one micro-batch), "
             f"{r['steps']} steps; rank 1 made to run out above 128 rows (`--inject-oom`). "
             "samples/s over the steps after step 5 that needed no retry. The result is the "
             "sizes and the out-of-memory counts: this small MLP on this CPU runs two "
             "micro-batches of 128 rows about 10% faster than one of 256 (cache), so its rates "
             "say nothing of what regrowing gains where a larger micro-batch is faster (GPUs).",
             "",
             "| out-of-memory | final micro-batch off, regrow 20 | OOM events off, regrow 20 | "
             "samples/s off | samples/s regrow 20 |", "|---|---|---|---|---|"]
    for case, what in (("transient", "at step 5 only"), ("lasting", "at every step")):
        row = r[case]
        lines.append(f"| {what} | {row['final_off']['median']:g}, "
                     f"{row['final_regrow']['median']:g} | {row['ooms_off']['median']:g}, "
                     f"{row['ooms_regrow']['median']:g} | {fmt(row['off'], 0)} | "
                     f"{fmt(row['regrow'], 0)} |")
    return "\n".join(lines) + "\n"


def peak_rss(cmd, out):
    """Runs `cmd` (one process: a singleton MPI rank) with its output in `out`; returns its
    peak resident set in bytes (wait4's ru_maxrss: the process's own)."""
    with open(out, "w") as f:
        p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        with open(out) as f:
            sys.exit(f"bench: failed ({p.returncode}): {' '.join(map(str, cmd))}\n{f.read()}")
    return usage.ru_maxrss * 1024


def bench_checkpoint(work, reps, results):
    """Issue 29 item 10: the memory a checkpoint adds to rank 0 and its write rate. One rank
    trains an MLP 784-4096-4096-4096-10 (36.8M parameters, SGD with momentum: a 281 MiB
    checkpoint) for 2 steps, without and with --checkpoint (written once, at the end); peak RSS
    of each, in alternation. The write rate (the run log's checkpoints/bytes over /seconds:
    serializing, writing, fsync, renames) against dd writing as many bytes to the same folder
    with conv=fsync."""
    log("== checkpoint: peak memory and write rate")
    data = os.path.join(work, "ckpt-synth.h5")
    run([BIN, "synth", "--out", data, "--rows", 256, "--features", 784, "--classes", 10,
         "--seed", 1])
    base = [BIN, "train", "--data", data, "--model", "mlp", "--hidden", "4096,4096,4096",
            "--global-batch", 32, "--micro-batch", 32, "--steps", 2, "--threads", 2,
            "--log-every", 0]
    raw = {"without": [], "with": [], "added": [], "bytes": [], "seconds": [], "rate": [],
           "dd_rate": [], "rate_ratio": [], "added_fraction": []}
    for rep in range(reps):
        checkpoint = os.path.join(work, "ckpt.h5")
        logfile = os.path.join(work, "ckpt-log.h5")
        for path in (checkpoint, checkpoint + ".prev", logfile):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        without = peak_rss(base, os.path.join(work, "ckpt-out.txt"))
        with_ = peak_rss(base + ["--checkpoint", checkpoint, "--run-log", logfile],
                         os.path.join(work, "ckpt-out.txt"))
        with h5py.File(logfile, "r") as f:
            size = int(f["checkpoints/bytes"][-1])
            seconds = float(f["checkpoints/seconds"][-1])
        blocks = max(1, size // (8 << 20))
        target = os.path.join(work, "dd.bin")
        start = time.monotonic()
        run(["dd", "if=/dev/zero", f"of={target}", "bs=8M", f"count={blocks}", "conv=fsync"])
        dd_rate = blocks * (8 << 20) / (time.monotonic() - start)
        os.remove(target)
        raw["without"].append(without)
        raw["with"].append(with_)
        raw["added"].append(with_ - without)
        raw["added_fraction"].append((with_ - without) / size)
        raw["bytes"].append(size)
        raw["seconds"].append(seconds)
        raw["rate"].append(size / seconds)
        raw["dd_rate"].append(dd_rate)
        raw["rate_ratio"].append(size / seconds / dd_rate)
        log(f"  rep {rep + 1}/{reps}: peak RSS {without / 2**20:.0f} MiB without, "
            f"{with_ / 2**20:.0f} MiB with a {size / 2**20:.1f} MiB checkpoint (+"
            f"{(with_ - without) / 2**20:.1f} MiB); written in {seconds:.2f} s "
            f"({size / seconds / 2**20:.0f} MiB/s, dd {dd_rate / 2**20:.0f} MiB/s)")
    # Issue 46: what checksums cost, the same checkpoint written (with fsync) and read back whole
    # (as --resume reads it) with and without them, in alternation (bench_checkpoint.cpp).
    r = run([os.path.join(BENCH, "bench_checkpoint"), work, max(5, reps)])
    sums = {key: float(re.search(rf"{pattern} = (\S+)", r.stdout).group(1)) for key, pattern in
            (("write_ratio", "write rate with / without"), ("read_ratio", "read time with / without"),
             ("sum_bytes", "checkpoint bytes"))}
    reads = re.search(r"read seconds without = (\S+), with = (\S+)", r.stdout)
    writes = re.search(r"write seconds without = (\S+), with = (\S+)", r.stdout)
    sums.update(write_without=float(writes.group(1)), write_with=float(writes.group(2)),
                read_without=float(reads.group(1)), read_with=float(reads.group(2)),
                sum_reps=max(5, reps))
    log(f"  checksums: write rate with/without {sums['write_ratio']:.3f}, "
        f"read time with/without {sums['read_ratio']:.3f}")
    results["checkpoint"] = {"reps": reps, **{k: spread(v) for k, v in raw.items()},
                             "checksums": sums}


OPTIMIZER_ELEMENTS = 8 << 20  # three tensors of this many float32 elements (96 MiB) and a bias


def bench_optimizer(reps, results):
    """Issue 55 item 4: the optimizer step in pieces of at most 2^20 elements against LibTorch's
    whole-tensor step (the update it replaced), on the same parameters and gradients, one
    thread, interleaved in one process: time and the temporaries' bytes (the CPU budget's
    counters)."""
    log("== optimizer: the update in pieces against LibTorch's whole-tensor step")
    out = {"elements": OPTIMIZER_ELEMENTS, "reps": reps}
    for optimizer in ("sgd", "adamw"):
        raw = {k: [] for k in ("pieces_ms", "libtorch_ms", "ratio", "pieces_extra_bytes",
                               "libtorch_extra_bytes")}
        for rep in range(reps):
            r = json.loads(run([os.path.join(BENCH, "bench_optimizer_step"), optimizer,
                                OPTIMIZER_ELEMENTS]).stdout)
            for k in ("pieces_ms", "libtorch_ms", "pieces_extra_bytes", "libtorch_extra_bytes"):
                raw[k].append(r[k])
            raw["ratio"].append(r["libtorch_ms"] / r["pieces_ms"])
            out["total_elements"] = r["elements"]
            log(f"  rep {rep + 1}/{reps} {optimizer}: pieces {r['pieces_ms']:.1f} ms, LibTorch "
                f"{r['libtorch_ms']:.1f} ms; temporaries {r['pieces_extra_bytes'] / 2**20:.1f} "
                f"/ {r['libtorch_extra_bytes'] / 2**20:.1f} MiB")
        out[optimizer] = {k: spread(v) for k, v in raw.items()}
    results["optimizer"] = out


def render_optimizer(results):
    r = results["optimizer"]
    mib = 1 / 2**20
    lines = [f"Generated by `tests/bench/run.sh --only optimizer` on {results['date']} "
             f"({results['machine']}); {r['reps']} repetitions, medians (min-max). One process, "
             f"one thread: three float32 parameters of {r['elements']} elements and a bias "
             f"({r['total_elements']} elements), lr 1e-3, weight decay 0.01, SGD with momentum "
             "0.9; each step's time and the most bytes allocated during it beyond what was live "
             "(`tests/bench/bench_optimizer_step`). Both give the same bits (`unit_train` "
             "`SgdAndAdamW/OptimizerInPieces.*`).", "",
             "| optimizer | pieces ms | LibTorch ms | speed, pieces / LibTorch | temporaries, "
             "pieces | temporaries, LibTorch | target |", "|---|---|---|---|---|---|---|"]
    for name in ("sgd", "adamw"):
        o = r[name]
        ok = o["pieces_extra_bytes"]["max"] <= 4 * 2**20 + 4096 and o["ratio"]["median"] >= 1.0
        lines.append(f"| {name} | {fmt(o['pieces_ms'], 1)} | {fmt(o['libtorch_ms'], 1)} | "
                     f"{fmt(o['ratio'])} | {fmt(o['pieces_extra_bytes'], 1, mib, ' MiB')} | "
                     f"{fmt(o['libtorch_extra_bytes'], 1, mib, ' MiB')} | temporaries <= 4 MiB, "
                     f"speed >= 1.0: {'yes' if ok else '**no**'} |")
    return "\n".join(lines) + "\n"


def render_checkpoint(results):
    r = results["checkpoint"]
    mib = 1 / 2**20
    lines = [f"Generated by `tests/bench/run.sh --only checkpoint` on {results['date']} "
             f"({results['machine']}); {r['reps']} repetitions, medians (min-max). One rank, "
             "2 threads, MLP 784-4096-4096-4096-10 (36.8M parameters), SGD with momentum, 2 "
             "steps; the checkpoint written once at the end. Peak RSS is the process's "
             "(wait4); the write rate is the run log's `checkpoints/bytes` over "
             "`checkpoints/seconds` (serializing, writing, fsync, renames), dd's is "
             "`dd if=/dev/zero bs=8M conv=fsync` of as many bytes to the same folder, right "
             "after. Targets: peak RSS added <= 10% of the checkpoint's size plus a fixed "
             "8 MiB piece; write rate >= 0.8 of dd's.", "",
             "| | value |", "|---|---|",
             f"| checkpoint size | {fmt(r['bytes'], 1, mib, ' MiB')} |",
             f"| peak RSS without `--checkpoint` | {fmt(r['without'], 0, mib, ' MiB')} |",
             f"| peak RSS with `--checkpoint` | {fmt(r['with'], 0, mib, ' MiB')} |",
             f"| added by the checkpoint | {fmt(r['added'], 1, mib, ' MiB')} |",
             f"| added / checkpoint size | {fmt(r['added_fraction'], 3)} |",
             f"| write time | {fmt(r['seconds'], 2, 1, ' s')} |",
             f"| write rate | {fmt(r['rate'], 0, mib, ' MiB/s')} |",
             f"| dd's rate | {fmt(r['dd_rate'], 0, mib, ' MiB/s')} |",
             f"| write rate / dd's | {fmt(r['rate_ratio'], 2)} |"]
    s = r.get("checksums")
    if s:
        lines += ["", f"Checksums (issue 46): `bench_checkpoint` writes the same kind of checkpoint "
                  f"({s['sum_bytes'] / 2**20:.1f} MiB: the MLP's float32 parameters and as many "
                  "bytes of optimizer state) with fsync and renames as training does, then reads "
                  "it back whole as `--resume` does, with and without checksums, in alternation; "
                  f"medians of {s['sum_reps']}. Targets: write rate with >= 0.9 of without; read "
                  "time with <= 1.3x of without.", "",
                  "| | without | with | ratio | target met |", "|---|---|---|---|---|",
                  f"| write | {s['write_without']:.3f} s | {s['write_with']:.3f} s | rate "
                  f"{s['write_ratio']:.3f} | {'yes' if s['write_ratio'] >= 0.9 else '**no**'} |",
                  f"| read (resume) | {s['read_without']:.3f} s | {s['read_with']:.3f} s | time "
                  f"{s['read_ratio']:.3f} | {'yes' if s['read_ratio'] <= 1.3 else '**no**'} |"]
    return "\n".join(lines) + "\n"


OVERLAP_GPT = {"context": 64, "width": 256, "layers": 4, "heads": 4}
OVERLAP_MICRO = 8
OVERLAP_STEPS = 16


def bench_overlap(work, reps, results):
    """Issue 26: the gradient all-reduce during the last backward pass (--overlap on) against
    after it (off) and against PyTorch DDP (gloo, no_sync), one rank on each of two simulated
    nodes whose links tc limits to a rate at which the all-reduce of the GPT's gradients takes
    about one micro-batch's compute; and overlap's cost on one node (shared memory)."""
    log("== overlap: the gradient all-reduce during the last backward pass")
    folder = os.path.join(work, "overlap")
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, "text-train.h5")
    run(MPI[:-1] + ["1", BIN, "import", "text", "--out", folder, "--context",
                    OVERLAP_GPT["context"]])
    model = os.path.join(folder, "gpt.pt")
    run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"), "--out", model]
        + [a for k, v in OVERLAP_GPT.items() for a in (f"--{k}", v)])
    m = OVERLAP_MICRO
    extra = ["--model-file", model, "--optimizer", "adamw", "--lr", 0.003, "--weight-decay",
             0.01]
    out = {"micro_batch": m, "gpt": OVERLAP_GPT, "steps": OVERLAP_STEPS}

    # One node: the all-reduce is shared memory; overlap may only cost (a thread, n + 1 calls).
    runner = Runner(work, OVERLAP_STEPS)
    one = {k: {"on": [], "off": [], "ratio": []} for k in (1, 4)}
    for rep in range(reps):
        for k in (1, 4):
            rates = {}
            for mode in ("off", "on"):
                rates[mode] = runner.steady(runner.train(
                    m, data=data, global_batch=2 * m * k, extra=extra + ["--overlap", mode]))
                one[k][mode].append(rates[mode])
            one[k]["ratio"].append(rates["on"] / rates["off"])
            log(f"  rep {rep + 1}/{reps} one node, {k} micro-batch(es): off {rates['off']:.1f}/s, "
                f"on {rates['on']:.1f}/s, ratio {one[k]['ratio'][-1]:.3f}")
    out["one_node"] = {str(k): {x: spread(v) for x, v in one[k].items()} for k in one}

    state, env = start_two_nodes(work)
    if not state:
        results["overlap"] = out
        return
    count = [0]

    def two_nodes(k, mode):
        count[0] += 1
        path = os.path.join(folder, f"two{count[0]}.h5")
        run(["srun", "-N2", "-n2", "--mpi=pmix", BIN, "train", "--data", data, "--global-batch",
             2 * m * k, "--micro-batch", m, "--steps", OVERLAP_STEPS, "--threads", 1,
             "--log-every", 0, "--run-log", path, "--overlap", mode, *extra], env=env)
        with h5py.File(path, "r") as f:
            steps = {c: f["steps"][c][:] for c in f["steps"]}
            parameters = float(f.attrs["parameters"])
            buckets = int(f.attrs["gradient_buckets"])
        keep = np.arange(len(steps["step"])) >= 3
        return {"rate": Runner.steady(steps),
                "step": float(np.median(steps["step_seconds"][keep])),
                "exposed": float(np.median(steps["allreduce_seconds"][keep])),
                "parameters": parameters, "buckets": buckets}

    def ddp_two_nodes(k, port):
        script = os.path.join(ROOT, "tests", "bench", "ddp_baseline.py")
        # Gloo binds to the node's own link: its one 10.99.0.x interface.
        command = ("GLOO_SOCKET_IFNAME=$(ip -o -4 addr | awk '/10\\.99\\./ {print $2; exit}') "
                   f"exec /usr/bin/python3 {script} --rank $SLURM_PROCID --ranks 2 --model gpt "
                   f"--data {data} --width {OVERLAP_GPT['width']} --layers "
                   f"{OVERLAP_GPT['layers']} --heads {OVERLAP_GPT['heads']} --global-batch "
                   f"{2 * m * k} --micro-batch {m} --steps {OVERLAP_STEPS} --threads 1 --port "
                   f"{port}")
        r = run(["srun", "-N2", "-n2", "sh", "-c", command],
                env={**env, "MASTER_ADDR": "10.99.0.2", "USE_LIBUV": "0"})
        return float(re.search(r"samples/s (\S+)", r.stdout).group(1))

    try:
        # The rate: the gradients' bytes (each rank sends and receives about the whole buffer
        # in a two-rank all-reduce) in one micro-batch's compute, measured on the free link.
        free = two_nodes(1, "off")
        compute = free["step"] - free["exposed"]
        gradient_bytes = free["parameters"] * 4
        mbit = gradient_bytes * 8 / compute / 1e6
        log(f"  calibration: {free['parameters'] / 1e6:.2f}M parameters "
            f"({gradient_bytes / 2**20:.1f} MiB of gradients), a micro-batch of {m} computes in "
            f"{compute * 1e3:.0f} ms: links limited to {mbit:.0f} Mbit/s")
        links(mbit)
        two = {k: {x: [] for x in ("off", "on", "ddp", "on_off", "on_ddp", "exposed_off",
                                     "exposed_on", "step_off", "allreduce_over_compute")}
               for k in (1, 4)}
        buckets = 0
        for rep in range(reps):
            for k in (1, 4):
                off, on = two_nodes(k, "off"), two_nodes(k, "on")
                d = ddp_two_nodes(k, 29900 + rep * 10 + k)
                buckets = on["buckets"]
                row = two[k]
                row["off"].append(off["rate"])
                row["on"].append(on["rate"])
                row["ddp"].append(d)
                row["on_off"].append(on["rate"] / off["rate"])
                row["on_ddp"].append(on["rate"] / d)
                row["exposed_off"].append(off["exposed"])
                row["exposed_on"].append(on["exposed"])
                row["step_off"].append(off["step"])
                row["allreduce_over_compute"].append(off["exposed"] / (compute * 1))
                log(f"  rep {rep + 1}/{reps} two nodes, {k} micro-batch(es): off "
                    f"{off['rate']:.1f}/s (all-reduce {off['exposed'] * 1e3:.0f} ms), on "
                    f"{on['rate']:.1f}/s (exposed {on['exposed'] * 1e3:.0f} ms), DDP {d:.1f}/s; "
                    f"on/off {row['on_off'][-1]:.2f}, on/DDP {row['on_ddp'][-1]:.2f}")
    finally:
        links(None)
        run([os.path.join(ROOT, "jobs", "ci", "slurm-down.sh"), state], check=False)
    out["two_nodes"] = {str(k): {x: spread(v) for x, v in two[k].items()} for k in two}
    out["calibration"] = {"compute_seconds": compute, "gradient_bytes": gradient_bytes,
                          "mbit": mbit, "parameters": free["parameters"], "buckets": buckets}
    results["overlap"] = out


def render_overlap(results):
    r = results["overlap"]
    g = r["gpt"]
    lines = [f"Generated by `tests/bench/run.sh --only overlap` on {results['date']} "
             f"({results['machine']}); medians (min-max) of samples/s over steps 4-"
             f"{r['steps']}. The GPT of jobs/models/gpt.py (context {g['context']}, width "
             f"{g['width']}, {g['layers']} layers, {g['heads']} heads), AdamW, micro-batch "
             f"{r['micro_batch']}, 1 thread per rank; global batch 2 x {r['micro_batch']} x k "
             "for k micro-batches per step.", ""]
    c = r.get("calibration")
    if c:
        lines += [f"Two nodes (`jobs/ci/slurm-up.sh --nodes 2`, one rank each, srun): both "
                  f"links limited by `tc` (tbf, each way) to {c['mbit']:.0f} Mbit/s, the rate "
                  f"at which the {c['gradient_bytes'] / 2**20:.1f} MiB of gradients "
                  f"({c['parameters'] / 1e6:.2f}M parameters) cross in one micro-batch's "
                  f"compute ({c['compute_seconds'] * 1e3:.0f} ms, measured on the free link "
                  "first): each rank sends and receives about the whole buffer in a two-rank "
                  f"all-reduce. `--overlap on` cut it into {c['buckets']} buckets of 1 MiB "
                  "(the default). PyTorch DDP: the same eager model, gloo, `no_sync` on all "
                  "but the last micro-batch, same links. Exposed: the run log's "
                  "`allreduce_seconds` (off: the whole all-reduce).", "",
                  "| micro-batches per step | off | on | DDP | on / off | target | on / DDP "
                  "| target | exposed off | exposed on |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for k, target in (("1", 1.3), ("4", 1.1)):
            t = r["two_nodes"][k]
            on_off = t["on_off"]["median"]
            on_ddp = t["on_ddp"]["median"]
            lines.append(
                f"| {k} | {fmt(t['off'], 1)} | {fmt(t['on'], 1)} | {fmt(t['ddp'], 1)} | "
                f"{fmt(t['on_off'])} | >= {target} {'yes' if on_off >= target else '**no**'} | "
                f"{fmt(t['on_ddp'])} | >= 1.0 {'yes' if on_ddp >= 1.0 else '**no**'} | "
                f"{fmt(t['exposed_off'], 0, 1e3, ' ms')} | {fmt(t['exposed_on'], 0, 1e3, ' ms')} |")
        lines.append("")
    else:
        lines += ["Two nodes: not measured in this run (the cluster needs root and Slurm).", ""]
    lines += ["One node (mpirun, 2 ranks on the 2 cores, shared memory): `--overlap auto` (the "
              "default) leaves overlap off on one node, so the default costs nothing there; "
              "forced on, what it costs where the all-reduce is cheap (target: on / off >= "
              "0.98). The communication thread waits in MPI while the other rank computes; "
              "on one node autoaccum sets Open MPI's `mpi_yield_when_idle` so that it yields its "
              "core (spinning, it cost 15-23% at one micro-batch per step here).", "",
              "| micro-batches per step | off | on | on / off | target |", "|---|---|---|---|---|"]
    for k, t in r["one_node"].items():
        ratio = t["ratio"]["median"]
        lines.append(f"| {k} | {fmt(t['off'], 1)} | {fmt(t['on'], 1)} | {fmt(t['ratio'], 3)} | "
                     f">= 0.98 {'yes' if ratio >= 0.98 else '**no**'} |")
    return "\n".join(lines) + "\n"


def balance_row(results):
    """The memory-model table's balance target, from the mixed-hardware figures (--only mixed)."""
    row = results.get("mixed", {}).get("balance", {}).get("3 auto")
    if not row:
        return ("| `--balance throughput` with `auto`, one rank 3x slower, >= 1.6x | not measured "
                "(run `--only mixed`) | **no** |")
    ratio = row["ratio"]["median"]
    return (f"| `--balance throughput` with `auto`, one rank 3x slower, >= 1.6x (mixed-hardware "
            f"table) | {fmt(row['ratio'])} | {'yes' if ratio >= 1.6 else '**no**'} |")


def render_memory_model(results):
    r = results["memory_model"]
    met = lambda ok: "yes" if ok else "**no**"
    lines = [f"Generated by `tests/bench/run.sh --only memory-model` on {results['date']} "
             f"({results['machine']}). 2 ranks x 1 thread, CPU budget (`--memory-limit`), "
             "limits placed at random (seed 27) between the peaks of two powers of two; the "
             "largest size that fits found by bisection with fixed runs under the same limit. "
             "`predict` is the default search, `halve` the search before it.", "",
             "| model | placements | predicted / fits, median (min-max) | above what fits | "
             "OOMs per run: predict, halve (median) | first step: predict / halve (median) | "
             "samples/s: predict / fixed at what fits (median) |",
             "|---|---|---|---|---|---|---|"]
    all_ratios, all_ooms, all_rates = [], [], []
    for name, rows in r.items():
        if name in ("documents", "meta"):
            continue
        ratios = [x["ratio"] for x in rows]
        above = sum(1 for x in rows if x["predicted"] > x["truth"])
        op = statistics.median(x["ooms_predict"] for x in rows)
        oh = statistics.median(x["ooms_halve"] for x in rows)
        first = statistics.median(x["first_predict"] / x["first_halve"] for x in rows)
        rate = statistics.median(x["rate_ratio"] for x in rows)
        all_ratios += ratios
        all_ooms += [x["ooms_predict"] for x in rows]
        all_rates += [x["rate_ratio"] for x in rows]
        lines.append(f"| {name} | {len(rows)} | {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}-{max(ratios):.3f}) | {above} | {op:g}, {oh:g} | "
                     f"{first:.2f} | {rate:.3f} |")
    d = r["documents"]
    lines += ["", "| target | measured | met |", "|---|---|---|",
              f"| predicted / largest that fits >= 0.93 (median over all placements) | "
              f"{statistics.median(all_ratios):.3f} | {met(statistics.median(all_ratios) >= 0.93)} |",
              f"| never above what fits | {sum(1 for x in all_ratios if x > 1)} placements above | "
              f"{met(all(x <= 1 for x in all_ratios))} |",
              f"| out-of-memory events per run <= 1 (median) | {statistics.median(all_ooms):g} | "
              f"{met(statistics.median(all_ooms) <= 1)} |",
              f"| auto / best fixed samples/s >= 0.98 (median) | {statistics.median(all_rates):.3f} "
              f"| {met(statistics.median(all_rates) >= 0.98)} |",
              f"| documents: an epoch of fortunes ({d['steps']} steps, GPT context 256, "
              f"{d['limit'] // 2**20} MiB), no out-of-memory after step 10 | budget "
              f"{d['budget']} tokens, out-of-memory at steps {d['oom_steps'] or 'none'}, padding "
              f"{100 * d['padding']:.1f}% | {met(all(s < 10 for s in d['oom_steps']))} |",
              balance_row(results), ""]
    return "\n".join(lines)


def synth784(work):
    """The MLP benchmarks' data file in `work`, made once: 16384 rows of 784 features."""
    data = os.path.join(work, "synth784.h5")
    if not os.path.exists(data):
        run([BIN, "synth", "--out", data, "--rows", 16384, "--features", 784, "--classes", 10,
             "--seed", 1])
    return data


def bench_mixed(work, reps, results):
    """Issue 16: one rank made 2x and 3x slower (--inject-slow), --balance throughput against
    none (target >= 1.3 at 2x); and one rank with room for half the activations,
    --micro-batch-scope rank against global."""
    log("== mixed hardware: a slow rank, --balance throughput against none")
    runner = Runner(work, 40)
    data = synth784(work)
    out = {"balance": {}, "scope": {}}
    # Micro-batch 64, and auto (issue 27: each rank's micro-batch then follows its share).
    for factor, micro in ((2, 64), (3, 64), (3, "auto")):
        raw = {"none": [], "throughput": [], "ratio": [], "rows": None}
        for rep in range(reps):
            got = {}
            for balance in ("none", "throughput"):
                steps = runner.train(micro, data=data, extra=[
                    "--inject-slow", f"rank=1,factor={factor}", "--balance", balance,
                    "--balance-every", 5])
                got[balance] = runner.steady(steps, skip=12)
            raw["none"].append(got["none"])
            raw["throughput"].append(got["throughput"])
            raw["ratio"].append(got["throughput"] / got["none"])
            log(f"  rep {rep + 1}/{reps} rank 1 {factor}x slower, micro-batch {micro}: none "
                f"{got['none']:.0f}/s, throughput {got['throughput']:.0f}/s, ratio "
                f"{raw['ratio'][-1]:.2f}")
        key = str(factor) if micro == 64 else f"{factor} {micro}"
        out["balance"][key] = {k: spread(v) for k, v in raw.items() if v}

    log("== mixed hardware: rank 1 with less memory, --micro-batch-scope rank against global")
    peaks = {}
    for m in (64, 128, 256):
        peaks[m] = int(runner.train(m, data=data, steps=4)["peak_bytes"].max())
    # Rank 0 holds 128 but not 256; rank 1 holds 64 but not 128.
    small = limit_between(peaks, 64)
    large = limit_between(peaks, 128)
    limits = f"{large},{small}"
    raw = {"global": [], "rank": [], "ratio": []}
    for rep in range(reps):
        got = {}
        for scope in ("global", "rank"):
            steps = runner.train("auto", data=data, limit=limits,
                                 extra=["--micro-batch-scope", scope])
            got[scope] = runner.steady(steps)
        raw["global"].append(got["global"])
        raw["rank"].append(got["rank"])
        raw["ratio"].append(got["rank"] / got["global"])
        log(f"  rep {rep + 1}/{reps}: global {got['global']:.0f}/s, rank {got['rank']:.0f}/s, "
            f"ratio {raw['ratio'][-1]:.2f}")
    out["scope"] = {k: spread(v) for k, v in raw.items()}
    out["scope_limits"] = [int(large), int(small)]
    out["reps"] = reps
    results["mixed"] = out


def render_mixed(results):
    mixed = results["mixed"]
    lines = [f"Generated by `tests/bench/run.sh` on {results['date']} ({results['machine']}); "
             f"{mixed['reps']} repetitions, interleaved; medians (min-max). 2 ranks x 1 thread, "
             f"MLP 784-512-512-10, global batch {GLOBAL_BATCH}, 40 steps per run, the first 12 "
             "left out (the balance is set at step 5 and applies from step 7).", "",
             "| rank 1 slowed | micro-batch | --balance none samples/s | --balance throughput "
             "samples/s | throughput / none | met (>= 1.3 at 2x; >= 1.6 at 3x with auto) |",
             "|---|---|---|---|---|---|"]
    for key, row in mixed["balance"].items():
        factor, _, micro = key.partition(" ")
        goal = {"2": 1.3, "3 auto": 1.6}.get(key)
        ok = ("yes" if row["ratio"]["median"] >= goal else "**no**") if goal else \
            "(report only)"
        lines.append(f"| {factor}x (`--inject-slow rank=1,factor={factor}`) | {micro or 64} | "
                     f"{fmt(row['none'], 0)} | {fmt(row['throughput'], 0)} | "
                     f"{fmt(row['ratio'])} | {ok} |")
    sc = mixed["scope"]
    large, small = mixed["scope_limits"]
    lines += ["", f"One rank with less memory: `--memory-limit {large / 2**20:.2f}MiB,"
              f"{small / 2**20:.2f}MiB` (rank 0 holds micro-batch 128, rank 1 only 64; the "
              "parameters, gradients and momentum take 7.7 MiB of each, so the activations "
              "rank 1 can hold are half of rank 0's).", "",
              "| scope | samples/s |", "|---|---|",
              f"| global (every rank at rank 1's size) | {fmt(sc['global'], 0)} |",
              f"| rank (each rank at its own) | {fmt(sc['rank'], 0)} |",
              f"| rank / global | {fmt(sc['ratio'])} |"]
    return "\n".join(lines) + "\n"


def bench_precision(work, reps, results):
    """Issue 19: --precision bf16 against fp32 in autoaccum at micro-batch 64 and 512 (target
    >= 2x with fast bf16), bf16 against PyTorch DDP under torch.autocast bf16 (target >= 1.5x),
    peak bytes per row in each, and where the automatic search settles under one limit."""
    log("== precision: bf16 against fp32, and against DDP with autocast bf16")
    runner = Runner(work, 40)
    data = synth784(work)
    bf16 = ["--precision", "bf16"]
    out = {"throughput": {}, "reps": reps}
    raw = {m: {"fp32": [], "bf16": [], "ratio": [], "ddp_bf16": [], "vs_ddp": []}
           for m in (64, 512)}
    gemm = []
    for rep in range(reps):
        for m in (64, 512):
            a32 = runner.steady(runner.train(m, data=data))
            steps = runner.train(m, data=data, extra=bf16)
            a16 = runner.steady(steps)
            gemm.append(steps["gemm_speedup"])
            d16 = ddp(m, runner.steps, 29700 + rep * 10 + m % 7, extra=bf16)
            r = raw[m]
            r["fp32"].append(a32)
            r["bf16"].append(a16)
            r["ratio"].append(a16 / a32)
            r["ddp_bf16"].append(d16)
            r["vs_ddp"].append(a16 / d16)
            log(f"  rep {rep + 1}/{reps} m={m}: fp32 {a32:.0f}/s, bf16 {a16:.0f}/s "
                f"(x{a16 / a32:.2f}), DDP bf16 {d16:.0f}/s (autoaccum/DDP {a16 / d16:.2f}); "
                f"bf16/fp32 GEMM {gemm[-1]:.1f}x")
    out["throughput"] = {str(m): {k: spread(v) for k, v in r.items()} for m, r in raw.items()}
    out["gemm_speedup"] = spread(gemm)

    log("== precision: peak bytes (fixed part and per row), and auto under one limit")
    fashion = os.path.join(work, "fashion-mnist-train.h5")
    if not os.path.exists(fashion):
        run([BIN, "import", "fashion-mnist", "--out", work])
    models = {"mlp": (data, [], (64, 128, 256)),
              "cnn": (fashion, ["--model", "cnn"], (32, 64, 128))}
    out["memory"] = {}
    for model, (path, model_args, sizes) in models.items():
        mem = {}
        for name, extra in (("fp32", []), ("bf16", bf16)):
            peaks = {m: int(runner.train(m, data=path, steps=4, extra=model_args + extra)
                            ["peak_bytes"].max()) for m in sizes}
            per_row = (peaks[sizes[-1]] - peaks[sizes[0]]) / (sizes[-1] - sizes[0])
            mem[name] = {"peaks": {str(m): v for m, v in peaks.items()}, "per_row": per_row,
                         "fixed": peaks[sizes[0]] - sizes[0] * per_row}
            log(f"  {model} {name}: {mem[name]['fixed'] / 2**20:.2f} MiB fixed, "
                f"{per_row / 1024:.2f} KiB per row")
        out["memory"][model] = mem
    # The cnn, whose memory is mostly activations: a limit under which fp32 holds 32 rows, not 64.
    cnn = out["memory"]["cnn"]["fp32"]["peaks"]
    limit = (cnn["32"] + cnn["64"]) // 2
    out["limit"] = int(limit)
    out["auto"] = {}
    for name, extra in (("fp32", []), ("bf16", bf16)):
        steps = runner.train("auto", data=fashion, limit=limit, extra=["--model", "cnn", *extra])
        out["auto"][name] = {"micro_batch": steps["final_micro_batch"],
                             "samples_per_second": runner.steady(steps)}
        log(f"  cnn {name} under {limit / 2**20:.2f} MiB: auto settles at "
            f"{steps['final_micro_batch']}, {out['auto'][name]['samples_per_second']:.0f}/s")
    results["precision"] = out


def render_precision(results):
    pr = results["precision"]
    g = pr["gemm_speedup"]
    lines = [f"Generated by `tests/bench/run.sh` on {results['date']} ({results['machine']}); "
             f"{pr['reps']} repetitions, interleaved; medians (min-max). 2 ranks x 1 thread, "
             f"MLP 784-512-512-10, global batch {GLOBAL_BATCH}, 40 steps per run. This machine's "
             f"bf16 matrix products run {fmt(g, 1)}x as fast as fp32's (autoaccum's start-up "
             "probe, 512x512x512): the ceiling for bf16's gain.", "",
             "| micro-batch | fp32 samples/s | bf16 samples/s | bf16 / fp32 | met (>= 2) | "
             "DDP bf16 samples/s | autoaccum / DDP, bf16 | met (>= 1.5) |",
             "|---|---|---|---|---|---|---|---|"]
    for m, row in pr["throughput"].items():
        lines.append(f"| {m} | {fmt(row['fp32'], 0)} | {fmt(row['bf16'], 0)} | "
                     f"{fmt(row['ratio'])} | "
                     f"{'yes' if row['ratio']['median'] >= 2 else '**no**'} | "
                     f"{fmt(row['ddp_bf16'], 0)} | {fmt(row['vs_ddp'])} | "
                     f"{'yes' if row['vs_ddp']['median'] >= 1.5 else '**no**'} |")
    mem, auto = pr["memory"], pr["auto"]
    lines += ["", "Memory, from the peaks at three fixed micro-batches: a fixed part (parameters, "
              "gradients, optimizer state, and in bf16 the weights' bf16 copies) and a part per "
              "row of a micro-batch (activations).", "",
              "| model | precision | fixed MiB | KiB per row | per row bf16 / fp32 |",
              "|---|---|---|---|---|"]
    for model, m in mem.items():
        for name in ("fp32", "bf16"):
            ratio = f"{m['bf16']['per_row'] / m['fp32']['per_row']:.2f}" if name == "bf16" else ""
            lines.append(f"| {model} | {name} | {m[name]['fixed'] / 2**20:.2f} | "
                         f"{m[name]['per_row'] / 1024:.2f} | {ratio} |")
    lines += ["", f"The cnn on Fashion-MNIST under one limit of {pr['limit'] / 2**20:.2f} MiB per "
              "rank (fp32 holds 32 rows, not 64), `--micro-batch auto`:", "",
              "| precision | settles at | samples/s |", "|---|---|---|"]
    for name in ("fp32", "bf16"):
        lines.append(f"| {name} | {auto[name]['micro_batch']} | "
                     f"{auto[name]['samples_per_second']:.0f} |")
    return "\n".join(lines) + "\n"


def bench_allreduce(reps, results):
    """Target 4: the gradient collective's bandwidth against raw MPI_Allreduce."""
    log("== gradient all-reduce: MpiCommunicator vs raw MPI_Allreduce, same bytes")
    ratios, outs = [], []
    for rep in range(reps):
        r = run(MPI + [os.path.join(BENCH, "bench_allreduce"), 669706 + 2 * RANKS + 2, 200])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        outs.append(out)
        ratios.append(out["ratio"])
        log(f"  rep {rep + 1}: raw {out['raw_us']:.0f} us, autoaccum {out['ours_us']:.0f} us, "
            f"bandwidth ratio {out['ratio']:.3f}")
    results["allreduce"] = {"ratio": spread(ratios),
                            "raw_gbps": spread([o["raw_gbps"] for o in outs]),
                            "ours_gbps": spread([o["ours_gbps"] for o in outs]),
                            "floats": outs[0]["floats"]}


def bench_watchdog(work, reps, results):
    """Issue 18: the collective watchdog's cost. The gradient collective with and without it
    (target: ratio >= 0.98), a small buffer's, and whole training steps with and without it."""
    log("== watchdog: the collective with --collective-timeout against without it")
    sizes = {"gradients (mlp)": 669706 + 2 * RANKS + 2, "4096 floats": 4096, "16 floats": 16}
    out = {"reps": reps, "collective": {}, "training": {}}
    raw = {name: {"off_us": [], "on_us": [], "ratio": []} for name in sizes}
    for rep in range(reps):
        for name, floats in sizes.items():
            r = run(MPI + [os.path.join(BENCH, "bench_allreduce"), floats, 400])
            o = json.loads(r.stdout.strip().splitlines()[-1])
            raw[name]["off_us"].append(o["ours_us"])
            raw[name]["on_us"].append(o["watched_us"])
            raw[name]["ratio"].append(o["watchdog_ratio"])
            log(f"  rep {rep + 1} {name}: without {o['ours_us']:.1f} us, with "
                f"{o['watched_us']:.1f} us (ratio {o['watchdog_ratio']:.3f})")
    out["collective"] = {name: {k: spread(v) for k, v in r.items()} for name, r in raw.items()}
    out["thread_level"] = thread_levels(MPI, reps, "one node")
    runner = Runner(work, 60)
    data = synth784(work)
    configs = {"global batch 1024, micro-batch 512": (1024, 512, 60),
               "global batch 64, micro-batch 32": (64, 32, 400)}
    train = {name: {"off": [], "on": [], "ratio": []} for name in configs}
    for rep in range(2 * reps):  # each order of the pair as often
        for name, (batch, m, steps) in configs.items():
            runs = {}
            for watched in ((False, True) if rep % 2 == 0 else (True, False)):
                extra = [] if watched else ["--collective-timeout", 0]
                runs[watched] = runner.steady(runner.train(m, data=data, global_batch=batch,
                                                           steps=steps, extra=extra))
            off, on = runs[False], runs[True]
            train[name]["off"].append(off)
            train[name]["on"].append(on)
            train[name]["ratio"].append(on / off)
            log(f"  rep {rep + 1} {name}: without {off:.0f}/s, with {on:.0f}/s "
                f"(ratio {on / off:.3f})")
    out["training"] = {name: {k: spread(v) for k, v in r.items()} for name, r in train.items()}
    out["two_nodes"] = two_node_allreduce(work, reps)
    results["watchdog"] = out


def thread_levels(launch, reps, where, env=None):
    """What MPI_THREAD_MULTIPLE (which the watchdog's thread needs) costs the gradient all-reduce
    against MPI_THREAD_FUNNELED: a thread level is fixed per process, so processes alternate,
    each order equally often; the raw MPI_Allreduce column of each."""
    times = {"funneled": [], "multiple": [], "ratio": []}
    for rep in range(2 * reps):
        pair = {}
        for level in (("funneled", "multiple") if rep % 2 == 0 else ("multiple", "funneled")):
            r = run(launch + [os.path.join(BENCH, "bench_allreduce"), 669706 + 2 * RANKS + 2, 200,
                              level], env=env)
            o = json.loads(r.stdout.strip().splitlines()[-1])
            if o["thread_level"] != level:
                raise RuntimeError(f"asked for {level}, MPI gave {o['thread_level']}")
            pair[level] = o["raw_us"]
        for level, us in pair.items():
            times[level].append(us)
        times["ratio"].append(pair["funneled"] / pair["multiple"])
        log(f"  rep {rep + 1} {where}: FUNNELED {pair['funneled']:.0f} us, MULTIPLE "
            f"{pair['multiple']:.0f} us (ratio {times['ratio'][-1]:.3f})")
    return {k: spread(v) for k, v in times.items()}


SHARD_LIMIT = "48MiB"  # the per-rank limit the largest-model search trains under


def shard_run(ranks, data, hidden, args, launcher=None, env=None, check=True):
    """One autoaccum run of an MLP 784-hidden-10 with AdamW on `ranks` ranks (mpirun, or
    `launcher`), its run log read back: (returncode, {attribute or column: value})."""
    log_path = os.path.join(os.path.dirname(data), f"shard-{time.monotonic_ns()}.h5")
    cmd = (launcher or MPI[:-1] + [str(ranks)]) + [
        BIN, "train", "--data", data, "--hidden", hidden, "--optimizer", "adamw", "--lr", 0.001,
        "--threads", 1, "--log-every", 0, "--shuffle", "none", "--run-log", log_path, *args]
    r = run(cmd, check=check, env=env)
    if r.returncode != 0:
        return r.returncode, {}
    out = {}
    with h5py.File(log_path, "r") as f:
        for name, value in f.attrs.items():
            out[name] = value.decode() if isinstance(value, bytes) else value
        for group in ("steps", "memory_model"):
            if group in f:
                for c in f[group]:
                    out[f"{group}/{c}"] = f[group][c][:]
    os.remove(log_path)
    return 0, out


def mlp_parameters(width, layers=2, inputs=784, classes=10):
    sizes = [inputs] + [width] * layers + [classes]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def largest_width(ranks, data, shard, low=64, high=8192):
    """The widest MLP 784-w-w-10 (AdamW, micro-batch auto) that trains a step on `ranks` ranks
    under SHARD_LIMIT each, by bisection over w (exit 3: it does not fit)."""
    fits = lambda w: shard_run(ranks, data, f"{w},{w}", [
        "--global-batch", 8 * ranks, "--steps", 1, "--memory-limit", SHARD_LIMIT, "--shard",
        shard], check=False)[0] == 0
    if not fits(low):
        return 0
    while high - low > 16:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def links(mbit=None):
    """Limits the simulated two-node cluster's links to `mbit` Mbit/s with tc (None: unlimited)."""
    for i in (1, 2):
        for prefix, dev in (([], f"aa-v{i}"), (["-n", f"aa-node{i}"], f"aa-p{i}")):
            if mbit is None:
                run(["tc", *prefix, "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                run(["tc", *prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                     f"{mbit:.0f}mbit", "burst", "1mb", "latency", "100ms"])


def bench_shard(work, reps, results):
    """Issue 44: --shard optimizer. Fixed bytes per rank at 4 ranks with AdamW against
    unsharded; the widest MLP that trains under one per-rank limit at 4 ranks, sharded or not;
    one model under one limit at 2 and 4 ranks (the automatic micro-batch grows with the ranks);
    step time at one micro-batch on one node and across two simulated nodes whose links tc
    limits to 1 Gbit/s; the memory a sharded checkpoint of a 37M-parameter AdamW model adds to
    each rank; the step time with one row per rank at 1, 2 and 4 ranks (mostly the optimizer
    step and the collectives) for a 25M-parameter model."""
    log("== shard: sharded optimizer state")
    data = synth784(work)
    out = {"limit": SHARD_LIMIT}

    # Fixed bytes at 4 ranks: counted from the sizes, and as the memory model measured them.
    fixed = {}
    for shard in ("none", "optimizer", "gradients"):
        _, o = shard_run(4, data, "1024,1024", ["--global-batch", 64, "--steps", 2,
                                                 "--memory-limit", "256MiB", "--shard", shard])
        counted = max(int(b) for b in o["fixed_bytes_counted"].split(","))
        measured = float(np.max(o["memory_model/fixed_bytes"]))
        fixed[shard] = {"counted": counted, "measured": measured}
        log(f"  4 ranks, --shard {shard}: fixed bytes counted {counted / 2**20:.2f} MiB, "
            f"measured {measured / 2**20:.2f} MiB")
    out["fixed"] = fixed
    out["fixed_ratio"] = fixed["optimizer"]["counted"] / fixed["none"]["counted"]
    out["fixed_ratio_measured"] = fixed["optimizer"]["measured"] / fixed["none"]["measured"]
    out["fixed_ratio_gradients"] = fixed["gradients"]["counted"] / fixed["none"]["counted"]
    out["fixed_ratio_gradients_measured"] = (fixed["gradients"]["measured"] /
                                             fixed["none"]["measured"])

    # The widest model under one limit.
    widths = {shard: largest_width(4, data, shard)
              for shard in ("none", "optimizer", "gradients")}
    out["widths"] = widths
    out["largest_ratio"] = (mlp_parameters(widths["optimizer"]) /
                            max(1, mlp_parameters(widths["none"])))
    out["largest_ratio_gradients"] = (mlp_parameters(widths["gradients"]) /
                                      max(1, mlp_parameters(widths["none"])))
    log(f"  widest under {SHARD_LIMIT} per rank at 4 ranks: {widths['none']} unsharded, "
        f"{widths['optimizer']} sharded ({out['largest_ratio']:.2f}x the parameters), "
        f"{widths['gradients']} with gradients sharded ({out['largest_ratio_gradients']:.2f}x)")

    # One model, one limit, 2 and 4 ranks: the widest that trains sharded at 2 ranks.
    width = largest_width(2, data, "optimizer")
    scaling = {}
    for ranks in (2, 4):
        checkpoint = os.path.join(work, f"shard-scale-{ranks}.h5")
        _, o = shard_run(ranks, data, f"{width},{width}", [
            "--global-batch", 2048, "--steps", 3, "--memory-limit", SHARD_LIMIT, "--shard",
            "optimizer", "--checkpoint", checkpoint])
        scaling[ranks] = {"micro_batch": int(o["steps/micro_batch"][0]),
                          "oom_retries": int(np.sum(o["steps/oom_retries"]))}
        with h5py.File(checkpoint, "r") as f:
            scaling[ranks]["params"] = {n: f[f"params/{n}"][()] for n in f.attrs["params_names"]}
        log(f"  width {width} under {SHARD_LIMIT}: {ranks} ranks start at micro-batch "
            f"{scaling[ranks]['micro_batch']} ({scaling[ranks]['oom_retries']} out-of-memory "
            "retries)")
    a, b = scaling[2].pop("params"), scaling[4].pop("params")
    out["scaling"] = {"width": width, **{str(k): v for k, v in scaling.items()},
                      "agreement": max(float(np.linalg.norm(a[n] - b[n]) / np.linalg.norm(b[n]))
                                       for n in a)}

    # Step time at one micro-batch, 2 ranks on one node, in alternation.
    common = ["--global-batch", 128, "--micro-batch", 32, "--steps", 12]
    step = {"none": [], "optimizer": [], "ratio": []}
    for rep in range(reps):
        times = {}
        for shard in ("none", "optimizer"):
            _, o = shard_run(2, data, "2048,2048", common + ["--shard", shard])
            times[shard] = float(np.median(o["steps/step_seconds"][3:]))
            step[shard].append(times[shard])
        step["ratio"].append(times["none"] / times["optimizer"])
        log(f"  rep {rep + 1}/{reps} one node: step {times['none'] * 1e3:.0f} ms unsharded, "
            f"{times['optimizer'] * 1e3:.0f} ms sharded (speed ratio {step['ratio'][-1]:.3f})")
    out["one_node"] = {k: spread(v) for k, v in step.items()}

    # --shard gradients with one micro-batch per rank (no accumulation), 2 ranks on one node.
    alone = {"none": [], "gradients": [], "ratio": []}
    for rep in range(reps):
        times = {}
        for shard in ("none", "gradients"):
            _, o = shard_run(2, data, "2048,2048", ["--global-batch", 64, "--micro-batch", 32,
                                                     "--steps", 12, "--shard", shard])
            times[shard] = float(np.median(o["steps/step_seconds"][3:]))
            alone[shard].append(times[shard])
        alone["ratio"].append(times["none"] / times["gradients"])
        log(f"  rep {rep + 1}/{reps} one node, one micro-batch: step {times['none'] * 1e3:.0f} ms "
            f"unsharded, {times['gradients'] * 1e3:.0f} ms gradients sharded (speed ratio "
            f"{alone['ratio'][-1]:.3f})")
    out["one_node_gradients"] = {k: spread(v) for k, v in alone.items()}

    # Across two simulated nodes, links at 1 Gbit/s.
    state, env = start_two_nodes(work)
    if state:
        # Unsharded without overlap moves the same bytes in one all-reduce; with it (what
        # --overlap auto gives between nodes) it hides them behind the last backward pass. A
        # sharded step, since issue 55, reduces its buckets to their owners during backward
        # too (auto between nodes); "optimizer_off" is the sharded step without overlap.
        two = {"none": [], "overlap": [], "optimizer": [], "optimizer_off": [], "ratio": [],
               "ratio_overlap": [], "ratio_sharded_overlap": []}
        srun = ["srun", "-N2", "-n2", "--mpi=pmix"]
        try:
            links(1000)
            for rep in range(reps):
                times = {}
                for mode, args in (("none", ["--shard", "none", "--overlap", "off"]),
                                   ("overlap", ["--shard", "none", "--overlap", "on"]),
                                   ("optimizer_off", ["--shard", "optimizer", "--overlap", "off"]),
                                   ("optimizer", ["--shard", "optimizer", "--overlap", "on"])):
                    _, o = shard_run(2, data, "2048,2048", common + args, launcher=srun,
                                     env=env)
                    times[mode] = float(np.median(o["steps/step_seconds"][3:]))
                    two[mode].append(times[mode])
                two["ratio"].append(times["none"] / times["optimizer"])
                two["ratio_overlap"].append(times["overlap"] / times["optimizer"])
                two["ratio_sharded_overlap"].append(times["optimizer_off"] / times["optimizer"])
                log(f"  rep {rep + 1}/{reps} two nodes at 1 Gbit/s: step "
                    f"{times['none'] * 1e3:.0f} ms unsharded ({times['overlap'] * 1e3:.0f} ms "
                    f"with --overlap on), {times['optimizer'] * 1e3:.0f} ms sharded with overlap "
                    f"({times['optimizer_off'] * 1e3:.0f} ms without); sharded+overlap against "
                    f"unsharded+overlap {two['ratio_overlap'][-1]:.3f}, against unsharded "
                    f"{two['ratio'][-1]:.3f}")
        finally:
            links(None)
            run([os.path.join(ROOT, "jobs", "ci", "slurm-down.sh"), state], check=False)
        out["two_nodes"] = {k: spread(v) for k, v in two.items()}

    # A sharded checkpoint of a 37M-parameter AdamW model: peak RSS of each rank (GNU time's
    # %M per rank) with and without --checkpoint.
    def rss(extra, steps=1):
        r = run(MPI + ["/usr/bin/time", "-f", "rss %M", BIN, "train", "--data", data, "--hidden",
                       "4096,4096,4096", "--optimizer", "adamw", "--global-batch", 16,
                       "--micro-batch", 8, "--steps", steps, "--threads", 1, "--log-every", 0,
                       "--shard", "optimizer", *extra])
        return [int(v) * 1024 for v in re.findall(r"rss (\d+)", r.stdout + r.stderr)]
    checkpoint = os.path.join(work, "shard-ckpt.h5")
    added, size = [], 0
    for rep in range(max(1, min(reps, 2))):
        without = rss([])
        with_ = rss(["--checkpoint", checkpoint])
        size = os.path.getsize(checkpoint)
        os.remove(checkpoint)
        added.append(max(w - o for w, o in zip(sorted(with_), sorted(without))))
        log(f"  rep {rep + 1}: a {size / 2**20:.0f} MiB sharded checkpoint adds "
            f"{added[-1] / 2**20:.1f} MiB to a rank's peak RSS")
    out["checkpoint"] = {"bytes": size, "added": spread(added),
                         "bound": 0.1 * size + 64 * 2**20}

    # Resuming it: what reading the checkpoint adds to a rank's peak RSS against a fresh start
    # of the same step (each rank reads the parameters straight into the model and its slice of
    # the optimizer state straight into its state, after verifying the file in 32 MiB pieces).
    resumed = []
    for rep in range(max(1, min(reps, 2))):
        rss(["--checkpoint", checkpoint])
        fresh = rss([], steps=2)
        again = rss(["--checkpoint", checkpoint, "--resume"], steps=2)
        os.remove(checkpoint)
        resumed.append(max(a - f for a, f in zip(sorted(again), sorted(fresh))))
        log(f"  rep {rep + 1}: resuming it adds {resumed[-1] / 2**20:.1f} MiB to a rank's peak "
            f"RSS")
    params_bytes = 4 * mlp_parameters(4096, layers=3)
    out["resume"] = {"added": spread(resumed), "params": params_bytes,
                     "state": 2 * params_bytes, "bound": 64 * 2**20}

    # The step with one row per rank (the optimizer step and collectives dominate), 25M
    # parameters (MLP 784-3072-3072-3072-10 is 24.4M).
    optimizer = {}
    for ranks in (1, 2, 4):
        _, o = shard_run(ranks, data, "3072,3072,3072", [
            "--global-batch", ranks, "--micro-batch", 1, "--steps", 6, "--shard", "optimizer"])
        optimizer[str(ranks)] = float(np.median(o["steps/step_seconds"][2:]))
        log(f"  {ranks} rank(s), one row each: step {optimizer[str(ranks)] * 1e3:.0f} ms")
    out["optimizer_step"] = optimizer
    results["shard"] = out


def render_shard(results):
    r = results["shard"]
    mib = 1 / 2**20
    yes = lambda ok: "yes" if ok else "**no**"
    f, w, sc = r["fixed"], r["widths"], r["scaling"]
    lines = [f"Generated by `tests/bench/run.sh --only shard` on {results['date']} "
             f"({results['machine']}). MLPs on 784 synthetic features, AdamW, `--threads 1` per "
             "rank; ratios of runs made side by side. Fixed bytes: counted from the sizes "
             "(parameters, gradient buffer, optimizer state; the run log's "
             "`fixed_bytes_counted`) and the memory model's measured fixed part.", "",
             "| | measured | target | met |", "|---|---|---|---|",
             f"| fixed bytes per rank at 4 ranks, sharded / unsharded (MLP 784-1024-1024-10) | "
             f"{r['fixed_ratio']:.3f} counted ({f['optimizer']['counted'] * mib:.2f} / "
             f"{f['none']['counted'] * mib:.2f} MiB); {r['fixed_ratio_measured']:.3f} measured | "
             f"<= 0.65 measured | {yes(r['fixed_ratio_measured'] <= 0.65)} |",
             f"| the same with gradients sharded too (`--shard gradients`) | "
             f"{r['fixed_ratio_gradients']:.3f} counted ({f['gradients']['counted'] * mib:.2f} "
             f"MiB); {r['fixed_ratio_gradients_measured']:.3f} measured | <= 0.47 measured | "
             f"{yes(r['fixed_ratio_gradients_measured'] <= 0.47)} |",
             f"| the memory model's measured fixed part / the count, at 4 ranks | "
             f"{f['gradients']['measured'] / f['gradients']['counted']:.3f} gradients, "
             f"{f['optimizer']['measured'] / f['optimizer']['counted']:.3f} optimizer, "
             f"{f['none']['measured'] / f['none']['counted']:.3f} unsharded | within 3% | "
             f"{yes(all(abs(f[k]['measured'] / f[k]['counted'] - 1) <= 0.03 for k in f))} |",
             f"| widest MLP 784-w-w-10 training under {r['limit']} per rank at 4 ranks | "
             f"w = {w['optimizer']} sharded, {w['none']} unsharded: "
             f"{r['largest_ratio']:.2f}x the parameters | >= 1.5x | "
             f"{yes(r['largest_ratio'] >= 1.5)} |",
             f"| the same with `--shard gradients` | w = {w['gradients']}: "
             f"{r['largest_ratio_gradients']:.2f}x the parameters of unsharded | >= 2x | "
             f"{yes(r['largest_ratio_gradients'] >= 2)} |",
             f"| w = {sc['width']} under {r['limit']}: automatic micro-batch at 2 and 4 ranks | "
             f"{sc['2']['micro_batch']} ({sc['2']['oom_retries']} out-of-memory) and "
             f"{sc['4']['micro_batch']} ({sc['4']['oom_retries']}); parameters after 3 steps "
             f"agree to {sc['agreement']:.1e} | larger at 4, <= 1 out-of-memory, 1e-6 | "
             f"{yes(sc['4']['micro_batch'] > sc['2']['micro_batch'] and sc['4']['oom_retries'] <= 1 and sc['agreement'] <= 1e-6)} |",
             f"| step speed at micro-batch 32, 2 ranks on one node, sharded / unsharded "
             f"(MLP 784-2048-2048-10) | {fmt(r['one_node']['ratio'], 3)} | >= 0.95 | "
             f"{yes(r['one_node']['ratio']['median'] >= 0.95)} |",
             f"| step speed at one micro-batch of 32 per rank (no accumulation), 2 ranks on one "
             f"node, `--shard gradients` / unsharded | "
             f"{fmt(r['one_node_gradients']['ratio'], 3)} | >= 0.95 | "
             f"{yes(r['one_node_gradients']['ratio']['median'] >= 0.95)} |"]
    if "two_nodes" in r:
        t = r["two_nodes"]
        lines.append(f"| step speed across two simulated nodes, links at 1 Gbit/s, sharded with "
                     f"`--overlap on` (buckets reduced to their owners during backward) / "
                     f"unsharded with `--overlap on` | {fmt(t['ratio_overlap'], 3)} | >= 1.0 | "
                     f"{yes(t['ratio_overlap']['median'] >= 1.0)} |")
        lines.append(f"| the same / unsharded with `--overlap off` (one all-reduce of the same "
                     f"bytes) | {fmt(t['ratio'], 3)} | >= 1.0 | {yes(t['ratio']['median'] >= 1.0)} |")
        if "ratio_sharded_overlap" in t:
            lines.append(f"| the same / sharded with `--overlap off` (what overlap gains a sharded "
                         f"step) | {fmt(t['ratio_sharded_overlap'], 3)} | reported | |")
    else:
        lines.append("| the same across two simulated nodes | not run (the simulated cluster "
                     "needs root and Slurm) | >= 1.0 | **no** |")
    c = r["checkpoint"]
    lines += [f"| peak RSS a sharded checkpoint adds to a rank (MLP 784-4096-4096-4096-10, "
              f"37M parameters, 2 ranks; a {c['bytes'] * mib:.0f} MiB file) | "
              f"{fmt(c['added'], 1, mib, ' MiB')} | <= {c['bound'] * mib:.0f} MiB (10% + 64 MiB)"
              f" | {yes(c['added']['median'] <= c['bound'])} |",
              f"| peak RSS resuming that checkpoint adds to a rank, against a fresh start (AdamW "
              f"state {r['resume']['state'] * mib:.0f} MiB, each rank reading only its half, "
              f"and the parameters, {r['resume']['params'] * mib:.0f} MiB, read straight into the "
              f"model) | {fmt(r['resume']['added'], 1, mib, ' MiB')} | <= two 32 MiB pieces "
              f"({r['resume']['bound'] * mib:.0f} MiB) | "
              f"{yes(r['resume']['added']['median'] <= r['resume']['bound'])} |"
              if "resume" in r else "| resume peak | not run | | |",
              "| step with one row per rank, MLP 784-3072-3072-3072-10 (24.4M), sharded | " +
              ", ".join(f"{k} rank(s) {v * 1e3:.0f} ms" for k, v in r["optimizer_step"].items())
              + " | reported | |"]
    return "\n".join(lines) + "\n"


def start_two_nodes(work):
    """The simulated two-node cluster (jobs/ci/slurm-up.sh --nodes 2) in `work`: its state folder
    and the environment srun needs there, or (None, None) where it cannot start (not root, no
    Slurm). Stopped with slurm-down.sh STATE."""
    os.chmod(work, 0o755)  # munged (user munge) reaches its socket through it
    state = os.path.join(work, "cluster")
    up = run([os.path.join(ROOT, "jobs", "ci", "slurm-up.sh"), "--nodes", 2, state], check=False)
    if up.returncode != 0:
        log("  two nodes: cluster not started (" + (up.stderr.strip().splitlines() or ["?"])[-1]
            + ")")
        return None, None
    env = {**os.environ, "SLURM_CONF": os.path.join(state, "slurm.conf"),
           "SLURM_SRUN_COMM_IFHN": "10.99.0.1", "SLURM_PMIX_FENCE": "ring"}  # docs/slurm.md
    return state, env


def two_node_allreduce(work, reps):
    """The gradient all-reduce between two simulated nodes (network namespaces linked by a
    bridge, jobs/ci/slurm-up.sh --nodes 2), one rank each, through srun: autoaccum's (with and
    without the watchdog) against a raw MPI_Allreduce of the same bytes. None where the cluster
    cannot be started (not root, no Slurm)."""
    state, env = start_two_nodes(work)
    if not state:
        return None
    raw = {"raw_us": [], "ours_us": [], "watched_us": [], "ratio": [], "watchdog_ratio": []}
    srun = ["srun", "-N2", "-n2", "--mpi=pmix"]
    try:
        for rep in range(reps):
            r = run(srun + [os.path.join(BENCH, "bench_allreduce"), 669706 + 2 * RANKS + 2, 200],
                    env=env)
            o = json.loads(r.stdout.strip().splitlines()[-1])
            for k in raw:
                raw[k].append(o[k])
            log(f"  rep {rep + 1} two nodes: raw {o['raw_us']:.0f} us, autoaccum "
                f"{o['ours_us']:.0f} us, with the watchdog {o['watched_us']:.0f} us")
        levels = thread_levels(srun, reps, "two nodes", env=env)
    finally:
        run([os.path.join(ROOT, "jobs", "ci", "slurm-down.sh"), state], check=False)
    out = {k: spread(v) for k, v in raw.items()}
    out["thread_level"] = levels
    return out


def render_watchdog(results):
    w = results["watchdog"]
    lines = [f"Generated by `tests/bench/run.sh --only watchdog` on {results['date']} "
             f"({results['machine']}); {w['reps']} repetitions; medians (min-max). 2 ranks on one "
             "node. With: the default `--collective-timeout` (10 min: the blocking all-reduce "
             "with the watchdog armed around it). Without: `--collective-timeout 0`. Both in "
             "one process under MPI_THREAD_MULTIPLE, as autoaccum runs.", "",
             "`MpiCommunicator::allreduce_sum`, 400 calls per column and repetition in blocks of 20, "
             "the columns' order rotating from block to block:", "",
             "| buffer | without (us) | with (us) | without / with | met (>= 0.98) |",
             "|---|---|---|---|---|"]
    for name, c in w["collective"].items():
        target = name.startswith("gradients")
        lines.append(f"| {name} | {fmt(c['off_us'], 1)} | {fmt(c['on_us'], 1)} | "
                     f"{fmt(c['ratio'], 3)} | "
                     f"{('yes' if c['ratio']['median'] >= 0.98 else '**no**') if target else '-'} |")
    lines += ["", "Whole training steps (MLP 784-512-512-10, 60 and 400 steps per run, samples/s "
              f"after 3 warm-up steps; {2 * w['reps']} pairs, each order equally often):", "",
              "| run | without | with | with / without |", "|---|---|---|---|"]
    for name, t in w["training"].items():
        lines.append(f"| {name} | {fmt(t['off'], 0)} | {fmt(t['on'], 0)} | {fmt(t['ratio'], 3)} |")
    two = w.get("two_nodes")
    levels = [("one node, 2 ranks", w.get("thread_level"))]
    levels.append(("two nodes, 1 rank each", two.get("thread_level") if two else None))
    lines += ["", "The thread level the watchdog needs: a raw MPI_Allreduce of the gradients "
              "(669,712 floats, 200 calls) in a process initialised with MPI_THREAD_FUNNELED "
              f"against one with MPI_THREAD_MULTIPLE, {2 * w['reps']} pairs of processes, each "
              "order equally often:", "",
              "| where | FUNNELED (us) | MULTIPLE (us) | FUNNELED / MULTIPLE |", "|---|---|---|---|"]
    for where, t in levels:
        if t:
            lines.append(f"| {where} | {fmt(t['funneled'], 0)} | {fmt(t['multiple'], 0)} | "
                         f"{fmt(t['ratio'], 3)} |")
    lines += ["", "The gradient all-reduce (669,712 floats) between two simulated nodes, one rank "
              "each (network namespaces joined by a bridge, TCP; `jobs/ci/slurm-up.sh --nodes 2`, "
              "launched by `srun`), 200 calls per column and repetition in rotating blocks of 20:", ""]
    if two:
        lines += ["| raw MPI_Allreduce (us) | autoaccum (us) | with the watchdog (us) | raw / "
                  "autoaccum | without / with watchdog |", "|---|---|---|---|---|",
                  f"| {fmt(two['raw_us'], 0)} | {fmt(two['ours_us'], 0)} | "
                  f"{fmt(two['watched_us'], 0)} | {fmt(two['ratio'], 3)} | "
                  f"{fmt(two['watchdog_ratio'], 3)} |"]
    else:
        lines.append("Not measured in this run: the two-node cluster needs root and Slurm.")
    return "\n".join(lines) + "\n"


def bench_data(runner, quick, results):
    """Target 5: time waiting for data, from the run log, on Fashion-MNIST and a 2 GB file."""
    log("== data: waiting for the prefetcher, from the run log")
    out = {}
    fashion = os.path.join(ROOT, "data", "fashion-mnist-train.h5")
    if not os.path.exists(fashion):
        run([BIN, "import", "fashion-mnist", "--out", os.path.join(ROOT, "data")])
    steps = runner.train("auto", steps=120 if quick else 234, data=fashion,
                         extra=["--model", "cnn"], limit="12MiB")
    out["fashion-mnist cnn"] = wait_fraction(steps)
    big = os.path.join(ROOT, "build", "bench-data", "synth-2g.h5")
    if not os.path.exists(big):
        os.makedirs(os.path.dirname(big), exist_ok=True)
        run([BIN, "synth", "--out", big, "--rows", 2000000, "--features", 256, "--classes", 10,
             "--seed", 1])
    cold = drop_page_cache(big)
    steps = runner.train(64, steps=150 if quick else 400, data=big, global_batch=4096)
    out["2 GB synthetic, mlp 256-512-512-10, global batch 4096"] = wait_fraction(steps)
    out["2 GB synthetic, mlp 256-512-512-10, global batch 4096"]["cold_cache"] = cold
    for name, v in out.items():
        log(f"  {name}: waited {100 * v['fraction']:.3f}% of step time "
            f"(max one step {v['max_step_fraction'] * 100:.1f}%)")
    results["data"] = out


def wait_fraction(steps):
    wait, total = steps["data_wait_seconds"][1:], steps["step_seconds"][1:]
    return {"fraction": float(wait.sum() / total.sum()), "waited_seconds": float(wait.sum()),
            "step_seconds": float(total.sum()),
            "max_step_fraction": float((wait / total).max()), "steps": int(len(total))}


def drop_page_cache(path):
    """Evicts the file from the page cache when the kernel lets us (posix_fadvise DONTNEED)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def bench_existing(reps, results):
    """The earlier micro-benchmarks: fused OOM flag, slab reads."""
    log("== OOM flag fused into the gradient all-reduce vs a separate all-reduce")
    out = {}
    for floats in (1000, 669706):
        ratios = []
        for _ in range(max(1, reps // 2)):
            r = run(MPI + [os.path.join(BENCH, "bench_flag_fusion"), floats, 300])
            ratios.append(float(re.search(r"separate / fused = (\S+)", r.stdout).group(1)))
        out[str(floats)] = spread(ratios)
        log(f"  {floats} floats: separate/fused {statistics.median(ratios):.2f}")
    results["flag_fusion"] = out
    log("== slab reads vs sequential reads of the 2 GB file (page cache)")
    big = os.path.join(ROOT, "build", "bench-data", "synth-2g.h5")
    subprocess.run(["cat", big], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    slab = {}
    for batch in (512, 4096, 65536):
        ratios = []
        for _ in range(max(1, reps // 2)):
            r = run(MPI + [os.path.join(BENCH, "bench_slab_read"), big, batch, 5])
            ratios.append(float(re.search(r"slab / sequential bandwidth = (\S+)",
                                          r.stdout).group(1)))
        slab[str(batch)] = spread(ratios)
        log(f"  global batch {batch}: slab/sequential {statistics.median(ratios):.2f}")
    results["slab_read"] = slab


def render(results):
    t = results["throughput"]
    lines = [f"Generated by `tests/bench/run.sh` on {results['date']} ({results['machine']}); "
             f"{results['reps']} repetitions, interleaved; each cell is the median "
             "(min-max over repetitions). 2 ranks x 1 thread, OpenBLAS, MLP 784-512-512-10, "
             f"global batch {GLOBAL_BATCH}, {results['steps']} steps per run (the first 3 and "
             "any with OOM retries left out of the medians).", ""]
    lines += ["### 1. Against PyTorch DDP (target: autoaccum / DDP >= 1.5 at each micro-batch)",
              "", "| micro-batch | autoaccum samples/s | DDP samples/s | autoaccum / DDP | met |",
              "|---|---|---|---|---|"]
    for m, row in t.items():
        ok = "yes" if row["ratio"]["median"] >= 1.5 else "**no**"
        lines.append(f"| {m} | {fmt(row['autoaccum'], 0)} | {fmt(row['ddp'], 0)} | "
                     f"{fmt(row['ratio'])} | {ok} |")
    lines += ["", "Where the difference comes from: the same autoaccum run with plain `nn::Linear` "
              "layers (`AUTOACCUM_FUSED_LINEAR=0`, autograd writes each weight gradient and then "
              "adds it) against the fused weight-gradient accumulation (docs/design.md):", "",
              "| micro-batch | plain nn::Linear samples/s | fused / plain |", "|---|---|---|"]
    for m, row in t.items():
        lines.append(f"| {m} | {fmt(row['unfused'], 0)} | {fmt(row['fused_gain'])} |")
    peak = results["sgemm_peak_gflops"]
    lines += ["", "### 2. Model FLOP utilisation against sgemm (target: >= 0.80 from micro-batch "
              "64 up)", "",
              f"FLOPs per sample {FLOP_PER_SAMPLE:,} (3 GEMMs per layer, no input gradient for "
              f"the first); sgemm ceiling per rank, both ranks running at once: "
              f"{fmt(peak, 1)} GFLOP/s (best of the shapes below, slowest rank).", "",
              "| micro-batch | MFU | met |", "|---|---|---|"]
    for m, row in t.items():
        ok = "(report only)" if m == "8" else ("yes" if row["mfu"]["median"] >= 0.8 else "**no**")
        lines.append(f"| {m} | {fmt(row['mfu'])} | {ok} |")
    lines += ["", "sgemm shapes (last repetition), GFLOP/s per rank: " + ", ".join(
        f"{s['m']}x{s['k']}x{s['n']}: {s['gflops']:.1f}" for s in results["sgemm_last"]["shapes"])]
    a = results["auto"]
    lines += ["", "### 3. Automatic against hand-tuned (target: within 2%)", "",
              f"Memory limit {a['limit'] / 2**20:.2f} MiB per rank (between the peaks of "
              f"micro-batch 64 and 128); `--micro-batch auto` settles at {a['final']}. Fixed "
              "micro-batches tried under the same limit: " + ", ".join(
                  f"{m} ({'fits' if ok else 'OOM'})" for m, ok in a["fits"].items()) + ".", "",
              "| search | settled at | samples/s | best fixed m | its samples/s | auto / best "
              "(range) | met |",
              "|---|---|---|---|---|---|---|",
              f"| predict (default) | {a['final']} | {fmt(a['auto'], 0)} | {a['best_m']} | "
              f"{fmt(a['best_fixed'], 0)} | "
              f"{a['ratio']['median']:.3f} ({a['ratio']['min']:.3f}-{a['ratio']['max']:.3f}) | "
              f"{'yes' if a['ratio']['median'] >= 0.98 else '**no**'} |",
              f"| refine | {', '.join(map(str, a['refine_finals']))} | {fmt(a['refine'], 0)} | "
              f"{a['best_m']} | {fmt(a['best_fixed'], 0)} | "
              f"{a['refine_ratio']['median']:.3f} ({a['refine_ratio']['min']:.3f}-"
              f"{a['refine_ratio']['max']:.3f}) | "
              f"{'yes' if a['refine_ratio']['median'] >= 0.98 else '**no**'} |", "",
              "Every fixed size that fits, medians (min-max): " + "; ".join(
                  f"{m}: {fmt(v, 0)}" for m, v in a["fixed"].items()) + "." + (
                  f" Auto against fixed at its own size ({a['final']}): "
                  f"{a['ratio_same_m']:.3f}." if a["ratio_same_m"] else ""), "",
              "Search cost of `--micro-batch-search halve` (12-step runs; seconds spent in the attempts that ran out of memory, "
              "the run log's `retry_seconds`; a retry fails at its first micro-batch, so it costs "
              "about one micro-batch's forward pass):", "",
              "| final micro-batch | log2(512 / final) | retries | search seconds | normal step |",
              "|---|---|---|---|---|"]
    for final, s in results["search"].items():
        lines.append(f"| {s['final']} | {s['log2']} | {', '.join(map(str, s['retries']))} | "
                     f"{fmt(s['seconds'], 3)} | {s['step_seconds']:.3f} s |")
    ar = results["allreduce"]
    lines += ["", "### 4. Gradient synchronisation (target: >= 0.9 of raw MPI_Allreduce)", "",
              f"{ar['floats']:,} floats (gradients + slots), 200 interleaved calls per "
              "repetition, medians.", "",
              "| raw MPI_Allreduce GB/s | autoaccum GB/s | ratio | met |", "|---|---|---|---|",
              f"| {fmt(ar['raw_gbps'], 2)} | {fmt(ar['ours_gbps'], 2)} | {fmt(ar['ratio'], 3)} | "
              f"{'yes' if ar['ratio']['median'] >= 0.9 else '**no**'} |", "",
              "Exactly one gradient collective per optimizer step is asserted in the test suite "
              "(`mpi_trainer`, `ExactlyOneGradientCollectivePerStep`, at 2, 3 and 4 ranks)."]
    lines += ["", "### 5. Waiting for data (target: < 2% of step time)", "",
              "| data | steps | waited / step time | worst single step | met |",
              "|---|---|---|---|---|"]
    for name, v in results["data"].items():
        note = " (page cache dropped first)" if v.get("cold_cache") else ""
        lines.append(f"| {name}{note} | {v['steps']} | {100 * v['fraction']:.2g}% | "
                     f"{100 * v['max_step_fraction']:.1f}% | "
                     f"{'yes' if v['fraction'] < 0.02 else '**no**'} |")
    peaks = results["peak_bytes"]
    live = results["live_1000"]
    lines += ["", "### 6. Memory", "", "Peak live tensor bytes (largest over the ranks) against "
              "the micro-batch:", "", "| micro-batch | " + " | ".join(peaks) + " |",
              "|---" * (len(peaks) + 1) + "|",
              "| peak MiB | " + " | ".join(f"{v / 2**20:.2f}" for v in peaks.values()) + " |", "",
              f"Live bytes after each of {live['steps']} steps at micro-batch 64 (rank 0): step 0 "
              f"{live['first']:,}; steps 1-{live['steps'] - 1}: min {live['min']:,}, max "
              f"{live['max']:,} ({'flat' if live['min'] == live['max'] else 'not flat'}). "
              f"Peak after step 0 {live['peak_first']:,}, after the last {live['peak_last']:,}."]
    ff = results["flag_fusion"]
    lines += ["", "### OOM flag fused into the gradient all-reduce", "",
              "| gradient floats | separate / fused |", "|---|---|"]
    for n, s in ff.items():
        lines.append(f"| {int(n):,} | {fmt(s)} |")
    lines += ["", "### Slab reads against a plain sequential read (2 GB file, page cache)", "",
              "| global batch (slab per rank) | slab / sequential bandwidth |", "|---|---|"]
    for n, s in results["slab_read"].items():
        lines.append(f"| {int(n):,} ({int(n) // RANKS * 1024 // 1024} KiB) | {fmt(s)} |")
    return "\n".join(lines) + "\n"


def write_docs(text, section="bench"):
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as f:
        doc = f.read()
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    if begin not in doc:
        doc += f"\n{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path + ".tmp", "w") as f:
        f.write(head + begin + "\n" + text + end + tail)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="1 repetition, short runs")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument("--only", choices=["step", "lm", "mixed", "precision", "watchdog",
                                           "documents", "memory-model", "regrow", "checkpoint",
                                           "overlap", "shard", "hf", "optimizer"],
                        help="run one group (step: the MLP step against DDP, memory, the "
                             "automatic search, the all-reduce, data and the existing tables' "
                             "figures; lm: the language model; mixed: a slow rank and "
                             "unequal memory; precision: bf16 against fp32; watchdog: the "
                             "collective watchdog's cost) and rewrite its tables")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the tables from build/bench/results.json without running")
    args = parser.parse_args()
    if args.render_only:
        with open(os.path.join(ROOT, "build", "bench", "results.json")) as f:
            write_all(json.load(f))
        return
    if args.quick:
        args.reps, args.steps = 1, 12
    if os.geteuid() == 0:
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.time()
    results = {"date": datetime.date.today().isoformat(), "reps": args.reps,
               "steps": args.steps,
               "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
                          + cpu_name()}
    with tempfile.TemporaryDirectory(prefix="autoaccum-bench-") as work:
        if args.only == "lm":
            bench_lm(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "mixed":
            bench_mixed(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "precision":
            bench_precision(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "watchdog":
            bench_watchdog(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "documents":
            bench_documents(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "regrow":
            bench_regrow(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "checkpoint":
            bench_checkpoint(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "overlap":
            bench_overlap(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "shard":
            bench_shard(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "hf":
            bench_hf(work, max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "optimizer":
            bench_optimizer(max(1, min(args.reps, 3)), results)
            return finish(results, start, args)
        if args.only == "memory-model":
            bench_memory_model(work, 1, results)
            args.only = "memory_model"
            return finish(results, start, args)
        runner = Runner(work, args.steps)
        run([BIN, "synth", "--out", runner.data, "--rows", 16384, "--features", 784,
             "--classes", 10, "--seed", 1])
        bench_throughput(runner, args.reps, results)
        peaks = bench_memory(runner, results)
        bench_auto(runner, peaks, max(1, min(args.reps, 3)), results)
        bench_allreduce(max(1, min(args.reps, 3)), results)
        bench_data(runner, args.quick, results)
        bench_existing(args.reps, results)
        if args.only == "step":
            return finish(results, start, args)
        bench_lm(work, max(1, min(args.reps, 3)), results)
        bench_mixed(work, max(1, min(args.reps, 3)), results)
        bench_precision(work, max(1, min(args.reps, 3)), results)
        bench_watchdog(work, max(1, min(args.reps, 3)), results)
        bench_documents(work, max(1, min(args.reps, 3)), results)
        bench_memory_model(work, 1, results)
        bench_regrow(work, max(1, min(args.reps, 3)), results)
        bench_checkpoint(work, max(1, min(args.reps, 3)), results)
        bench_overlap(work, max(1, min(args.reps, 3)), results)
        bench_shard(work, max(1, min(args.reps, 3)), results)
        bench_hf(work, max(1, min(args.reps, 3)), results)
        bench_optimizer(max(1, min(args.reps, 3)), results)
    finish(results, start, args)


def finish(results, start, args):
    """Saves the raw figures (merged into an earlier results.json for --only) and the tables."""
    seconds = time.time() - start
    results["seconds"] = seconds
    for group in ("lm", "mixed", "precision", "watchdog", "documents", "memory_model",
                  "regrow", "checkpoint", "overlap", "shard", "hf", "optimizer"):
        if group in results:
            results[group]["meta"] = {k: results[k] for k in ("date", "machine")}
    path = os.path.join(ROOT, "build", "bench", "results.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if args.only and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # step's figures are the top level's (the first table); a group's are under its name.
        results = ({**old, **results} if args.only == "step"
                   else {**old, args.only: results[args.only]})
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    if not args.no_docs:
        write_all(results)
        log("docs/benchmarks.md updated")
    log(f"bench: {seconds / 60:.1f} minutes")  # this run's (an --only merges older figures)


def write_all(results):
    """Rewrites every generated section the results hold."""
    if "throughput" in results:
        text = render(results)
        print(text)
        write_docs(text)
    if "lm" in results:
        text = render_lm({**results, **results["lm"].get("meta", {}), "lm": results["lm"]})
        print(text)
        write_docs(text, "bench-lm")
    if "mixed" in results:
        text = render_mixed({**results, **results["mixed"].get("meta", {}),
                             "mixed": results["mixed"]})
        print(text)
        write_docs(text, "bench-mixed")
    if "precision" in results:
        text = render_precision({**results, **results["precision"].get("meta", {}),
                                 "precision": results["precision"]})
        print(text)
        write_docs(text, "bench-precision")
    if "watchdog" in results:
        text = render_watchdog({**results, **results["watchdog"].get("meta", {}),
                                "watchdog": results["watchdog"]})
        print(text)
        write_docs(text, "bench-watchdog")
    if "documents" in results:
        text = render_documents({**results, **results["documents"].get("meta", {}),
                                 "documents": results["documents"]})
        print(text)
        write_docs(text, "bench-documents")
    if "memory_model" in results:
        text = render_memory_model({**results, **results["memory_model"].get("meta", {}),
                                    "memory_model": results["memory_model"]})
        print(text)
        write_docs(text, "bench-memory-model")
    if "regrow" in results:
        text = render_regrow({**results, **results["regrow"].get("meta", {}),
                              "regrow": results["regrow"]})
        print(text)
        write_docs(text, "bench-regrow")
    if "checkpoint" in results:
        text = render_checkpoint({**results, **results["checkpoint"].get("meta", {}),
                                  "checkpoint": results["checkpoint"]})
        print(text)
        write_docs(text, "bench-checkpoint")
    if "overlap" in results:
        text = render_overlap({**results, **results["overlap"].get("meta", {}),
                               "overlap": results["overlap"]})
        print(text)
        write_docs(text, "bench-overlap")
    if "shard" in results:
        text = render_shard({**results, **results["shard"].get("meta", {}),
                             "shard": results["shard"]})
        print(text)
        write_docs(text, "bench-shard")
    if "optimizer" in results:
        text = render_optimizer({**results, **results["optimizer"].get("meta", {}),
                                 "optimizer": results["optimizer"]})
        print(text)
        write_docs(text, "bench-optimizer")
    if "hf" in results:
        text = render_hf({**results, **results["hf"].get("meta", {}), "hf": results["hf"]})
        print(text)
        write_docs(text, "bench-hf")


def cpu_name():
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
