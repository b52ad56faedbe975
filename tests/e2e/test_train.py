"""`autoaccum train` and `autoaccum log` end to end, checked with h5py and Python's csv module."""
import csv
import io
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import h5py
import numpy as np

from harness import BIN, MPIEXEC, autoaccum, kill_session, mpi_env, older_checkpoint, older_checkpoints, one_core, small_disk

SCHEMA = {
    "steps": ["step", "micro_batch", "accumulation", "loss", "lr", "step_seconds",
              "samples_per_second", "oom_retries", "accumulation_max", "accumulation_max_rank"],
    "oom": ["step", "rank", "micro_batch", "next_micro_batch"],
    "eval": ["step", "loss", "accuracy"],
    "ranks": ["rank", "hostname", "peak_bytes"],
    "rank_sizes": ["step", "rank", "micro_batch", "rows"],
}
ROOT_ATTRIBUTES = ["format", "schema_version", "world_size", "global_batch", "micro_batch_mode",
                   "micro_batch_scope", "balance", "command_line", "started_at", "status",
                   "final_micro_batch"]


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


class Run(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="autoaccum-train-")
        cls.data = os.path.join(cls.dir, "synth.h5")
        cls.val = os.path.join(cls.dir, "val.h5")
        for path, seed in ((cls.data, 1), (cls.val, 2)):
            r = autoaccum(1, "synth", "--out", path, "--rows", 2000, "--features", 20,
                          "--classes", 4, "--seed", seed)
            assert r.returncode == 0, r

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def train(self, ranks, *args, timeout=120):
        return autoaccum(ranks, "train", "--data", self.data, "--hidden", "32,32", "--threads", 1,
                         *args, timeout=timeout)


class Threads(Run):
    @unittest.skipUnless(shutil.which("taskset") and len(os.sched_getaffinity(0)) >= 2,
                         "needs taskset and two CPUs")
    def test_default_threads_follow_the_cpu_mask(self):
        def threads(prefix):
            log = self.path("threads.h5")
            if os.path.exists(log):
                os.remove(log)
            command = [*prefix, MPIEXEC, "--oversubscribe", "--bind-to", "none", "-n", "1", BIN,
                       "train", "--data", self.data, "--hidden", "8", "--global-batch", 50,
                       "--steps", 1, "--run-log", log]
            done = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                                  timeout=60, env=mpi_env())
            self.assertEqual(done.returncode, 0, done.stderr)
            with h5py.File(log, "r") as f:
                return int(f.attrs["threads_per_rank"]), done.stdout

        count, banner = threads(["taskset", "-c", "0"])
        self.assertEqual(count, 1)
        self.assertIn("1 thread(s) per rank (CPU mask of 1 core(s))", banner)
        count, banner = threads([])
        self.assertEqual(count, len(os.sched_getaffinity(0)))
        if len(os.sched_getaffinity(0)) == os.cpu_count():
            self.assertIn(f"{count} thread(s) per rank ({count} cores / 1 rank(s) on the node)",
                          banner)


