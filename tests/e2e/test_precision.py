"""--precision bf16: training under LibTorch's autocast, against PyTorch's own torch.autocast
computation of the same global batch (scripted models and the built-in mlp and cnn), at 2 and 3
ranks, with micro-batches that do not divide a rank's rows and an out-of-memory mid-step.

Parameters are compared through the update: d = ||autoaccum - reference|| / ||reference -
initial|| over all trainable parameters. Two tolerances, both measured:
- EXACT = 5e-5 where PyTorch walks the same micro-batches: the bf16 arithmetic is then the same
  operation for operation, and only fp32 sums (over ranks) are ordered differently. Measured:
  0 for the built-ins, 6e-8 for a scripted BatchNorm model, but once 2.07e-5 for that model at
  2 ranks on Debian 13 under CI's load (cause not found; it passed alone 3 times after). The
  fp32 computation of the same steps lies 4e-3 to 6e-2 from the bf16 reference (above
  APART = 1e-3), so a run that ignored --precision fails.
- BF16 = 1e-2 where the batch is cut differently (the result must not depend on the
  micro-batch): bf16 rounds each micro-batch's products, so cutting a batch otherwise moves
  the update by bf16 rounding (8 significant bits, 2^-9 relative per rounding). Measured 2.4e-3.
Global batches are powers of two: 1/B then scales bf16 values exactly, in PyTorch's loss / B and
in autoaccum's division after the sum alike."""
import h5py
import numpy as np
import torch

import user_models as um
from harness import TempDirTest, autoaccum, older_checkpoint, one_core, text

EXACT = 5e-5
# The least distance that shows two computations differ (fp32 against bf16: 4e-3 and more).
APART = 1e-3
BF16 = 1e-2


def initial_params(model_path):
    return {n: p.detach().numpy().copy() for n, p in torch.jit.load(model_path).named_parameters()}


