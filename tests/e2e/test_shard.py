"""--shard optimizer: each rank keeps the optimizer state of a 1/W slice of the parameters,
the gradients are reduce-scattered (or, with --overlap on, reduced in buckets to the ranks
owning them during the last backward pass), then the step's control values all-reduced (so an
out-of-memory anywhere is agreed in the step's collectives), and the parameters all-gathered.
--shard gradients: each rank also keeps only its slice of the accumulated gradients; every
micro-batch's gradients go in buckets to their owners during its backward pass, every rank
sending as many micro-batches' buckets as the rank with the most (zeros where it has none).

Every sharded run here is compared with PyTorch's own computation of the same steps, or with
the same run unsharded (where PyTorch has no counterpart: clipping, bf16, out-of-memory
retries); parameters and optimizer state, read back by h5py, agree to 1e-6 of their norm
(reduce-scatter and all-reduce add the ranks' floats in other orders; at two ranks the sums
are the same and so are the runs, bit for bit). Checkpoints are one format whatever the
sharding: a run resumes sharded or not, on another number of ranks."""
import os
import unittest

import h5py
import numpy as np
import torch

import user_models as um
import test_documents as td
from harness import TempDirTest, autoaccum, digest, one_core

CLOSE = 1e-6  # of a tensor's norm


def stored(path):
    """Every parameter and optimizer state tensor of a checkpoint, by dataset name."""
    out = {}
    with h5py.File(path, "r") as f:
        for name in f.attrs["params_names"]:
            out[f"params/{name}"] = f[f"params/{name}"][()]
        for name in f.attrs.get("optimizer_names", []):
            out[f"optimizer/{name}"] = f[f"optimizer/{name}"][()]
        out["optimizer_step"] = np.array(f.attrs.get("optimizer_step", 0))
    return out