class RunLogEndToEnd(Run):
    @one_core
    def test_injected_oom_run_log_has_every_field(self):
        log = self.path("oom.h5")
        r = self.train(2, "--global-batch", 200, "--steps", 12, "--val-data", self.val,
                       "--eval-every", 6, "--inject-oom", "rank=1,above=30", "--run-log", log)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("rank 1 ran out of memory at micro-batch 100", r.stdout)
        with h5py.File(log, "r") as f:
            for name in ROOT_ATTRIBUTES:
                self.assertIn(name, f.attrs, name)
            self.assertEqual(text(f.attrs["format"]), "autoaccum.runlog")
            self.assertEqual(int(f.attrs["schema_version"]), 15)
            self.assertEqual(int(f.attrs["world_size"]), 2)
            self.assertEqual(int(f.attrs["global_batch"]), 200)
            self.assertEqual(text(f.attrs["micro_batch_mode"]), "auto")
            self.assertEqual(text(f.attrs["status"]), "completed")
            self.assertIn("--inject-oom", text(f.attrs["command_line"]))
            self.assertRegex(text(f.attrs["started_at"]), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
            for group, columns in SCHEMA.items():
                for column in columns:
                    self.assertIn(f"{group}/{column}", f, f"{group}/{column}")
            lengths = {len(f[f"steps/{c}"]) for c in SCHEMA["steps"]}
            self.assertEqual(lengths, {12}, "every steps column has one row per step")
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(12))
            # Rank 0's part of a batch is 100 rows: micro_batch x accumulation must cover it.
            m, acc = f["steps/micro_batch"][:], f["steps/accumulation"][:]
            self.assertTrue(np.all(m * acc >= 100) and np.all(m * (acc - 1) < 100), (m, acc))
            self.assertTrue(np.all(m <= 30))
            # Both ranks at the same size on equal shares: rank 0 ran the most (lowest rank).
            np.testing.assert_array_equal(f["steps/accumulation_max"][:], acc)
            np.testing.assert_array_equal(f["steps/accumulation_max_rank"][:], 0)
            self.assertEqual(int(f.attrs["final_micro_batch"]), int(m[-1]))
            # The OOM rows: rank 1, at step 0, halving from 100.
            np.testing.assert_array_equal(f["oom/rank"][:], [1, 1])
            np.testing.assert_array_equal(f["oom/micro_batch"][:], [100, 50])
            np.testing.assert_array_equal(f["oom/next_micro_batch"][:], [50, 25])
            np.testing.assert_array_equal(f["oom/step"][:], [0, 0])
            self.assertEqual(int(f["steps/oom_retries"][0]), 2)
            self.assertTrue(np.all(f["steps/oom_retries"][1:] == 0))
            self.assertTrue(np.all(f["steps/samples_per_second"][:] > 0))
            np.testing.assert_array_equal(f["eval/step"][:], [6, 12])
            self.assertTrue(np.all((f["eval/accuracy"][:] >= 0) & (f["eval/accuracy"][:] <= 1)))
            np.testing.assert_array_equal(f["ranks/rank"][:], [0, 1])
            self.assertEqual(len(f["ranks/hostname"]), 2)
            self.assertTrue(np.all(f["ranks/peak_bytes"][:] > 0))
            # Every rank's sizes as changes: both ranks at 25 on 100 rows from step 0 (the size
            # of the attempt that succeeded), nothing changed after.
            sizes = [tuple(int(v) for v in row) for row in zip(
                *(f[f"rank_sizes/{c}"][:] for c in SCHEMA["rank_sizes"]))]
            self.assertEqual(sizes, [(0, 0, 25, 100), (0, 1, 25, 100)])
            steps_h5 = {c: f[f"steps/{c}"][:] for c in SCHEMA["steps"]}

        # The summary names the OOM and the final size.
        summary = autoaccum(1, "log", log)
        self.assertEqual(summary.returncode, 0, summary)
        self.assertIn("step 0: 100 did not fit on rank 1 -> 50", summary.stdout)
        self.assertIn("step 0: 50 did not fit on rank 1 -> 25, accumulation 4, from step 0 on", summary.stdout)
        self.assertIn("final micro-batch 25 (accumulation 4)", summary.stdout)
        self.assertIn("OOM events: 2", summary.stdout)
        self.assertIn("Status: completed", summary.stdout)

        # CSV parses to the values h5py reads.
        table = autoaccum(1, "log", log, "--csv", "steps")
        self.assertEqual(table.returncode, 0, table)
        rows = list(csv.DictReader(io.StringIO(table.stdout)))
        self.assertEqual(len(rows), 12)
        for column, values in steps_h5.items():
            parsed = np.array([float(row[column]) for row in rows])
            np.testing.assert_array_equal(parsed, values.astype(float), column)
        oom = list(csv.DictReader(io.StringIO(autoaccum(1, "log", log, "--csv", "oom").stdout)))
        self.assertEqual([int(r["rank"]) for r in oom], [1, 1])
        # The shortest text that reads back exactly: the learning rate 0.05 prints as 0.05.
        self.assertEqual(rows[0]["lr"], "0.05", rows[0])

    @one_core
    def test_comparison_table_for_several_logs(self):
        logs = []
        for batch in (100, 200):
            logs.append(self.path(f"sweep-{batch}.h5"))
            r = self.train(2, "--global-batch", batch, "--steps", 4, "--run-log", logs[-1])
            self.assertEqual(r.returncode, 0, r)
        missing = self.path("never-written.h5")
        table = autoaccum(1, "log", logs[0], missing, logs[1])
        self.assertEqual(table.returncode, 0, table)
        lines = table.stdout.splitlines()
        self.assertEqual(len(lines), 3, table)
        self.assertIn("sweep-100.h5", lines[1])
        self.assertIn("sweep-200.h5", lines[2])
        self.assertIn("skipping", table.stderr)
        self.assertIn(missing, table.stderr)
        r = autoaccum(1, "log", missing, self.path("also-missing.h5"))
        self.assertEqual(r.returncode, 1, r)
        # A quoted glob, as a job script passes it, expands in name order.
        table = autoaccum(1, "log", self.path("sweep-*.h5"))
        self.assertEqual(table.returncode, 0, table)
        lines = table.stdout.splitlines()
        self.assertEqual(len(lines), 3, table)
        self.assertIn("sweep-100.h5", lines[1])
        self.assertIn("sweep-200.h5", lines[2])
        r = autoaccum(1, "log", self.path("nothing-*.h5"))
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("matches no file", r.stderr)

    @one_core
    def test_a_data_file_held_by_a_writer_is_named_as_locked(self):
        held = self.path("held-by-writer.h5")
        shutil.copyfile(self.data, held)
        with h5py.File(held, "a"):  # h5py holds HDF5's exclusive lock while it is open
            r = autoaccum(1, "inspect", held)
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn("held-by-writer.h5", errors[0])
        self.assertIn("another process has it open for writing", errors[0])
        self.assertIn("HDF5_USE_FILE_LOCKING=FALSE", errors[0])

    @one_core
    def test_config_file_with_a_train_section_and_several_paths_on_one_line(self):
        shard = self.path("second-shard.h5")
        shutil.copyfile(self.data, shard)
        config = self.path("sectioned.ini")
        with open(config, "w") as f:
            f.write(f"# a config as users write them\n[train]\ndata = {self.data} {shard}\n"
                    "hidden = 32,32\nglobal-batch = 100\nsteps = 2\nthreads = 1\n")
        r = autoaccum(2, "train", "--config", config)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("4000 rows", r.stdout, "both shards, from one line")
        with open(config, "a") as f:
            f.write("[evaluate]\nsteps = 3\n")
        r = autoaccum(2, "train", "--config", config)
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn("sectioned.ini", errors[0])
        self.assertIn("section [evaluate]", errors[0])

    def test_oom_at_micro_batch_one_exits_3_on_every_rank(self):
        log = self.path("fail.h5")
        r = self.train(3, "--global-batch", 60, "--steps", 5, "--inject-oom", "rank=2,above=0",
                       "--memory-limit", "64MiB", "--run-log", log,
                       "--micro-batch-search", "halve", timeout=60)
        self.assertEqual(r.returncode, 3, r)
        self.assertLess(r.seconds, 30, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn("rank 2 ran out of memory at micro-batch 1", errors[0])
        self.assertIn("limit 64.0 MiB per rank", errors[0])
        self.assertIn("peak", errors[0])
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "failed")
            self.assertIn("micro-batch 1", text(f.attrs["error"]))

    @one_core
    def test_fixed_micro_batch_oom_exits_3_with_a_hint(self):
        r = self.train(2, "--global-batch", 100, "--steps", 3, "--micro-batch", 20,
                       "--inject-oom", "rank=0,above=10")
        self.assertEqual(r.returncode, 3, r)
        self.assertIn("--micro-batch auto", r.stderr)

    def test_kill_9_leaves_a_readable_log_with_the_flushed_rows(self):
        log = self.path("killed.h5")
        command = [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.data,
                   "--hidden", "32,32", "--threads", "1", "--global-batch", "100",
                   "--steps", "1000000", "--run-log", log, "--log-every", "0"]
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, env=mpi_env())
        try:
            deadline = time.monotonic() + 60
            rows = 0
            while time.monotonic() < deadline and rows < 30:
                time.sleep(0.5)
                try:
                    with h5py.File(log, "r") as f:  # readable while the job runs
                        rows = len(f["steps/step"])
                except OSError:
                    pass  # between creation and the first flush, or mid-flush
            self.assertGreaterEqual(rows, 30, "the log should grow while the job runs")
        finally:
            kill_session(job)
        with h5py.File(log, "r") as f:
            n = len(f["steps/step"])
            self.assertGreaterEqual(n, rows)
            for column in SCHEMA["steps"]:
                self.assertEqual(len(f[f"steps/{column}"]), n, column)
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(n))
            self.assertEqual(text(f.attrs["status"]), "running")

    def test_a_reader_holding_the_log_open_does_not_stop_the_job(self):
        log = self.path("held.h5")
        command = [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.data,
                   "--hidden", "32,32", "--threads", "1", "--global-batch", "100",
                   "--steps", "3000", "--run-log", log, "--log-every", "0"]
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env())
        deadline = time.monotonic() + 30
        while not os.path.exists(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        held = None
        while held is None and time.monotonic() < deadline:
            try:
                held = h5py.File(log, "r")  # keep it open while the job flushes
            except OSError:
                time.sleep(0.05)
        time.sleep(3)
        held.close()
        out, err = job.communicate(timeout=120)
        self.assertEqual(job.returncode, 0, out + err)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            self.assertEqual(len(f["steps/step"]), 3000)

    def test_sigusr1_checkpoints_exits_4_and_resume_completes(self):
        log, checkpoint = self.path("preempt.h5"), self.path("preempt-ckpt.h5")
        command = [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.data,
                   "--hidden", "32,32", "--threads", "1", "--global-batch", "100",
                   "--steps", "100000", "--run-log", log, "--checkpoint", checkpoint,
                   "--memory-limit", "64MiB", "--inject-oom", "rank=1,above=20",
                   "--log-every", "0"]
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env())
        time.sleep(6)
        job.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
        out, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 4, out + err)
        self.assertIn("stopped by a signal", out)
        with h5py.File(checkpoint, "r") as f:
            stopped_at = int(f.attrs["step"])
            self.assertEqual(int(f.attrs["micro_batch"]), 12)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "preempted")
            self.assertEqual(len(f["steps/step"]), stopped_at)
        total = stopped_at + 5
        r = self.train(2, "--global-batch", 100, "--steps", total, "--run-log", log,
                       "--checkpoint", checkpoint, "--resume", "--memory-limit", "64MiB",
                       "--inject-oom", "rank=1,above=20")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(f"resumed at step {stopped_at} with micro-batch 12", r.stdout)
        self.assertNotIn("ran out of memory", r.stdout, "no new search after resuming")
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "completed")
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(total))


    def test_a_signal_mid_step_drops_the_step_at_once_and_resume_is_exact(self):
        # Long steps: 1000 micro-batches of one row per rank. A SIGUSR1 in the middle of step 2
        # ends the job between micro-batches, long before the step would have ended; the step is
        # dropped, and resuming computes it whole: the result equals an uninterrupted run.
        common = ["--data", self.data, "--hidden", "2048,2048", "--threads", "1",
                  "--global-batch", "2000", "--micro-batch", "1", "--shuffle", "none"]
        reference = self.path("whole-2.h5")
        r = autoaccum(2, "train", *common, "--steps", 2, "--checkpoint", reference, timeout=300)
        self.assertEqual(r.returncode, 0, r)
        checkpoint, log = self.path("mid-step.h5"), self.path("mid-step-log.h5")
        job = subprocess.Popen([MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", *common,
                                "--steps", "2", "--log-every", "1", "--checkpoint", checkpoint,
                                "--run-log", log], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=mpi_env())
        out = []
        for line in job.stdout:
            out.append(line)
            if line.startswith("step 1/2"):
                break
        # "step 1/2  loss ...  m 1 x 1000  1.2k samples/s ...": the first step's duration.
        rate = re.search(r"([\d.]+)(k?) samples/s", out[-1])
        self.assertIsNotNone(rate, out)
        step_seconds = 2000 / (float(rate.group(1)) * (1000 if rate.group(2) else 1))
        time.sleep(step_seconds / 4)  # well inside step 2
        sent = time.monotonic()
        job.send_signal(signal.SIGUSR1)
        # Rank 0 says it stopped once the checkpoint is written. Timed to that line, not to the
        # job's end: mpirun alone takes another second to end a job whose ranks exit non-zero
        # (`mpiexec -n 2 sh -c 'exit 4'` takes 1.1 s, `exit 0` 0.1 s).
        stopped_after = None
        for line in job.stdout:
            out.append(line)
            if line.startswith("autoaccum: stopped by a signal"):
                stopped_after = time.monotonic() - sent
                break
        rest, err = job.communicate(timeout=120)
        out = "".join(out) + rest
        self.assertEqual(job.returncode, 4, out + err)
        self.assertIn("stopped by a signal at step 1 (in step 2, between micro-batches", out)
        # The bound: one micro-batch, the collective and a checkpoint, not the rest of the step.
        self.assertIsNotNone(stopped_after, out)
        self.assertLess(stopped_after, step_seconds / 2, (stopped_after, step_seconds))
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 1)
        with h5py.File(log, "r") as f:
            self.assertEqual(text(f.attrs["status"]), "preempted")
            self.assertEqual(len(f["steps/step"]), 1)
        r = autoaccum(2, "train", *common, "--steps", 2, "--checkpoint", checkpoint, "--resume",
                      timeout=300)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("resumed at step 1", r.stdout)
        with h5py.File(checkpoint, "r") as a, h5py.File(reference, "r") as b:
            for name in b.attrs["params_names"]:
                np.testing.assert_array_equal(a[f"params/{name}"][()], b[f"params/{name}"][()],
                                              err_msg=name)


