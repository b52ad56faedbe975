"""Shared helpers for end-to-end tests: run autoaccum (or a probe) under mpiexec with a timeout."""
import os
import subprocess
import time

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
