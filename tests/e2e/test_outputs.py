"""No output overwrites an input: every command that writes refuses, before writing anything,
an output that is one of its inputs or its other output, by name, through a symbolic or a hard
link, or through a linked folder; one line naming both options, exit 1, every file untouched."""
import os

import user_models as um
from harness import TempDirTest, autoaccum, digest, one_core, synth


class OutputsApartFromInputs(TempDirTest):
    prefix = "autoaccum-outputs-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = synth(cls.path("d.h5"), rows=200, features=8, classes=3)
        cls.val = synth(cls.path("v.h5"), rows=50, features=8, classes=3, seed=2)
        cls.model = um.save_scripted(um.Tied(), cls.path("net.pt"))
        os.symlink(cls.data, cls.path("link-to-d.h5"))
        os.link(cls.data, cls.path("hard-d.h5"))
        os.symlink(cls.dir, cls.path("same-folder"))

    def assert_refused(self, r, first, second, before):
        """`before`: the digests of the files that must be untouched, taken before the run."""
        self.assertEqual(r.returncode, 1, r)
        errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
        self.assertEqual(len(errors), 1, r)
        self.assertIn(first, errors[0])
        self.assertIn(second, errors[0])
        self.assertIn("is the same file as", errors[0])
        self.assertIn("nothing was written", errors[0])
        self.assertNotIn("MPI_ABORT", r.stderr + r.stdout)
        for path, value in before.items():
            self.assertEqual(digest(path), value, path)

    def train(self, *args):
        return autoaccum(2, "train", "--data", self.data, "--global-batch", 20, "--steps", 2,
                         "--threads", 1, "--log-every", 0, *args)

    @one_core
    def test_train_refuses_an_output_that_is_its_data_by_any_name(self):
        files = [self.data, self.val, self.model]
        before = {p: digest(p) for p in files}
        cases = [
            (("--checkpoint", self.data), "--checkpoint", "--data"),
            (("--run-log", self.path("link-to-d.h5")), "--run-log", "--data"),
            (("--checkpoint", self.path("hard-d.h5")), "--checkpoint", "--data"),
            (("--checkpoint", self.path("same-folder/d.h5")), "--checkpoint", "--data"),
            (("--checkpoint", self.path("./x/../d.h5")), "--checkpoint", "--data"),
            (("--val-data", self.val, "--run-log", self.val), "--run-log", "--val-data"),
            (("--model-file", self.model, "--checkpoint", self.model), "--checkpoint",
             "--model-file"),
        ]
        for args, first, second in cases:
            with self.subTest(args=args):
                self.assert_refused(self.train(*args), first, second, before)
        # Run log and checkpoint in one file, not written yet, one named through a linked folder.
        out = self.path("out.h5")
        r = self.train("--run-log", out, "--checkpoint", self.path("same-folder/out.h5"))
        self.assert_refused(r, "--checkpoint", "--run-log", before)
        self.assertFalse(os.path.exists(out))
        # Apart, the same command trains.
        r = self.train("--run-log", self.path("log.h5"), "--checkpoint", out)
        self.assertEqual(r.returncode, 0, r)

    @one_core
    def test_export_and_import_refuse_to_overwrite_what_they_read(self):
        checkpoint = self.path("export.ckpt.h5")
        r = autoaccum(1, "train", "--data", self.data, "--model-file", self.model,
                      "--global-batch", 20, "--steps", 1, "--threads", 1, "--log-every", 0,
                      "--checkpoint", checkpoint)
        self.assertEqual(r.returncode, 0, r)
        before = {p: digest(p) for p in (self.model, checkpoint)}
        for out, second in ((self.model, "--model-file"), (checkpoint, "--checkpoint")):
            with self.subTest(out=out):
                r = autoaccum(1, "export", "--checkpoint", checkpoint, "--model-file", self.model,
                              "--out", out)
                self.assert_refused(r, "--out", second, before)
        text = self.path("text")
        os.makedirs(text)
        source = os.path.join(text, "text-train.h5")
        with open(source, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog\n" * 40)
        before = {source: digest(source)}
        r = autoaccum(1, "import", "text", "--context", 8, "--out", text, source)
        self.assert_refused(r, "--out", source, before)
        self.assertFalse(os.path.exists(os.path.join(text, "text-val.h5")))


if __name__ == "__main__":
    import unittest
    unittest.main()
