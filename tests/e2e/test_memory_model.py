"""Predicting what fits (--micro-batch-search predict, the default): the probe's prediction
against the largest micro-batch found by bisection with fixed runs under the same limit; the
probe leaves no trace (the trained model equals PyTorch's computation with the sizes the run
log records); per-rank limits predict per-rank sizes; a prediction that does not fit falls back
to halving on every rank; a limit that nothing fits under ends with exit 3 and one line."""
import math
import os
import re
import subprocess
import unittest

import h5py
import numpy as np
import torch

import user_models as um
from harness import TempDirTest, autoaccum, one_core, text

# ConvBnDropout(width=16) on 1x8x8 images takes about 32 KiB + 16 KiB per row of a micro-batch.
LIMIT = "1MiB"


class MemoryModel(TempDirTest):
    prefix = "autoaccum-memory-model-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = um.classification_data(512, (1, 8, 8), 4, seed=11)
        cls.data = um.write_data(cls.path("images.h5"), cls.x, cls.y, classes=4)
        # BatchNorm (statistics per micro-batch) and no dropout, so PyTorch can follow exactly.
        cls.model = um.save_scripted(um.ConvBnDropout(dropout=0.0, width=16),
                                     cls.path("cbn.pt"))

    def train(self, ranks, name, *args, expect=0):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        r = autoaccum(ranks, "train", "--data", self.data, "--model-file", self.model,
                      "--threads", 1, "--shuffle", "none", "--lr", 0.1, "--momentum", 0,
                      "--run-log", log, "--checkpoint", checkpoint, *args, timeout=120)
        self.assertEqual(r.returncode, expect, r)
        return r, log, checkpoint

    def fits(self, ranks, global_batch, size, limit):
        """Whether a fixed micro-batch of `size` trains a step under `limit` (a fixed size that
        runs out of memory ends the run with exit 3)."""
        r = autoaccum(ranks, "train", "--data", self.data, "--model-file", self.model,
                      "--threads", 1, "--shuffle", "none", "--global-batch", global_batch,
                      "--steps", 1, "--memory-limit", limit, "--micro-batch", size, timeout=120)
        self.assertIn(r.returncode, (0, 3), r)
        return r.returncode == 0

    def largest_by_bisection(self, ranks, global_batch, limit):
        low, high = 1, global_batch // ranks  # low fits (checked), high + 1 does not (or is past)
        self.assertTrue(self.fits(ranks, global_batch, low, limit))
        if self.fits(ranks, global_batch, high, limit):
            return high
        while high - low > 1:
            middle = (low + high) // 2
            if self.fits(ranks, global_batch, middle, limit):
                low = middle
            else:
                high = middle
        return low

    def memory_rows(self, log):
        with h5py.File(log, "r") as f:
            self.assertGreaterEqual(int(f.attrs["schema_version"]), 7)
            g = {c: f[f"memory_model/{c}"][:] for c in f["memory_model"]}
            ooms = len(f["oom/step"])
        return g, ooms

    def assert_equals_pytorch(self, world, log, checkpoint, global_batch, steps):
        size_of, parts, _ = um.rank_sizes(log)
        reference = um.reference_steps(self.model, self.x, self.y, world=world,
                                       micro_batch=size_of, global_batch=global_batch,
                                       steps=steps, lr=0.1, parts=parts)
        um.assert_close_to_model(self, checkpoint, reference)

    def test_prediction_is_close_below_the_largest_that_fits_and_leaves_no_trace(self):
        truth = self.largest_by_bisection(2, 256, LIMIT)
        r, log, checkpoint = self.train(2, "predict", "--global-batch", 256, "--steps", 3,
                                        "--memory-limit", LIMIT)
        g, ooms = self.memory_rows(log)
        self.assertEqual(ooms, 0, r.stdout)
        self.assertEqual(sorted(g["rank"]), [0, 1])
        for i in range(2):
            predicted = int(g["predicted"][i])
            # Never above what fits; within the 5% margin (and a row) of it.
            self.assertLessEqual(predicted, truth, (predicted, truth))
            self.assertGreaterEqual(predicted, int(0.93 * truth), (predicted, truth))
            self.assertLessEqual(int(g["micro_batch"][i]), predicted)
            self.assertGreater(g["fixed_bytes"][i], 0)
            self.assertGreater(g["bytes_per_unit"][i], 0)
            self.assertEqual(int(g["limit_bytes"][i]), 1 << 20)
        self.assertIn("memory model: rank 0: fixed", r.stdout)
        self.assertIn("/row; predicted", r.stdout)
        # The probe's micro-batches changed nothing: BatchNorm statistics, weights and the data
        # order are those of PyTorch walking the micro-batches the run log records.
        self.assert_equals_pytorch(2, log, checkpoint, 256, 3)
        summary = autoaccum(1, "log", log)
        self.assertEqual(summary.returncode, 0, summary)
        self.assertRegex(summary.stdout,
                         r"rank 0: predicted \d+ rows \(fixed [0-9.]+ [KM]iB \+ [0-9.]+ KiB/row\), "
                         r"used \d+, no out-of-memory")

    def test_per_rank_limits_predict_per_rank_sizes(self):
        r, log, checkpoint = self.train(2, "perrank", "--global-batch", 256, "--steps", 2,
                                        "--memory-limit", "600KiB,1MiB",
                                        "--micro-batch-scope", "rank")
        g, ooms = self.memory_rows(log)
        self.assertEqual(ooms, 0, r.stdout)
        order = np.argsort(g["rank"])
        predicted = [int(v) for v in g["predicted"][order]]
        used = [int(v) for v in g["micro_batch"][order]]
        self.assertLess(predicted[0], predicted[1])
        self.assertLess(used[0], used[1])
        self.assertEqual([int(v) for v in g["limit_bytes"][order]], [600 << 10, 1 << 20])
        self.assert_equals_pytorch(2, log, checkpoint, 256, 2)
        # Scope global: every rank starts at the smaller prediction.
        r, log, checkpoint = self.train(2, "global", "--global-batch", 256, "--steps", 2,
                                        "--memory-limit", "600KiB,1MiB")
        g, ooms = self.memory_rows(log)
        self.assertEqual(ooms, 0, r.stdout)
        self.assertEqual(len(set(int(v) for v in g["micro_batch"])), 1)
        self.assertEqual(int(g["micro_batch"][0]), used[0])

    @one_core
    def test_a_prediction_that_does_not_fit_halves_on_every_rank(self):
        # Rank 1 runs out above 20 rows whatever the model predicts: the prediction fails once,
        # every rank halves, and the result is still PyTorch's.
        r, log, checkpoint = self.train(2, "miss", "--global-batch", 256, "--steps", 2,
                                        "--memory-limit", LIMIT, "--inject-oom",
                                        "rank=1,above=20")
        g, _ = self.memory_rows(log)
        start = int(g["micro_batch"][0])
        self.assertGreater(start, 20)
        with h5py.File(log, "r") as f:
            oom = list(zip(f["oom/rank"][:], f["oom/micro_batch"][:], f["oom/next_micro_batch"][:]))
        self.assertEqual(oom[0], (1, start, start // 2))
        self.assertIn(f"rank 1 ran out of memory at micro-batch {start}", r.stdout)
        size_of, _, _ = um.rank_sizes(log)
        self.assertEqual(size_of(1, 0), size_of(1, 1))
        self.assertLessEqual(size_of(1, 1), 20)
        self.assert_equals_pytorch(2, log, checkpoint, 256, 2)

    def test_a_transient_out_of_memory_regrows_and_a_lasting_one_costs_one_more(self):
        # Rank 1 runs out above 20 rows at step 1 only (a transient peak), or at every step.
        # With --micro-batch-regrow 3 every rank tries the predicted size again three clean
        # steps after the lowering: the transient case goes back to it for good; the lasting
        # case runs out once more, returns to the size that ran and stays there.
        for name, injection in (("transient", "rank=1,above=20,step=1"),
                                ("lasting", "rank=1,above=20")):
            with self.subTest(name):
                r, log, checkpoint = self.train(2, f"regrow-{name}", "--global-batch", 256,
                                                "--steps", 9, "--memory-limit", LIMIT,
                                                "--micro-batch-regrow", 3,
                                                "--inject-oom", injection)
                g, _ = self.memory_rows(log)
                start = int(g["micro_batch"][0])
                self.assertGreater(start, 20)
                size_of, _, _ = um.rank_sizes(log)
                sizes = [size_of(s, 1) for s in range(9)]
                with h5py.File(log, "r") as f:
                    oom = list(zip(f["oom/step"][:], f["oom/micro_batch"][:]))
                    retries = list(f["steps/oom_retries"][:])
                small = sizes[-1] if name == "lasting" else sizes[2]
                self.assertLessEqual(small, 20)
                if name == "transient":
                    # Lowered at step 1, clean at 1, 2, 3, tried again at 4: fits from then on.
                    self.assertEqual(sizes, [start] + [small] * 3 + [start] * 5)
                    self.assertEqual({step for step, _ in oom}, {1})
                    self.assertIn(f"every rank tries micro-batch {start} again after 3 clean "
                                  "steps (--micro-batch-regrow) at step 4", r.stdout)
                else:
                    # Lowered at step 0, tried again at step 3: one more out-of-memory, then
                    # the size that ran for the rest of the run.
                    self.assertEqual(sizes, [small] * 9)
                    self.assertEqual({step for step, _ in oom}, {0, 3})
                    self.assertEqual([m for step, m in oom if step == 3], [start])
                    self.assertEqual(retries[3], 1)
                    self.assertEqual(sum(retries[4:]), 0)
                self.assert_equals_pytorch(2, log, checkpoint, 256, 9)

    @one_core
    def test_a_limit_nothing_fits_under_is_one_line_and_exit_3(self):
        for ranks in (1, 2):
            with self.subTest(ranks=ranks):
                r, log, _ = self.train(ranks, f"none{ranks}", "--global-batch", 64, "--steps", 2,
                                       "--memory-limit", "40KiB", expect=3)
                errors = um.error_lines(r)
                self.assertEqual(len(errors), 1, r)
                self.assertIn("while probing memory before the first step", errors[0])
                self.assertIn("(40.0 KiB per rank, peak", errors[0])
                self.assertIn("ran out of memory on a micro-batch of 2 rows", errors[0])
                self.assertNotIn("Traceback", r.stderr)
                with h5py.File(log, "r") as f:
                    self.assertEqual(text(f.attrs["status"]), "failed")

    @one_core
    def test_dry_run_predicts_and_writes_nothing(self):
        log = self.path("dry.h5")
        r = autoaccum(2, "train", "--data", self.data, "--model-file", self.model, "--threads", 1,
                      "--global-batch", 256, "--memory-limit", "600KiB,1MiB",
                      "--micro-batch-scope", "rank", "--dry-run", "--run-log", log, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        self.assertFalse(um.exists(log), "a dry run writes no run log")
        predicted = [int(v) for v in
                     re.findall(r"predicted (\d+) rows under", r.stdout)]
        self.assertEqual(len(predicted), 2, r.stdout)
        self.assertLess(predicted[0], predicted[1])
        self.assertIn(f"the largest global batch without accumulation is about {sum(predicted)} "
                      f"rows ({predicted[0]}, {predicted[1]} per rank)", r.stdout)
        self.assertNotIn("step 1/", r.stdout)
        # Without a limit there is nothing to predict against: said, exit 0.
        r = autoaccum(1, "train", "--data", self.data, "--model-file", self.model, "--threads", 1,
                      "--global-batch", 64, "--dry-run", timeout=120)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("dry run: nothing to predict against", r.stdout)
        r = autoaccum(1, "train", "--data", self.data, "--model-file", self.model,
                      "--global-batch", 64, "--dry-run", "--resume", "--checkpoint", log,
                      timeout=60)
        self.assertEqual(r.returncode, 1, r)
        self.assertEqual(um.error_lines(r), ["autoaccum: error: --dry-run trains nothing: drop --resume"])

    @one_core
    def test_a_model_that_refuses_the_size_memory_forces_is_one_line_and_exit_3(self):
        # BatchNorm1d cannot train on one row. Out-of-memory (injected above 1 row) halves
        # 8 -> 4 -> 2 -> 1 and the model then raises its own error: every rank ends with one
        # line naming the rank, the size, the size that ran out and the model's words, exit 3
        # (it was a TorchScript traceback from each rank and Open MPI's abort, exit 2). Per-rank
        # scope: only rank 1 goes down to 1 row, and it is named.
        x, y = um.classification_data(64, (6,), 3, seed=3)
        data = um.write_data(self.path("flat.h5"), x, y, classes=3)
        model = um.save_scripted(um.LinearBn(), self.path("linear-bn.pt"))
        for name, extra, who in (("global", ["--inject-oom", "rank=0,above=1"], "rank 0"),
                                 ("rank", ["--inject-oom", "rank=1,above=1",
                                           "--micro-batch-scope", "rank"], "rank 1")):
            with self.subTest(scope=name):
                log = self.path(f"refused-{name}.h5")
                r = autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                              "--global-batch", 16, "--steps", 2, "--micro-batch-search",
                              "halve", "--run-log", log, *extra, timeout=120)
                self.assertEqual(r.returncode, 3, r)
                errors = um.error_lines(r)
                self.assertEqual(len(errors), 1, r)
                self.assertIn(f"{who}: the model fails on a micro-batch of 1 row (out of memory "
                              "at 2", errors[0])
                self.assertIn("Expected more than 1 value per channel when training", errors[0])
                self.assertIn("raise --memory-limit", errors[0])
                self.assertNotIn("Traceback", r.stderr + r.stdout)
                self.assertNotIn("MPI_ABORT", r.stderr + r.stdout)
                with h5py.File(log, "r") as f:
                    self.assertEqual(text(f.attrs["status"]), "failed")
                    self.assertEqual(sorted(set(int(s) for s in f["oom/step"][:])), [0])
        # A model error with no out-of-memory before it is the model's own failure, as before.
        r = autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                      "--global-batch", 2, "--steps", 1, timeout=120)
        self.assertNotIn(r.returncode, (0, 3), r)
        # The memory probe too (predict, under a limit): a model that takes 2 rows (the setup
        # trial's) or a multiple of 8, the probe's first size (8 rows, a sixteenth of the share)
        # runs out (injected above 4) and the halved 4 is refused: the same one line and exit 3
        # (it was each rank's error and Open MPI's abort).
        x, y = um.classification_data(256, (6,), 3, seed=4)
        data = um.write_data(self.path("flat256.h5"), x, y, classes=3)

        class GroupsOfEight(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(6, 3)

            def forward(self, x):
                if x.size(0) > 2 and x.size(0) % 8 != 0:
                    raise ValueError("rows must be 2 or a multiple of 8")
                return self.fc(x)

        model = um.save_scripted(GroupsOfEight(), self.path("groups-of-eight.pt"))
        log = self.path("refused-probe.h5")
        r = autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                      "--global-batch", 256, "--steps", 2, "--memory-limit", "1GiB",
                      "--inject-oom", "rank=0,above=4", "--run-log", log, timeout=120)
        self.assertEqual(r.returncode, 3, r)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn("rank 0: the model fails on a micro-batch of 4 rows (out of memory at 8",
                      errors[0])
        self.assertIn("rows must be 2 or a multiple of 8", errors[0])
        self.assertNotIn("Traceback", r.stderr + r.stdout)
        self.assertNotIn("MPI_ABORT", r.stderr + r.stdout)

    @one_core
    def test_autoaccums_own_error_at_a_smaller_size_is_not_taken_for_a_refusal(self):
        # The model's (loss_sum, weight) has a weight of two values at one row: autoaccum's own
        # check refuses that output. Reached at 1 row after out-of-memory halved 8 -> 4 -> 2 -> 1,
        # it is still that error (exit 1, its own words), not "the model fails on a micro-batch
        # of 1 row ... raise --memory-limit" (exit 3), which it was taken for before.
        class BadWeightAtOneRow(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(6, 3)

            def forward(self, x, y):
                loss = torch.nn.functional.cross_entropy(self.fc(x), y, reduction="sum")
                if x.size(0) < 2:
                    return loss, torch.ones(2)
                return loss, torch.tensor(float(x.size(0)))

        x, y = um.classification_data(64, (6,), 3, seed=5)
        data = um.write_data(self.path("own-error.h5"), x, y, classes=3)
        model = um.save_scripted(BadWeightAtOneRow(), self.path("bad-weight.pt"))
        r = autoaccum(2, "train", "--data", data, "--model-file", model, "--loss", "model",
                      "--threads", 1, "--global-batch", 16, "--steps", 2, "--micro-batch-search",
                      "halve", "--inject-oom", "rank=0,above=1", timeout=120)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("all 2 ranks continue at 1", r.stdout)
        self.assertIn("--loss model: forward(inputs..., targets) returned a Tuple", r.stderr)
        self.assertNotIn("the model fails on a micro-batch", r.stdout + r.stderr)

    @one_core
    def test_halve_keeps_the_old_search(self):
        r, log, _ = self.train(2, "halve", "--global-batch", 256, "--steps", 2,
                               "--memory-limit", LIMIT, "--micro-batch-search", "halve")
        self.assertNotIn("memory model", r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(len(f["memory_model/step"]), 0)
            self.assertEqual(int(f["oom/micro_batch"][0]), 128)


try:
    import torchvision
except ImportError:  # python3-torchvision (jobs/setup.sh installs it)
    torchvision = None


@unittest.skipUnless(torchvision, "python3-torchvision is not installed")
class OptimizerStepEdge(TempDirTest):
    """Issue 55: no run whose set-up said it fits runs out of memory in its optimizer step. The
    per-rank limit walks down through the edge, at 2 ranks, unsharded and sharded, for AdamW
    with weight decay and clipping (its temporaries: the step's pieces) and for SGD with
    momentum (none): the edge (12, 9 and 8 MiB here) is bisected to 1/2 MiB, then the limits
    1/16 and 1/4 MiB above the last one refused run.
    Every run either trains its steps (exit 0, micro-batch search included) or is refused
    before its first step (exit 3, one line); none ends in the optimizer step."""
    prefix = "autoaccum-optimizer-edge-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = cls.path("synth.h5")
        r = autoaccum(1, "synth", "--out", cls.data, "--rows", 256, "--features", 784,
                      "--classes", 10, "--seed", 3)
        assert r.returncode == 0, r

    def trains(self, kib, *args):
        r = autoaccum(2, "train", "--data", self.data, "--model", "mlp", "--hidden", "512,512",
                      "--global-batch", 64, "--steps", 1, "--threads", 1, "--log-every", 0,
                      "--memory-limit", f"{kib}KiB", *args, timeout=120)
        said = r.stdout + r.stderr
        self.assertNotIn("in the optimizer step", said, f"{kib} KiB {args}")
        self.assertIn(r.returncode, (0, 3), said)
        if r.returncode == 3:
            errors = um.error_lines(r)
            self.assertTrue(errors, said)
            self.assertTrue(all(line == errors[0] for line in errors), said)
            self.assertRegex(errors[0], r"do not fit in memory|does not fit", said)
        return r.returncode == 0

    @one_core
    def test_every_run_that_passes_set_up_takes_its_optimizer_steps(self):
        # Below the parameters themselves (2.6 MiB): refused as the model is built, in one line.
        self.assertFalse(self.trains(2048))
        errors = um.error_lines(autoaccum(2, "train", "--data", self.data, "--model", "mlp",
                                          "--hidden", "512,512", "--steps", 1, "--memory-limit",
                                          "2MiB"))
        self.assertEqual(len(set(errors)), 1, errors)
        self.assertIn("the model's parameters do not fit in memory (limit 2.0 MiB per rank); "
                      "raise --memory-limit", errors[0])
        cases = [("adamw", ["--optimizer", "adamw", "--weight-decay", 0.1, "--clip-grad-norm",
                            1.0, "--lr", 0.001]),
                 ("sgd", ["--optimizer", "sgd", "--momentum", 0.9, "--lr", 0.01])]
        for name, args, shard in [(*cases[0], "none"), (*cases[0], "optimizer"),
                                  (*cases[1], "none")]:
            with self.subTest(optimizer=name, shard=shard):
                run = lambda kib: self.trains(kib, *args, "--shard", shard)
                low, high = 4096, 16384  # KiB: low is refused, high trains
                self.assertFalse(run(low))
                self.assertTrue(run(high))
                while high - low > 512:
                    middle = (low + high) // 2
                    if run(middle):
                        high = middle
                    else:
                        low = middle
                for above in (64, 256):
                    run(low + above)


class TorchvisionResNet(TempDirTest):
    """A model nobody here wrote: torchvision's resnet18 (11.2M parameters, BatchNorm), scripted,
    trained with AdamW on 3x32x32 images."""
    prefix = "autoaccum-memory-model-resnet-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        net = torchvision.models.resnet18(num_classes=10)
        cls.model = cls.path("resnet18.pt")
        torch.jit.script(net).save(cls.model)
        cls.x, cls.y = um.classification_data(64, (3, 32, 32), 10, seed=5)
        cls.data = um.write_data(cls.path("images.h5"), cls.x, cls.y, classes=10)

    def train(self, name, limit, *args, expect=0):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        r = autoaccum(2, "train", "--data", self.data, "--model-file", self.model, "--threads", 1,
                      "--global-batch", 64, "--steps", 2, "--shuffle", "none", "--optimizer",
                      "adamw", "--lr", 0.001, "--memory-limit", limit, "--run-log", log,
                      "--checkpoint", checkpoint, *args, timeout=240)
        self.assertEqual(r.returncode, expect, r)
        return r, log, checkpoint

    @one_core
    def test_state_that_leaves_no_room_is_one_line_and_exit_3(self):
        # Parameters, gradients and AdamW's two moments: 4 x 42.7 MB of the 180 MiB.
        r, log, _ = self.train("full", "180MiB", expect=3)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn("ran out of memory on a micro-batch of 2 rows while probing", errors[0])
        self.assertIn("--optimizer sgd", errors[0])
        self.assertNotIn("Expected more than 1 value per channel", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_prediction_without_out_of_memory_equals_pytorch(self):
        # The state and attempt overhead depend on the CPU's convolution kernels: about 189 MiB
        # with AVX-512 (LibTorch 1.13), 216 MiB with AVX2 alone (AMD EPYC), + 432 KiB per row on
        # both. A roomy run measures them here; the limit then leaves room for 28 rows.
        _, log, _ = self.train("calibrate", "400MiB")
        with h5py.File(log, "r") as f:
            fixed = float(f["memory_model/fixed_bytes"][:].max())
            per_row = float(f["memory_model/bytes_per_unit"][:].max())
        limit = f"{math.ceil((fixed + 28 * per_row) / 2**20)}MiB"
        r, log, checkpoint = self.train("room", limit)
        with h5py.File(log, "r") as f:
            self.assertEqual(len(f["oom/step"]), 0, r.stdout)
            predicted = int(f["memory_model/predicted"][:].min())
            used = int(f["memory_model/micro_batch"][:].min())
        # With AVX-512 that limit is 201 MiB: 26 rows fit in 200 MiB (fixed runs: 26 trains, 28
        # runs out); the line from the state through one 2-row measurement alone would have
        # said 2. The predicted size itself trains.
        self.assertGreaterEqual(predicted, 12, r.stdout)
        self.train("at-predicted", limit, "--micro-batch", predicted)
        size_of, parts, _ = um.rank_sizes(log)
        self.assertEqual(size_of(0, 0), used)
        reference = um.reference_steps(self.model, self.x, self.y, world=2, micro_batch=size_of,
                                       global_batch=64, steps=2, lr=0.001, optimizer="adamw",
                                       parts=parts)
        # Relative to the update, over all 11.2M parameters: AdamW divides by the root of the
        # second moment, so elements whose gradient is near zero differ by up to lr x rounding
        # (33 of conv1's 9408 by 1e-4 on Debian 13; below 1e-3 overall on LibTorch 1.13 and
        # 2.6, 4.6e-3 on the CUDA wheel's 2.11, whose CPU convolutions round differently with
        # the reference's thread count); a wrong micro-batch would be ~1e-1.
        initial = {n: p.detach().numpy() for n, p in torch.jit.load(self.model).named_parameters()}
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, reference, initial), 1e-2)


class TokenBudgets(TempDirTest):
    """Documents: the prediction is a budget of padded tokens (the GPT on Debian's fortunes)."""
    prefix = "autoaccum-memory-model-docs-"

    @unittest.skipUnless(os.path.isdir("/usr/share/games/fortunes"),
                         "Debian's fortunes package is not installed")
    @one_core
    def test_gpt_budget_predicted_below_the_share_without_out_of_memory_equals_pytorch(self):
        import test_documents as td
        data, docs, model, initial = td.fortune_documents_and_gpt(self)
        log, checkpoint = self.path("gpt.h5"), self.path("gpt.ckpt.h5")
        steps = 12
        r = autoaccum(2, "train", "--data", f"{data}/text-docs-train.h5", "--model-file", model,
                      "--global-batch", 24, "--steps", steps, "--shuffle", "none", "--lr", 0.1,
                      "--momentum", 0, "--threads", 1, "--memory-limit", "2MiB",
                      "--run-log", log, "--checkpoint", checkpoint, timeout=180)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("/token; predicted", r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(len(f["oom/step"]), 0, r.stdout)
            budgets = f["memory_model/micro_batch"][:]
            self.assertGreater(f["memory_model/bytes_per_unit"][0], 0)
            padded = f["steps/padded_tokens"][:]
        # Below a rank's whole share (12 documents of up to 48 tokens), above one document.
        self.assertTrue(all(48 <= b < 12 * 48 for b in budgets), budgets)
        self.assertGreater(int(padded.max()), 0)
        ref = td.reference(model, docs, 24, steps, 0.1)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, initial), td.EXACT)

    @unittest.skipUnless(os.path.isdir("/usr/share/games/fortunes"),
                         "Debian's fortunes package is not installed")
    def test_a_resumed_run_cuts_documents_as_the_uninterrupted_one_bit_for_bit(self):
        # The checkpoint keeps every rank's memory model and how a budget is spent across
        # widths (data::WidthCost, fixed at the probe), so a resumed run cuts the same
        # micro-batches and ends with the same parameters as one that was never stopped.
        import test_documents as td
        data, _, model, _ = td.fortune_documents_and_gpt(self)

        def train(name, steps, *args):
            log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
            r = autoaccum(2, "train", "--data", f"{data}/text-docs-train.h5", "--model-file",
                          model, "--global-batch", 24, "--steps", steps, "--shuffle", "batch",
                          "--lr", 0.1, "--momentum", 0, "--threads", 1, "--memory-limit",
                          "2MiB", "--run-log", log, "--checkpoint", self.path(f"{name}.ckpt.h5"),
                          *td.PIECES, *args, timeout=180)  # two fresh starts: cut from the data
            self.assertEqual(r.returncode, 0, r)
            return log, checkpoint

        whole_log, whole = train("whole", 10)
        train("cut", 5)
        cut_log, cut = train("cut", 10, "--resume")
        with h5py.File(whole, "r") as f:
            ratios = f["memory_model/ranks"][:, 2]
            points = f["memory_model/points"][:]
        self.assertEqual(len(ratios), 2)
        self.assertEqual(sorted(set(points[:, 0].astype(int))), [0, 1])  # both ranks' models
        self.assertTrue(all(points[:, 3] > 0))  # peaks in bytes
        with h5py.File(whole_log, "r") as a, h5py.File(cut_log, "r") as b:
            self.assertEqual(list(b["steps/step"][:]), list(range(10)))
            self.assertEqual(list(a["steps/padded_tokens"][:]), list(b["steps/padded_tokens"][:]))
            self.assertEqual(len(a["oom/step"]), 0)
            self.assertEqual(len(b["oom/step"]), 0)
        p, q = um.checkpoint_tensors(whole)[0], um.checkpoint_tensors(cut)[0]
        for name in p:
            np.testing.assert_array_equal(p[name], q[name], err_msg=name)


    @unittest.skipUnless(os.path.isdir("/usr/share/games/fortunes"),
                         "Debian's fortunes package is not installed")
    def test_token_cost_memory_gives_short_documents_more_tokens_and_equals_pytorch(self):
        # An attention-heavy GPT (8 heads of width 4: the scores, rows x heads x width^2, are
        # most of a long document's memory) on every fortune up to 256 bytes (lengths 1-256,
        # median 110). With --token-cost memory the probe adds a micro-batch of shorter
        # documents, the memory model fits bytes per rows x width^2, and a piece of short
        # documents takes more padded tokens than the budget: fewer micro-batches than the same
        # budget counted flat, no out-of-memory, and the same parameters as PyTorch.
        import test_documents as td
        data = self.path("docs")
        r = autoaccum(1, "import", "text", "--documents", "fortune", "--max-length", 256,
                      "--out", data, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(f"{data}/text-docs-train.h5", "r") as f:
            tokens, offsets = f["tokens"][:].astype(np.int64), f["offsets"][:]
        docs = [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        model = self.path("gpt.pt")
        subprocess.run(["/usr/bin/python3", os.path.join(td.ROOT, "jobs/models/gpt.py"), "--out",
                        model, "--context", "256", "--width", "32", "--layers", "2", "--heads",
                        "8", "--dropout", "0"], check=True, capture_output=True)
        initial = {n: p.detach().numpy().copy()
                   for n, p in torch.jit.load(model).named_parameters()}
        steps, batch = 4, 64

        def train(name, *args):
            log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
            r = autoaccum(2, "train", "--data", f"{data}/text-docs-train.h5", "--model-file",
                          model, "--global-batch", batch, "--steps", steps, "--shuffle", "none",
                          "--lr", 0.1, "--momentum", 0, "--threads", 1, "--memory-limit",
                          "24MiB", "--run-log", log, "--checkpoint", checkpoint, *td.PIECES,
                          *args, timeout=240)  # pieces counted: the cut from the data alone
            self.assertEqual(r.returncode, 0, r)
            with h5py.File(log, "r") as f:
                self.assertEqual(len(f["oom/step"]), 0, r.stdout)
                steps_of = {k: f["steps"][k][:] for k in ("micro_batch", "accumulation")}
                per_square = f["memory_model/bytes_per_square"][:]
            return r, steps_of, per_square, checkpoint

        r, memory, per_square, checkpoint = train("memory", "--token-cost", "memory")
        self.assertIn("spent by memory", r.stdout)
        self.assertIn("probed with 3 attempts", r.stdout)
        self.assertTrue(all(per_square > 0), per_square)
        with h5py.File(checkpoint, "r") as f:
            self.assertTrue(all(f["memory_model/ranks"][:, 2] > 0))  # the width-cost ratio
        budget = int(memory["micro_batch"][0])
        self.assertTrue(all(memory["micro_batch"] == budget))
        # The same budget counted flat (fixed, as --token-cost flat spends it).
        _, flat, _, _ = train("flat", "--micro-batch-tokens", budget)
        self.assertLess(int(memory["accumulation"].sum()), int(flat["accumulation"].sum()))
        ref = td.reference(model, docs, batch, steps, 0.1)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, initial), td.EXACT)
        # Refused where it cannot apply: a fixed budget.
        r = autoaccum(1, "train", "--data", f"{data}/text-docs-train.h5", "--model-file", model,
                      "--steps", 1, "--micro-batch-tokens", 1024, "--token-cost", "memory")
        self.assertEqual(r.returncode, 1, r)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn("--token-cost memory", errors[0])
        self.assertIn("--micro-batch-tokens 1024 is fixed", errors[0])


if __name__ == "__main__":
    unittest.main()
