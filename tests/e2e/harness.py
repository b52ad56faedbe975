"""Shared helpers for end-to-end tests: run autoaccum (or a probe) under mpiexec with a timeout."""
import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("AUTOACCUM_BIN", "autoaccum")
MPIEXEC = os.environ.get("AUTOACCUM_MPIEXEC", "mpiexec")
FAULT_PROBE = os.environ.get("AUTOACCUM_FAULT_PROBE", "fault_probe")


def one_core(test):
    """Marks a test (method or class) that runs one process at a time for most of its time
    (measured: at most 1.3 of the machine's cores on average, docs/reliability.md) and asserts no
    time that a slower core would break: ctest gives it one core of its own, run_one.py keeps it
    and everything it starts there, and another such test runs on the other core. Read from the
    source by list_tests.py; at run time it changes nothing."""
    return test


class Result:
    def __init__(self, returncode, stdout, stderr, seconds):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds

    def __repr__(self):
        return (f"rc={self.returncode} after {self.seconds:.1f}s\n--- stdout\n{self.stdout}"
                f"\n--- stderr\n{self.stderr}")


# Open MPI keeps a session directory per mpiexec under $TMPDIR (Open MPI 5:
# prterun.<host>.<pid>.<uid>; 4: ompi.<host>.<uid>/pid.<pid>) and removes it only when mpiexec
# ends normally. Tests that kill mpiexec with SIGKILL leave theirs behind, and a later mpiexec
# that happens to get the same process id (they wrap at 32768) fails to start: Open MPI 5 says
# "PMIX_ERR_EXISTS ... prte_session_dir failed" and exits with 213 (seen in a repeat of the kill
# -9 tests). So every mpiexec a test process starts gets that process's own TMPDIR, removed when
# the process ends: what a killed mpiexec leaves cannot meet another test's mpiexec.
_SESSION_DIR = None


def mpi_env(extra=None):
    """The environment for an mpiexec started by this test process: ours, with a private TMPDIR
    for Open MPI's session directories, and `extra`."""
    global _SESSION_DIR
    if _SESSION_DIR is None:
        _SESSION_DIR = tempfile.mkdtemp(prefix="autoaccum-mpi-")
        atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
    env = dict(os.environ, TMPDIR=_SESSION_DIR)
    env.update(extra or {})
    return env


def session_processes(sid):
    """Process ids of the live (not zombie) processes of session `sid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(int(name))
    return found


def signal_session(job, name):
    """Sends signal `name` (KILL, STOP, ...) to every process of `job`'s session: mpiexec puts
    each rank in a process group of its own, so killpg would reach mpiexec alone."""
    subprocess.run(["pkill", f"-{name}", "-s", str(job.pid)], check=False)


def kill_session(job, seconds=30):
    """SIGKILLs a job's mpiexec and every rank at once and waits until none is left. mpiexec
    gives each rank a process group of its own, so killpg reached mpiexec alone: the orphaned
    ranks ran on for 1-2 s (spinning in MPI beside the next test, writing a run log into a folder
    being removed). `job` must have been started with start_new_session=True."""
    signal_session(job, "KILL")
    job.wait(timeout=seconds)
    deadline = time.monotonic() + seconds
    while session_processes(job.pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {session_processes(job.pid)} of the killed job "
                               f"{job.pid} still run after {seconds} s")
        time.sleep(0.05)


def mpirun(ranks, program, *args, timeout=60, env=None):
    """Runs PROGRAM ARGS on RANKS ranks; a run past TIMEOUT is killed and fails the test."""
    command = [MPIEXEC, "--oversubscribe", "-n", str(ranks), program, *map(str, args)]
    full_env = mpi_env(env)
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
    return Result(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def autoaccum(ranks, *args, timeout=60, env=None):
    return mpirun(ranks, BIN, *args, timeout=timeout, env=env)


def cpu_flags():
    """This CPU's instruction-set flags (/proc/cpuinfo): tests that force or need a kernel set."""
    with open("/proc/cpuinfo") as f:
        return set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))


