"""Data commands end to end: import, synth and inspect, checked with h5py and an independent
IDX decoder; the bad-input matrix exits 1 on every rank with one line naming the problem."""
import gzip
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

from harness import BIN, autoaccum, digest, one_core

FASHION = "/usr/share/datasets/fashion-mnist"


def decode_idx(path):
    """Independent IDX decoder (gzip + struct + numpy), not the importer's code."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    assert zero == 0 and dtype == 0x08, path
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw[4 + 4 * ndim:], dtype=np.uint8).reshape(shape)


class Workdir(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="autoaccum-e2e-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)


@unittest.skipUnless(os.path.isdir(FASHION), "dataset-fashion-mnist is not installed")
class ImportFashionMnist(Workdir):
    @one_core
    def test_every_value_matches_the_idx_files(self):
        r = autoaccum(2, "import", "fashion-mnist", "--out", self.dir, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stdout.count("wrote "), 2, r)  # rank 0 only
        for split, prefix, rows in (("train", "train", 60000), ("test", "t10k", 10000)):
            images = decode_idx(f"{FASHION}/{prefix}-images-idx3-ubyte.gz")
            labels = decode_idx(f"{FASHION}/{prefix}-labels-idx1-ubyte.gz")
            with h5py.File(self.path(f"fashion-mnist-{split}.h5"), "r") as f:
                x, y = f["x"], f["y"]
                self.assertEqual(x.dtype, np.uint8)
                self.assertEqual(y.dtype, np.int64)
                self.assertEqual(x.shape, (rows, 1, 28, 28))
                self.assertEqual(y.shape, (rows,))
                np.testing.assert_array_equal(x[:, 0], images)
                np.testing.assert_array_equal(y[:], labels.astype(np.int64))
                self.assertEqual(int(f.attrs["num_classes"]), 10)
                names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["class_names"]]
                self.assertEqual(len(names), 10)
                self.assertEqual(names[0], "T-shirt/top")
                self.assertEqual(names[9], "Ankle boot")

    @one_core
    def test_missing_source_names_the_file_and_keeps_existing_output(self):
        out = self.path("fashion-mnist-train.h5")
        with open(out, "w") as f:
            f.write("precious")
        r = autoaccum(2, "import", "fashion-mnist", "--source", self.path("nowhere"), "--out", self.dir)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("nowhere/train-images-idx3-ubyte.gz", r.stderr)
        with open(out) as f:
            self.assertEqual(f.read(), "precious")

    @one_core
    def test_unknown_dataset(self):
        r = autoaccum(1, "import", "cifar", "--out", self.dir)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("unknown data set 'cifar'", r.stderr)


class Synth(Workdir):
    def synth(self, name, seed, rows=4000):
        r = autoaccum(2, "synth", "--out", self.path(name), "--rows", rows, "--features", 16,
                      "--classes", 4, "--seed", seed)
        self.assertEqual(r.returncode, 0, r)
        return self.path(name)

    def test_deterministic_from_the_seed_and_learnable(self):
        a, b, c = self.synth("a.h5", 5), self.synth("b.h5", 5), self.synth("c.h5", 6)
        with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb, h5py.File(c, "r") as fc:
            np.testing.assert_array_equal(fa["x"][:], fb["x"][:])
            np.testing.assert_array_equal(fa["y"][:], fb["y"][:])
            self.assertFalse(np.array_equal(fa["x"][:], fc["x"][:]))
            x, y = fa["x"][:], fa["y"][:]
            self.assertEqual(x.dtype, np.float32)
            self.assertEqual(int(fa.attrs["num_classes"]), 4)
        # Learnable: class means estimated on one half classify the other half well.
        half = len(y) // 2
        means = np.stack([x[:half][y[:half] == k].mean(axis=0) for k in range(4)])
        guess = np.argmin(((x[half:, None, :] - means[None]) ** 2).sum(-1), axis=1)
        self.assertGreater((guess == y[half:]).mean(), 0.9)

    @one_core
    def test_bad_sizes(self):
        r = autoaccum(2, "synth", "--out", self.path("z.h5"), "--rows", 0, "--features", 3,
                      "--classes", 2)
        self.assertEqual(r.returncode, 1, r)
        self.assertIn("--rows", r.stderr)
        self.assertFalse(os.path.exists(self.path("z.h5")))


class InspectAndBadInput(Workdir):
    def make(self, name, **datasets):
        path = self.path(name)
        with h5py.File(path, "w") as f:
            for key, value in datasets.items():
                if key == "attrs":
                    f.attrs.update(value)
                else:
                    f[key] = value
        return path

    def good(self):
        return self.make("good.h5", x=np.zeros((8, 3), np.float32), y=np.arange(8) % 2,
                         attrs={"num_classes": 2})

    def test_inspect_prints_datasets_and_attributes(self):
        r = autoaccum(2, "inspect", self.good())
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("x  float32  [8, 3]", r.stdout)
        self.assertIn("y  int64  [8]", r.stdout)
        self.assertIn("num_classes = 2", r.stdout)
        self.assertEqual(r.stdout.count("valid training file: 8 rows"), 1, r)

    def assert_bad(self, args, *needles):
        path = args[0] if args and os.path.exists(args[0]) and os.path.isfile(args[0]) else None
        before = digest(path) if path else None
        r = autoaccum(2, "inspect", *args, timeout=30)
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        for needle in needles:
            self.assertIn(needle, errors[0], r)
        self.assertLess(r.seconds, 10, r)
        if path:
            self.assertEqual(digest(path), before, "inspect must not modify the file")

    @one_core
    def test_not_hdf5(self):
        path = self.path("notes.txt")
        with open(path, "w") as f:
            f.write("not hdf5")
        self.assert_bad([path], "notes.txt", "not an HDF5 file")

    @one_core
    def test_truncated(self):
        path = self.make("big.h5", x=np.zeros((5000, 8), np.float32), y=np.zeros(5000, np.int64))
        with open(path, "r+b") as f:
            f.truncate(4096)
        self.assert_bad([path], "big.h5")

    @one_core
    def test_missing_dataset(self):
        self.assert_bad([self.good(), "--inputs", "pixels"], "no dataset 'pixels'", "--inputs")

    @one_core
    def test_lengths_differ(self):
        path = self.make("len.h5", x=np.zeros((10, 2), np.float32), y=np.zeros(9, np.int64))
        self.assert_bad([path], "'x' has 10 rows but 'y' has 9")

    @one_core
    def test_unsupported_dtype(self):
        path = self.make("i16.h5", x=np.zeros((4, 2), np.int16), y=np.zeros(4, np.int64))
        self.assert_bad([path], "dataset 'x'", "unsupported type int16")

    @one_core
    def test_label_out_of_range(self):
        path = self.make("lab.h5", x=np.zeros((4, 2), np.float32), y=np.array([0, 1, 5, 1]),
                         attrs={"num_classes": 3})
        self.assert_bad([path], "dataset 'y'", "label 5 at row 2 is outside [0, 3)")

    @one_core
    def test_empty_dataset(self):
        path = self.make("empty.h5", x=np.zeros((0, 2), np.float32), y=np.zeros(0, np.int64))
        self.assert_bad([path], "empty.h5", "no rows")

    @one_core
    def test_directory(self):
        self.assert_bad([self.dir], "is a directory")

    @one_core
    def test_missing_file(self):
        self.assert_bad([self.path("absent.h5")], "absent.h5", "No such file")

    @one_core
    def test_no_read_permission(self):
        path = self.good()
        os.chmod(path, 0)
        if os.geteuid() != 0:
            self.assert_bad([path], "no read permission")
            return
        # Root reads anything: run as nobody instead (one process, MPI's singleton start).
        setpriv = shutil.which("setpriv")
        if not setpriv:
            self.skipTest("running as root without setpriv")
        os.chmod(self.dir, 0o755)
        done = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                               BIN, "inspect", path], capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("no read permission", done.stderr)

if __name__ == "__main__":
    unittest.main()


class SlowDataIsNamedAtStart(Workdir):
    def test_compressed_data_gets_one_warning_with_its_measured_rate(self):
        # One row per chunk with gzip trains several times slower, and the prefetch thread's
        # decompression takes the training cores without showing as waiting for data.
        rng = np.random.default_rng(1)
        x = rng.standard_normal((512, 64)).astype(np.float32)
        y = rng.integers(0, 4, 512).astype(np.int64)
        slow, fast = os.path.join(self.dir, "slow.h5"), os.path.join(self.dir, "fast.h5")
        with h5py.File(slow, "w") as f:
            f.create_dataset("x", data=x, chunks=(1, 64), compression="gzip")
            f.create_dataset("y", data=y, chunks=(1,), compression="gzip")
        with h5py.File(fast, "w") as f:
            f["x"], f["y"] = x, y
        for path, warned in ((slow, True), (fast, False)):
            with self.subTest(data=path):
                r = autoaccum(2, "train", "--data", path, "--hidden", "16", "--global-batch",
                              128, "--steps", 2, "--threads", 1, "--log-every", 0)
                self.assertEqual(r.returncode, 0, r)
                lines = [l for l in r.stderr.splitlines() if "stored compressed" in l]
                self.assertEqual(len(lines), 1 if warned else 0, r)
                if warned:
                    self.assertRegex(lines[0], r"^autoaccum: warning: --data: 'x' in \S*slow\.h5 "
                                               r"\(chunks of 1 row\) and 1 more stored "
                                               r"compressed: reading a rank's share of a batch "
                                               r"\(64 rows, [\d.]+ KiB\) took [\d.]+ ms \(\d+ "
                                               r"rows/s\)")
                    self.assertIn("h5repack -f NONE -l CONTI", lines[0])
