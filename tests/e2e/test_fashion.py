"""Fashion-MNIST end to end: 2 ranks, cnn, a memory limit that forces accumulation of at least
4, test accuracy at least 0.88; on a CPU with bf16 instructions, bf16 settles on twice the rows
and ends within 0.5 points of fp32."""
import os
import shutil
import tempfile
import unittest

import re

import h5py
import numpy as np
import torch

import user_models as um
from harness import autoaccum, cpu_flags

FASHION = "/usr/share/datasets/fashion-mnist"


NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


@unittest.skipUnless(os.path.isdir(FASHION), "dataset-fashion-mnist is not installed")
class FashionMnist(unittest.TestCase):
    def train_cnn(self, work, precision, *args):
        """The cnn on Fashion-MNIST under a 12 MiB limit (a search down to a forced
        accumulation); returns the run log's final test accuracy, micro-batch and
        accumulation."""
        log = os.path.join(work, f"run-{precision}.h5")
        r = autoaccum(2, "train", "--data", f"{work}/fashion-mnist-train.h5", "--val-data",
                      f"{work}/fashion-mnist-test.h5", "--model", "cnn", "--global-batch", 256,
                      "--lr", 0.05, "--schedule", "cosine", "--warmup-steps", 50,
                      "--memory-limit", "12MiB", "--precision", precision, "--run-log", log,
                      "--micro-batch-search", "halve", "--log-every", 200, *args, timeout=280)
        self.assertEqual(r.returncode, 0, r)
        print(r.stdout[-600:])
        with h5py.File(log, "r") as f:
            self.assertGreater(len(f["oom/step"]), 0, "the limit must have forced a search")
            accuracy = float(f["eval/accuracy"][-1])
            return accuracy, int(f["steps/micro_batch"][-1]), int(f["steps/accumulation"][-1])

    def imported(self):
        work = tempfile.mkdtemp(prefix="autoaccum-fashion-")
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        r = autoaccum(2, "import", "fashion-mnist", "--out", work, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        return work

    def test_cnn_with_forced_accumulation_reaches_088(self):
        accuracy, _, accumulation = self.train_cnn(self.imported(), "fp32", "--epochs", 5)
        self.assertGreaterEqual(accumulation, 4)
        self.assertGreaterEqual(accuracy, 0.88)  # measured: 0.8938 (AVX-512), 0.8942 (AVX2)

    @unittest.skipUnless(NATIVE_BF16, "this CPU has no bf16 instructions (avx512_bf16, amx_bf16): "
                         "LibTorch emulates bf16 on it, 11x slower than fp32 and with fp32 "
                         "copies that save no memory (measured on an AVX2 AMD EPYC: the search "
                         "settles on the same 32 rows); 5 epochs would take half an hour")
    def test_bf16_settles_on_twice_the_rows_and_ends_within_half_a_point_of_fp32(self):
        # Measured on a Xeon with AVX-512 bf16: 0.8938 in fp32, 0.8945 in bf16.
        work = self.imported()
        accuracy, micro = {}, {}
        for precision in ("fp32", "bf16"):
            accuracy[precision], micro[precision], _ = self.train_cnn(work, precision,
                                                                      "--epochs", 5)
        print("accuracy", accuracy, "final micro-batch", micro)
        # bf16 activations take half the bytes: the search settles on twice the rows.
        self.assertEqual(micro["bf16"], 2 * micro["fp32"])
        self.assertLessEqual(abs(accuracy["bf16"] - accuracy["fp32"]), 0.005, accuracy)

    def test_scripted_conv_batchnorm_dropout_under_a_limit_reaches_089(self):
        """The users' path: a scripted conv + BatchNorm + dropout model whose memory limit
        forces two halvings inside the scripted model, one of them in its backward; the
        exported model, evaluated by PyTorch itself, agrees with autoaccum's evaluation."""
        work = tempfile.mkdtemp(prefix="autoaccum-fashion-script-")
        try:
            r = autoaccum(2, "import", "fashion-mnist", "--out", work, timeout=120)
            self.assertEqual(r.returncode, 0, r)
            model = um.save_scripted(um.FashionNet, os.path.join(work, "net.pt"))
            log, checkpoint = os.path.join(work, "run.h5"), os.path.join(work, "ck.h5")
            test = f"{work}/fashion-mnist-test.h5"
            r = autoaccum(2, "train", "--data", f"{work}/fashion-mnist-train.h5", "--val-data",
                          test, "--model-file", model, "--global-batch", 256, "--epochs", 4,
                          "--lr", 0.05, "--schedule", "cosine", "--warmup-steps", 50,
                          "--memory-limit", "16MiB", "--threads", 1, "--run-log", log,
                          "--micro-batch-search", "halve",
                          "--checkpoint", checkpoint, "--log-every", 200, timeout=280)
            self.assertEqual(r.returncode, 0, r)
            print(r.stdout[-700:])
            halvings = re.findall(r"ran out of memory at micro-batch (\d+) in (\w+)", r.stdout)
            self.assertGreaterEqual(len({m for m, _ in halvings}), 2, r.stdout)
            self.assertIn("backward", [where for _, where in halvings], r.stdout)
            with h5py.File(log, "r") as f:
                accuracy = float(f["eval/accuracy"][-1])
                self.assertGreaterEqual(int(f["steps/accumulation"][-1]), 4)
            self.assertGreaterEqual(accuracy, 0.89)

            trained = os.path.join(work, "trained.pt")
            r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", model, "--out",
                          trained)
            self.assertEqual(r.returncode, 0, r)
            net = torch.jit.load(trained)
            with h5py.File(test, "r") as f:
                x = torch.from_numpy(f["x"][:].astype(np.float32) / 255.0)
                y = torch.from_numpy(f["y"][:])
            torch.set_num_threads(2)
            with torch.no_grad():
                correct = sum(int((net(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
                              for i in range(0, len(y), 1000))
            self.assertAlmostEqual(correct / len(y), accuracy, places=4)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
