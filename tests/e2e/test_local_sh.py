"""./jobs/local.sh, the README's main command: trains the cnn on Fashion-MNIST and its summary
shows at least one halving of the micro-batch."""
import os
import subprocess
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@unittest.skipUnless(os.path.isdir("/usr/share/datasets/fashion-mnist"), "dataset-fashion-mnist missing")
class LocalScript(unittest.TestCase):
    def test_trains_and_shows_a_halving(self):
        done = subprocess.run([os.path.join(ROOT, "jobs", "local.sh")], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
        out = done.stdout
        self.assertIn("did not fit on rank", out)
        self.assertRegex(out, r"-> \d+, accumulation \d+, from step 0 on")
        self.assertIn("Status: completed", out)
        accuracy = float(out.split("accuracy ")[-1].split()[0])
        self.assertGreater(accuracy, 0.8)


if __name__ == "__main__":
    unittest.main()
