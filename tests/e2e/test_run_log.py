"""The run log on disk is always whole: after kill -9 at any moment, after a failed write on a
full disk, and across resumes, every log opens with h5py, each group's columns have one length,
steps/step is strictly increasing, each step is there once, and `autoaccum log` reads what h5py
reads."""
import csv
import io
import os
import random
import shutil
import subprocess
import tempfile
import time
import unittest

import h5py
import numpy as np

from harness import BIN, MPIEXEC, autoaccum, kill_session, mpi_env, one_core, small_disk, synth, text


class RunLogIntegrity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="autoaccum-runlog-")
        cls.data = synth(os.path.join(cls.dir, "synth.h5"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def command(self, log, checkpoint, steps, *extra, checkpoint_every=3, flush_every=1):
        return [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.data,
                "--hidden", "32,32", "--threads", "1", "--global-batch", "100", "--steps",
                str(steps), "--run-log", log, "--checkpoint", checkpoint, "--checkpoint-every",
                str(checkpoint_every), "--log-flush-every", str(flush_every), "--log-every", "0",
                "--resume", *extra]

    def assert_whole(self, log):
        """Returns the steps column after checking the log as a reader would."""
        with h5py.File(log, "r") as f:
            for group in ("steps", "oom", "eval", "resumes"):
                lengths = {name: len(f[f"{group}/{name}"]) for name in f[group]}
                self.assertEqual(len(set(lengths.values())), 1, (group, lengths))
            steps = f["steps/step"][:]
            losses = f["steps/loss"][:]
        self.assertTrue(np.all(np.diff(steps) > 0), steps)
        r = autoaccum(1, "log", log, "--csv", "steps")
        self.assertEqual(r.returncode, 0, r)
        rows = list(csv.DictReader(io.StringIO(r.stdout)))
        self.assertEqual([int(row["step"]) for row in rows], steps.tolist())
        self.assertEqual([float(row["loss"]) for row in rows], losses.tolist())
        return steps

    def test_kill_9_at_random_moments_leaves_whole_rows(self):
        log, checkpoint = os.path.join(self.dir, "killed.h5"), os.path.join(self.dir, "killed.ckpt")
        rng = random.Random(7)
        for _ in range(30):
            before = os.stat(log).st_mtime_ns if os.path.exists(log) else 0
            job = subprocess.Popen(self.command(log, checkpoint, 100000), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True, env=mpi_env())
            # Kill while this job writes its log (every step): at a random moment once it has
            # written it at least once.
            deadline = time.monotonic() + 60
            while (not os.path.exists(log) or os.stat(log).st_mtime_ns == before) and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.8))
            kill_session(job)  # mpiexec and every rank, at once
            self.assert_whole(log)
        # The log continues to a clean end: every step once, each resume recorded.
        with h5py.File(checkpoint, "r") as f:
            done = int(f.attrs["step"])
        r = subprocess.run(self.command(log, checkpoint, done + 5), capture_output=True, text=True,
                           timeout=120, env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        steps = self.assert_whole(log)
        np.testing.assert_array_equal(steps, np.arange(done + 5))
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            self.assertGreaterEqual(len(f["resumes/step"]), 1)
            self.assertTrue(np.all(np.diff(f["resumes/step"][:]) >= 0))
        leftovers = [n for n in os.listdir(self.dir) if ".tmp." in n]
        self.assertEqual(leftovers, [], "a killed writer's temporaries are removed at the next start")

    def test_a_run_that_dies_after_a_checkpoint_has_a_row_for_every_checkpointed_step(self):
        # Writes of the log are rare here (--log-flush-every 1000), so only the checkpoint at
        # step 4 makes one: rank 1 then stalls in step 6 and the job is killed there.
        log, checkpoint = os.path.join(self.dir, "dies.h5"), os.path.join(self.dir, "dies.ckpt")
        command = self.command(log, checkpoint, 100, "--collective-timeout", "0", "--inject-stall",
                               "rank=1,step=6,seconds=120", checkpoint_every=4, flush_every=1000)
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, env=mpi_env())
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(checkpoint):
                self.assertLess(time.monotonic(), deadline, "no checkpoint written")
                time.sleep(0.05)
            time.sleep(2)  # steps take milliseconds: rank 1 is in its stall now
            self.assertIsNone(job.poll())
        finally:
            kill_session(job)
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 4)
        np.testing.assert_array_equal(self.assert_whole(log), np.arange(4))
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "running")

    @one_core
    def test_every_checkpoint_has_a_row_with_its_size_and_a_resume_keeps_those_before_it(self):
        log, checkpoint = os.path.join(self.dir, "saved.h5"), os.path.join(self.dir, "saved.ckpt")
        r = subprocess.run(self.command(log, checkpoint, 7, checkpoint_every=3),
                           capture_output=True, text=True, timeout=120, env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        size = os.path.getsize(checkpoint)
        with h5py.File(log, "r") as f:
            np.testing.assert_array_equal(f["checkpoints/step"][:], [3, 6, 7])
            self.assertEqual(int(f["checkpoints/bytes"][-1]), size)
            self.assertEqual(int(f["checkpoints/bytes"][1]), os.path.getsize(checkpoint + ".step6"))
            self.assertTrue(np.all(f["checkpoints/seconds"][:] > 0))
            self.assertEqual(int(f.attrs["schema_version"]), 15)
        r = autoaccum(1, "log", log)
        self.assertIn(f"3 checkpoint(s), the last after step 7: {size / 2**20:.1f} MiB in", r.stdout)
        # Resumed from step 7 (its checkpoint) to 9: the rows up to 7 stay, one more at 9.
        r = subprocess.run(self.command(log, checkpoint, 9, checkpoint_every=3),
                           capture_output=True, text=True, timeout=120, env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with h5py.File(log, "r") as f:
            np.testing.assert_array_equal(f["checkpoints/step"][:], [3, 6, 7, 9])
        r = autoaccum(1, "log", log, "--csv", "checkpoints")
        self.assertEqual([int(row["step"]) for row in csv.DictReader(io.StringIO(r.stdout))],
                         [3, 6, 7, 9])

    def test_a_failed_write_then_a_good_one_leaves_each_row_once(self):
        disk = os.path.join(self.dir, "small-disk")
        with small_disk(self, disk, "2m"):
            log = os.path.join(disk, "log.h5")
            checkpoint = os.path.join(self.dir, "full.ckpt")
            errors = os.path.join(self.dir, "full.err")
            with open(errors, "w") as err:
                job = subprocess.Popen(self.command(log, checkpoint, 3000), stdout=subprocess.DEVNULL,
                                       stderr=err, env=mpi_env())
                deadline = time.monotonic() + 60
                while not os.path.exists(log) and time.monotonic() < deadline:
                    time.sleep(0.05)
                # Fill the disk: the next writes fail.
                filler = os.path.join(disk, "filler")
                subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                               capture_output=True)
                while "run log not updated" not in open(errors).read():
                    self.assertLess(time.monotonic(), deadline, "no write failed")
                    time.sleep(0.05)
                os.remove(filler)
                job.wait(timeout=120)
            self.assertEqual(job.returncode, 0, open(errors).read())
            steps = self.assert_whole(log)
            np.testing.assert_array_equal(steps, np.arange(3000))
            with h5py.File(log, "r") as f:
                self.assertEqual(text(f.attrs["status"]), "completed")

    def test_compressed_data_read_while_the_log_and_checkpoints_are_written(self):
        # The prefetch thread reads compressed chunks through HDF5 while the main thread writes
        # the run log and a checkpoint every step and reads compressed validation data: all
        # HDF5 calls go through one lock. The result equals the same run on contiguous files.
        # (Debian's HDF5 is thread-safe, so here this shows the concurrent use is correct; the
        # lock is what keeps a library built without thread safety from being entered twice.)
        with h5py.File(self.data, "r") as f:
            x, y = f["x"][:], f["y"][:]
        plain = os.path.join(self.dir, "plain-val.h5")
        packed = os.path.join(self.dir, "packed.h5")
        packed_val = os.path.join(self.dir, "packed-val.h5")
        with h5py.File(packed, "w") as f:
            f.create_dataset("x", data=x, chunks=(37, x.shape[1]), compression="gzip")
            f.create_dataset("y", data=y, chunks=(37,), compression="gzip")
        with h5py.File(packed_val, "w") as f, h5py.File(plain, "w") as g:
            f.create_dataset("x", data=x[:500], chunks=(50, x.shape[1]), compression="gzip")
            f.create_dataset("y", data=y[:500], chunks=(50,), compression="gzip")
            g["x"], g["y"] = x[:500], y[:500]
        results = []
        for data, val, name in ((packed, packed_val, "packed"), (self.data, plain, "plain")):
            log, checkpoint = (os.path.join(self.dir, f"{name}-{kind}.h5") for kind in ("log", "ckpt"))
            r = autoaccum(2, "train", "--data", data, "--val-data", val, "--hidden", "32,32",
                          "--threads", "1", "--global-batch", "100", "--steps", "40",
                          "--run-log", log, "--log-flush-every", "1", "--checkpoint", checkpoint,
                          "--checkpoint-every", "1", "--eval-every", "2", timeout=180)
            self.assertEqual(r.returncode, 0, r)
            self.assert_whole(log)
            with h5py.File(checkpoint, "r") as f, h5py.File(log, "r") as g:
                results.append(({n: f[f"params/{n}"][()] for n in f.attrs["params_names"]},
                                g["eval/loss"][:]))
        (packed_params, packed_eval), (plain_params, plain_eval) = results
        self.assertEqual(len(packed_eval), 20)
        np.testing.assert_array_equal(packed_eval, plain_eval)
        for name, value in plain_params.items():
            np.testing.assert_array_equal(packed_params[name], value, err_msg=name)


if __name__ == "__main__":
    unittest.main()
