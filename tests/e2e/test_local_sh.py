"""./jobs/local.sh, the README's main command: trains the cnn on Fashion-MNIST under a 12 MiB
limit per rank; its summary shows the memory model each rank fitted and the micro-batch it
started at, with no out-of-memory."""
import os
import signal
import subprocess
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@unittest.skipUnless(os.path.isdir("/usr/share/datasets/fashion-mnist"), "dataset-fashion-mnist missing")
class LocalScript(unittest.TestCase):
    def test_trains_and_shows_the_predicted_micro_batch(self):
        done = subprocess.run([os.path.join(ROOT, "jobs", "local.sh"), "--epochs", "1"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
        out = done.stdout
        self.assertIn("Memory model (probed in 2 attempts", out)
        for rank in (0, 1):
            self.assertRegex(out, rf"rank {rank}: predicted \d+ rows \(fixed [0-9.]+ MiB \+ "
                                  rf"[0-9.]+ KiB/row\), used \d+, no out-of-memory")
        self.assertIn("OOM events: 0", out)
        self.assertIn("Status: completed", out)
        accuracy = float(out.split("accuracy ")[-1].split()[0])
        self.assertGreater(accuracy, 0.8)

    def test_sigterm_checkpoints_and_exits_4(self):
        job = subprocess.Popen([os.path.join(ROOT, "jobs", "local.sh")], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines = []
        deadline = time.monotonic() + 240
        for line in job.stdout:
            lines.append(line)
            if line.startswith("step 50/") or time.monotonic() > deadline:
                break
        job.send_signal(signal.SIGTERM)
        rest, _ = job.communicate(timeout=120)
        out = "".join(lines) + rest
        self.assertEqual(job.returncode, 4, out[-3000:])
        self.assertIn("stopped by a signal", out)
        self.assertIn("Status: preempted", out)


if __name__ == "__main__":
    unittest.main()
