"""Token-level losses stay exact across micro-batches and ranks: a scripted language model whose
ignored positions make the counted tokens differ between micro-batches and ranks, trained under
an out-of-memory that halves mid-step and at a micro-batch that does not divide the per-rank
batch, equals PyTorch's full-batch step (sum of token losses / all counted tokens). The same
for binary cross-entropy. Loss choices that cannot work are one line, exit 1."""
import os
import shutil
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch.nn.functional as F

import user_models as um
from harness import autoaccum, one_core

VOCAB, CONTEXT = 11, 6


class TinyLM(torch.nn.Module):
    """Token and position embeddings, a causal running mean, a linear head: [m, T] -> [m, T, V]."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, 8)
        self.pos = torch.nn.Parameter(0.1 * torch.randn(CONTEXT, 8))
        self.mix = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, x):
        h = torch.relu(self.mix(self.tok(x) + self.pos))
        steps = torch.arange(1, x.size(1) + 1, dtype=h.dtype).view(1, -1, 1)
        return self.head(torch.cumsum(h, 1) / steps)


class Multilabel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.a(x)))


class WeightedLoss(torch.nn.Module):
    """--loss model: forward(x, y) returns (sum of weighted row losses, sum of weights)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x, y):
        logits = self.out(torch.tanh(self.a(x)))
        w = 1.0 + torch.remainder(y, 3).to(torch.float32)
        return (w * F.cross_entropy(logits, y, reduction="none")).sum(), w.sum()


class LogitsAndHidden(torch.nn.Module):
    """Returns a tuple whose first element is the output, as many models do."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.out(h), h


def full_batch_steps(model_path, x, y, global_batch, steps, lr, loss):
    """PyTorch's step on whole global batches: plain SGD on the mean over counted items."""
    model = torch.jit.load(model_path)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        rows = slice(step * global_batch, (step + 1) * global_batch)
        xb, yb = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])
        opt.zero_grad()
        out = model(xb) if loss != "model" else None
        if isinstance(out, tuple):
            out = out[0]
        if loss == "tokens":
            value = F.cross_entropy(out.reshape(-1, VOCAB), yb.reshape(-1), ignore_index=-100)
        elif loss == "model":
            loss_sum, weight = model(xb, yb)
            value = loss_sum / weight
        else:
            value = F.binary_cross_entropy_with_logits(out, yb)
        value.backward()
        opt.step()
    return model


