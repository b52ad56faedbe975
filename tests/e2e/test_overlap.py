"""--overlap on: the gradients all-reduced in buckets during the last backward pass give the
same sums as the one collective (bit for bit on two ranks), and the agreement still holds when
a rank runs out of memory in the forward or the backward pass of that micro-batch, is stopped by
a signal in the middle of a step, or stalls (the watchdog names the bucket the others wait in).
Results against PyTorch's own computation and against runs without overlap."""
import os
import signal
import subprocess
import unittest

import h5py
import numpy as np

import user_models as um
from harness import BIN, MPIEXEC, TempDirTest, autoaccum, mpi_env, one_core, text


class Overlap(TempDirTest):
    prefix = "autoaccum-overlap-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.xi, cls.yi = um.classification_data(192, (1, 8, 8), 4, seed=6)
        cls.images = um.write_data(cls.path("images.h5"), cls.xi, cls.yi, classes=4)
        cls.x, cls.y = um.classification_data(96, (8,), 3, seed=5)
        cls.flat = um.write_data(cls.path("flat.h5"), cls.x, cls.y, classes=3)

    def train(self, ranks, model, data, *args, timeout=120):
        return autoaccum(ranks, "train", "--data", data, "--model-file", model, "--threads", 1,
                         "--shuffle", "none", *args, timeout=timeout)

    def assert_same_tensors(self, a, b):
        got, want = um.checkpoint_tensors(a), um.checkpoint_tensors(b)
        for kind in (0, 1):
            self.assertEqual(sorted(got[kind]), sorted(want[kind]))
            for name in want[kind]:
                np.testing.assert_array_equal(got[kind][name], want[kind][name], err_msg=name)

    def test_buckets_give_the_one_collectives_sums_bit_for_bit_on_two_ranks(self):
        # BatchNorm and dropout; tied weights; frozen weights: several micro-batches per step,
        # buckets of 10 bytes (every parameter in a bucket of its own).
        cases = [("cbnd", um.ConvBnDropout(width=16), self.images, 96),
                 ("tied", um.Tied, self.flat, 48),
                 ("frozen", um.PartlyFrozen, self.flat, 48)]
        for name, module, data, batch in cases:
            model = um.save_scripted(module, self.path(f"{name}.pt"))
            outputs = {}
            for overlap in ("on", "off"):
                checkpoint = self.path(f"{name}-{overlap}.h5")
                log = self.path(f"{name}-{overlap}-log.h5")
                r = self.train(2, model, data, "--global-batch", batch, "--micro-batch", 8,
                               "--steps", 3, "--lr", 0.1, "--momentum", 0.9, "--overlap",
                               overlap, "--bucket-mib", "0.00001", "--checkpoint", checkpoint,
                               "--run-log", log)
                self.assertEqual(r.returncode, 0, r)
                outputs[overlap] = (r, checkpoint, log)
            r, _, log = outputs["on"]
            self.assertIn("gradient all-reduce overlapped with the last backward pass", r.stdout)
            self.assertIn("gradient all-reduce after the last backward pass",
                          outputs["off"][0].stdout)
            with h5py.File(log, "r") as f:
                self.assertIn("overlapped", text(f.attrs["overlap"]))
                self.assertGreaterEqual(int(f.attrs["gradient_buckets"]), 2, name)
            with h5py.File(outputs["off"][2], "r") as f:
                self.assertEqual(int(f.attrs["gradient_buckets"]), 0)
            summary = autoaccum(1, "log", log)
            self.assertEqual(summary.returncode, 0, summary)
            self.assertRegex(summary.stdout, r"gradient all-reduce overlapped with the last "
                                             r"backward pass: \d+ bucket\(s\) of 10 B .*; "
                                             r"exposed [\d.]+ ms per step \(median\)")
            self.assert_same_tensors(outputs["on"][1], outputs["off"][1])

    def test_an_out_of_memory_in_the_last_micro_batch_is_agreed_on_every_rank(self):
        # Three ranks of 32 rows each: the first attempt is one micro-batch of 32 (the last of
        # its attempt) and runs out of memory on rank 1, or on every rank, at the end of its
        # forward pass or late in its backward pass (after the first buckets went). Every rank
        # halves to 16 and the run equals a fixed run at 16 bit for bit, and PyTorch.
        model = um.save_scripted(um.ConvBnDropout(width=16, dropout=0.0), self.path("cbn.pt"))
        common = ["--global-batch", 96, "--steps", 2, "--lr", 0.1, "--momentum", 0,
                  "--overlap", "on", "--bucket-mib", "0.001"]
        fixed = self.path("fixed.h5")
        r = self.train(3, model, self.images, *common, "--micro-batch", 16, "--checkpoint", fixed)
        self.assertEqual(r.returncode, 0, r)
        reference = um.reference_steps(model, self.xi, self.yi, world=3, micro_batch=16,
                                       global_batch=96, steps=2, lr=0.1)
        um.assert_close_to_model(self, fixed, reference)
        for where, key in (("forward", ""), ("backward", ",backward=1")):
            for ranks in ([1], [0, 1, 2]):
                injection = ";".join(f"rank={r},above=16,step=0{key}" for r in ranks)
                checkpoint = self.path(f"oom-{where}-{len(ranks)}.h5")
                r = self.train(3, model, self.images, *common, "--micro-batch-search", "halve",
                               "--inject-oom", injection, "--checkpoint", checkpoint)
                self.assertEqual(r.returncode, 0, r)
                who = "rank 1" if ranks == [1] else "ranks 0, 1, 2"
                self.assertRegex(r.stdout, rf"{who} ran out of memory at micro-batch 32 in "
                                           rf"{where}\b.*all 3 ranks continue at 16", r.stdout)
                self.assert_same_tensors(checkpoint, fixed)

    @unittest.skipUnless(os.path.isdir("/usr/share/games/fortunes"),
                         "Debian's fortunes package is not installed")
    def test_documents_cut_by_tokens_give_the_same_sums_and_agree_on_an_out_of_memory(self):
        # The GPT on fortunes as documents, buckets of about 1 KiB. A fixed budget of 160 tokens:
        # several length-ordered, padded micro-batches per rank, on equals off bit for bit. An
        # automatic budget: each rank's share starts as one micro-batch (the last of its
        # attempt), rank 1 runs out of memory late in its backward pass at step 1, after the
        # first buckets went, and every rank retries the step at a smaller budget; on equals
        # off bit for bit.
        import test_documents as td
        data, _, model, _ = td.fortune_documents_and_gpt(self)
        # Two fresh starts compared bit for bit: the cut from the data alone (pieces), not from
        # timings (auto, the default), which may differ between them.
        common = ["--global-batch", 24, "--steps", 3, "--lr", 0.1, "--momentum", 0.9,
                  "--bucket-mib", "0.001", *td.PIECES]
        data = f"{data}/text-docs-train.h5"
        for case, extra in (("plain", ["--micro-batch-tokens", 160]),
                            ("oom", ["--micro-batch-tokens", "auto", "--micro-batch-search",
                                     "halve", "--inject-oom", "rank=1,above=300,step=1,backward=1"])):
            outputs = {}
            for overlap in ("on", "off"):
                checkpoint = self.path(f"docs-{case}-{overlap}.h5")
                log = self.path(f"docs-{case}-{overlap}-log.h5")
                r = self.train(2, model, data, *common, *extra, "--overlap", overlap,
                               "--checkpoint", checkpoint, "--run-log", log)
                self.assertEqual(r.returncode, 0, r)
                outputs[overlap] = (checkpoint, log)
            with h5py.File(outputs["on"][1], "r") as f:
                self.assertGreaterEqual(int(f.attrs["gradient_buckets"]), 2)
                oom_steps = set(int(s) for s in f["oom/step"][:])
                budgets = [int(b) for b in f["steps/micro_batch"][:]]
                pieces = [int(a) for a in f["steps/accumulation"][:]]
            if case == "plain":
                self.assertEqual((oom_steps, budgets), (set(), [160] * 3))
                self.assertGreaterEqual(min(pieces), 2)
            else:
                self.assertEqual(oom_steps, {1})
                self.assertEqual(pieces[0], 1)  # rank 0's share whole: the last micro-batch
                self.assertGreater(budgets[0], 300)
                self.assertLessEqual(budgets[1], 300)
                self.assertEqual(budgets[2], budgets[1])
            self.assert_same_tensors(outputs["on"][0], outputs["off"][0])

    def test_a_stop_signal_in_the_middle_of_a_step_drops_it_and_the_resume_is_exact(self):
        # Rank 0 stalls at the start of step 1 while rank 1 computes it; SIGUSR1 reaches both:
        # rank 1 stops between micro-batches, rank 0 before its first, each sends its buckets,
        # and both agree to drop the step. The resumed run equals an uninterrupted one.
        model = um.save_scripted(um.ConvBnDropout(width=16), self.path("stop.pt"))
        common = ["--global-batch", 192, "--micro-batch", 1, "--steps", 3, "--overlap", "on",
                  "--bucket-mib", "0.001"]
        whole = self.path("whole.h5")
        r = self.train(2, model, self.images, *common, "--checkpoint", whole)
        self.assertEqual(r.returncode, 0, r)
        checkpoint = self.path("stopped.h5")
        job = subprocess.Popen(
            [MPIEXEC, "--oversubscribe", "-n", "2", BIN, "train", "--data", self.images,
             "--model-file", model, "--threads", "1", "--shuffle", "none", *map(str, common),
             "--log-every", "1", "--checkpoint", checkpoint, "--inject-stall",
             "rank=0,step=1,seconds=3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=mpi_env())
        out = []
        try:
            for line in job.stdout:
                out.append(line)
                if line.startswith("step 1/3"):
                    job.send_signal(signal.SIGUSR1)  # mpirun forwards it to every rank
                    break
            rest, err = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
        out = "".join(out) + rest
        self.assertEqual(job.returncode, 4, out + err)
        self.assertIn("stopped by a signal at step 1 (in step 2, between micro-batches", out)
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 1)
        r = self.train(2, model, self.images, *common, "--checkpoint", checkpoint, "--resume")
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("resumed at step 1", r.stdout)
        self.assert_same_tensors(checkpoint, whole)

    def test_a_stalled_rank_is_named_with_the_bucket_the_others_wait_in(self):
        model = um.save_scripted(um.SmallConv(), self.path("small.pt"))
        r = self.train(3, model, self.images, "--global-batch", 48, "--micro-batch", 8,
                       "--steps", 6, "--overlap", "on", "--bucket-mib", "0.001",
                       "--collective-timeout", 3, "--inject-stall", "rank=1,step=2,seconds=60",
                       timeout=90)
        self.assertEqual(r.returncode, 5, r)
        lines = [l.replace("\x00", "") for l in r.stderr.splitlines() if "collective timeout" in l]
        self.assertEqual(len(lines), 1, r)
        self.assertRegex(lines[0], r"collective timeout: MPI_Allreduce\(float, sum\) of gradient "
                                   r"bucket 1 of \d+ did not complete within 3 s .*rank 1 on \S+ "
                                   r"did not reach it \(still running\); ranks 0, 2 waited; in "
                                   r"step 3 of 6")

    @one_core
    def test_bad_values_get_one_line(self):
        model = um.save_scripted(um.Tied, self.path("bad.pt"))
        for args, needle in ((["--overlap", "sometimes"],
                              "--overlap: 'sometimes' is not one of auto, on, off"),
                             (["--bucket-mib", "0"], "--bucket-mib: must be a size in MiB above 0"),
                             (["--inject-oom", "rank=0,above=1,backward=2"],
                              "backward must be 0 or 1")):
            r = self.train(1, model, self.flat, "--global-batch", 8, "--steps", 1, *args)
            self.assertEqual(r.returncode, 1, r)
            errors = [l for l in r.stderr.splitlines() if l.startswith("autoaccum: error:")]
            self.assertEqual(len(errors), 1, r)
            self.assertIn(needle, errors[0])


if __name__ == "__main__":
    unittest.main()