def digest(path):
    """SHA-256 of a file's bytes: to show a file was left untouched."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def flip_a_bit(path, dataset, bit=0x08):
    """Flips one bit in the middle of an HDF5 dataset's bytes on disk (a contiguous dataset), as
    a failing disk would."""
    import h5py  # the harness itself runs without h5py
    with h5py.File(path, "r") as f:
        d = f[dataset]
        offset, size = d.id.get_offset(), d.id.get_storage_size()
    assert offset is not None and size > 0, dataset
    with open(path, "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)[0]
        f.seek(offset + size // 2)
        f.write(bytes([byte ^ bit]))


def older_checkpoint(path, step):
    """The name autoaccum keeps an older checkpoint under (c.h5 -> c.step40.h5)."""
    stem, suffix = (path[:-3], ".h5") if path.endswith(".h5") else (path, "")
    return f"{stem}.step{step}{suffix}"


def older_checkpoints(path):
    """The older checkpoints kept beside `path`, newest first."""
    stem, suffix = (path[:-3], ".h5") if path.endswith(".h5") else (path, "")
    folder, head = os.path.split(stem + ".step")
    found = []
    for name in os.listdir(folder or "."):
        if name.startswith(head) and name.endswith(suffix):
            digits = name[len(head):len(name) - len(suffix)]
            if digits.isdigit():
                found.append((int(digits), os.path.join(folder, name)))
    return [p for _, p in sorted(found, reverse=True)]


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


def slurm_job_state(slurm, job):
    """(JobState, Restarts, ExitCode) of a Slurm job; `slurm(*command)` runs a client command."""
    fields = dict(item.split("=", 1) for item in
                  slurm("scontrol", "show", "job", "-o", job).stdout.split() if "=" in item)
    return fields.get("JobState"), int(fields.get("Restarts", 0)), fields.get("ExitCode")


# Slurm's job states after which a job runs no more (a requeued job passes through none of them).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE")


def sbatch_wait(slurm, *args, timeout=240):
    """`sbatch ARGS` that returns when the job (every task of an array job) has ended, as
    `sbatch --wait` does, but polling every 0.3 s: sbatch --wait polls at growing intervals and
    returned 45 s after a 10 s job had ended. `slurm(*command)` runs a client command. Returns a
    CompletedProcess whose stdout is the job id and whose returncode is, as sbatch --wait's, the
    highest exit code of the job's tasks (128 + the signal for one a signal ended), or sbatch's
    own when the submission failed."""
    submitted = slurm("sbatch", "--parsable", *map(str, args))
    if submitted.returncode != 0:
        return submitted
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        shown = slurm("scontrol", "show", "job", "-o", job).stdout.splitlines()
        records = [dict(item.split("=", 1) for item in line.split() if "=" in item)
                   for line in shown if line.strip()]
        if records and all(r.get("JobState") in ENDED for r in records):
            break
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(["sbatch", *map(str, args)], timeout)
        time.sleep(0.3)
    codes = []
    for r in records:
        status, _, sig = r.get("ExitCode", "0:0").partition(":")
        codes.append(128 + int(sig) if int(sig or 0) else int(status))
    return subprocess.CompletedProcess(submitted.args, max(codes), job + "\n", submitted.stderr)


def preempt_and_requeue(slurm, job, output, line, seconds=240, while_pending=None):
    """Waits until `job`'s output file `output` holds `line`, signals the job as a preemption
    would (scancel --signal=USR1: the job script checkpoints and requeues), lets the requeued
    job start at once (Slurm would hold it about two minutes), and waits until it ends. Returns
    slurm_job_state's triple.

    The job must not be able to end before the signal arrives, whatever the machine's speed:
    give it an --inject-stall a little after the step that prints `line` (the signal then comes
    during the stall at the latest). A job merely long enough to be signalled mid-run ended
    first on a fast machine (3000 steps in 4 s).

    `while_pending(job)`, when given, runs once the job waits to be requeued, before it is
    released (to damage its checkpoint, as a failing disk would)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with open(output) as f:
                if line in f.read():
                    break
        time.sleep(0.2)
    else:
        with contextlib.suppress(OSError):
            with open(output) as f:
                said = f.read()
        raise RuntimeError(f"job {job} never printed {line!r} in {output} (90 s); it printed:\n"
                           + locals().get("said", "(nothing)"))
    if slurm("scancel", "--signal=USR1", job).returncode != 0:
        raise RuntimeError(f"scancel --signal=USR1 {job} failed")
    deadline = time.monotonic() + seconds
    pending_since = None
    released = False
    while time.monotonic() < deadline:
        state, restarts, exit_code = slurm_job_state(slurm, job)
        if state == "PENDING" and restarts >= 1 and pending_since is None:
            pending_since = time.monotonic()
        # Released 3 s after the requeue, not at once: the nodes revoke the first run's
        # credential, and a new one issued within the same second is refused as revoked (the
        # requeued job then failed with exit code 1 before its script ran).
        if pending_since is not None and not released and time.monotonic() - pending_since >= 3:
            if while_pending:
                while_pending(job)
            slurm("scontrol", "update", f"JobId={job}", "StartTime=now")
            released = True
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.5)
    return state, restarts, exit_code
