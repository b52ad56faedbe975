"""An error on one rank reaches every rank: the job exits non-zero, promptly, with the message."""
import unittest

from harness import FAULT_PROBE, mpirun


class OneRankFails(unittest.TestCase):
    def test_alone_ends_every_rank_through_abort(self):
        # Ranks other than 2 sit in a barrier that would never complete; MPI_Abort ends them.
        r = mpirun(3, FAULT_PROBE, "alone", 2, timeout=60)
        self.assertEqual(r.returncode, 1, r)  # MPI_Abort's error code: InputError's exit code
        self.assertIn("autoaccum: rank 2: error: probe failure on its own", r.stderr)
        self.assertNotIn("all ranks finished", r.stdout)
        self.assertLess(r.seconds, 30, r)

    def test_agreed_failure_exits_with_its_code_and_one_message(self):
        for ranks in (2, 3, 4):
            r = mpirun(ranks, FAULT_PROBE, "agree", ranks - 1, timeout=60)
            self.assertEqual(r.returncode, 1, r)
            lines = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
            self.assertEqual(lines, [f"autoaccum: error: rank {ranks - 1}: probe failure, agreed"], r)
            self.assertNotIn("MPI_ABORT", r.stderr)
            self.assertLess(r.seconds, 30, r)

    def test_no_failure_completes(self):
        r = mpirun(4, FAULT_PROBE, "ok", 0, timeout=60)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stdout.count("all ranks finished"), 1, r)


if __name__ == "__main__":
    unittest.main()
