"""The command line end to end: --version, help, and usage errors, under mpiexec."""
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import BIN, autoaccum, one_core


class Version(unittest.TestCase):
    def test_every_version_line_once_under_two_ranks(self):
        r = autoaccum(2, "--version")
        self.assertEqual(r.returncode, 0, r)
        lines = r.stdout.splitlines()
        for prefix in ("autoaccum ", "LibTorch ", "BLAS ", "MPI ", "HDF5 ", "NCCL ", "Boost "):
            matching = [line for line in lines if line.startswith(prefix)]
            self.assertEqual(len(matching), 1, f"{prefix!r} should appear once\n{r}")
        self.assertIn("Open MPI", r.stdout)
        self.assertRegex(r.stdout, r"LibTorch\s+\d+\.\d+")
        self.assertRegex(r.stdout, r"HDF5\s+1\.\d+\.\d+")
        self.assertRegex(r.stdout, r"NCCL\s+(\d+\.\d+\.\d+|not built)")
        self.assertIn("world     2 rank(s)", r.stdout)

    @one_core
    def test_version_subcommand_matches_flag(self):
        a = autoaccum(1, "--version")
        b = autoaccum(1, "version")
        self.assertEqual(a.returncode, 0, a)
        self.assertEqual(a.stdout, b.stdout)


class Help(unittest.TestCase):
    @one_core
    def test_general_help_lists_commands(self):
        r = autoaccum(1, "--help")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("Usage: autoaccum <command>", r.stdout)
        self.assertIn("version", r.stdout)

    def test_help_per_subcommand(self):
        for args in (("version", "--help"), ("help", "version")):
            r = autoaccum(2, *args)
            self.assertEqual(r.returncode, 0, r)
            self.assertEqual(r.stdout.count("Usage: autoaccum version"), 1, r)


    def test_defaults_are_printed_as_written(self):
        r = autoaccum(1, "train", "--help")
        self.assertEqual(r.returncode, 0, r)
        for shown in ("--lr LR (=0.05)", "--momentum M (=0.9)", "--weight-decay WD (=0)",
                      "--collective-timeout SECONDS (=600)"):
            self.assertIn(shown, r.stdout)
        self.assertNotIn("0000000", r.stdout)


class NoMpiWhereNoneIsNeeded(unittest.TestCase):
    """Only `train` initialises MPI: help, version, log, inspect, synth and import start no MPI
    runtime (instant, and usable on a login node). Shown with an MPI that cannot initialise (a
    PML that does not exist): `train` fails there, the others work."""

    def run_alone(self, *args):
        env = dict(os.environ, OMPI_MCA_pml="no_such_pml")
        for name in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMI_", "SLURM_"))]:
            del env[name]
        return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                              timeout=60, env=env)

    def test_commands_other_than_train_run_without_mpi(self):
        folder = tempfile.mkdtemp(prefix="autoaccum-nompi-")
        try:
            data = os.path.join(folder, "d.h5")
            for args, needle in [(("--version",), "world     1 rank(s)"),
                                 (("--help",), "Usage: autoaccum <command>"),
                                 (("train", "--help"), "--global-batch"),
                                 (("synth", "--out", data, "--rows", 100, "--features", 4,
                                   "--classes", 2), "wrote"),
                                 (("inspect", data), "valid training file")]:
                with self.subTest(args=args):
                    r = self.run_alone(*args)
                    self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                    self.assertIn(needle, r.stdout)
            r = self.run_alone("train", "--data", data, "--steps", 1, "--global-batch", 10)
            self.assertNotEqual(r.returncode, 0, "this MPI must not initialise:\n" + r.stderr)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class UsageErrors(unittest.TestCase):
    def assert_one_line_error(self, r, *needles):
        self.assertEqual(r.returncode, 1, r)
        errors = [line for line in r.stderr.splitlines() if line.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, f"one error line from rank 0 expected\n{r}")
        for needle in needles:
            self.assertIn(needle, errors[0])
        self.assertLess(r.seconds, 30, r)

    @one_core
    def test_no_command(self):
        self.assert_one_line_error(autoaccum(2), "no command")

    @one_core
    def test_unknown_command(self):
        self.assert_one_line_error(autoaccum(2, "fly"), "unknown command 'fly'")

    @one_core
    def test_unknown_option(self):
        self.assert_one_line_error(autoaccum(3, "version", "--bogus"), "--bogus", "autoaccum version")

    @one_core
    def test_help_for_unknown_command(self):
        self.assert_one_line_error(autoaccum(2, "help", "fly"), "fly")


if __name__ == "__main__":
    unittest.main()
