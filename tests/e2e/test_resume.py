"""Nothing silently changes which rows a resumed run reads: the checkpoint records what decides
the data order (global batch, shuffle, seed, the data's rows and fingerprint), and --resume with
any of them changed is refused with one line naming the option and both values, the checkpoint
untouched; with them unchanged, a resume on another number of ranks ends where an uninterrupted
run ends. Ranks on different hardware keep bit-identical parameters through clipped steps."""
import h5py
import numpy as np

import user_models as um
from harness import BIN, TempDirTest, autoaccum, cpu_flags, digest, mpirun, one_core, text


class ResumeKeepsTheDataOrder(TempDirTest):
    prefix = "autoaccum-resume-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Labels that identify the row's position (row i has class i % 4) and inputs that
        # identify the row itself: two files of the same shape differ in their values.
        rng = np.random.default_rng(3)
        x = rng.standard_normal((256, 8)).astype(np.float32)
        y = (np.arange(256) % 4).astype(np.int64)
        cls.data = um.write_data(cls.path("rows.h5"), x, y, classes=4)
        cls.same_shape = um.write_data(cls.path("other.h5"), x[::-1].copy(), y, classes=4)
        cls.longer = um.write_data(cls.path("longer.h5"), np.concatenate([x, x]),
                                   np.concatenate([y, y]), classes=4)

    def train(self, ranks, checkpoint, *args, data=None):
        return autoaccum(ranks, "train", "--data", data or self.data, "--hidden", "16",
                         "--threads", 1, "--log-every", 0, "--checkpoint", checkpoint,
                         "--checkpoint-every", 2, *args, timeout=120)

    @one_core
    def test_a_changed_data_option_is_refused_with_one_line(self):
        checkpoint = self.path("run.ckpt.h5")
        base = ("--global-batch", 32, "--shuffle", "batch", "--seed", 5)
        r = self.train(2, checkpoint, *base, "--steps", 4)
        self.assertEqual(r.returncode, 0, r)
        before = digest(checkpoint)
        cases = [
            (("--global-batch", 64, "--shuffle", "batch", "--seed", 5), {},
             ["--global-batch 32", "this run has 64"]),
            (("--global-batch", 32, "--shuffle", "batch", "--seed", 6), {},
             ["--seed 5", "this run has 6"]),
            (("--global-batch", 32, "--shuffle", "none", "--seed", 5), {},
             ["--shuffle batch", "this run has none"]),
            (base, {"data": self.same_shape}, ["--data rows.h5 (256 rows", "other.h5 (256 rows"]),
            (base, {"data": self.longer}, ["--data rows.h5 (256 rows", "longer.h5 (512 rows"]),
        ]
        for args, where, needles in cases:
            with self.subTest(args=args, **where):
                r = self.train(2, checkpoint, *args, "--steps", 8, "--resume", **where)
                self.assertEqual(r.returncode, 1, r)
                errors = um.error_lines(r)
                self.assertEqual(len(errors), 1, r)
                self.assertIn("--resume: checkpoint", errors[0])
                self.assertIn("read some rows of the epoch twice and others never", errors[0])
                for needle in needles:
                    self.assertIn(needle, errors[0])
                self.assertEqual(digest(checkpoint), before)
        # The seed does not order the rows with --shuffle none: changing it is allowed there.
        plain = self.path("plain.ckpt.h5")
        r = self.train(2, plain, "--global-batch", 32, "--shuffle", "none", "--steps", 2)
        self.assertEqual(r.returncode, 0, r)
        r = self.train(2, plain, "--global-batch", 32, "--shuffle", "none", "--seed", 9,
                       "--steps", 4, "--resume")
        self.assertEqual(r.returncode, 0, r)

    def test_unchanged_options_resume_on_another_number_of_ranks_bit_for_bit(self):
        args = ("--global-batch", 48, "--shuffle", "batch", "--seed", 2, "--micro-batch", 8)
        part, whole = self.path("part.ckpt.h5"), self.path("whole.ckpt.h5")
        r = self.train(2, part, *args, "--steps", 4)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(part, "r") as f:
            self.assertEqual(int(f.attrs["data_global_batch"]), 48)
            self.assertEqual(f.attrs["data_shuffle"].decode() if isinstance(
                f.attrs["data_shuffle"], bytes) else str(f.attrs["data_shuffle"]), "batch")
            self.assertEqual(int(f.attrs["data_rows"]), 256)
            self.assertEqual(int(f.attrs["data_batch_in_epoch"]), 4 % (256 // 48))
        log = self.path("part.log.h5")
        r = self.train(3, part, *args, "--steps", 9, "--resume", "--run-log", log)
        self.assertEqual(r.returncode, 0, r)
        r = self.train(3, part, *args, "--steps", 11, "--resume", "--run-log", log,
                       "--log-flush-every", 1)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(log, "r") as f:
            # The run log says how each resumed run was started, beside the first command line.
            self.assertNotIn("--log-flush-every", text(f.attrs["command_line"]))
            resumed = [text(v) for v in f.attrs["resume_command_lines"]]
            self.assertEqual(len(resumed), len(f["resumes/step"]), resumed)
            self.assertIn("--log-flush-every 1", resumed[-1])
        r = self.train(3, whole, *args, "--steps", 11)
        self.assertEqual(r.returncode, 0, r)
        a, _ = um.checkpoint_tensors(part)
        b, _ = um.checkpoint_tensors(whole)
        for name in b:
            # The rank split changes the summation order between 2 and 3 ranks: equal to float
            # rounding, which a different batch order would far exceed.
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


    @one_core
    def test_resume_reshape_changes_the_order_at_an_epoch_boundary_reading_every_row_once(self):
        rows = 96
        x = np.arange(rows, dtype=np.float32).reshape(rows, 1)  # each row names itself
        data = um.write_data(self.path("ids.h5"), x, (np.arange(rows) % 2).astype(np.int64),
                             classes=2)
        model = um.save_scripted(um.RowCounter(rows), self.path("counter.pt"))
        ck, log = self.path("reshape.ckpt.h5"), self.path("reshape.log.h5")

        def run(*args):
            return autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                             "--log-every", 0, "--micro-batch", 4, "--shuffle", "batch",
                             "--checkpoint", ck, "--run-log", log, *args, timeout=120)

        def counts():
            return um.checkpoint_tensors(ck)[1]["seen"] * 2  # averaged over 2 ranks

        # 12 batches of 8 rows per epoch: stop at batch 5 of epoch 1.
        r = run("--global-batch", 8, "--seed", 1, "--steps", 17)
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(sorted(set(counts())), [1, 2])  # epoch 0 whole, 5 batches of epoch 1
        before = digest(ck)
        # Without --resume-reshape a new global batch is refused (test above); with it, in the
        # middle of an epoch, too: the epoch's other rows exist only in the old order. The line
        # says how to finish it.
        r = run("--global-batch", 16, "--seed", 1, "--epochs", 4, "--resume-reshape")
        self.assertEqual(r.returncode, 1, r)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn("--resume-reshape: checkpoint", errors[0])
        self.assertIn("(step 17) is at batch 5 of epoch 1", errors[0])
        self.assertIn("resume first with --global-batch 8 --shuffle batch --seed 1 --steps 24",
                      errors[0])
        self.assertEqual(digest(ck), before)
        # As told: the epoch finished in its order, then 16 rows per batch and another seed.
        r = run("--global-batch", 8, "--seed", 1, "--steps", 24, "--resume")
        self.assertEqual(r.returncode, 0, r)
        np.testing.assert_array_equal(counts(), np.full(rows, 2.0))
        r = run("--global-batch", 16, "--seed", 2, "--epochs", 4, "--resume-reshape")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("--resume-reshape: epoch 2 (from step 24) on reads every row once in the "
                      "new order: --global-batch 8, this run has 16", r.stdout)
        # Epochs 2 and 3 at 6 batches of 16: every row read once per epoch, 4 times in all.
        np.testing.assert_array_equal(counts(), np.full(rows, 4.0))
        with h5py.File(ck, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 36)
            self.assertEqual(int(f.attrs["epoch"]), 4)
            self.assertEqual(int(f.attrs["data_batch_in_epoch"]), 0)
            self.assertEqual(int(f.attrs["data_global_batch"]), 16)
        with h5py.File(log, "r") as f:
            self.assertEqual(list(f["resumes/step"][:]), [17, 24])
            self.assertEqual(list(f["resumes/global_batch"][:]), [8, 16])
            self.assertEqual(list(f["resumes/reshaped"][:]), [0, 1])
            epoch_of = dict(zip(f["steps/step"][:], f["steps/epoch"][:]))
        self.assertEqual([epoch_of[s] for s in (11, 12, 23, 24, 29, 30, 35)],
                         [0, 1, 1, 2, 2, 3, 3])
        summary = autoaccum(1, "log", log).stdout
        self.assertIn("resumed at step 24 on 2 rank(s), global batch 16 (--resume-reshape", summary)
        # A plain resume of the reshaped run counts epochs from its checkpoint: one more epoch.
        r = run("--global-batch", 16, "--seed", 2, "--epochs", 5, "--resume")
        self.assertEqual(r.returncode, 0, r)
        np.testing.assert_array_equal(counts(), np.full(rows, 5.0))
        with h5py.File(ck, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 42)

    @one_core
    def test_resume_reshape_of_documents_cut_by_tokens_reads_every_document_once_per_epoch(self):
        # 48 documents of 2-8 tokens, the first naming the document; batches cut by tokens
        # (whole documents in file order up to the budget, a tail the data ended dropped).
        rng = np.random.default_rng(4)
        lengths = rng.integers(2, 9, 48)
        docs = [np.concatenate([[i], rng.integers(0, 48, n - 1)]) for i, n in enumerate(lengths)]
        data = self.path("docs.h5")
        with h5py.File(data, "w") as f:
            f["tokens"] = np.concatenate(docs).astype(np.uint16)
            f["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            f.attrs["num_classes"] = 48
        model = um.save_scripted(um.DocumentCounter(48), self.path("doc-counter.pt"))
        ck, log = self.path("docs.ckpt.h5"), self.path("docs.log.h5")

        def plan(budget):
            """docs/data-format.md's cut: (documents read per epoch as 0/1, batches per epoch)."""
            read, begin, used, batches = np.zeros(48), 0, 0, 0
            for i, n in enumerate(lengths):
                if used + n > budget:
                    read[begin:i], begin, used, batches = 1, i, 0, batches + 1
                used += n
            if used + lengths.min() > budget:  # else the data ended the last batch: dropped
                read[begin:], batches = 1, batches + 1
            return read, batches

        def run(*args):
            return autoaccum(2, "train", "--data", data, "--model-file", model, "--threads", 1,
                             "--log-every", 0, "--micro-batch-tokens", 16, "--shuffle", "batch",
                             "--checkpoint", ck, "--run-log", log, *args, timeout=120)

        def counts():
            return um.checkpoint_tensors(ck)[1]["seen"] * 2  # averaged over 2 ranks

        (first, per_epoch), (second, per_epoch_after) = plan(40), plan(64)
        r = run("--global-batch-tokens", 40, "--seed", 1, "--steps", per_epoch + 2)
        self.assertEqual(r.returncode, 0, r)
        before = digest(ck)
        r = run("--global-batch-tokens", 64, "--seed", 1, "--epochs", 4, "--resume-reshape")
        self.assertEqual(r.returncode, 1, r)
        errors = um.error_lines(r)
        self.assertEqual(len(errors), 1, r)
        self.assertIn("is at batch 2 of epoch 1", errors[0])
        self.assertIn(f"resume first with --global-batch-tokens 40 --shuffle batch --seed 1 "
                      f"--steps {2 * per_epoch}", errors[0])
        self.assertEqual(digest(ck), before)
        r = run("--global-batch-tokens", 40, "--seed", 1, "--steps", 2 * per_epoch, "--resume")
        self.assertEqual(r.returncode, 0, r)
        np.testing.assert_array_equal(counts(), 2 * first)
        # Another budget and seed for epochs 2 and 3: each reads its plan's documents once.
        r = run("--global-batch-tokens", 64, "--seed", 2, "--epochs", 4, "--resume-reshape")
        self.assertEqual(r.returncode, 0, r)
        np.testing.assert_array_equal(counts(), 2 * first + 2 * second)
        with h5py.File(ck, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 2 * per_epoch + 2 * per_epoch_after)
            self.assertEqual(int(f.attrs["epoch"]), 4)
            self.assertEqual(int(f.attrs["data_global_batch_tokens"]), 64)


def vector_widths():
    """Two of LibTorch's CPU kernel sets that this CPU runs (ATEN_CPU_CAPABILITY): AVX2 and
    AVX-512 where it has AVX-512, else the portable kernels and AVX2. Forcing AVX-512 on a CPU
    without it ends the process with SIGILL (seen on an AVX2-only AMD EPYC)."""
    return ("avx2", "avx512") if "avx512f" in cpu_flags() else ("default", "avx2")


class ReplicasStayEqual(TempDirTest):
    """Ranks on different hardware take every decision after the all-reduce alike: with
    gradient clipping on every step, ranks whose LibTorch uses kernels of different vector
    widths (AVX2 against AVX-512: norm() differs in the last bits, 288.63986 against 288.63983
    for the same 83,000 values; the portable kernels against AVX2 where AVX-512 is missing, whose
    sum() differs: -200.94727 against -200.94577) keep bit-identical parameters, as each
    checkpoint's replica fingerprints say."""
    prefix = "autoaccum-replicas-"

    @one_core
    def test_clipped_steps_leave_ranks_of_different_vector_width_bit_identical(self):
        rng = np.random.default_rng(4)
        data = um.write_data(self.path("d.h5"), rng.standard_normal((512, 64)).astype(np.float32),
                             rng.integers(0, 4, 512).astype(np.int64), classes=4)
        checkpoint = self.path("c.h5")
        args = ["train", "--data", data, "--hidden", "256,256", "--global-batch", 64,
                "--steps", 24, "--clip-grad-norm", 0.05, "--lr", 0.5, "--threads", 1,
                "--log-every", 0, "--checkpoint", checkpoint, "--checkpoint-every", 8]
        # Each rank picks its kernels by its rank (one program: Open MPI 5's launcher crashes
        # on an MPMD command line).
        first, second = vector_widths()
        pick = (f'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then export ATEN_CPU_CAPABILITY={first}; '
                f'else export ATEN_CPU_CAPABILITY={second}; fi; exec "$0" "$@"')
        r = mpirun(2, "sh", "-c", pick, BIN, *args, timeout=180)
        self.assertEqual(r.returncode, 0, r)
        self.assertNotIn("drifted apart", r.stderr)
        with h5py.File(checkpoint, "r") as f:
            prints = [text(v) for v in f.attrs["replica_fingerprints"]]
        self.assertEqual(len(prints), 2)
        self.assertEqual(len(set(prints)), 1, prints)


if __name__ == "__main__":
    import unittest
    unittest.main()
