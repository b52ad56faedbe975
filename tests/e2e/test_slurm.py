"""The Slurm job script on a single-node Slurm cluster started on this machine (jobs/ci):
a small job completes; a job signalled mid-run checkpoints, exits 4, is requeued, resumes at
the learned micro-batch without a new search, and ends bit for bit where an uninterrupted run
ends."""
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

from harness import (BIN, autoaccum, flip_a_bit, older_checkpoints, preempt_and_requeue,
                     sbatch_wait)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SBATCH = os.path.join(ROOT, "jobs", "slurm", "train.sbatch")
CONFIG = os.path.join(ROOT, "jobs", "configs", "ci-small.ini")
HAVE_SLURM = all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "munged"))


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


@unittest.skipUnless(HAVE_SLURM and os.geteuid() == 0, "needs root and Slurm (jobs/setup.sh installs it)")
class Slurm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="autoaccum-slurm-")
        os.chmod(cls.dir, 0o755)
        cls.state = os.path.join(cls.dir, "cluster")
        up = subprocess.run([os.path.join(ROOT, "jobs", "ci", "slurm-up.sh"), cls.state],
                            capture_output=True, text=True, timeout=60)
        if up.returncode != 0:
            raise RuntimeError("slurm-up failed:\n" + up.stdout + up.stderr)
        cls.env = dict(os.environ, SLURM_CONF=os.path.join(cls.state, "slurm.conf"),
                       AUTOACCUM_BIN=BIN, AUTOACCUM_CONFIG=CONFIG,
                       AUTOACCUM_RUNS=os.path.join(cls.dir, "runs"))
        os.makedirs(os.path.join(cls.dir, "runs"))
        cls.data = os.path.join(cls.dir, "synth.h5")
        r = autoaccum(1, "synth", "--out", cls.data, "--rows", 2000, "--features", 20,
                      "--classes", 4, "--seed", 1)
        assert r.returncode == 0, r

    @classmethod
    def tearDownClass(cls):
        subprocess.run([os.path.join(ROOT, "jobs", "ci", "slurm-down.sh"), cls.state], timeout=60)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def slurm(self, *command, timeout=60, env=None):
        return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                              env=env or self.env, cwd=self.dir)

    def test_small_job_completes(self):
        r = sbatch_wait(self.slurm, "--output", f"{self.dir}/runs/slurm-%j.out", SBATCH,
                        "--data", self.data, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        job = r.stdout.split()[-1]
        with h5py.File(f"{self.dir}/runs/{job}.h5", "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            self.assertEqual(len(f["steps/step"]), 60)
            self.assertEqual(int(f.attrs["final_micro_batch"]), 12)

    def test_language_model_job_from_its_config(self):
        # jobs/configs/gpt-fortunes.ini through the ordinary job script, on a small text and a
        # small GPT (the config's own data and model come from ./jobs/lm.sh --prepare).
        corpus = os.path.join(self.dir, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("a small corpus for a small language model, repeated.\n" * 60)
        r = autoaccum(1, "import", "text", "--out", os.path.join(self.dir, "text"), "--context",
                      16, corpus)
        self.assertEqual(r.returncode, 0, r)
        model = os.path.join(self.dir, "gpt.pt")
        made = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "jobs", "models", "gpt.py"),
                               "--out", model, "--context", "16", "--width", "16", "--layers", "1",
                               "--heads", "2"], capture_output=True, text=True, timeout=120)
        self.assertEqual(made.returncode, 0, made.stdout + made.stderr)
        env = dict(self.env, AUTOACCUM_CONFIG=os.path.join(ROOT, "jobs", "configs",
                                                           "gpt-fortunes.ini"))
        r = sbatch_wait(lambda *c: self.slurm(*c, env=env), "--output",
                        f"{self.dir}/runs/slurm-%j.out", SBATCH,
                        "--data", f"{self.dir}/text/text-train.h5",
                        "--val-data", f"{self.dir}/text/text-val.h5", "--model-file", model,
                        "--steps", "20", "--eval-every", "10", "--checkpoint-every", "10",
                        "--threads", "1", timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        job = r.stdout.split()[-1]
        with h5py.File(f"{self.dir}/runs/{job}.h5", "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            self.assertEqual(len(f["steps/step"]), 20)
            self.assertIn("per token", text(f.attrs["loss"]))
            self.assertGreaterEqual(len(f["eval/loss"]), 1)
            self.assertLess(float(f["steps/loss"][-1]), float(f["steps/loss"][0]))

    def test_array_sweep_over_global_batch_compares_in_one_table(self):
        sweep = os.path.join(ROOT, "jobs", "slurm", "sweep.sbatch")
        env = dict(self.env, AUTOACCUM_SWEEP="100 200", AUTOACCUM_HOME=ROOT)
        r = sbatch_wait(lambda *c: self.slurm(*c, env=env), "--array=0-1", "--output",
                        f"{self.dir}/runs/slurm-%A_%a.out", sweep, "--data", self.data,
                        "--steps", "20", timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        job = r.stdout.split()[-1]
        logs = [f"{self.dir}/runs/{job}_{i}.h5" for i in (0, 1)]
        table = autoaccum(1, "log", *logs)
        self.assertEqual(table.returncode, 0, table)
        rows = table.stdout.splitlines()[1:]
        self.assertEqual(len(rows), 2, table.stdout)
        self.assertEqual(rows[0].split()[1:4], ["completed", "2", "100"])
        self.assertEqual(rows[1].split()[1:4], ["completed", "2", "200"])

    def preempted_job(self, steps, stall_at, log_every, while_pending=None):
        """Submits train.sbatch for `steps` steps with rank 0 stalled 20 s at `stall_at`, preempts
        it when it prints that step (preempt_and_requeue) and waits for the requeued job's end.
        Returns the job id, its output and its (state, restarts, exit code)."""
        r = self.slurm("sbatch", "--parsable", "--output", f"{self.dir}/runs/slurm-%j.out", SBATCH,
                       "--data", self.data, "--steps", steps, "--log-every", log_every,
                       "--inject-stall", f"rank=0,step={stall_at},seconds=20")
        self.assertEqual(r.returncode, 0, r.stderr)
        job = r.stdout.strip().split(";")[0]
        state = preempt_and_requeue(self.slurm, job, f"{self.dir}/runs/slurm-{job}.out",
                                    f"step {stall_at}/{steps}", while_pending=while_pending)
        with open(f"{self.dir}/runs/slurm-{job}.out") as out:
            return job, out.read(), state

    def assert_equals_an_uninterrupted_run(self, checkpoint, steps):
        """The job's final checkpoint equals, bit for bit, the same job run uninterrupted under
        mpirun."""
        reference = f"{self.dir}/reference-{steps}.ckpt.h5"
        r = autoaccum(2, "train", "--config", CONFIG, "--data", self.data, "--steps", steps,
                      "--checkpoint", reference, "--log-every", 0, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(checkpoint, "r") as a, h5py.File(reference, "r") as b:
            self.assertEqual(int(a.attrs["step"]), int(steps))
            names = list(b["params"].keys())
            self.assertTrue(names)
            for name in names:
                np.testing.assert_array_equal(a[f"params/{name}"][:], b[f"params/{name}"][:], name)

    def test_preempted_job_is_requeued_resumes_and_matches_an_uninterrupted_run(self):
        # The signal is sent when "step 150/3000" is printed (150 steps done, step 100's try of
        # the size it lowered from among them) and reaches the job during the 20 s stall that
        # starts right after, however fast the steps run (3000 steps once ended in 4 s, before
        # a signal sent after 100 logged steps). The requeued job resumes at 150 and stalls
        # again; it sleeps, nothing else changes. 3000 steps take 10-40 s.
        steps = "3000"
        job, output, state = self.preempted_job(steps, 150, "50")
        log = f"{self.dir}/runs/{job}.h5"
        checkpoint = f"{self.dir}/runs/{job}.ckpt.h5"
        self.assertEqual(state, ("COMPLETED", 1, "0:0"), output)
        self.assertIn("Exited with exit code 4", output)
        self.assertIn("requeueing job", output)
        # At a step's end, or between two micro-batches of the next one (then dropped).
        stopped = int(re.search(r"stopped by a signal at step (\d+)", output).group(1))
        self.assertIn(f"resumed at step {stopped} with micro-batch 12", output)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(int(steps)))
            # The search at step 0 (and, 100 clean steps later, the one try of the size before
            # the lowering that --micro-batch-regrow makes), then no new search after the
            # requeue: the resumed job continues at 12.
            oom_steps = sorted(set(int(s) for s in f["oom/step"][:]))
            self.assertEqual(oom_steps[0], 0)
            self.assertLessEqual(len(oom_steps), 2, oom_steps)
            self.assertTrue(all(s < stopped for s in oom_steps), (oom_steps, stopped))
        self.assert_equals_an_uninterrupted_run(checkpoint, steps)

    def test_a_requeued_job_whose_checkpoint_was_damaged_resumes_from_the_newest_whole_one(self):
        # Preempted during a stall at step 60; while the job waits to be requeued, one bit of its
        # newest checkpoint's parameters flips on disk. The requeued job passes over it, says so,
        # resumes from the older one kept beside it and ends where an uninterrupted run ends.
        steps = "120"
        kept = []

        def damage(job):
            checkpoint = f"{self.dir}/runs/{job}.ckpt.h5"
            with h5py.File(checkpoint, "r") as f:
                first = "params/" + sorted(f["params"].keys())[0]
            flip_a_bit(checkpoint, first, bit=0x04)
            for older in older_checkpoints(checkpoint):
                with h5py.File(older, "r") as f:
                    kept.append((older, int(f.attrs["step"])))

        job, output, state = self.preempted_job(steps, 60, "10", while_pending=damage)
        checkpoint = f"{self.dir}/runs/{job}.ckpt.h5"
        self.assertEqual(state, ("COMPLETED", 1, "0:0"), output)
        self.assertTrue(kept, "an older checkpoint is kept beside the newest")
        older, older_step = kept[0]
        self.assertIn(f"skipped checkpoint '{checkpoint}' is damaged: dataset 'params/", output)
        self.assertIn(f"resuming from the newest whole checkpoint, {older} (step {older_step})",
                      output)
        self.assertIn(f"resumed at step {older_step}", output)
        with h5py.File(f"{self.dir}/runs/{job}.h5", "r") as f:
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(int(steps)))
            np.testing.assert_array_equal(f["resumes/skipped_checkpoints"][:], [1])
        self.assert_equals_an_uninterrupted_run(checkpoint, steps)

    def test_a_later_job_continues_the_run_on_fewer_ranks(self):
        # Job A: 2 ranks, 40 steps. Job B continues A's run on 1 rank to 80 steps. The result
        # equals an uninterrupted 2-rank run of 80 steps (the sample sequence is global).
        common = ["--data", self.data, "--log-every", "0"]
        r = sbatch_wait(self.slurm, "--output", f"{self.dir}/runs/slurm-%j.out", SBATCH,
                        *common, "--steps", "40", timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        first = r.stdout.strip().split(";")[0]
        env = dict(self.env, AUTOACCUM_CONTINUE=first)
        r = sbatch_wait(lambda *c: self.slurm(*c, env=env), "--ntasks-per-node=1", "--output",
                        f"{self.dir}/runs/slurm-%j.out", SBATCH, *common, "--steps", "80",
                        timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        second = r.stdout.strip().split(";")[0]
        with open(f"{self.dir}/runs/slurm-{second}.out") as out:
            output = out.read()
        self.assertIn("1 task(s)", output)
        self.assertIn("the checkpoint was written by 2 rank(s); now 1: every rank keeps "
                      "micro-batch 12", output)
        self.assertIn("resumed at step 40", output)
        with h5py.File(f"{self.dir}/runs/{first}.h5", "r") as f:
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(80))
            np.testing.assert_array_equal(f["resumes/step"][:], [40])
        reference = f"{self.dir}/reference-80.ckpt.h5"
        r = autoaccum(2, "train", "--config", CONFIG, *common, "--steps", "80",
                      "--checkpoint", reference, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(f"{self.dir}/runs/{first}.ckpt.h5", "r") as a, \
                h5py.File(reference, "r") as b:
            self.assertEqual(int(a.attrs["step"]), 80)
            self.assertEqual(int(a.attrs["world_size"]), 1)
            for name in b["params"].keys():
                np.testing.assert_allclose(a[f"params/{name}"][:], b[f"params/{name}"][:],
                                           rtol=1e-5, atol=1e-7, err_msg=name)


if __name__ == "__main__":
    unittest.main()
