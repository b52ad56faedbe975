"""Mixed hardware: per-rank memory limits, per-rank micro-batches (--micro-batch-scope rank),
shares balanced by measured speed (--balance throughput, with --inject-slow), and resuming on
another number of ranks. Each result against PyTorch's own computation of the same global batch
with the sizes and shares each rank used (read back from the run log's rank_sizes group), or
against an uninterrupted run."""
import unittest

import h5py
import numpy as np
import torch

import user_models as um
from harness import TempDirTest, autoaccum, one_core

# ConvBnDropout(width=16) on 1x8x8 images: about 32 KiB + 16 KiB per row of a micro-batch
# (measured: 16 rows 288 KiB, 32 rows 544 KiB, 64 rows 1056 KiB).
SMALL, MEDIUM, LARGE = "300KiB", "600KiB", "1MiB"
# A learning rate at which training is stable: at 0.1 the loss jumps from 1.7 to 7.4 in two steps
# and a rounding difference of 1e-7 (PyTorch's order of sums against the all-reduce's) grows to
# 5e-4 of the update in 12 steps, as large as a micro-batch cut one row differently (2e-3);
# at 0.02 it stays at 3e-6. The comparison is the distance to PyTorch's parameters relative to
# how far they moved (user_models.update_distance): EXACT sits 30x above that rounding and 20x
# below one row cut differently at one step. Element by element, a weight near zero fails an
# rtol on its rounding alone.
LR = 0.02
EXACT = 1e-4