class Shard(TempDirTest):
    prefix = "autoaccum-shard-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = um.classification_data(96, (8,), 3, seed=5)
        cls.flat = um.write_data(cls.path("flat.h5"), cls.x, cls.y, classes=3)

    def train(self, ranks, model, *args, data=None, expect=0):
        r = autoaccum(ranks, "train", "--data", data or self.flat, "--model-file", model,
                      "--threads", 1, "--shuffle", "none", "--log-every", 0, *args, timeout=120)
        self.assertEqual(r.returncode, expect, r)
        return r

    def assert_same_run(self, a, b, bitwise=False):
        got, want = stored(a), stored(b)
        self.assertEqual(sorted(got), sorted(want))
        for name in want:
            if bitwise:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                continue
            scale = max(float(np.linalg.norm(want[name])), 1e-30)
            self.assertLess(float(np.linalg.norm(got[name] - want[name])) / scale, CLOSE, name)

    def test_users_models_equal_pytorch_and_the_unsharded_run(self):
        # Tied weights (one tensor, two names), a frozen part, BatchNorm (its statistics travel in
        # every slice): SGD with momentum and AdamW with weight decay, at 2, 3 (uneven slices) and
        # 4 ranks, against PyTorch; then with clipping, against the same run unsharded. (Not
        # AdamW with BatchNorm: the bias before it has a zero gradient, whose rounding noise
        # AdamW turns into steps of the learning rate, in PyTorch as here.)
        cases = [("tied", um.Tied, 3, "sgd"), ("frozen", um.PartlyFrozen, 4, "adamw"),
                 ("tied2", um.Tied, 2, "adamw"), ("bn", um.LinearBn(features=8), 3, "sgd")]
        for name, module, ranks, optimizer in cases:
            model = um.save_scripted(module, self.path(f"{name}.pt"))
            common = ["--global-batch", 48, "--steps", 3, "--micro-batch", 8, "--lr", 0.05,
                      "--momentum", 0.9, "--optimizer", optimizer, "--weight-decay", 0.1]
            sharded = self.path(f"{name}-sharded.h5")
            r = self.train(ranks, model, *common, "--shard", "optimizer", "--checkpoint", sharded)
            self.assertIn("gradient all-reduce sharded (--shard optimizer)", r.stdout)
            reference = um.reference_steps(model, self.x, self.y, world=ranks, micro_batch=8,
                                           global_batch=48, steps=3, lr=0.05, momentum=0.9,
                                           weight_decay=0.1, optimizer=optimizer)
            um.assert_close_to_model(self, sharded, reference)
            sliced = self.path(f"{name}-gradients.h5")
            r = self.train(ranks, model, *common, "--shard", "gradients", "--bucket-mib", 0.0001,
                           "--checkpoint", sliced)
            self.assertRegex(r.stdout, r"gradient all-reduce sharded \(--shard gradients\): "
                                       r"every micro-batch's gradients reduced to the ranks "
                                       r"owning each slice as its backward pass makes them, "
                                       r"\d+ bucket")
            um.assert_close_to_model(self, sliced, reference)
            with h5py.File(sharded, "r") as f:
                self.assertEqual(f.attrs["optimizer_kind"], optimizer)
                if optimizer == "adamw":
                    self.assertEqual(int(f.attrs["optimizer_step"]), 3)
            runs = {}
            # Sharded with buckets of 26 floats reduced to their owners during backward: a
            # bucket spans slices, a parameter crosses buckets' owners.
            for run, args in (("optimizer", ["--shard", "optimizer"]), ("none", []),
                              ("overlap", ["--shard", "optimizer", "--overlap", "on",
                                           "--bucket-mib", 0.0001]),
                              ("gradients", ["--shard", "gradients"])):
                runs[run] = self.path(f"{name}-clip-{run}.h5")
                r = self.train(ranks, model, *common, "--clip-grad-norm", 0.05, *args,
                               "--checkpoint", runs[run])
                if run == "overlap":
                    self.assertRegex(r.stdout, r"sharded \(--shard optimizer\): reduced to the "
                                               r"ranks owning each slice, overlapped with the "
                                               r"last backward pass: \d+ bucket")
            self.assert_same_run(runs["optimizer"], runs["none"], bitwise=ranks == 2)
            self.assert_same_run(runs["overlap"], runs["none"], bitwise=ranks == 2)
            # Summed over ranks every micro-batch, then over micro-batches: another order.
            self.assert_same_run(runs["gradients"], runs["none"])

    def test_an_out_of_memory_on_one_rank_bf16_and_per_rank_sizes_agree_as_unsharded(self):
        # Three ranks, bf16, automatic sizes per rank: rank 1 runs out of memory alone in the
        # middle of step 1; the sharded run halves exactly as the unsharded one and ends equal.
        model = um.save_scripted(um.ConvBnDropout(width=8, dropout=0.0), self.path("cbn.pt"))
        xi, yi = um.classification_data(192, (1, 8, 8), 4, seed=6)
        images = um.write_data(self.path("images.h5"), xi, yi, classes=4)
        runs, logs = {}, {}
        # Sharded, also with its buckets reduced during the last backward pass: the attempt
        # that ran out sends what its buckets hold, and the step's control values drop it.
        for run, args in (("optimizer", ["--shard", "optimizer"]), ("none", []),
                          ("overlap", ["--shard", "optimizer", "--overlap", "on",
                                       "--bucket-mib", 0.001]),
                          ("gradients", ["--shard", "gradients", "--bucket-mib", 0.001])):
            runs[run], logs[run] = self.path(f"oom-{run}.h5"), self.path(f"oom-{run}-log.h5")
            r = self.train(3, model, "--global-batch", 96, "--steps", 3, "--optimizer", "adamw",
                           "--lr", 0.01, "--precision", "bf16", "--micro-batch-scope", "rank",
                           "--micro-batch-search", "halve", "--inject-oom",
                           "rank=1,above=8,step=1", *args, "--checkpoint",
                           runs[run], "--run-log", logs[run], data=images)
            self.assertIn("rank 1 ran out of memory", r.stdout)
        self.assert_same_run(runs["optimizer"], runs["none"])
        self.assert_same_run(runs["overlap"], runs["none"])
        self.assert_same_run(runs["gradients"], runs["none"])
        sizes = {}
        for shard, log in logs.items():
            with h5py.File(log, "r") as f:
                sizes[shard] = {c: f[f"rank_sizes/{c}"][:].tolist()
                                for c in ("step", "rank", "micro_batch")}
        self.assertEqual(sizes["optimizer"], sizes["none"])
        self.assertEqual(sizes["overlap"], sizes["none"])
        self.assertEqual(sizes["gradients"], sizes["none"])

    def test_documents_at_three_ranks_equal_pytorch(self):
        docs = td.documents(72, seed=3)
        data = td.write_documents(self.path("docs.h5"), docs)
        model = um.save_scripted(td.DocLM(), self.path("doclm.pt"))
        initial = {n: p.detach().numpy().copy()
                   for n, p in torch.jit.load(model).named_parameters()}
        reference = td.reference(model, docs, 12, 3, 0.1)
        # Ranks cut their documents into different numbers of micro-batches.
        for shard in ("optimizer", "gradients"):
            checkpoint = self.path(f"docs-{shard}.h5")
            self.train(3, model, "--global-batch", 12, "--steps", 3, "--lr", 0.1, "--momentum",
                       0, "--memory-limit", "64MiB", "--shard", shard, "--checkpoint",
                       checkpoint, data=data)
            params = um.checkpoint_tensors(checkpoint)[0]
            self.assertLess(um.update_distance(params, reference, initial), td.EXACT, shard)

    def test_resumes_across_sharding_and_numbers_of_ranks_equal_an_uninterrupted_run(self):
        # 4 -> 2 and 2 -> 3 ranks sharded; sharded -> unsharded and back on the same 2 ranks
        # (bit for bit there: one file format, the same sums). No BatchNorm: its statistics
        # depend on how many ranks share a batch.
        model = um.save_scripted(um.Tied, self.path("resume.pt"))
        common = ["--global-batch", 48, "--micro-batch", 8, "--optimizer", "adamw", "--lr", 0.01,
                  "--weight-decay", 0.1, "--clip-grad-norm", 0.5]
        straight = self.path("straight.h5")
        self.train(2, model, *common, "--steps", 6, "--checkpoint", straight)
        for first, then, bitwise in (((4, "optimizer"), (2, "optimizer"), False),
                                     ((2, "optimizer"), (3, "optimizer"), False),
                                     ((2, "optimizer"), (2, "none"), True),
                                     ((2, "none"), (2, "optimizer"), True),
                                     ((4, "gradients"), (3, "optimizer"), False),
                                     ((2, "optimizer"), (2, "gradients"), False),
                                     ((3, "gradients"), (2, "none"), False)):
            name = f"{first[0]}{first[1]}-{then[0]}{then[1]}"
            checkpoint = self.path(f"{name}.h5")
            self.train(first[0], model, *common, "--steps", 3, "--shard", first[1],
                       "--checkpoint", checkpoint)
            r = self.train(then[0], model, *common, "--steps", 6, "--shard", then[1],
                           "--checkpoint", checkpoint, "--resume")
            self.assertIn("resumed at step 3", r.stdout, name)
            with self.subTest(name):
                self.assert_same_run(checkpoint, straight, bitwise=bitwise)

    def test_balanced_shares_with_a_slow_rank_equal_pytorch(self):
        # --balance throughput moves rows between ranks; the slice of parameters a rank owns
        # does not move with them. Three ranks, rank 2 twenty times slower: its share shrinks,
        # and the run equals PyTorch walking the rows each rank was given (the run log's).
        model = um.save_scripted(um.Tied, self.path("balance.pt"))
        initial = {n: p.detach().numpy().copy()
                   for n, p in torch.jit.load(model).named_parameters()}
        # With gradients sliced too, the ranks' numbers of micro-batches differ once balanced.
        for shard in ("optimizer", "gradients"):
            log, checkpoint = self.path(f"balance-{shard}-log.h5"), self.path(f"bal-{shard}.h5")
            r = self.train(3, model, "--global-batch", 48, "--steps", 6, "--micro-batch", 4,
                           "--lr", 0.05, "--momentum", 0.9, "--balance", "throughput",
                           "--balance-every", 2, "--inject-slow", "rank=2,factor=20", "--shard",
                           shard, "--run-log", log, "--checkpoint", checkpoint)
            self.assertIn("rows per rank", r.stdout)
            size_of, parts, _ = um.rank_sizes(log)
            rows = [hi - lo for lo, hi in parts(5)]
            self.assertLess(rows[2], 16, rows)
            reference = um.reference_steps(model, self.x, self.y, world=3, micro_batch=size_of,
                                           global_batch=48, steps=6, lr=0.05, momentum=0.9,
                                           parts=parts)
            params = um.checkpoint_tensors(checkpoint)[0]
            self.assertLess(um.update_distance(params, reference, initial), 1e-5, shard)

    def test_every_level_is_counted_and_the_memory_model_measures_the_count(self):
        # The built-in MLP 784-512x4-10 at 4 ranks, AdamW: the banner (sharded, or --dry-run)
        # counts the fixed bytes at every level, this run's marked; the run log keeps them and
        # `autoaccum log` prints them; the memory model's fixed part, measured by the
        # allocator, is within 3% of the run's count at every level.
        data = self.path("synth.h5")
        autoaccum(1, "synth", "--out", data, "--rows", 512, "--features", 784, "--classes", 10,
                  "--seed", 1)
        common = ["train", "--data", data, "--hidden", "512,512,512,512", "--optimizer", "adamw",
                  "--threads", 1, "--log-every", 0, "--global-batch", 64, "--steps", 2,
                  "--memory-limit", "256MiB", "--shuffle", "none"]
        levels = r"[\d.]+ [KMG]iB unsharded( \(this run\))?, [\d.]+ [KMG]iB with --shard " \
                 r"optimizer( \(this run\))?, [\d.]+ [KMG]iB with --shard gradients( \(this " \
                 r"run\))?$"
        for shard in ("none", "optimizer", "gradients"):
            log = self.path(f"count-{shard}.h5")
            runs = [["--run-log", log]] + ([["--dry-run"]] if shard == "none" else [])
            for extra in runs:
                r = autoaccum(4, *common, "--shard", shard, *extra, timeout=120)
                self.assertEqual(r.returncode, 0, r)
                if shard == "none" and "--dry-run" not in extra:
                    continue  # unsharded, the banner counts only under --dry-run
                banner = next(l for l in r.stdout.splitlines() if "fixed bytes per rank" in l)
                self.assertRegex(banner, levels)
                self.assertEqual(banner.count("(this run)"), 1, banner)
                self.assertIn(("unsharded" if shard == "none" else f"--shard {shard}") +
                              " (this run)", banner)
            with h5py.File(log, "r") as f:
                counted = max(int(b) for b in f.attrs["fixed_bytes_counted"].split(","))
                measured = float(np.max(f["memory_model/fixed_bytes"][:]))
                each = {k: float(f.attrs[f"fixed_bytes_counted_{k}"])
                        for k in ("unsharded", "optimizer", "gradients")}
            self.assertEqual(each["unsharded" if shard == "none" else shard], counted)
            self.assertLess(each["gradients"], each["optimizer"])
            self.assertLess(each["optimizer"], each["unsharded"])
            self.assertLess(abs(measured / counted - 1), 0.03, (shard, measured, counted))
            summary = autoaccum(1, "log", log).stdout
            line = next(l.strip() for l in summary.splitlines()
                        if l.strip().startswith("shard "))
            others = [("without sharding" if k == "none" else f"with --shard {k}")
                      for k in ("none", "optimizer", "gradients") if k != shard]
            self.assertRegex(line, rf"^shard {shard}: fixed bytes per rank [\d.]+ [KMG]iB"
                                   rf"( \(least [\d.]+ [KMG]iB\))?, "
                                   rf"[\d.]+ [KMG]iB {others[0]}, [\d.]+ [KMG]iB {others[1]}$")

    @one_core
    def test_bad_input_gets_one_line_and_one_rank_a_note(self):
        model = um.save_scripted(um.Tied(), self.path("bad.pt"))
        common = ["--global-batch", 48, "--steps", 1, "--micro-batch", 8]
        r = self.train(2, model, *common, "--shard", "all", expect=1)
        self.assertIn("--shard: 'all' is not one of none, optimizer, gradients",
                      um.error_lines(r)[0])
        # A checkpoint whose optimizer state is another optimizer's: one line, nothing written.
        checkpoint, log = self.path("adamw.h5"), self.path("adamw-log.h5")
        self.train(2, model, *common, "--optimizer", "adamw", "--shard", "optimizer",
                   "--checkpoint", checkpoint, "--run-log", log)
        before = {p: digest(p) for p in (checkpoint, log)}
        r = self.train(2, model, *common[:2], "--steps", 2, "--micro-batch", 8, "--optimizer",
                       "sgd", "--shard", "optimizer", "--checkpoint", checkpoint, "--run-log",
                       log, "--resume", expect=1)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn(f"'{checkpoint}': its optimizer state is adamw's, and this run's "
                      "--optimizer is sgd", errors[0])
        self.assertEqual({p: digest(p) for p in before}, before, "nothing written")
        # One rank: nothing to shard, and the run goes on.
        r = self.train(1, model, *common, "--shard", "optimizer")
        self.assertIn("--shard optimizer on one rank: nothing to shard", r.stdout)


if __name__ == "__main__":
    unittest.main()