class Checkpoints(Run):
    def test_last_two_are_kept_and_a_corrupt_newest_falls_back_to_the_previous(self):
        checkpoint, log = self.path("rotate.h5"), self.path("rotate-log.h5")
        r = self.train(2, "--global-batch", 100, "--steps", 10, "--checkpoint-every", 4,
                       "--checkpoint", checkpoint, "--run-log", log)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(older_checkpoints(checkpoint), [older_checkpoint(checkpoint, 8)],
                         "--keep-checkpoints 2 by default: the newest and one before")
        with h5py.File(checkpoint, "r") as f, h5py.File(older_checkpoint(checkpoint, 8), "r") as g:
            self.assertEqual(int(f.attrs["step"]), 10)
            self.assertEqual(int(g.attrs["step"]), 8)
        with open(checkpoint, "r+b") as f:
            f.truncate(2000)
        r = self.train(2, "--global-batch", 100, "--steps", 12, "--checkpoint", checkpoint, "--resume",
                       "--run-log", log)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(f"warning: --resume: skipped checkpoint '{checkpoint}'", r.stdout)
        self.assertIn(f"(moved to {checkpoint}.damaged)", r.stdout)
        self.assertIn("resumed at step 8", r.stdout)
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 12)
        # The log had steps 0-9; the resumed run computed 8 and 9 again: their old rows are gone
        # and the resume says so.
        with h5py.File(log, "r") as f:
            np.testing.assert_array_equal(f["steps/step"][:], np.arange(12))
            np.testing.assert_array_equal(f["resumes/step"][:], [8])
            np.testing.assert_array_equal(f["resumes/dropped_steps"][:], [2])
            self.assertEqual(text(f.attrs["status"]), "completed")

    @one_core
    def test_full_disk_while_writing_a_checkpoint_keeps_the_previous_ones(self):
        disk = self.path("tiny")
        # Room for two checkpoints (45 KB each) and a third's estimate (54 KB) minus 30 KB: the
        # third finds the disk too full before it writes anything.
        with small_disk(self, disk, "120k"):
            checkpoint = os.path.join(disk, "c.h5")
            log = self.path("full.h5")
            r = autoaccum(2, "train", "--data", self.data, "--hidden", "64", "--threads", 1,
                          "--global-batch", 100, "--steps", 20, "--checkpoint", checkpoint,
                          "--checkpoint-every", 2, "--run-log", log, timeout=60)
            self.assertEqual(r.returncode, 1, r)
            errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
            self.assertEqual(len(errors), 1, r)
            self.assertRegex(errors[0], rf"^autoaccum: error: rank 0: cannot write "
                                        rf"'{re.escape(checkpoint)}' \(No space left on device: "
                                        r"\d+ bytes needed, \d+ free\)$", r)
            with h5py.File(checkpoint, "r") as f:
                step = int(f.attrs["step"])
            with h5py.File(older_checkpoint(checkpoint, step - 2), "r") as g:
                self.assertEqual(int(g.attrs["step"]) + 2, step)
            self.assertEqual(sorted(os.listdir(disk)), ["c.h5", f"c.step{step - 2}.h5"],
                             "no temporary left behind")
            with h5py.File(log, "r") as f:
                self.assertEqual(text(f.attrs["status"]), "failed")
                self.assertIn("No space left on device", text(f.attrs["error"]))

    @one_core
    def test_truncated_checkpoint_without_a_previous_one_is_a_clear_error(self):
        checkpoint = self.path("lonely.h5")
        r = self.train(2, "--global-batch", 100, "--steps", 2, "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        for older in older_checkpoints(checkpoint):
            os.remove(older)
        with open(checkpoint, "r+b") as f:
            f.truncate(1500)
        with open(checkpoint, "rb") as f:
            before = f.read()
        r = self.train(2, "--global-batch", 100, "--steps", 4, "--checkpoint", checkpoint, "--resume")
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn("lonely.h5", errors[0])
        with open(checkpoint, "rb") as f:
            self.assertEqual(f.read(), before, "the file must not be touched")


class RankDies(Run):
    def test_kill_9_of_one_rank_ends_the_job_and_the_checkpoint_resumes_exactly(self):
        log, checkpoint = self.path("dies.h5"), self.path("dies.ckpt.h5")
        steps = 20000
        common = ["--data", self.data, "--hidden", "32,32", "--threads", "1", "--global-batch", "99",
                  "--checkpoint-every", "50", "--log-every", "0"]
        command = [MPIEXEC, "--oversubscribe", "-n", "3", BIN, "train", *common, "--steps", str(steps),
                   "--run-log", log, "--checkpoint", checkpoint]
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=mpi_env())
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not os.path.exists(checkpoint):
                time.sleep(0.2)
            time.sleep(1)
            ranks = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
            self.assertEqual(len(ranks), 3, ranks)
            killed_at = time.monotonic()
            os.kill(int(ranks[1]), signal.SIGKILL)
            job.communicate(timeout=30)  # every rank gone within 30 s, or this times out
            self.assertLess(time.monotonic() - killed_at, 30)
            self.assertNotEqual(job.returncode, 0)
        finally:
            if job.poll() is None:
                kill_session(job)
        with h5py.File(log, "r") as f:
            self.assertGreater(len(f["steps/step"]), 0)
        with h5py.File(checkpoint, "r") as f:
            stopped = int(f.attrs["step"])
            self.assertGreater(stopped, 0)
            self.assertEqual(stopped % 50, 0)
        total = stopped + 30
        resumed = self.train(3, *common[6:], "--steps", total,
                             "--checkpoint", checkpoint, "--resume")
        self.assertEqual(resumed.returncode, 0, resumed)
        self.assertIn(f"resumed at step {stopped}", resumed.stdout)
        reference = self.path("dies-reference.h5")
        r = self.train(3, *common[6:], "--steps", total, "--checkpoint", reference)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(checkpoint, "r") as a, h5py.File(reference, "r") as b:
            for name in b["params"]:
                np.testing.assert_array_equal(a[f"params/{name}"][:], b[f"params/{name}"][:], name)