class Precision(TempDirTest):
    prefix = "autoaccum-precision-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = um.classification_data(300, (1, 8, 8), 4, seed=6)
        cls.data = um.write_data(cls.path("images.h5"), cls.x, cls.y, classes=4)

    def train(self, ranks, model, name, *args, env=None):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        model_args = ("--model-file", model) if model.endswith(".pt") else ("--model", model)
        r = autoaccum(ranks, "train", "--data", self.data, *model_args, "--threads", 1,
                      "--shuffle", "none", "--lr", 0.1, "--momentum", 0, "--run-log", log,
                      "--checkpoint", checkpoint, *args, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r)
        return r, log, checkpoint

    def assert_equals_reference(self, params, reference, initial, fp32_reference):
        self.assertLess(um.update_distance(params, reference, initial), EXACT)
        # The check can fail: fp32 arithmetic is far from the bf16 reference.
        fp32 = {n: p.detach().numpy() for n, p in fp32_reference.named_parameters()}
        self.assertGreater(um.update_distance(fp32, reference, initial), APART)

    def test_scripted_batchnorm_model_at_two_and_three_ranks_with_an_oom_equals_pytorch(self):
        # Conv + BatchNorm: its statistics depend on every micro-batch, so the reference walks
        # the micro-batches each rank walked (read back from the run log).
        model = um.save_scripted(um.ConvBnDropout(dropout=0.0, width=16), self.path("cbn.pt"))
        initial = initial_params(model)
        for ranks in (2, 3):
            with self.subTest(ranks=ranks):
                # 128 rows a step (a power of two: 1/128 scales bf16 values exactly, in
                # PyTorch's loss / B as in autoaccum's division after the sum). Rank 1 runs out
                # of memory above 24 rows, after rank 0 has done its micro-batches; all retry.
                # 2 ranks (64 each), refined: 64, 32 fail, 16 fits, then 24 (24 x 2 + 16).
                # 3 ranks (42/43/43): 43 fails, 21 fits (21 x 2 + 1 or 0).
                search = ["--micro-batch-search", "refine"] if ranks == 2 else []
                r, log, checkpoint = self.train(ranks, model, f"cbn{ranks}", "--global-batch", 128,
                                                "--steps", 3, "--precision", "bf16",
                                                "--inject-oom", "rank=1,above=24", *search)
                self.assertIn("ran out of memory", r.stdout)
                size_of, parts, _ = um.rank_sizes(log)
                final = [size_of(2, rank) for rank in range(ranks)]
                self.assertEqual(final, [24, 24] if ranks == 2 else [21, 21, 21])
                reference = um.reference_steps(model, self.x, self.y, ranks, size_of, 128, 3, 0.1,
                                               autocast=torch.bfloat16)
                fp32 = um.reference_steps(model, self.x, self.y, ranks, size_of, 128, 3, 0.1)
                params, buffers = um.checkpoint_tensors(checkpoint)
                self.assert_equals_reference(params, reference, initial, fp32)
                # BatchNorm's running statistics, averaged over the ranks.
                for name, b in reference.named_buffers():
                    np.testing.assert_allclose(buffers[name].reshape(b.shape), b.numpy(),
                                               rtol=1e-5, atol=1e-6, err_msg=name)

    def test_the_result_does_not_depend_on_the_micro_batch(self):
        # No BatchNorm: the gradient of a batch is the same however it is cut, up to rounding.
        model = um.save_scripted(um.SmallConv(), self.path("conv.pt"))
        initial = initial_params(model)
        # 3 ranks, 42/43/43 rows: one micro-batch each, or 21-row ones after an out-of-memory.
        _, _, whole = self.train(3, model, "whole", "--global-batch", 128, "--steps", 3,
                                 "--precision", "bf16", "--micro-batch", 43)
        _, log, cut = self.train(3, model, "cut", "--global-batch", 128, "--steps", 3,
                                 "--precision", "bf16", "--inject-oom", "rank=0,above=24")
        size_of, _, _ = um.rank_sizes(log)
        self.assertEqual([size_of(2, r) for r in range(3)], [21, 21, 21])
        # PyTorch's autocast over the whole global batch at once, on one process.
        reference = um.reference_steps(model, self.x, self.y, 1, 128, 128, 3, 0.1,
                                       autocast=torch.bfloat16)
        for checkpoint in (whole, cut):
            params = um.checkpoint_tensors(checkpoint)[0]
            self.assertLess(um.update_distance(params, reference, initial), BF16)
        # And the two runs against each other.
        a, b = um.checkpoint_tensors(whole)[0], um.checkpoint_tensors(cut)[0]
        diff = sum(float(np.sum((a[n] - b[n]) ** 2)) for n in a)
        moved = sum(float(np.sum((a[n] - initial[n].reshape(a[n].shape)) ** 2)) for n in a)
        self.assertLess((diff / moved) ** 0.5, BF16)

    def test_builtin_models_one_step_from_a_checkpoint_equals_pytorch(self):
        # The built-in models have no file to start a reference from: the run keeps its last two
        # checkpoints (--checkpoint-every 1), and PyTorch takes the last step from the one before.
        cases = [("mlp", {}), ("mlp", {"AUTOACCUM_FUSED_LINEAR": "0"}), ("cnn", {})]
        for kind, env in cases:
            with self.subTest(model=kind, env=env):
                name = kind + ("-plain" if env else "")
                args = ["--global-batch", 128, "--steps", 3, "--checkpoint-every", 1,
                        "--precision", "bf16", "--micro-batch", 12]
                if kind == "mlp":
                    args += ["--hidden", "64,64"]
                _, _, checkpoint = self.train(3, kind, name, *args, env=env)
                before, _ = um.checkpoint_tensors(older_checkpoint(checkpoint, 2))
                with h5py.File(older_checkpoint(checkpoint, 2), "r") as f:
                    self.assertEqual(int(f.attrs["step"]), 2)
                after, _ = um.checkpoint_tensors(checkpoint)

                def start():
                    m = um.builtin_model(kind, (1, 8, 8), 4)
                    with torch.no_grad():
                        for n, p in m.named_parameters():
                            p.copy_(torch.from_numpy(before[n].reshape(p.shape)))
                    return m
                reference = um.reference_steps(start(), self.x, self.y, 3, 12, 128, 1, 0.1,
                                               autocast=torch.bfloat16, first_step=2)
                fp32 = um.reference_steps(start(), self.x, self.y, 3, 12, 128, 1, 0.1,
                                          first_step=2)
                self.assert_equals_reference(after, reference, before, fp32)

    @one_core
    def test_run_log_banner_and_log_command_say_the_precision(self):
        model = um.save_scripted(um.SmallConv(), self.path("say.pt"))
        r, log, _ = self.train(2, model, "say", "--global-batch", 128, "--steps", 2,
                               "--precision", "bf16")
        self.assertRegex(r.stdout, r"precision bf16: forward and loss under autocast, parameters "
                                   r"and gradients fp32; this CPU's bf16 matrix products run "
                                   r"[0-9.]+x as fast as fp32's")
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["precision"]), "bf16")
            self.assertGreater(float(f.attrs["lower_precision_gemm_speedup"]), 0)
        self.assertIn("precision bf16", autoaccum(1, "log", log).stdout)
        r, log, _ = self.train(1, model, "say32", "--global-batch", 128, "--steps", 1)
        self.assertIn("precision fp32", r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["precision"]), "fp32")

    @one_core
    def test_bad_precision_is_one_line_and_fp16_needs_a_gpu(self):
        model = um.save_scripted(um.SmallConv(), self.path("bad.pt"))
        for value, needle in (("fp8", "--precision: 'fp8' is not one of fp32, bf16, fp16"),
                              ("fp16", "--precision fp16 needs --device cuda")):
            with self.subTest(value=value):
                r = autoaccum(2, "train", "--data", self.data, "--model-file", model,
                              "--global-batch", 128, "--steps", 1, "--precision", value)
                self.assertEqual(r.returncode, 1, r)
                lines = um.error_lines(r)
                self.assertEqual(len(lines), 1, r)
                self.assertIn(needle, lines[0])

    @one_core
    def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank_and_halves_the_scale(self):
        # No GPU here: AUTOACCUM_FP16_ON_CPU=1 runs --precision fp16's loss scaling with bf16
        # products. The scale is a power of two, so scaling and unscaling are exact, and the run
        # must equal PyTorch's bf16 computation with the overflowed step left out.
        env = {"AUTOACCUM_FP16_ON_CPU": "1"}
        model = um.save_scripted(um.SmallConv(), self.path("fp16.pt"))
        initial = initial_params(model)
        r, log, checkpoint = self.train(2, model, "fp16", "--global-batch", 128, "--steps", 4,
                                        "--precision", "fp16", "--micro-batch", 24,
                                        "--inject-overflow", "rank=1,step=1", env=env)
        # The loss sums 64 rows per rank: the scale starts at 2^16 / 64.
        self.assertIn("fp16 loss scale 1024", r.stdout)
        self.assertEqual(r.stdout.count("fp16 gradients overflowed at loss scale 1024; every rank "
                                        "skips the step and continues at 512"), 1, r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["precision"]), "fp16")
            self.assertEqual(list(f["steps/loss_scale"][:]), [1024, 1024, 512, 512])
            self.assertEqual(list(f["steps/skipped"][:]), [0, 1, 0, 0])
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(float(f.attrs["loss_scale"]), 512)
        reference = um.reference_steps(model, self.x, self.y, 2, 24, 128, 4, 0.1,
                                       autocast=torch.bfloat16, skip_steps={1})
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, reference, initial), EXACT)
        # Leaving the step in would be far off: the skip is what makes it equal.
        applied = um.reference_steps(model, self.x, self.y, 2, 24, 128, 4, 0.1,
                                     autocast=torch.bfloat16)
        self.assertGreater(um.update_distance(params, applied, initial), APART)
        summary = autoaccum(1, "log", log).stdout
        self.assertIn("loss scale 1024 at step 0, 512 at step 3 (1 step(s) skipped", summary)

    def test_fp16_loss_scale_survives_a_resume(self):
        env = {"AUTOACCUM_FP16_ON_CPU": "1"}
        model = um.save_scripted(um.SmallConv(), self.path("fp16r.pt"))
        common = ["--global-batch", 128, "--precision", "fp16", "--micro-batch", 64]
        self.train(2, model, "fp16r", *common, "--steps", 2, "--inject-overflow",
                   "rank=0,step=1", env=env)
        r, log, _ = self.train(2, model, "fp16r", *common, "--steps", 4, "--resume", env=env)
        with h5py.File(log, "r") as f:
            self.assertEqual(list(f["steps/loss_scale"][:]), [1024, 1024, 512, 512])
            self.assertEqual(list(f["steps/skipped"][:]), [0, 1, 0, 0])

    def test_fp16_scale_of_a_summed_token_loss_keeps_a_large_vocabulary_in_fp16_range(self):
        # A language model's loss sums every token: at 2^16 (PyTorch's start for a mean loss) a
        # target the model gives p < 5e-4 has a logit gradient of 65536 (1 - p) > 65504, fp16's
        # largest value, so step 0 overflowed whatever the data, and so did every growth back
        # to 2^16. The scale now starts at 2^16 over the tokens a rank's share counts. Checked
        # against PyTorch's fp32 gradients of the same micro-batch: scaled, they fit in fp16.
        env = {"AUTOACCUM_FP16_ON_CPU": "1"}
        vocab, context, rows = 4096, 8, 64
        gen = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, vocab, (rows, context + 1), generator=gen)
        x, y = tokens[:, :-1].numpy(), tokens[:, 1:].numpy()
        data = self.path("tokens.h5")
        with h5py.File(data, "w") as f:
            f["x"], f["y"] = x, y
            f["y"].attrs["num_classes"] = vocab
        model = um.save_scripted(um.TokenLm(vocab, 16), self.path("lm16.pt"))
        log = self.path("lm16.h5")
        r = autoaccum(2, "train", "--data", data, "--model-file", model, "--global-batch", 16,
                      "--steps", 3, "--micro-batch", 8, "--shuffle", "none", "--threads", 1,
                      "--precision", "fp16", "--run-log", log, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r)
        scale = 1024  # 2^16 / (8 rows x 8 tokens per rank)
        self.assertIn(f"fp16 loss scale {scale},", r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(list(f["steps/loss_scale"][:]), [scale] * 3)
            self.assertEqual(list(f["steps/skipped"][:]), [0, 0, 0])
        # Rank 0's first micro-batch (rows 0-7, no shuffle), in fp32 with PyTorch.
        net = torch.jit.load(model)
        logits = net(torch.from_numpy(x[:8]).long())
        logits.retain_grad()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                 torch.from_numpy(y[:8]).reshape(-1),
                                                 reduction="sum")
        loss.backward()
        largest = max([float(logits.grad.abs().max())] +
                      [float(p.grad.abs().max()) for p in net.parameters()])
        fp16_max = float(torch.finfo(torch.float16).max)
        self.assertLess(scale * largest, fp16_max / 8)
        self.assertGreater(65536 * float(logits.grad.abs().max()), fp16_max,
                           "the check can fail: the old start overflowed this batch")

    @one_core
    def test_evaluation_runs_under_autocast_and_equals_pytorch(self):
        model = um.save_scripted(um.SmallConv(logit_scale=4.0, gain=1.0038), self.path("eval.pt"))
        _, log, checkpoint = self.train(2, model, "eval", "--global-batch", 128, "--steps", 2,
                                        "--precision", "bf16", "--val-data", self.data)
        with h5py.File(log, "r") as f:
            loss, accuracy = float(f["eval/loss"][-1]), float(f["eval/accuracy"][-1])
        net = torch.jit.load(model)
        params = um.checkpoint_tensors(checkpoint)[0]
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(torch.from_numpy(params[name].reshape(p.shape)))
        net.eval()
        x, y = torch.from_numpy(self.x), torch.from_numpy(self.y)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(x)
            expected = float(torch.nn.functional.cross_entropy(out, y, reduction="sum")) / len(y)
        expected_accuracy = float((out.argmax(1) == y).float().mean())
        # Equal to PyTorch's autocast evaluation within 1e-6 (measured 4e-8 and 1.6e-7 apart on
        # LibTorch 2.6 and 1.13). The model ends in a fixed gain of 1.0038 applied by linear(),
        # which bf16 rounds to 1: an fp32 evaluation scales the logits by 1.0038 and its loss
        # lies far outside that band whatever the trained weights (measured 2.9e-3 to 4.1e-3
        # apart on both platforms, over random initialisations). (Without the gain the gap
        # between the two evaluations is bf16's rounding of the weights alone, which came as
        # close as 4.9e-6 on one run and failed the check below.)
        self.assertAlmostEqual(loss, expected, delta=1e-6 * expected)
        self.assertAlmostEqual(accuracy, expected_accuracy, delta=2 / len(y))
        with torch.no_grad():
            fp32 = float(torch.nn.functional.cross_entropy(net(x), y, reduction="sum")) / len(y)
        self.assertGreater(abs(expected - fp32), 1e-4 * expected)
