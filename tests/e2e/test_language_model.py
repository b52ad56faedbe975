"""A language model end to end: `import text` makes byte windows (checked with h5py), the
example GPT (jobs/models/gpt.py) trains on 2 ranks with the micro-batch halved by a memory limit,
and its per-token validation loss equals PyTorch's evaluation of the exported model."""
import os
import shutil
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torch.nn.functional as F

import user_models as um
from harness import autoaccum, one_core

FORTUNES = "/usr/share/games/fortunes"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class LanguageModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="autoaccum-lm-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @one_core
    def test_import_text_makes_next_byte_windows(self):
        text = os.path.join(self.dir, "small.txt")
        corpus = b"the quick brown fox jumps over the lazy dog\n" * 20
        with open(text, "wb") as f:
            f.write(corpus)
        out = os.path.join(self.dir, "small")
        r = autoaccum(1, "import", "text", "--out", out, "--context", 16, text)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(f"{out}/text-train.h5") as f, h5py.File(f"{out}/text-val.h5") as g:
            x = np.concatenate([f["x"][:], g["x"][:]])
            y = np.concatenate([f["y"][:], g["y"][:]])
            self.assertEqual(int(f.attrs["num_classes"]), 256)
            # Bytes stored as bytes, marked as token ids rather than an image.
            self.assertEqual(f["x"].dtype, np.uint8)
            self.assertEqual(f["x"].attrs["encoding"], "integer")
        windows = (len(corpus) - 1) // 16
        self.assertEqual(len(x), windows)
        stream = np.frombuffer(corpus, np.uint8).astype(np.int64)
        np.testing.assert_array_equal(x.reshape(-1), stream[:windows * 16])
        np.testing.assert_array_equal(y.reshape(-1), stream[1:windows * 16 + 1])

        empty = os.path.join(self.dir, "empty.txt")
        open(empty, "w").close()
        r = autoaccum(2, "import", "text", "--out", out, empty)
        self.assertEqual(r.returncode, 1, r)
        lines = um.error_lines(r)
        self.assertEqual(len(lines), 1, r)
        self.assertIn("0 bytes", lines[0])

    @unittest.skipUnless(os.path.isdir(FORTUNES), "Debian's fortunes package is not installed")
    @one_core
    def test_gpt_on_fortunes_halves_and_its_loss_matches_pytorch(self):
        data = os.path.join(self.dir, "fortunes")
        r = autoaccum(1, "import", "text", "--out", data, "--context", 32, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        model = os.path.join(self.dir, "gpt.pt")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "jobs/models/gpt.py"), "--out",
                        model, "--context", "32", "--width", "32", "--layers", "1", "--heads",
                        "2"], check=True, capture_output=True)
        log, checkpoint = os.path.join(self.dir, "lm.h5"), os.path.join(self.dir, "lm-ck.h5")
        r = autoaccum(2, "train", "--data", f"{data}/text-train.h5", "--val-data",
                      f"{data}/text-val.h5", "--model-file", model, "--global-batch", 64,
                      "--steps", 80, "--optimizer", "adamw", "--lr", 0.005, "--memory-limit",
                      "6MiB", "--threads", 1, "--run-log", log, "--checkpoint", checkpoint,
                      "--log-every", 20, "--micro-batch-search", "halve", timeout=240)
        self.assertEqual(r.returncode, 0, r)
        print(r.stdout[-600:])
        self.assertIn("cross-entropy per token over 256 classes", r.stdout)
        self.assertRegex(r.stdout, r"ran out of memory at micro-batch \d+")
        with h5py.File(log, "r") as f:
            self.assertGreater(len(f["oom/step"]), 0)
            val_loss = float(f["eval/loss"][-1])
            first, last = float(f["steps/loss"][0]), float(f["steps/loss"][-1])
        self.assertGreater(first, 5.0)  # ln 256 = 5.55 at the start
        self.assertLess(last, first - 1.0)  # the training loss falls too
        self.assertLess(val_loss, 3.6)  # bytes are far from uniform after 80 steps

        out = os.path.join(self.dir, "gpt-trained.pt")
        r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", model, "--out", out)
        self.assertEqual(r.returncode, 0, r)
        net = torch.jit.load(out)
        with h5py.File(f"{data}/text-val.h5") as f:
            # uint8 byte ids (encoding = integer): the model takes them as int64, as autoaccum
            # passes them.
            x, y = torch.from_numpy(f["x"][:]).long(), torch.from_numpy(f["y"][:])
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(x), 256):
                logits = net(x[i:i + 256])
                total += float(F.cross_entropy(logits.reshape(-1, 256), y[i:i + 256].reshape(-1),
                                               reduction="sum"))
        self.assertAlmostEqual(total / y.numel(), val_loss, places=4)


if __name__ == "__main__":
    unittest.main()