class NonFinite(Run):
    def test_stop_by_default_and_skip_when_asked(self):
        r = self.train(3, "--global-batch", 99, "--steps", 8, "--lr", "1e12")
        self.assertEqual(r.returncode, 2, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn("non-finite loss or gradient", errors[0])
        log = self.path("nonfinite.h5")
        checkpoint = self.path("nonfinite.ckpt.h5")
        r = self.train(3, "--global-batch", 99, "--steps", 8, "--lr", "1e12", "--on-nonfinite", "skip",
                       "--run-log", log, "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(log, "r") as f:
            skipped = f["steps/skipped"][:]
            loss = f["steps/loss"][:]
            self.assertEqual(len(skipped), 8)
            self.assertGreater(skipped.sum(), 0)
            np.testing.assert_array_equal(skipped == 1, ~np.isfinite(loss))
        with h5py.File(checkpoint, "r") as f:
            for name in f["params"]:
                self.assertTrue(np.all(np.isfinite(f[f"params/{name}"][:])), "never applied")


class PlotScript(Run):
    @one_core
    def test_png_for_one_and_two_runs(self):
        logs = []
        for name, inject in (("plot-a.h5", "rank=0,above=40"), ("plot-b.h5", "rank=1,above=1000")):
            logs.append(self.path(name))
            r = self.train(2, "--global-batch", 200, "--steps", 5, "--inject-oom", inject,
                           "--run-log", logs[-1])
            self.assertEqual(r.returncode, 0, r)
        script = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "plot-run.py")
        for chosen, png in ((logs[:1], self.path("one.png")), (logs, self.path("two.png"))):
            done = subprocess.run(["/usr/bin/python3", script, *chosen, "-o", png],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(png, "rb") as f:
                header = f.read(8)
            self.assertEqual(header, b"\x89PNG\r\n\x1a\n")
            self.assertGreater(os.path.getsize(png), 10000)
        # A log of an older autoaccum killed mid-flush (columns of unequal length) still plots;
        # a log with no step yet is one line and exit 1, with no PNG.
        torn, empty = self.path("torn.h5"), self.path("empty.h5")
        shutil.copyfile(logs[0], torn)
        with h5py.File(torn, "a") as f:
            loss = f["steps/loss"][:]
            del f["steps/loss"]
            f["steps/loss"] = loss[:-2]
        shutil.copyfile(logs[0], empty)
        with h5py.File(empty, "a") as f:
            for name in list(f["steps"]):
                values = f[f"steps/{name}"][:0]
                del f[f"steps/{name}"]
                f[f"steps/{name}"] = values
        done = subprocess.run(["/usr/bin/python3", script, torn, "-o", self.path("torn.png")],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        done = subprocess.run(["/usr/bin/python3", script, empty, "-o", self.path("empty.png")],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 1, done)
        self.assertIn("no step", done.stderr)
        self.assertFalse(os.path.exists(self.path("empty.png")))


class TrainBadInput(Run):
    def assert_bad(self, ranks, args, *needles, extra=()):
        r = autoaccum(ranks, "train", *args, timeout=30)
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        for needle in needles:
            self.assertIn(needle, errors[0])
        self.assertLess(r.seconds, 10, r)

    @one_core
    def test_matrix(self):
        d = ["--data", self.data, "--steps", "2"]
        cases = [
            (["--bogus"] + d, "--bogus"),
            (d + ["--global-batch", "0"], "--global-batch must be at least 1"),
            (d + ["--lr", "-0.1"], "--lr must be positive"),
            (d + ["--global-batch", "100", "--micro-batch", "60"], "--micro-batch 60 is larger than the per-rank batch"),
            (d + ["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
            (d + ["--global-batch", "1"], "less than one row each"),
            (["--steps", "2"], "'--data' is required"),
            (d + ["--config", self.path("missing.ini")], "--config: cannot read"),
            (d + ["--global-batch", "5000"], "larger than the training data (2000 rows)"),
            (["--data", self.path("nope.h5"), "--steps", "2"], "nope.h5"),
            (d + ["--micro-batch", "lots"], "--micro-batch"),
            (d + ["--model", "transformer"], "--model: 'transformer'"),
            (d + ["--inject-oom", "rank=x"], "--inject-oom"),
            (["--data", self.data], "--steps N or --epochs E"),
            (d + ["--run-log", "/nonexistent/folder/run.h5"], "--run-log: cannot write"),
            (d + ["--checkpoint", self.dir], "is a folder"),
            (d + ["--micro-batch-search", "bisect"], "--micro-batch-search: 'bisect'"),
            # No CUDA build here (or no GPU): every rank learns it, one line.
            (d + ["--device", "cuda"], "--device cuda"),
            (d + ["--device", "tpu"], "--device: 'tpu'"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                self.assert_bad(2, args, needle)

    @one_core
    def test_existing_log_untouched_by_a_failed_start(self):
        log = self.path("keep.h5")
        with open(log, "w") as f:
            f.write("precious")
        self.assert_bad(2, ["--data", self.data, "--steps", "2", "--lr", "0", "--run-log", log], "--lr")
        with open(log) as f:
            self.assertEqual(f.read(), "precious")


if __name__ == "__main__":
    unittest.main()