class TokenLoss(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="autoaccum-tokens-")
        rng = np.random.default_rng(4)
        rows = 72
        x = rng.integers(0, VOCAB, (rows, CONTEXT)).astype(np.int64)
        y = np.roll(x, -1, axis=1)
        # Padding: row r ignores its last (r * 5) % CONTEXT positions, so micro-batches and ranks
        # count different numbers of tokens; a few rows count none at all.
        for r in range(rows):
            pad = (r * 5) % CONTEXT
            if pad:
                y[r, CONTEXT - pad:] = -100
        y[7] = -100
        cls.x, cls.y = x, y
        cls.data = os.path.join(cls.dir, "tokens.h5")
        with h5py.File(cls.data, "w") as f:
            f["x"], f["y"] = x, y
            f.attrs["num_classes"] = VOCAB
        torch.manual_seed(1)
        cls.model = os.path.join(cls.dir, "lm.pt")
        torch.jit.script(TinyLM()).save(cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def train(self, ranks, data, model, *args):
        return autoaccum(ranks, "train", "--data", data, "--model-file", model, "--threads", 1,
                         "--shuffle", "none", "--momentum", 0, "--lr", 0.5, *args, timeout=120)

    def test_token_cross_entropy_is_exact_for_any_split(self):
        reference = full_batch_steps(self.model, self.x, self.y, 24, 2, 0.5, "tokens")
        cases = [
            (2, ["--inject-oom", "rank=1,above=3"]),  # 12 per rank, halved to 3 mid-step
            (3, ["--micro-batch", 5]),  # 8 per rank: micro-batches of 5 and 3
        ]
        for ranks, extra in cases:
            with self.subTest(ranks=ranks, extra=extra):
                checkpoint = os.path.join(self.dir, f"lm-{ranks}.h5")
                r = self.train(ranks, self.data, self.model, "--global-batch", 24, "--steps", 2,
                               "--checkpoint", checkpoint, *extra)
                self.assertEqual(r.returncode, 0, r)
                self.assertIn("cross-entropy per token over 11 classes, over all counted tokens "
                              "of the global batch", r.stdout)
                if "--inject-oom" in extra:
                    self.assertIn("continue at 3", r.stdout)
                um.assert_close_to_model(self, checkpoint, reference, rtol=1e-5, atol=1e-6)

    @one_core
    def test_uint8_token_ids_with_encoding_integer_train_as_int64(self):
        # The same tokens stored as bytes: with encoding = "integer" the model gets the ids
        # unscaled (an Embedding would refuse floats), and the run equals PyTorch's full batch.
        data = os.path.join(self.dir, "tokens-u8.h5")
        with h5py.File(data, "w") as f:
            f["x"], f["y"] = self.x.astype(np.uint8), self.y
            f["x"].attrs["encoding"] = "integer"
            f.attrs["num_classes"] = VOCAB
        r = autoaccum(1, "inspect", data)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("input x: uint8 token ids (encoding = integer), passed unscaled as int64",
                      r.stdout)
        reference = full_batch_steps(self.model, self.x, self.y, 24, 2, 0.5, "tokens")
        checkpoint = os.path.join(self.dir, "lm-u8.h5")
        r = self.train(2, data, self.model, "--global-batch", 24, "--steps", 2, "--micro-batch", 5,
                       "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        um.assert_close_to_model(self, checkpoint, reference, rtol=1e-5, atol=1e-6)

        # Without the attribute the bytes are an image (x / 255): an Embedding refuses floats.
        with h5py.File(data, "a") as f:
            del f["x"].attrs["encoding"]
        r = autoaccum(1, "inspect", data)
        self.assertIn("input x: uint8 image, scaled to float32 in [0, 1]", r.stdout)
        # An encoding that is not one of the two, or on a type it cannot apply to: one line.
        for dtype, encoding in ((np.uint8, "bytes"), (np.float32, "integer"),
                                (np.int64, "scaled")):
            with h5py.File(data, "a") as f:
                del f["x"]
                f["x"] = self.x.astype(dtype)
                f["x"].attrs["encoding"] = encoding
            r = self.train(2, data, self.model, "--global-batch", 24, "--steps", 1)
            self.assert_one_line_error(r, "tokens-u8.h5", "dataset 'x'", f"encoding '{encoding}'")

    def test_binary_cross_entropy_is_exact(self):
        rng = np.random.default_rng(8)
        x = rng.standard_normal((60, 8)).astype(np.float32)
        y = (rng.random((60, 4)) < 0.3).astype(np.float32)
        data = um.write_data(os.path.join(self.dir, "multilabel.h5"), x, y)
        torch.manual_seed(2)
        model = os.path.join(self.dir, "multilabel.pt")
        torch.jit.script(Multilabel()).save(model)
        checkpoint = os.path.join(self.dir, "bce.h5")
        r = self.train(3, data, model, "--loss", "bce", "--global-batch", 20, "--steps", 3,
                       "--micro-batch", 3, "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("binary cross-entropy with logits", r.stdout)
        reference = full_batch_steps(model, x, y, 20, 3, 0.5, "bce")
        um.assert_close_to_model(self, checkpoint, reference, rtol=1e-5, atol=1e-6)

    @one_core
    def test_the_models_own_weighted_loss_is_exact(self):
        x, y = um.classification_data(60, (8,), 3, seed=12)
        data = um.write_data(os.path.join(self.dir, "weighted.h5"), x, y, classes=3)
        torch.manual_seed(3)
        model = os.path.join(self.dir, "weighted.pt")
        torch.jit.script(WeightedLoss()).save(model)
        checkpoint = os.path.join(self.dir, "weighted-ck.h5")
        r = self.train(3, data, model, "--loss", "model", "--global-batch", 30, "--steps", 2,
                       "--inject-oom", "rank=2,above=4", "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("continue at", r.stdout)
        self.assertIn("the model's own (loss_sum, weight)", r.stdout)
        reference = full_batch_steps(model, x, y, 30, 2, 0.5, "model")
        um.assert_close_to_model(self, checkpoint, reference, rtol=1e-5, atol=1e-6)
        # A model for --loss model that returns a tensor is one line.
        plain = um.save_scripted(Multilabel(), os.path.join(self.dir, "plain.pt"))
        r = self.train(2, data, plain, "--loss", "model", "--global-batch", 30, "--steps", 1)
        self.assert_one_line_error(r, "--loss model", "(loss_sum, weight)")

    @one_core
    def test_a_tuple_output_trains_on_its_first_element(self):
        rng = np.random.default_rng(9)
        x = rng.standard_normal((40, 8)).astype(np.float32)
        y = rng.integers(0, 4, 40).astype(np.int64)
        data = um.write_data(os.path.join(self.dir, "tuple.h5"), x, y, classes=4)
        torch.manual_seed(4)
        model = os.path.join(self.dir, "tuple.pt")
        torch.jit.script(LogitsAndHidden()).save(model)
        checkpoint = os.path.join(self.dir, "tuple-ck.h5")
        r = self.train(2, data, model, "--global-batch", 20, "--steps", 2, "--checkpoint",
                       checkpoint)
        self.assertEqual(r.returncode, 0, r)
        reference = torch.jit.load(model)
        opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        for step in range(2):
            xb, yb = (torch.from_numpy(a[step * 20:(step + 1) * 20]) for a in (x, y))
            opt.zero_grad()
            F.cross_entropy(reference(xb)[0], yb).backward()
            opt.step()
        um.assert_close_to_model(self, checkpoint, reference, rtol=1e-5, atol=1e-6)

    def assert_one_line_error(self, r, *needles):
        self.assertEqual(r.returncode, 1, r)
        lines = um.error_lines(r)
        self.assertEqual(len(lines), 1, r)
        for needle in needles:
            self.assertIn(needle, lines[0], r)

    @one_core
    def test_losses_that_cannot_work_are_one_line(self):
        floats = um.write_data(os.path.join(self.dir, "floats.h5"),
                               *um.classification_data(40, (8,), 4, 1))
        with h5py.File(floats, "a") as f:
            del f["y"]
            f["y"] = np.zeros((40,), np.float32)
        model = um.save_scripted(Multilabel(), os.path.join(self.dir, "ml.pt"))
        r = self.train(2, floats, model, "--loss", "cross-entropy", "--global-batch", 20,
                       "--steps", 1)
        self.assert_one_line_error(r, "--loss cross-entropy", "float")

        # Token labels with a model that returns one row of logits per sequence.
        class PerSequence(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = torch.nn.Embedding(VOCAB, 4)
                self.head = torch.nn.Linear(4, VOCAB)

            def forward(self, x):
                return self.head(self.tok(x).mean(1))

        model = um.save_scripted(PerSequence(), os.path.join(self.dir, "per-seq.pt"))
        r = self.train(2, self.data, model, "--global-batch", 24, "--steps", 1)
        self.assert_one_line_error(r, "per-seq.pt", "[2, 11]", "[2, 6, 11]")

        # A label >= classes outside the ignored positions.
        bad = os.path.join(self.dir, "bad-label.h5")
        y = self.y.copy()
        y[3, 0] = VOCAB
        with h5py.File(bad, "w") as f:
            f["x"], f["y"] = self.x, y
            f.attrs["num_classes"] = VOCAB
        r = self.train(2, bad, self.model, "--global-batch", 24, "--steps", 1)
        self.assert_one_line_error(r, bad, "label 11 at row 3")


if __name__ == "__main__":
    unittest.main()
