"""--collective-timeout: a rank that never reaches a collective (a hung file system or GPU,
simulated by --inject-stall or the fault probe's stall; or a frozen process, as a dead node looks)
ends the job with exit code 5 and one line naming the rank, its host and what it is doing, the
step and the last checkpoint; the run log says why; the
checkpoint is intact and a resumed run ends where an uninterrupted one does (bit for bit), and
that one equals PyTorch's computation of the same steps."""
import re
import socket

import h5py
import numpy as np

import user_models as um
from harness import FAULT_PROBE, TempDirTest, autoaccum, mpirun, text

HOST = socket.gethostname()


def timeout_lines(result):
    # Open MPI 5's launcher has been seen to forward a stray NUL byte ahead of a line written
    # just before MPI_Abort ends the job; it is the launcher's, not autoaccum's.
    return [l.replace("\x00", "") for l in result.stderr.splitlines() if "collective timeout" in l]


class ProbeStall(TempDirTest):
    """The communicator alone (tests/mpi/fault_probe.cpp): one rank sleeps before a barrier, its
    watchdog thread answering (stall) or gone (freeze)."""

    def test_the_waiting_ranks_name_the_missing_one_once_and_exit_with_code_5(self):
        # Rank 0 missing: the lowest rank that waited (1) reports instead. The sleeping rank's
        # watchdog thread answers that it runs outside any collective.
        for missing, waited in ((1, "0, 2"), (0, "1, 2")):
            with self.subTest(missing=missing):
                r = mpirun(3, FAULT_PROBE, "stall", missing, 60, 3, timeout=60)
                self.assertEqual(r.returncode, 5, r)
                self.assertEqual(timeout_lines(r), [
                    "autoaccum: error: collective timeout: MPI_Barrier did not complete within "
                    f"3 s (--collective-timeout): rank {missing} on {HOST} did not reach it (still "
                    f"running); ranks {waited} waited; in the probe's stall"], r)
                # 3 s, then MPI_Abort; well before the stalled rank's 60 s.
                self.assertLess(r.seconds, 25, r)

    def test_a_rank_that_cannot_answer_is_named_as_such(self):
        # A process whose watchdog thread is gone answers nothing, as a dead node or a cut link:
        # the others wait the grace period (1 s) for it, then say so; the reporter's abort ends
        # every rank (the other waiting rank would abort itself only after 15 s).
        r = mpirun(3, FAULT_PROBE, "freeze", 1, 3, timeout=60)
        self.assertEqual(r.returncode, 5, r)
        self.assertEqual(timeout_lines(r), [
            "autoaccum: error: collective timeout: MPI_Barrier did not complete within 3 s "
            f"(--collective-timeout): rank 1 on {HOST} does not answer (process, node or link "
            "down); ranks 0, 2 waited; in the probe's freeze"], r)
        self.assertLess(r.seconds, 25, r)

    def test_a_rank_that_never_reaches_the_end_does_not_keep_the_others_in_mpi_finalize(self):
        # Rank 1 finishes its work but does not leave for 60 s (stuck writing on a hung file
        # system): the others wait for it in MPI_Finalize, under the same deadline.
        r = mpirun(3, FAULT_PROBE, "late", 1, 60, 3, timeout=60)
        self.assertEqual(r.returncode, 5, r)
        self.assertEqual(r.stdout.count("all ranks finished"), 1, r)
        self.assertRegex(r.stderr, r"autoaccum: rank [02]: error: MPI_Finalize did not complete "
                                   r"within 3 s \(--collective-timeout\): another rank did not "
                                   r"reach the end of the run")
        self.assertLess(r.seconds, 25, r)

    def test_a_wait_shorter_than_the_timeout_is_not_a_failure(self):
        r = mpirun(3, FAULT_PROBE, "stall", 2, 1.5, 5, timeout=60)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stdout.count("all ranks finished"), 1, r)
        self.assertEqual(timeout_lines(r), [], r)


