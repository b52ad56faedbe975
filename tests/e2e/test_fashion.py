"""Fashion-MNIST end to end: 2 ranks, cnn, a memory limit that forces accumulation of at least
4, test accuracy at least 0.88."""
import os
import shutil
import tempfile
import unittest

import h5py

from harness import autoaccum

FASHION = "/usr/share/datasets/fashion-mnist"


@unittest.skipUnless(os.path.isdir(FASHION), "dataset-fashion-mnist is not installed")
class FashionMnist(unittest.TestCase):
    def test_cnn_with_forced_accumulation_reaches_088(self):
        work = tempfile.mkdtemp(prefix="autoaccum-fashion-")
        try:
            r = autoaccum(2, "import", "fashion-mnist", "--out", work, timeout=120)
            self.assertEqual(r.returncode, 0, r)
            log = os.path.join(work, "run.h5")
            r = autoaccum(2, "train", "--data", f"{work}/fashion-mnist-train.h5",
                          "--val-data", f"{work}/fashion-mnist-test.h5", "--model", "cnn",
                          "--global-batch", 256, "--epochs", 5, "--lr", 0.05, "--schedule", "cosine",
                          "--warmup-steps", 50, "--memory-limit", "12MiB", "--run-log", log,
                          "--log-every", 200, timeout=280)
            self.assertEqual(r.returncode, 0, r)
            print(r.stdout[-600:])
            with h5py.File(log, "r") as f:
                self.assertGreaterEqual(int(f["steps/accumulation"][-1]), 4)
                self.assertGreater(len(f["oom/step"]), 0, "the limit must have forced a search")
                accuracy = float(f["eval/accuracy"][-1])
            self.assertGreaterEqual(accuracy, 0.88)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