class MixedRanks(TempDirTest):
    prefix = "autoaccum-mixed-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = um.classification_data(256, (1, 8, 8), 4, seed=6)
        cls.data = um.write_data(cls.path("images.h5"), cls.x, cls.y, classes=4)
        # BatchNorm in train mode: its statistics depend on each micro-batch, so the reference
        # must walk exactly the micro-batches each rank walked.
        cls.model = um.save_scripted(um.ConvBnDropout(dropout=0.0, width=16),
                                     cls.path("cbn.pt"))
        cls.initial = {n: p.detach().numpy().copy()
                       for n, p in torch.jit.load(cls.model).named_parameters()}

    def train(self, ranks, name, *args, returncode=0):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        r = autoaccum(ranks, "train", "--data", self.data, "--model-file", self.model,
                      "--threads", 1, "--shuffle", "none", "--lr", LR, "--momentum", 0,
                      "--run-log", log, "--checkpoint", checkpoint, *args, timeout=120)
        self.assertEqual(r.returncode, returncode, r)
        return r, log, checkpoint

    def final_sizes(self, log):
        with h5py.File(log, "r") as f:
            ranks, micro = f["rank_sizes/rank"][:], f["rank_sizes/micro_batch"][:]
            world = int(f.attrs["world_size"])
            self.assertEqual(f.attrs["schema_version"], 15)
        return [int(micro[ranks == r][-1]) for r in range(world)]

    def assert_equals_pytorch(self, world, log, checkpoint, global_batch, steps):
        size_of, parts, _ = um.rank_sizes(log)
        reference = um.reference_steps(self.model, self.x, self.y, world=world,
                                       micro_batch=size_of, global_batch=global_batch,
                                       steps=steps, lr=LR, parts=parts)
        params, buffers = um.checkpoint_tensors(checkpoint)
        self.assertLess(um.update_distance(params, reference, self.initial), EXACT)
        # BatchNorm's statistics: the mean over ranks of what each rank's micro-batches made.
        for name, b in reference.named_buffers():
            np.testing.assert_allclose(buffers[name].reshape(b.shape), b.numpy(), rtol=1e-4,
                                       atol=1e-5, err_msg=name)

    def test_two_ranks_each_halve_to_their_own_limit_and_equal_pytorch(self):
        # 64 rows per rank: rank 0 (300 KiB) halves 64 -> 32 -> 16, rank 1 (600 KiB) only to 32.
        # (The halving search itself; the default, predict, starts below the limits instead:
        # test_memory_model.py.)
        r, log, checkpoint = self.train(2, "rank2", "--global-batch", 128, "--steps", 2,
                                        "--memory-limit", f"{SMALL},{MEDIUM}",
                                        "--micro-batch-scope", "rank",
                                        "--micro-batch-search", "halve")
        self.assertEqual(self.final_sizes(log), [16, 32])
        self.assertIn("the other ranks keep theirs", r.stdout)
        self.assertIn("(limit 300.0 KiB on rank 0); it continues at 16", r.stdout)
        with h5py.File(log, "r") as f:
            self.assertEqual(f.attrs["micro_batch_scope"], "rank")
            oom = sorted(zip(f["oom/rank"][:], f["oom/micro_batch"][:], f["oom/next_micro_batch"][:]))
        self.assertEqual(oom, [(0, 32, 16), (0, 64, 32), (1, 64, 32)])
        self.assert_equals_pytorch(2, log, checkpoint, 128, 2)
        # `autoaccum log` shows each rank's sizes.
        summary = autoaccum(1, "log", log)
        self.assertRegex(summary.stdout, r"rank 0 on .*micro-batch 64 -> 32 -> 16|"
                                         r"rank 0 on .*micro-batch 16 on 64 rows")
        self.assertRegex(summary.stdout, r"rank 1 on .*micro-batch 32 on 64 rows")

        # The same limits with the default scope: every rank goes down to what rank 0 holds.
        r, log, checkpoint = self.train(2, "global2", "--global-batch", 128, "--steps", 2,
                                        "--memory-limit", f"{SMALL},{MEDIUM}",
                                        "--micro-batch-search", "halve")
        self.assertEqual(self.final_sizes(log), [16, 16])
        self.assertIn("all 2 ranks continue at", r.stdout)
        self.assert_equals_pytorch(2, log, checkpoint, 128, 2)

    def test_three_ranks_with_sizes_that_do_not_divide_their_part_equal_pytorch(self):
        # 42 rows per rank: rank 0 ends at 10 (42 = 4 x 10 + 2), rank 1 at 21, rank 2 keeps 42.
        r, log, checkpoint = self.train(3, "rank3", "--global-batch", 126, "--steps", 2,
                                        "--memory-limit", f"{SMALL},{MEDIUM},{LARGE}",
                                        "--micro-batch-scope", "rank",
                                        "--micro-batch-search", "halve", "--log-every", 1)
        self.assertEqual(self.final_sizes(log), [10, 21, 42])
        # The progress line gives each rank's size and number of micro-batches: ceil(42 / size).
        last = [line for line in r.stdout.splitlines() if line.startswith("step 2/2")]
        self.assertEqual(len(last), 1, r.stdout)
        self.assertIn("  m 10,21,42 x 5,2,1  ", last[0])
        self.assert_equals_pytorch(3, log, checkpoint, 126, 2)

    def test_a_slow_rank_gets_fewer_rows_and_the_result_equals_pytorch(self):
        for world, slow in ((2, 1), (3, 2)):
            with self.subTest(world=world):
                r, log, checkpoint = self.train(
                    world, f"balance{world}", "--global-batch", 120, "--steps", 6,
                    "--micro-batch", 8, "--balance", "throughput", "--balance-every", 2,
                    "--inject-slow", f"rank={slow},factor=20", "--log-every", 1)
                self.assertIn("rows per rank", r.stdout)
                _, parts, sizes = um.rank_sizes(log)
                first, last = parts(0), parts(5)
                self.assertEqual(first, um.rank_parts(120, world))
                rows = [hi - lo for lo, hi in last]
                self.assertEqual(sum(rows), 120)
                # The slow rank does a twentieth of the work per second: its share shrinks, and
                # never below its micro-batch. (20x, not 2x: the shares follow measured speeds,
                # and on a busy machine a rank whose core is shared runs 3-4x slower by itself.)
                self.assertLess(rows[slow], 120 // world - 10, rows)
                self.assertGreaterEqual(min(rows), 8, rows)
                with h5py.File(log, "r") as f:
                    self.assertEqual(f.attrs["balance"], "throughput, every 2 steps")
                self.assert_equals_pytorch(world, log, checkpoint, 120, 6)

    def test_automatic_micro_batches_follow_the_balanced_shares_and_equal_pytorch(self):
        # With --micro-batch auto each rank first holds its whole share (60 rows). Balanced, the
        # slow rank's share falls below that size and the fast rank's size grows into its larger
        # share: as far as the whole share without a limit (and at 2 MiB, where the memory
        # model predicts about 120 rows), only to what the model predicts under 1.25 MiB
        # (about 74 rows: two micro-batches), with no out-of-memory either way.
        for name, limit in (("none", None), ("roomy", "2MiB"), ("tight", "1.25MiB")):
            with self.subTest(limit=limit):
                r, log, checkpoint = self.train(
                    2, f"follow-{name}", "--global-batch", 120, "--steps", 6,
                    "--balance", "throughput", "--balance-every", 2,
                    "--inject-slow", "rank=1,factor=20", "--log-every", 1,
                    *(["--memory-limit", limit] if limit else []))
                _, parts, _ = um.rank_sizes(log)
                self.assertEqual(parts(0), [(0, 60), (60, 120)])
                rows = [hi - lo for lo, hi in parts(5)]
                self.assertEqual(sum(rows), 120)
                self.assertLess(rows[1], 45, rows)
                sizes = self.final_sizes(log)
                self.assertEqual(sizes[1], rows[1])  # the slow rank: its share, whole
                if limit == "1.25MiB":
                    self.assertLess(sizes[0], rows[0])
                    self.assertGreaterEqual(sizes[0], rows[0] // 2)
                else:
                    self.assertEqual(sizes[0], rows[0])  # grown past 60 into its share
                self.assertIn("follow the rows per rank", r.stdout)
                with h5py.File(log, "r") as f:
                    self.assertEqual(len(f["oom/step"]), 0)
                self.assert_equals_pytorch(2, log, checkpoint, 120, 6)

    def test_a_resumed_run_keeps_following_the_shares_within_its_memory(self):
        # 1.25 MiB: the fast rank's grown share does not fit whole; its memory model says how
        # much of it does. A resumed run continues at the recorded sizes and follows later
        # changes of the shares with the memory models the checkpoint kept: no out-of-memory
        # after the resume (without them it took the whole share, which ran out).
        # 2 MiB: the fast rank's size grows with its share past the even split (60 rows) and a
        # resume keeps it there (it was cut back to 60 when the even split capped it).
        for limit in ("1.25MiB", "2MiB"):
            with self.subTest(limit=limit):
                common = ("--global-batch", 120, "--balance", "throughput", "--balance-every",
                          2, "--inject-slow", "rank=1,factor=20", "--log-every", 1,
                          "--memory-limit", limit)
                name = f"follow-resume-{limit}"
                self.train(2, name, *common, "--steps", 5)
                r, log, checkpoint = self.train(2, name, *common, "--steps", 12, "--resume")
                micro, parts, _ = um.rank_sizes(log)
                with h5py.File(log, "r") as f:
                    self.assertEqual(list(f["steps/step"][:]), list(range(12)))
                    self.assertEqual([int(s) for s in f["oom/step"][:]], [], r.stdout)
                # At the resume, the sizes it had.
                self.assertEqual([micro(5, rank) for rank in (0, 1)],
                                 [micro(4, rank) for rank in (0, 1)])
                for step in range(5, 12):
                    rows = [hi - lo for lo, hi in parts(step)]
                    self.assertLess(rows[1], 45, rows)
                    if limit == "1.25MiB":  # in more than one piece
                        self.assertLess(micro(step, 0), rows[0], (step, rows))
                if limit == "2MiB":
                    self.assertGreater(micro(4, 0), 60)
                self.assert_equals_pytorch(2, log, checkpoint, 120, 12)

    @one_core
    def test_a_run_resumed_where_the_shares_change_follows_them_as_it_would_have(self):
        # The checkpoint at step 3 is the first with the balanced shares (computed at step 2,
        # applied from step 3): the sizes it holds followed the even split. The run dies in
        # step 3 (a stalled rank, the watchdog), as a job killed between checkpoints would. The
        # resumed run must follow the new shares at step 3 as the interrupted run would have:
        # at 2 MiB the fast rank's size grows past the even split's 60 rows. Before the
        # checkpoint kept the shares the sizes followed, the resumed run took them as
        # following the new shares already and ran rank 0's share in micro-batches of 60.
        common = ("--global-batch", 120, "--balance", "throughput", "--balance-every", 2,
                  "--inject-slow", "rank=1,factor=20", "--log-every", 1,
                  "--memory-limit", "2MiB", "--steps", 12)
        name = "follow-at-change"
        _, _, checkpoint = self.train(2, name, *common, "--checkpoint-every", 3,
                                      "--collective-timeout", 3,
                                      "--inject-stall", "rank=1,step=3,seconds=60", returncode=5)
        with h5py.File(checkpoint, "r") as f:
            self.assertEqual(int(f.attrs["step"]), 3)
            shares = [int(n) for n in f["shares"][:]]
            self.assertEqual([int(n) for n in f["shares_followed"][:]], [60, 60])
            self.assertEqual([int(n) for n in f["micro_batches"][:]], [60, 60])
        self.assertGreater(shares[0], 60)
        r, log, checkpoint = self.train(2, name, *common, "--resume")
        self.assertIn("resumed at step 3", r.stdout)
        micro, parts, _ = um.rank_sizes(log)
        with h5py.File(log, "r") as f:
            self.assertEqual(list(f["steps/step"][:]), list(range(12)))
            self.assertEqual([int(s) for s in f["oom/step"][:]], [], r.stdout)
        self.assertEqual([hi - lo for lo, hi in parts(3)], shares)
        self.assertGreater(micro(3, 0), 60)
        self.assert_equals_pytorch(2, log, checkpoint, 120, 12)

    def test_resume_on_another_number_of_ranks_continues_the_same_run(self):
        x, y = um.classification_data(240, (8,), 3, seed=9)
        data = um.write_data(self.path("flat.h5"), x, y, classes=3)
        model = um.save_scripted(um.Tied(), self.path("tied.pt"))

        def run(ranks, name, steps, *extra):
            checkpoint = self.path(f"{name}.ckpt.h5")
            r = autoaccum(ranks, "train", "--data", data, "--model-file", model, "--threads", 1,
                          "--global-batch", 48, "--steps", steps, "--lr", 0.1,
                          "--checkpoint", checkpoint, "--run-log", self.path(f"{name}.h5"),
                          *extra, timeout=120)
            self.assertEqual(r.returncode, 0, r)
            return r, checkpoint

        _, whole = run(2, "whole", 6)
        for first, then in ((2, 3), (3, 2)):
            with self.subTest(first=first, then=then):
                name = f"resume{first}{then}"
                run(first, name, 3)
                r, resumed = run(then, name, 6, "--resume")
                self.assertIn(f"the checkpoint was written by {first} rank(s); now {then}",
                              r.stdout)
                a, b = um.checkpoint_tensors(whole), um.checkpoint_tensors(resumed)
                for key in a[0]:
                    np.testing.assert_allclose(b[0][key], a[0][key], rtol=1e-5, atol=1e-7,
                                               err_msg=key)
                with h5py.File(self.path(f"{name}.h5"), "r") as f:
                    self.assertEqual(list(f["steps/step"][:]), list(range(6)))
                    self.assertEqual(list(f["resumes/step"][:]), [3])
                    self.assertEqual(list(f["resumes/world_size"][:]), [then])
                    self.assertEqual(int(f.attrs["world_size"]), then)
                    self.assertEqual(len(f["ranks/hostname"]), then)
                    ranks_seen = set(f["rank_sizes/rank"][f["rank_sizes/step"][:] >= 3])
                    self.assertEqual(ranks_seen, set(range(then)))

    @one_core
    def test_bad_limit_lists_and_scopes_are_one_line(self):
        for args, needles in (
                (["--memory-limit", "8MiB,lots"], ["--memory-limit (item 2 of '8MiB,lots')",
                                                   "'lots' is not a size"]),
                (["--memory-limit", "8MiB,,16MiB"], ["item 2"]),
                (["--micro-batch-scope", "sideways"], ["--micro-batch-scope", "global, rank"]),
                (["--inject-slow", "rank=1,factor=0"], ["--inject-slow", "factor must be positive"]),
                (["--balance", "throughput", "--micro-batch", 32],
                 ["--balance throughput", "2 ranks x --micro-batch 32", "--global-batch 63"])):
            r = autoaccum(2, "train", "--data", self.data, "--model-file", self.model,
                          "--global-batch", 63, "--steps", 1, *args, timeout=60)
            self.assertEqual(r.returncode, 1, r)
            errors = um.error_lines(r)
            self.assertEqual(len(errors), 1, r)
            for needle in needles:
                self.assertIn(needle, errors[0], r)


if __name__ == "__main__":
    unittest.main()
