"""Checkpoints and data files a cluster can trust: every dataset carries a checksum (xxh3-64 of its
bytes, checked here against Python's xxhash on what h5py reads); a bit flipped on disk in any kind
of checkpoint dataset makes --resume go back to the newest checkpoint that verifies, say so in one
line and in the run log, and end exactly where an uninterrupted run ends; with none that verifies
it stops with one line and writes nothing; `inspect` verifies checkpoints and data files."""
import os
import shutil

import h5py
import numpy as np

import user_models as um
from harness import (TempDirTest, autoaccum, digest, flip_a_bit, older_checkpoint,
                     older_checkpoints, one_core, synth, text)

try:
    import xxhash
except ImportError:  # the CUDA wheel's environment; Debian's python3-xxhash elsewhere
    xxhash = None

# What each kind of dataset --resume reads is flipped in (a contiguous dataset each).
KINDS = ["params/3.weight", "optimizer/momentum_buffer/3.weight", "rng/rank1",
         "memory_model/points"]


def params_of(path):
    with h5py.File(path, "r") as f:
        return {n: f[f"params/{n}"][()] for n in f.attrs["params_names"]}


class Checksums(TempDirTest):
    prefix = "autoaccum-checksums-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = synth(cls.path("rows.h5"), rows=2000, features=20, classes=4, seed=2)

    def train(self, folder, steps, *args):
        # An automatic micro-batch under a limit: the checkpoint holds the memory model too.
        return autoaccum(2, "train", "--data", self.data, "--hidden", "64,64", "--threads", 1,
                         "--global-batch", 200, "--steps", steps, "--checkpoint-every", 4,
                         "--memory-limit", "24MiB", "--log-every", 0,
                         "--checkpoint", os.path.join(folder, "c.h5"),
                         "--run-log", os.path.join(folder, "log.h5"), *args, timeout=120)

    def folder(self, name):
        path = self.path(name)
        os.makedirs(path, exist_ok=True)
        return path

    @one_core
    def test_checksums_are_xxh3_of_the_bytes_h5py_reads(self):
        if xxhash is None:
            self.skipTest("python xxhash is not installed here")
        run = self.folder("independent")
        r = self.train(run, 4)
        self.assertEqual(r.returncode, 0, r)
        checked = 0
        with h5py.File(os.path.join(run, "c.h5"), "r") as f:
            def check(name, item):
                nonlocal checked
                if isinstance(item, h5py.Dataset):
                    self.assertEqual(text(item.attrs["checksum"]),
                                     "xxh3-64:" + xxhash.xxh3_64_hexdigest(item[()].tobytes()), name)
                    checked += 1
            f.visititems(check)
        self.assertGreaterEqual(checked, len(KINDS) + 5)
        with h5py.File(self.data, "r") as f:
            for name in ("x", "y"):
                self.assertEqual(text(f[name].attrs["checksum"]),
                                 "xxh3-64:" + xxhash.xxh3_64_hexdigest(f[name][()].tobytes()))

    @one_core
    def test_a_flipped_bit_in_any_kind_falls_back_and_ends_where_an_uninterrupted_run_ends(self):
        reference = self.folder("reference")
        r = self.train(reference, 12)
        self.assertEqual(r.returncode, 0, r)
        expected = params_of(os.path.join(reference, "c.h5"))

        interrupted = self.folder("interrupted")
        r = self.train(interrupted, 8)
        self.assertEqual(r.returncode, 0, r)
        newest = os.path.join(interrupted, "c.h5")
        self.assertEqual(older_checkpoints(newest), [older_checkpoint(newest, 4)])
        r = autoaccum(1, "inspect", newest)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("verified: ", r.stdout)

        for kind in KINDS:
            with self.subTest(dataset=kind):
                run = self.folder("flip-" + kind.replace("/", "-"))
                for name in os.listdir(interrupted):
                    shutil.copy(os.path.join(interrupted, name), run)
                checkpoint = os.path.join(run, "c.h5")
                flip_a_bit(checkpoint, kind)

                r = autoaccum(1, "inspect", checkpoint)
                self.assertEqual(r.returncode, 1, r)
                self.assertEqual(um.error_lines(r), [
                    f"autoaccum: error: checkpoint '{checkpoint}' is damaged: dataset '{kind}' "
                    "does not match its checksum"], r)

                r = self.train(run, 12, "--resume")
                self.assertEqual(r.returncode, 0, r)
                self.assertIn(f"autoaccum: warning: --resume: skipped checkpoint '{checkpoint}' is "
                              f"damaged: dataset '{kind}' does not match its checksum (moved to "
                              f"{checkpoint}.damaged)", r.stdout)
                self.assertIn("resumed at step 4", r.stdout)
                got = params_of(checkpoint)
                for name, value in expected.items():
                    np.testing.assert_array_equal(got[name], value, err_msg=f"{kind}: {name}")
                self.assertTrue(os.path.exists(checkpoint + ".damaged"), "kept for a look")
                with h5py.File(os.path.join(run, "log.h5"), "r") as f:
                    np.testing.assert_array_equal(f["steps/step"][:], np.arange(12),
                                                  "each step once")
                    np.testing.assert_array_equal(f["resumes/step"][:], [4])
                    np.testing.assert_array_equal(f["resumes/skipped_checkpoints"][:], [1])
                    np.testing.assert_array_equal(f["resumes/dropped_steps"][:], [4])
                    self.assertEqual([text(v) for v in f.attrs["resume_checkpoints"]],
                                     [older_checkpoint(checkpoint, 4)])
                    self.assertIn(kind, text(f.attrs["resume_skipped"][0]))
                r = autoaccum(1, "log", os.path.join(run, "log.h5"))
                self.assertIn(f"resumed at step 4 on 2 rank(s), global batch 200, from "
                              f"{older_checkpoint(checkpoint, 4)}", r.stdout)
                self.assertIn(f"skipped: checkpoint '{checkpoint}' is damaged: dataset '{kind}'",
                              r.stdout)

    @one_core
    def test_a_truncated_newest_falls_back_and_none_whole_is_one_line_with_nothing_written(self):
        run = self.folder("truncated")
        r = self.train(run, 8)
        self.assertEqual(r.returncode, 0, r)
        checkpoint, log = os.path.join(run, "c.h5"), os.path.join(run, "log.h5")
        older = older_checkpoint(checkpoint, 4)
        flip_a_bit(older, "optimizer/momentum_buffer/3.weight")
        with open(checkpoint, "r+b") as f:
            f.truncate(os.path.getsize(checkpoint) // 2)
        before = {p: digest(p) for p in (checkpoint, older, log)}
        r = self.train(run, 12, "--resume")
        self.assertEqual(r.returncode, 1, r)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn(f"--resume: no checkpoint of '{checkpoint}' reads whole", errors[0])
        self.assertIn(f"checkpoint '{checkpoint}' cannot be read", errors[0])
        self.assertIn(f"checkpoint '{older}' is damaged: dataset "
                      f"'optimizer/momentum_buffer/3.weight'", errors[0])
        self.assertEqual({p: digest(p) for p in before}, before, "nothing written")
        self.assertEqual(sorted(os.listdir(run)), ["c.h5", "c.step4.h5", "log.h5"])

    @one_core
    def test_inspect_verifies_a_data_file_and_names_a_damaged_dataset(self):
        data = synth(self.path("inspect.h5"), rows=500, features=8, classes=3, seed=4)
        r = autoaccum(1, "inspect", data)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("checksums: verified (x, y)", r.stdout)
        flip_a_bit(data, "x")
        r = autoaccum(1, "inspect", data)
        self.assertEqual(r.returncode, 1, r)
        self.assertEqual(um.error_lines(r), [
            f"autoaccum: error: '{data}' is damaged: dataset 'x' does not match its checksum"], r)
        # A file written by another tool has no checksums: said, and still valid.
        plain = um.write_data(self.path("plain.h5"), np.zeros((10, 3), np.float32),
                              np.zeros(10, np.int64), classes=2)
        r = autoaccum(1, "inspect", plain)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("checksums: none stored", r.stdout)

    @one_core
    def test_export_verifies_and_refuses_a_damaged_checkpoint_writing_nothing(self):
        x, y = um.classification_data(64, (6,), 3, seed=6)
        data = um.write_data(self.path("export.h5"), x, y, classes=3)
        model = um.save_scripted(um.LinearBn(), self.path("linear-bn.pt"))
        checkpoint, out = self.path("export.ckpt.h5"), self.path("trained.pt")
        r = autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                      "--global-batch", 16, "--steps", 2, "--checkpoint", checkpoint, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", model, "--out", out)
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("from step 2 (checksums verified) to", r.stdout)
        os.remove(out)
        with h5py.File(checkpoint, "r") as f:
            buffer = "buffers/" + text(f.attrs["buffers_names"][0])
        flip_a_bit(checkpoint, buffer)
        r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", model, "--out", out)
        self.assertEqual(r.returncode, 1, r)
        self.assertEqual(um.error_lines(r), [
            f"autoaccum: error: checkpoint '{checkpoint}' is damaged: dataset '{buffer}' does not "
            "match its checksum"], r)
        self.assertFalse(os.path.exists(out))

    @one_core
    def test_keep_checkpoints_keeps_the_last_n_and_bad_values_are_one_line(self):
        run = self.folder("keep")
        r = self.train(run, 16, "--keep-checkpoints", 3)
        self.assertEqual(r.returncode, 0, r)
        checkpoint = os.path.join(run, "c.h5")
        self.assertEqual(older_checkpoints(checkpoint),
                         [older_checkpoint(checkpoint, 12), older_checkpoint(checkpoint, 8)])
        for path, step in ((checkpoint, 16), (older_checkpoint(checkpoint, 8), 8)):
            with h5py.File(path, "r") as f:
                self.assertEqual(int(f.attrs["step"]), step)
        for bad in (0, -1):
            r = self.train(self.folder("keep-bad"), 4, "--keep-checkpoints", bad)
            self.assertEqual(r.returncode, 1, r)
            self.assertEqual(um.error_lines(r), [
                f"autoaccum: error: --keep-checkpoints: must be between 1 and 1000 (got {bad})"], r)
