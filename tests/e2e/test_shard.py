"""--shard optimizer: each rank keeps the optimizer state of a 1/W slice of the parameters,
the gradients are reduce-scattered (or, with --overlap on, reduced in buckets to the ranks
owning them during the last backward pass), then the step's control values all-reduced (so an
out-of-memory anywhere is agreed in the step's collectives), and the parameters all-gathered.

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
            with h5py.File(sharded, "r") as f:
                self.assertEqual(f.attrs["optimizer_kind"], optimizer)
                if optimizer == "adamw":
                    self.assertEqual(int(f.attrs["optimizer_step"]), 3)
            runs = {}
            # Sharded with buckets of 26 floats reduced to their owners during backward: a
            # bucket spans slices, a parameter crosses buckets' owners.
            for run, args in (("optimizer", ["--shard", "optimizer"]), ("none", []),
                              ("overlap", ["--shard", "optimizer", "--overlap", "on",
                                           "--bucket-mib", 0.0001])):
                runs[run] = self.path(f"{name}-clip-{run}.h5")
                r = self.train(ranks, model, *common, "--clip-grad-norm", 0.05, *args,
                               "--checkpoint", runs[run])
                if run == "overlap":
                    self.assertRegex(r.stdout, r"sharded \(--shard optimizer\): reduced to the "
                                               r"ranks owning each slice, overlapped with the "
                                               r"last backward pass: \d+ bucket")
            self.assert_same_run(runs["optimizer"], runs["none"], bitwise=ranks == 2)
            self.assert_same_run(runs["overlap"], runs["none"], bitwise=ranks == 2)

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
                                       "--bucket-mib", 0.001])):
            runs[run], logs[run] = self.path(f"oom-{run}.h5"), self.path(f"oom-{run}-log.h5")
            r = self.train(3, model, "--global-batch", 96, "--steps", 3, "--optimizer", "adamw",
                           "--lr", 0.01, "--precision", "bf16", "--micro-batch-scope", "rank",
                           "--micro-batch-search", "halve", "--inject-oom",
                           "rank=1,above=8,step=1", *args, "--checkpoint",
                           runs[run], "--run-log", logs[run], data=images)
            self.assertIn("rank 1 ran out of memory", r.stdout)
        self.assert_same_run(runs["optimizer"], runs["none"])
        self.assert_same_run(runs["overlap"], runs["none"])
        sizes = {}
        for shard, log in logs.items():
            with h5py.File(log, "r") as f:
                sizes[shard] = {c: f[f"rank_sizes/{c}"][:].tolist()
                                for c in ("step", "rank", "micro_batch")}
        self.assertEqual(sizes["optimizer"], sizes["none"])
        self.assertEqual(sizes["overlap"], sizes["none"])

    def test_documents_at_three_ranks_equal_pytorch(self):
        docs = td.documents(72, seed=3)
        data = td.write_documents(self.path("docs.h5"), docs)
        model = um.save_scripted(td.DocLM(), self.path("doclm.pt"))
        initial = {n: p.detach().numpy().copy()
                   for n, p in torch.jit.load(model).named_parameters()}
        checkpoint = self.path("docs-sharded.h5")
        self.train(3, model, "--global-batch", 12, "--steps", 3, "--lr", 0.1, "--momentum", 0,
                   "--memory-limit", "64MiB", "--shard", "optimizer", "--checkpoint", checkpoint,
                   data=data)
        reference = td.reference(model, docs, 12, 3, 0.1)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, reference, initial), td.EXACT)

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
                                     ((2, "none"), (2, "optimizer"), True)):
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
        log, checkpoint = self.path("balance-log.h5"), self.path("balance.h5")
        r = self.train(3, model, "--global-batch", 48, "--steps", 6, "--micro-batch", 4,
                       "--lr", 0.05, "--momentum", 0.9, "--balance", "throughput",
                       "--balance-every", 2, "--inject-slow", "rank=2,factor=20", "--shard",
                       "optimizer", "--run-log", log, "--checkpoint", checkpoint)
        self.assertIn("rows per rank", r.stdout)
        size_of, parts, _ = um.rank_sizes(log)
        rows = [hi - lo for lo, hi in parts(5)]
        self.assertLess(rows[2], 16, rows)
        reference = um.reference_steps(model, self.x, self.y, world=3, micro_batch=size_of,
                                       global_batch=48, steps=6, lr=0.05, momentum=0.9,
                                       parts=parts)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, reference, initial), 1e-5)

    @one_core
    def test_bad_input_gets_one_line_and_one_rank_a_note(self):
        model = um.save_scripted(um.Tied(), self.path("bad.pt"))
        common = ["--global-batch", 48, "--steps", 1, "--micro-batch", 8]
        r = self.train(2, model, *common, "--shard", "all", expect=1)
        self.assertIn("--shard: 'all' is not one of none, optimizer", um.error_lines(r)[0])
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
