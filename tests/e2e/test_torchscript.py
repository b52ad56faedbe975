"""A TorchScript model with two inputs (--model-file, --inputs x,z), trained one SGD step under
an injected OOM; the parameters must equal PyTorch's own step on the same batch."""
import os
import shutil
import tempfile
import unittest

import h5py
import numpy as np
import torch

from harness import autoaccum, one_core


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(20, 16)
        self.b = torch.nn.Linear(3, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x, z):
        return self.out(torch.relu(self.a(x) + self.b(z)))


class TorchScriptModel(unittest.TestCase):
    @one_core
    def test_one_step_equals_pytorch(self):
        work = tempfile.mkdtemp(prefix="autoaccum-script-")
        try:
            torch.manual_seed(0)
            model = torch.jit.script(TwoInputs())
            model_path = os.path.join(work, "m.pt")
            model.save(model_path)
            rng = np.random.default_rng(1)
            x = rng.standard_normal((64, 20)).astype(np.float32)
            z = rng.standard_normal((64, 3)).astype(np.float32)
            y = rng.integers(0, 4, 64).astype(np.int64)
            data = os.path.join(work, "d.h5")
            with h5py.File(data, "w") as f:
                f["x"], f["z"], f["y"] = x, z, y
                f.attrs["num_classes"] = 4
            checkpoint = os.path.join(work, "c.h5")
            r = autoaccum(2, "train", "--data", data, "--model-file", model_path, "--inputs", "x,z",
                          "--global-batch", 64, "--steps", 1, "--shuffle", "none", "--lr", 0.1,
                          "--momentum", 0, "--inject-oom", "rank=0,above=10",
                          "--checkpoint", checkpoint, "--threads", 1)
            self.assertEqual(r.returncode, 0, r)
            self.assertIn("continue at 8", r.stdout)

            # PyTorch's own step on the same 64 rows.
            reference = torch.jit.load(model_path)
            loss = torch.nn.functional.cross_entropy(
                reference(torch.from_numpy(x), torch.from_numpy(z)), torch.from_numpy(y))
            loss.backward()
            with torch.no_grad():
                expected = {n: (p - 0.1 * p.grad).numpy() for n, p in reference.named_parameters()}
            with h5py.File(checkpoint, "r") as f:
                self.assertEqual(int(f.attrs["micro_batch"]), 8)
                for name, value in expected.items():
                    np.testing.assert_allclose(f[f"params/{name}"][:], value, rtol=1e-5, atol=1e-6,
                                               err_msg=name)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
