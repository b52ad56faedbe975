"""./jobs/local.sh, the README's main command: trains the cnn on Fashion-MNIST and its summary
shows at least one halving of the micro-batch."""
import os
import signal
import subprocess
import time
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
