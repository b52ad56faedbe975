"""Shared helpers for end-to-end tests: run autoaccum (or a probe) under mpiexec with a timeout."""
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("AUTOACCUM_BIN", "autoaccum")
MPIEXEC = os.environ.get("AUTOACCUM_MPIEXEC", "mpiexec")
FAULT_PROBE = os.environ.get("AUTOACCUM_FAULT_PROBE", "fault_probe")


class Result:
    def __init__(self, returncode, stdout, stderr, seconds):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds

    def __repr__(self):
        return (f"rc={self.returncode} after {self.seconds:.1f}s\n--- stdout\n{self.stdout}"
                f"\n--- stderr\n{self.stderr}")


def mpirun(ranks, program, *args, timeout=60, env=None):
    """Runs PROGRAM ARGS on RANKS ranks; a run past TIMEOUT is killed and fails the test."""
    command = [MPIEXEC, "--oversubscribe", "-n", str(ranks), program, *map(str, args)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
    return Result(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def autoaccum(ranks, *args, timeout=60, env=None):
    return mpirun(ranks, BIN, *args, timeout=timeout, env=env)


def text(value):
    """An HDF5 string attribute as str (h5py returns bytes for fixed-length strings)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def synth(path, rows=2000, features=20, classes=4, seed=1):
    """A synthetic classification file made by `autoaccum synth`; fails loudly if it cannot."""
    r = autoaccum(1, "synth", "--out", path, "--rows", rows, "--features", features,
                  "--classes", classes, "--seed", seed)
    if r.returncode != 0:
        raise RuntimeError(f"autoaccum synth failed: {r}")
    return path


@contextlib.contextmanager
def small_disk(test, path, size):
    """A tmpfs of `size` (e.g. "100k") mounted at `path` for the block, unmounted after; skips
    the test where it cannot be mounted (not root, no tmpfs)."""
    os.makedirs(path, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                      capture_output=True).returncode != 0:
        test.skipTest("cannot mount a small tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


class TempDirTest(unittest.TestCase):
    """A test class with one temporary folder for all its tests (`cls.dir`, `path(name)`),
    removed after the last."""
    prefix = "autoaccum-"

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix=cls.prefix)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)
