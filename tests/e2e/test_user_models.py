"""Users' own TorchScript models end to end, each result against PyTorch's own computation:
out-of-memory inside the scripted model, tied and frozen weights, modes, BatchNorm buffers,
dropout streams, the setup trial's one-line errors, outputs owned by one job, export."""
import os
import re
import subprocess
import time
import unittest
from typing import Dict

import h5py
import numpy as np
import torch

import user_models as um
from harness import BIN, MPIEXEC, TempDirTest, autoaccum, kill_session, mpi_env, one_core, signal_session


class UserModels(TempDirTest):
    prefix = "autoaccum-user-models-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        x, y = um.classification_data(96, (8,), 3, seed=5)
        cls.x, cls.y = x, y
        cls.data = um.write_data(cls.path("flat.h5"), x, y, classes=3)
        xi, yi = um.classification_data(128, (1, 8, 8), 4, seed=6)
        cls.xi, cls.yi = xi, yi
        cls.images = um.write_data(cls.path("images.h5"), xi, yi, classes=4)

    def train(self, ranks, model, data, *args, timeout=120):
        return autoaccum(ranks, "train", "--data", data, "--model-file", model, "--threads", 1,
                         "--shuffle", "none", *args, timeout=timeout)

    # --- out-of-memory inside the scripted model ------------------------------------------

    def test_oom_inside_the_scripted_backward_halves_and_equals_pytorch(self):
        model = um.save_scripted(um.ConvBnDropout(dropout=0.0, width=16), self.path("cbn.pt"))
        checkpoint = self.path("cbn-auto.h5")
        # 128 rows on 2 ranks: 64 each; the limit holds the forward of 64 rows but not its
        # backward (found by the phase autoaccum reports).
        r = self.train(2, model, self.images, "--global-batch", 128, "--steps", 1, "--lr", 0.1,
                       "--momentum", 0, "--memory-limit", "500KiB", "--checkpoint", checkpoint,
                       "--micro-batch-search", "halve")
        self.assertEqual(r.returncode, 0, r)
        halvings = re.findall(r"ran out of memory at micro-batch (\d+) in (\w+)", r.stdout)
        self.assertGreaterEqual(len(halvings), 2, r.stdout)
        self.assertIn("backward", [where for _, where in halvings], r.stdout)
        with h5py.File(checkpoint, "r") as f:
            final = int(f.attrs["micro_batch"])
        self.assertLess(final, 64)
        reference = um.reference_steps(model, self.xi, self.yi, world=2, micro_batch=final,
                                       global_batch=128, steps=1, lr=0.1)
        um.assert_close_to_model(self, checkpoint, reference)

    def test_oom_run_equals_a_fixed_run_at_the_final_size_bit_for_bit(self):
        model = um.save_scripted(um.ConvBnDropout(width=16), self.path("cbnd.pt"))
        auto, fixed = self.path("cbnd-auto.h5"), self.path("cbnd-fixed.h5")
        r = self.train(3, model, self.images, "--global-batch", 96, "--steps", 3,
                       "--memory-limit", "400KiB", "--checkpoint", auto,
                       "--micro-batch-search", "halve")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("ran out of memory", r.stdout)
        with h5py.File(auto, "r") as f:
            final = int(f.attrs["micro_batch"])
        r = self.train(3, model, self.images, "--global-batch", 96, "--steps", 3,
                       "--micro-batch", final, "--checkpoint", fixed)
        self.assertEqual(r.returncode, 0, r)
        a, b = um.checkpoint_tensors(auto), um.checkpoint_tensors(fixed)
        for kind in (0, 1):
            for name in a[kind]:
                np.testing.assert_array_equal(a[kind][name], b[kind][name], err_msg=name)

    # --- parameters: tied and frozen --------------------------------------------------------

    @one_core
    def test_tied_weights_step_once(self):
        model = um.save_scripted(um.Tied, self.path("tied.pt"))
        checkpoint = self.path("tied.h5")
        r = self.train(2, model, self.data, "--global-batch", 48, "--steps", 2, "--lr", 0.1,
                       "--momentum", 0.9, "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("(0 frozen, 64 shared)", r.stdout)
        reference = um.reference_steps(model, self.x, self.y, world=2, micro_batch=24,
                                       global_batch=48, steps=2, lr=0.1, momentum=0.9)
        um.assert_close_to_model(self, checkpoint, reference)
        params, _ = um.checkpoint_tensors(checkpoint)
        np.testing.assert_array_equal(params["enc.weight"], params["dec.weight"])

    def test_frozen_parameters_do_not_move_under_weight_decay(self):
        model = um.save_scripted(um.PartlyFrozen, self.path("frozen.pt"))
        initial = {n: p.detach().numpy().copy()
                   for n, p in torch.jit.load(model).named_parameters()}
        for optimizer in ("sgd", "adamw"):
            checkpoint = self.path(f"frozen-{optimizer}.h5")
            r = self.train(2, model, self.data, "--global-batch", 48, "--steps", 2, "--lr", 0.05,
                           "--optimizer", optimizer, "--weight-decay", 0.1, "--checkpoint",
                           checkpoint)
            self.assertEqual(r.returncode, 0, r)
            self.assertIn("21 trainable parameters (54 frozen, 0 shared)", r.stdout)
            params, _ = um.checkpoint_tensors(checkpoint)
            for name in ("body.weight", "body.bias"):
                np.testing.assert_array_equal(params[name], initial[name], err_msg=name)
            reference = um.reference_steps(model, self.x, self.y, world=2, micro_batch=24,
                                           global_batch=48, steps=2, lr=0.05, momentum=0.9,
                                           weight_decay=0.1, optimizer=optimizer)
            um.assert_close_to_model(self, checkpoint, reference)

    # --- modes and buffers -----------------------------------------------------------------

    def test_batchnorm_saved_in_eval_mode_trains_and_averages_its_buffers(self):
        model = um.save_scripted(um.LinearBn(features=8), self.path("bn.pt"), eval_mode=True)
        val = um.write_data(self.path("bn-val.h5"), *um.classification_data(30, (8,), 3, 9),
                            classes=3)
        for ranks, micro in ((3, 5), (4, 3)):
            checkpoint, log = self.path(f"bn-{ranks}.h5"), self.path(f"bn-{ranks}-log.h5")
            r = self.train(ranks, model, self.data, "--global-batch", 60, "--steps", 1, "--lr",
                           0.1, "--momentum", 0, "--micro-batch", micro, "--checkpoint",
                           checkpoint, "--val-data", val, "--run-log", log)
            self.assertEqual(r.returncode, 0, r)
            reference = um.reference_steps(model, self.x, self.y, world=ranks, micro_batch=micro,
                                           global_batch=60, steps=1, lr=0.1)
            # Train mode from step 1: the running statistics moved, to the ranks' average.
            _, buffers = um.checkpoint_tensors(checkpoint)
            self.assertGreater(np.abs(buffers["bn.running_mean"]).max(), 1e-3)
            self.assertEqual(int(buffers["bn.num_batches_tracked"].reshape(())),
                             int(reference.bn.num_batches_tracked))
            um.assert_close_to_model(self, checkpoint, reference)
            # Every rank evaluated its part of the validation set with these same buffers.
            reference.eval()
            xv, yv = (torch.from_numpy(a) for a in um.classification_data(30, (8,), 3, 9))
            with torch.no_grad():
                expected = torch.nn.functional.cross_entropy(reference(xv), yv).item()
            with h5py.File(log, "r") as f:
                self.assertAlmostEqual(float(f["eval/loss"][-1]), expected, places=5)

    def test_a_float64_buffer_is_averaged_in_double(self):
        # Three ranks (10, 11 and 11 rows of 32) in micro-batches of 4: each rank's change to
        # the float64 tally has ~50 significant bits; through a float32 slot the mean kept 24
        # (relative error ~1e-8, the old behaviour); in double it equals PyTorch's to ~1e-16.
        model = um.save_scripted(um.DoubleTally, self.path("tally.pt"))
        checkpoint = self.path("tally.h5")
        r = self.train(3, model, self.data, "--global-batch", 32, "--steps", 3, "--lr", 0.1,
                       "--micro-batch", 4, "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("2 buffer value(s) averaged over the ranks every step", r.stdout)
        reference = um.reference_steps(model, self.x, self.y, world=3, micro_batch=4,
                                       global_batch=32, steps=3, lr=0.1, momentum=0.9)
        _, buffers = um.checkpoint_tensors(checkpoint)
        self.assertEqual(buffers["tally"].dtype, np.float64)
        np.testing.assert_allclose(buffers["tally"], reference.tally.numpy(), rtol=1e-14)
        um.assert_close_to_model(self, checkpoint, reference)

    # --- random numbers ---------------------------------------------------------------------

    def test_dropout_masks_differ_between_ranks_and_resume_is_bit_for_bit(self):
        model = um.save_scripted(um.DropoutWitness, self.path("drop.pt"))
        whole, part = self.path("drop-whole.h5"), self.path("drop-part.h5")
        common = ("--global-batch", 24, "--micro-batch", 4, "--lr", 0.05)
        r = self.train(2, model, self.data, *common, "--steps", 6, "--checkpoint", whole)
        self.assertEqual(r.returncode, 0, r)
        r = self.train(2, model, self.data, *common, "--steps", 3, "--checkpoint", part)
        self.assertEqual(r.returncode, 0, r)
        r = self.train(2, model, self.data, *common, "--steps", 6, "--checkpoint", part,
                       "--resume")
        self.assertEqual(r.returncode, 0, r)
        a, b = um.checkpoint_tensors(whole), um.checkpoint_tensors(part)
        for kind in (0, 1):
            for name in a[kind]:
                np.testing.assert_array_equal(a[kind][name], b[kind][name], err_msg=name)
        # The mask buffer is the mean of the two ranks' last masks (each 0 or 2): a 1 appears
        # only where they differ.
        mask = a[1]["mask"]
        self.assertTrue(np.any(mask == 1.0), mask)
        with h5py.File(whole, "r") as f:
            self.assertEqual(int(f.attrs["rng_ranks"]), 2)

    # --- the setup trial --------------------------------------------------------------------

    def assert_one_line_error(self, r, *needles):
        self.assertEqual(r.returncode, 1, r)
        lines = um.error_lines(r)
        self.assertEqual(len(lines), 1, r)
        self.assertNotIn("Traceback", r.stderr + r.stdout)
        for needle in needles:
            self.assertIn(needle, lines[0], r)

    @one_core
    def test_mistakes_seen_at_the_first_forward_are_one_line_and_exit_1(self):
        class WrongWidth(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(100, 3)

            def forward(self, x):
                return self.fc(x)

        class TwoInputs(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 3)

            def forward(self, x, z):
                return self.fc(x + z)

        class Named(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 3)

            def forward(self, x) -> Dict[str, torch.Tensor]:
                return {"scores": self.fc(x)}

        class FiveClasses(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 2)

            def forward(self, x):
                return self.fc(x)

        cases = [
            (WrongWidth, ["wrong.pt", "x [2, 8]", "shapes cannot be multiplied"]),
            (TwoInputs, ["two.pt", "argument"]),
            (Named, ["named.pt", "GenericDict", "\"logits\""]),
            (FiveClasses, ["five.pt", "[2, 2]", "must be [2, 3] logits"]),
        ]
        for module, needles in cases:
            with self.subTest(model=needles[0]):
                model = um.save_scripted(module(), self.path(needles[0]))
                r = self.train(2, model, self.data, "--global-batch", 48, "--steps", 1)
                self.assert_one_line_error(r, self.data, *needles)

    @one_core
    def test_a_model_file_that_is_missing_or_not_torchscript_is_one_line(self):
        pickled = self.path("pickled.pt")
        torch.save(um.Tied(), pickled)
        r = self.train(2, pickled, self.data, "--global-batch", 48, "--steps", 1)
        self.assert_one_line_error(r, pickled, "torch.save()", "torch.jit.script(model).save(")
        missing = self.path("missing.pt")
        r = self.train(2, missing, self.data, "--global-batch", 48, "--steps", 1)
        self.assert_one_line_error(r, missing, "does not exist")

    @one_core
    def test_a_model_with_nothing_to_train_is_one_line_at_start(self):
        # Every parameter frozen, or a torch.jit.freeze'd file (its weights are constants):
        # autoaccum used to fail at step 0 with "element 0 of tensors does not require grad",
        # exit 2 and MPI's abort banner.
        frozen = um.Tied()
        for p in frozen.parameters():
            p.requires_grad_(False)
        all_frozen = um.save_scripted(frozen, self.path("all-frozen.pt"))
        torch.manual_seed(0)
        freezed = self.path("freezed.pt")
        torch.jit.freeze(torch.jit.script(um.Tied().eval())).save(freezed)
        checkpoint = self.path("nothing.h5")
        for model, needles in ((all_frozen, ["requires_grad=False", "nothing to train"]),
                               (freezed, ["no parameters", "torch.jit.freeze"])):
            with self.subTest(model=model):
                r = self.train(2, model, self.data, "--global-batch", 48, "--steps", 1,
                               "--checkpoint", checkpoint)
                self.assert_one_line_error(r, model, *needles)
                self.assertNotIn("MPI_ABORT", r.stderr + r.stdout)
                self.assertFalse(os.path.exists(checkpoint))

    def test_a_traced_model_with_dropout_or_batchnorm_is_named_once(self):
        # torch.jit.trace bakes the traced mode into dropout and BatchNorm: evaluation would not
        # be in eval mode. A scripted model of the same layers, and a traced one without them,
        # get no warning.
        torch.manual_seed(0)
        x = torch.randn(4, 1, 8, 8)
        traced = self.path("traced-cbnd.pt")
        torch.jit.trace(um.ConvBnDropout(dropout=0.25, width=8).train(), x).save(traced)
        plain = self.path("traced-tied.pt")
        torch.jit.trace(um.Tied(features=64, classes=4), x.flatten(1)).save(plain)
        scripted = um.save_scripted(um.ConvBnDropout(dropout=0.25, width=8),
                                    self.path("scripted-cbnd.pt"))
        flat = um.write_data(self.path("flat64.h5"), self.xi.reshape(len(self.xi), -1), self.yi,
                             classes=4)
        for model, data, warned in ((traced, self.images, True), (scripted, self.images, False),
                                    (plain, flat, False)):
            with self.subTest(model=model):
                r = self.train(2, model, data, "--global-batch", 32, "--steps", 1,
                               "--val-data", data)
                self.assertEqual(r.returncode, 0, r)
                lines = [l for l in r.stderr.splitlines() if "torch.jit.trace" in l]
                self.assertEqual(len(lines), 1 if warned else 0, r)
                if warned:
                    self.assertIn("autoaccum: warning: --model-file '" + traced, lines[0])
                    self.assertIn("evaluation is not in eval mode", lines[0])

    @one_core
    def test_validation_labels_outside_the_training_classes_fail_at_start(self):
        model = um.save_scripted(um.Tied, self.path("tied-val.pt"))
        x, y = um.classification_data(20, (8,), 5, seed=3)
        val = um.write_data(self.path("val-5.h5"), x, y, classes=5)
        checkpoint = self.path("never.h5")
        r = self.train(2, model, self.data, "--global-batch", 48, "--steps", 50, "--val-data", val,
                       "--checkpoint", checkpoint)
        self.assert_one_line_error(r, "--val-data", val, "3 classes")
        self.assertFalse(os.path.exists(checkpoint))

    # --- outputs owned by one job -----------------------------------------------------------

    def test_a_second_job_on_the_same_outputs_is_refused_and_a_dead_holder_taken_over(self):
        model = um.save_scripted(um.Tied, self.path("tied-lock.pt"))
        log, checkpoint = self.path("shared-log.h5"), self.path("shared-ck.h5")
        first = subprocess.Popen(
            [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.data,
             "--model-file", model, "--threads", "1", "--global-batch", "8", "--steps",
             "1000000", "--run-log", log, "--log-every", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=mpi_env())
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(log + ".lock") or not os.path.exists(log):
                self.assertLess(time.monotonic(), deadline, "the first job never started")
                self.assertIsNone(first.poll(), "the first job ended early")
                time.sleep(0.2)
            # The holder stays alive but stopped: its spinning ranks would otherwise take the
            # two cores that the second job's start-up needs.
            signal_session(first, "STOP")
            before = os.path.getsize(log)
            for option, target in (("--run-log", log), ("--checkpoint", log)):
                r = self.train(2, model, self.data, "--global-batch", 8, "--steps", 1, option,
                               target)
                self.assert_one_line_error(r, option, "in use by another job", "pid")
            self.assertIsNone(first.poll(), "the first job must be untouched")
            self.assertGreaterEqual(os.path.getsize(log), before)
        finally:
            kill_session(first)  # every rank gone: their exit released their locks
        # Killed without clean-up: its lock file stays, held by nobody.
        self.assertTrue(os.path.exists(log + ".lock"))
        # A writer killed mid-checkpoint leaves its temporary: the next holder removes it.
        leftover = checkpoint + ".tmp.424242"
        with open(leftover, "w") as f:
            f.write("half a checkpoint")
        r = self.train(2, model, self.data, "--global-batch", 8, "--steps", 2, "--run-log", log,
                       "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("took over", r.stderr)
        self.assertFalse(os.path.exists(leftover))
        self.assertIn("removed " + leftover, r.stderr)
        self.assertFalse(os.path.exists(log + ".lock"), "a finished job removes its lock")
        self.assertFalse(os.path.exists(checkpoint + ".lock"))

    # --- export -------------------------------------------------------------------------------

    @one_core
    def test_export_equals_the_checkpoint_and_loads_in_pytorch(self):
        model = um.save_scripted(um.ConvBnDropout(width=4), self.path("export.pt"))
        checkpoint, out = self.path("export-ck.h5"), self.path("trained.pt")
        r = self.train(2, model, self.images, "--global-batch", 32, "--steps", 3, "--checkpoint",
                       checkpoint)
        self.assertEqual(r.returncode, 0, r)
        r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", model, "--out", out)
        self.assertEqual(r.returncode, 0, r)
        trained = torch.jit.load(out)
        self.assertFalse(trained.training)
        um.assert_close_to_model(self, checkpoint, trained, rtol=0, atol=0)
        with torch.no_grad():
            self.assertEqual(tuple(trained(torch.from_numpy(self.xi[:5])).shape), (5, 4))
        # A checkpoint of another model is refused with one line, and nothing is written.
        other = um.save_scripted(um.ConvBnDropout(width=6), self.path("other.pt"))
        r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", other, "--out",
                      self.path("never.pt"))
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("conv.weight", r.stderr)
        self.assertFalse(os.path.exists(self.path("never.pt")))


if __name__ == "__main__":
    unittest.main()