class TrainerStall(TempDirTest):
    prefix = "autoaccum-watchdog-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = um.classification_data(384, (1, 8, 8), 4, seed=3)
        cls.data = um.write_data(cls.path("images.h5"), cls.x, cls.y, classes=4)
        cls.model = um.save_scripted(um.SmallConv(), cls.path("small_conv.pt"))

    def train(self, name, *args, timeout=90):
        return autoaccum(3, "train", "--data", self.data, "--model-file", self.model,
                         "--threads", 1, "--shuffle", "none", "--lr", 0.1, "--momentum", 0.9,
                         "--global-batch", 48, "--steps", 8, "--micro-batch", 8,
                         "--checkpoint", self.path(f"{name}.ckpt.h5"), "--checkpoint-every", 2,
                         "--run-log", self.path(f"{name}.log.h5"), *args, timeout=timeout)

    def test_a_stalled_rank_ends_the_job_and_the_requeued_job_finishes_the_same_run(self):
        stalled = self.train("stalled", "--collective-timeout", 4,
                             "--inject-stall", "rank=1,step=3,seconds=120")
        self.assertEqual(stalled.returncode, 5, stalled)
        self.assertLess(stalled.seconds, 40, stalled)
        checkpoint = self.path("stalled.ckpt.h5")
        expected = ("collective timeout: MPI_Allreduce(float, sum) did not complete within 4 s "
                    f"(--collective-timeout): rank 1 on {HOST} did not reach it (still running); "
                    f"ranks 0, 2 waited; in step 4 of 8; last checkpoint: {checkpoint} at step 2")
        self.assertEqual(timeout_lines(stalled), ["autoaccum: error: " + expected], stalled)

        # The run log says why; the checkpoint is the one of step 2, readable.
        with h5py.File(self.path("stalled.log.h5"), "r") as log:
            self.assertEqual(text(log.attrs["status"]), "failed")
            self.assertEqual(text(log.attrs["error"]), expected)
            self.assertEqual(len(log["steps/step"]), 3)
        with h5py.File(checkpoint, "r") as c:
            self.assertEqual(int(c.attrs["step"]), 2)

        # Requeued: resumes from step 2 and ends where an uninterrupted run ends, bit for bit.
        resumed = self.train("stalled", "--resume")
        self.assertEqual(resumed.returncode, 0, resumed)
        self.assertIn("resum", resumed.stdout.lower())
        whole = self.train("whole", "--collective-timeout", 0)
        self.assertEqual(whole.returncode, 0, whole)
        got, _ = um.checkpoint_tensors(checkpoint)
        want, _ = um.checkpoint_tensors(self.path("whole.ckpt.h5"))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)

        # And the uninterrupted run is PyTorch's computation of the same 8 steps.
        reference = um.reference_steps(self.model, self.x, self.y, world=3, micro_batch=8,
                                       global_batch=48, steps=8, lr=0.1, momentum=0.9)
        um.assert_close_to_model(self, self.path("whole.ckpt.h5"), reference)

    def test_bad_values_get_one_line(self):
        for args, fragment in [
            (("--collective-timeout", -1), "--collective-timeout: must be a number of seconds"),
            (("--collective-timeout", 0.2), "--collective-timeout: less than 1 s"),
            (("--inject-stall", "rank=1,step=2"), "--inject-stall: 'rank=1,step=2'"),
            (("--inject-stall", "rank=1,step=2,seconds=-3"), "seconds must be a number >= 0"),
        ]:
            r = self.train("bad", *args, timeout=60)
            self.assertEqual(r.returncode, 1, r)
            lines = um.error_lines(r)
            self.assertEqual(len(lines), 1, r)
            self.assertIn(fragment, lines[0])
            self.assertTrue(re.match(r"^autoaccum: error: ", lines[0]), lines[0])


if __name__ == "__main__":
    import unittest
    unittest.main()
