"""Document data (tokens + offsets, docs/data-format.md): micro-batches are token budgets.

Every training run here is compared with PyTorch's own computation of the global batch, done
one document at a time with no padding at all: the loss is the sum of every counted token's
cross-entropy over the batch divided by the count, and one SGD step follows. autoaccum cuts the
same documents into length-ordered, right-padded [m, L] micro-batches, splits each batch
between ranks by tokens, halves budgets after an out-of-memory (all ranks, or one rank with
--micro-batch-scope rank), so agreement shows that none of that changes the gradient: padding
contributes nothing and no token is lost or counted twice. Tolerance EXACT = 1e-5 of the update
(fp32 sums in another order; measured about 1e-7). A run that dropped a micro-batch or counted
padding lies 1e-2 or more away."""
import os
import shutil
import subprocess
import unittest

import h5py
import numpy as np
import torch
import torch.nn.functional as F

import user_models as um
from harness import TempDirTest, autoaccum, older_checkpoint, one_core

VOCAB = 13
EXACT = 1e-5
# The cut from the data alone (the fewest micro-batches), for tests that count each rank's pieces
# or place an out-of-memory in a step: the default (auto) cuts by time measured before the first.
PIECES = ("--micro-batch-cost", "pieces")


class DocLM(torch.nn.Module):
    """Causal: token embedding, a mixing layer, a running mean over earlier positions, a head.
    Right padding cannot reach an earlier position, so a padded row computes what the document
    alone does."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, x):
        h = torch.tanh(self.mix(self.tok(x)))
        steps = torch.arange(1, x.size(1) + 1, dtype=h.dtype).view(1, -1, 1)
        return self.head(torch.cumsum(h, 1) / steps)


class DocClassifier(torch.nn.Module):
    """forward(tokens [m, L], lengths [m]): the mean of each document's own embeddings (the
    lengths mask the padding), then a head over 3 classes."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x, lengths):
        mask = (torch.arange(x.size(1)).view(1, -1) < lengths.view(-1, 1)).to(torch.float32)
        h = (self.tok(x) * mask.unsqueeze(2)).sum(1) / lengths.clamp(min=1).view(-1, 1)
        return self.head(torch.tanh(h))


def documents(count, seed, longest=30):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, count)
    lengths[3] = longest  # the longest is known
    return [rng.integers(0, VOCAB, n).astype(np.int64) for n in lengths]


def write_documents(path, docs, labels=None, dtype="uint16", offsets=None, classes=VOCAB):
    with h5py.File(path, "w") as f:
        f["tokens"] = np.concatenate(docs).astype(dtype)
        f["offsets"] = offsets if offsets is not None else np.concatenate(
            [[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        if labels is not None:
            f["label"] = np.asarray(labels, dtype=np.int64)
        f.attrs["num_classes"] = classes
    return path


def token_batches(lengths, tokens):
    """--global-batch-tokens as docs/data-format.md defines it: whole documents in order while
    the batch's tokens stay within `tokens`; a last batch that could still take a document is
    dropped (the data ended it)."""
    batches, begin, used = [], 0, 0
    for i, n in enumerate(lengths):
        if used + n > tokens:
            batches.append((begin, i))
            begin, used = i, 0
        used += n
    if used + min(lengths) > tokens or not batches:
        batches.append((begin, len(lengths)))
    return batches


def fewest_pieces(lengths, budget):
    """How many micro-batches a budget cuts documents of these lengths into at the fewest
    (docs/data-format.md): longest first, documents taken while (count x the first) fits; one
    longer than the budget goes alone. Taking while they fit gives the fewest such runs."""
    pieces, count, first = 0, 0, 0
    for n in sorted(lengths, reverse=True):
        if count and (count + 1) * first <= budget:
            count += 1
        else:
            pieces, count, first = pieces + 1, 1, n
    return pieces


def rank_budgets(log):
    """Every rank's token budget and documents at every step of a log (`rank_sizes` keeps a
    rank's row only when they change): {step: ([budget per rank], [documents per rank])}."""
    with h5py.File(log, "r") as f:
        g = {c: f[f"rank_sizes/{c}"][:] for c in ("step", "rank", "micro_batch", "rows")}
        steps, world = f["steps/step"][:], int(f.attrs["world_size"])
    out = {}
    for s in steps:
        budgets, rows = [], []
        for r in range(world):
            mine = (g["rank"] == r) & (g["step"] <= s)
            budgets.append(int(g["micro_batch"][mine][-1]))
            rows.append(int(g["rows"][mine][-1]))
        out[int(s)] = (budgets, rows)
    return out


def rank_pieces(log, lengths, batch):
    """Every rank's micro-batches at every step of a log, computed from the documents each rank
    was given and its budget, with --shuffle none: {step: [pieces per rank]}."""
    out = {}
    for s, (budgets, rows) in rank_budgets(log).items():
        begin, pieces = s * batch, []
        for budget, n in zip(budgets, rows):
            pieces.append(fewest_pieces(lengths[begin:begin + n], budget))
            begin += n
        out[s] = pieces
    return out


def reference(model_path, docs, global_batch, steps, lr, labels=None, batches=None):
    """PyTorch, one document at a time, no padding: mean over the batch's counted items.
    `batches`: [(begin, end)] in file order (--global-batch-tokens); default runs of
    `global_batch` documents."""
    model = torch.jit.load(model_path)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if batches is None:
        batches = [(b * global_batch, (b + 1) * global_batch)
                   for b in range(len(docs) // global_batch)]
    for step in range(steps):
        begin, end = batches[step % len(batches)]  # --shuffle none
        opt.zero_grad()
        total, count = 0.0, 0
        for i in range(begin, end):
            d = torch.from_numpy(docs[i])
            if labels is None:
                logits = model(d.view(1, -1))[0]
                total = total + F.cross_entropy(logits[:-1], d[1:], reduction="sum")
                count += len(d) - 1
            else:
                logits = model(d.view(1, -1), torch.tensor([len(d)]))
                total = total + F.cross_entropy(logits, torch.tensor([labels[i]]), reduction="sum")
                count += 1
        (total / count).backward()
        opt.step()
    return model


class Documents(TempDirTest):
    prefix = "autoaccum-documents-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.docs = documents(72, seed=3)
        cls.data = write_documents(cls.path("docs.h5"), cls.docs)
        cls.lm = um.save_scripted(DocLM(), cls.path("doclm.pt"))
        cls.initial = {n: p.detach().numpy().copy()
                       for n, p in torch.jit.load(cls.lm).named_parameters()}

    def train(self, ranks, name, *args, model=None, data=None, steps=3, batch=12, expect=0):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        batch_args = ("--global-batch", batch) if batch else ()
        r = autoaccum(ranks, "train", "--data", data or self.data, "--model-file", model or self.lm,
                      "--threads", 1, "--shuffle", "none", "--lr", 0.1, "--momentum", 0,
                      *batch_args, "--steps", steps, "--run-log", log,
                      "--checkpoint", checkpoint, *args, timeout=120)
        self.assertEqual(r.returncode, expect, r)
        return r, log, checkpoint

    def assert_equals_reference(self, checkpoint, steps=3, batch=12):
        ref = reference(self.lm, self.docs, batch, steps, 0.1)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, self.initial), EXACT)

    @one_core
    def test_whole_shares_at_two_ranks_equal_pytorch_and_log_tokens_and_padding(self):
        r, log, checkpoint = self.train(2, "whole")
        self.assert_equals_reference(checkpoint)
        self.assertIn("micro-batch tokens auto", r.stdout)
        with h5py.File(log, "r") as f:
            tokens, padded = f["steps/tokens"][:], f["steps/padded_tokens"][:]
            self.assertEqual(f.attrs["micro_batch_unit"], "tokens")
            # Documents are cut by predicted time unless told otherwise (issue 54 item 7).
            self.assertEqual(f.attrs["micro_batch_cost"], "by predicted time, each rank's "
                             "compute fitted by the time probe (--micro-batch-cost auto)")
            self.assertEqual(sorted(f["time_model/rank"][:]), [0, 1])  # each rank fitted
            g = {c: f[f"rank_sizes/{c}"][:] for c in ("step", "rank", "rows")}
        lengths = [len(d) for d in self.docs]
        self.assertEqual(list(tokens), [sum(lengths[s * 12:(s + 1) * 12]) for s in range(3)])
        # With the whole share as one micro-batch, each rank pads to its longest document.
        rows = {int(g["rank"][i]): int(g["rows"][i]) for i in range(len(g["step"]))
                if g["step"][i] == 0}
        first = lengths[:12]
        expected = rows[0] * max(first[:rows[0]]) + rows[1] * max(first[rows[0]:])
        self.assertEqual(int(padded[0]), expected)
        # The split is by tokens: the ranks' token counts differ by less than one document.
        t0, t1 = sum(first[:rows[0]]), sum(first[rows[0]:])
        self.assertLessEqual(abs(t0 - t1), max(first))
        summary = autoaccum(1, "log", log).stdout
        self.assertIn(f"Tokens: {sum(lengths[:36])} trained, {int(sum(padded))} processed", summary)
        self.assertIn("Token budget timeline", summary)
        # jobs/plot-run.py plots tokens/s and the padding, beside a row log.
        rows_log = self.path("rows-for-plot.h5")
        rows = um.write_data(self.path("rows.h5"), *um.classification_data(40, (4,), 3, seed=1),
                             classes=3)
        r = autoaccum(2, "train", "--data", rows, "--model", "mlp", "--hidden", "8",
                      "--global-batch", 8, "--steps", 2, "--run-log", rows_log, timeout=120)
        self.assertEqual(r.returncode, 0, r)
        script = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "plot-run.py")
        png = self.path("documents.png")
        done = subprocess.run(["/usr/bin/python3", script, log, rows_log, "-o", png],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertGreater(os.path.getsize(png), 10000)

    def test_small_fixed_budget_at_three_ranks_equals_pytorch(self):
        # 30 tokens: the longest document alone; shorter ones in twos and threes (the fewest
        # pieces, which rank_pieces computes: pinned, the default cuts by measured time).
        _, log, checkpoint = self.train(3, "fixed", "--micro-batch-tokens", 30, *PIECES)
        self.assert_equals_reference(checkpoint)
        with h5py.File(log, "r") as f:
            self.assertTrue(all(f["steps/accumulation"][:] > 1))
            self.assertEqual(set(f["steps/micro_batch"][:]), {30})
            most = [int(v) for v in f["steps/accumulation_max"][:]]
        pieces = rank_pieces(log, [len(d) for d in self.docs], 12)
        self.assertEqual(most, [max(pieces[s]) for s in range(3)], pieces)

    def test_out_of_memory_on_one_rank_of_three_halves_only_its_budget(self):
        r, log, checkpoint = self.train(
            3, "oom", "--micro-batch-scope", "rank", "--inject-oom", "rank=1,above=60,step=1",
            "--log-every", 1, *PIECES)
        self.assert_equals_reference(checkpoint)
        with h5py.File(log, "r") as f:
            ranks = f["oom/rank"][:]
            self.assertGreater(len(ranks), 0)
            self.assertEqual(set(ranks), {1})
            before, after = f["oom/micro_batch"][:], f["oom/next_micro_batch"][:]
            # Halved, never below the longest document (30 tokens), which must go alone.
            self.assertEqual(list(after), [max(b // 2, 30) for b in before])
            self.assertGreater(f["steps/oom_retries"][1], 0)
            acc = f["steps/accumulation"][:]
            most, most_rank = f["steps/accumulation_max"][:], f["steps/accumulation_max_rank"][:]
        # Every rank's micro-batches: rank 0's and the most (and where), as each rank's documents
        # and budget give them. Rank 1, with the halved budget, runs the most from step 1 on.
        expected = rank_pieces(log, [len(d) for d in self.docs], 12)
        for s, pieces in expected.items():
            self.assertEqual(int(acc[s]), pieces[0], s)
            self.assertEqual(int(most[s]), max(pieces), s)
            self.assertEqual(int(most_rank[s]), pieces.index(max(pieces)), s)
        self.assertEqual(int(most_rank[2]), 1, expected)
        self.assertGreater(int(most[2]), int(acc[2]))
        # Once the budgets differ, the progress line gives each rank's budget and micro-batches:
        # "tokens 120,60,120 x 2,4,2".
        budgets = rank_budgets(log)
        for s in (1, 2):
            text = ",".join(map(str, budgets[s][0])) + " x " + ",".join(map(str, expected[s]))
            line = [x for x in r.stdout.splitlines() if x.startswith(f"step {s + 1}/3 ")]
            self.assertEqual(len(line), 1, r.stdout)
            self.assertIn(f"  tokens {text}  pad ", line[0])
        summary = autoaccum(1, "log", log).stdout
        self.assertRegex(summary, rf"the most on one rank {max(most)} \(rank 1, step \d\)")

    @one_core
    def test_out_of_memory_on_every_rank_at_two_ranks_equals_pytorch(self):
        _, log, checkpoint = self.train(
            2, "oomall", "--inject-oom", "rank=0,above=40,step=0;rank=1,above=40,step=0",
            *PIECES)  # the out-of-memory in the first step, not in the time probe before it
        self.assert_equals_reference(checkpoint)
        with h5py.File(log, "r") as f:
            self.assertGreater(f["steps/oom_retries"][0], 0)
            self.assertLessEqual(int(f["steps/micro_batch"][0]), 40)

    def test_resume_on_three_ranks_keeps_the_learned_budget_and_equals_pytorch(self):
        common = ("--inject-oom", "rank=0,above=80,step=0;rank=1,above=80,step=0")
        self.train(2, "resume", *common, steps=2)
        r, log, checkpoint = self.train(3, "resume", *common, "--resume", steps=4)
        self.assert_equals_reference(checkpoint, steps=4)
        with h5py.File(log, "r") as f:
            budgets = list(f["steps/micro_batch"][:])
            self.assertEqual(list(f["steps/step"][:]), [0, 1, 2, 3])
            self.assertEqual(list(f["steps/oom_retries"][2:]), [0, 0])
        self.assertLessEqual(budgets[0], 80)
        self.assertEqual(budgets[2:], [budgets[1]] * 2)  # the halved budget, kept

    @one_core
    def test_batches_cut_by_tokens_equal_pytorch_and_resume_refuses_another_size(self):
        lengths = [len(d) for d in self.docs]
        batches = token_batches(lengths, 200)
        self.assertGreater(len({e - b for b, e in batches}), 1)  # the batches differ in documents
        _, log, checkpoint = self.train(2, "tokens", "--global-batch-tokens", 200,
                                        "--micro-batch-tokens", 60, steps=4, batch=None)
        ref = reference(self.lm, self.docs, None, 4, 0.1, batches=batches)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, self.initial), EXACT)
        with h5py.File(log, "r") as f:
            self.assertEqual(list(f["steps/tokens"][:]),
                             [sum(lengths[b:e]) for b, e in batches[:4]])
            self.assertTrue(all(t <= 200 for t in f["steps/tokens"][:]))
        r, _, _ = self.train(2, "tokens", "--global-batch-tokens", 300, "--resume", steps=6,
                             batch=None, expect=1)
        self.assertIn("was written with --global-batch-tokens 200, this run has 300",
                      um.error_lines(r)[0])

    def test_refine_probes_budgets_upwards_and_stays_exact(self):
        _, log, checkpoint = self.train(2, "refine", "--micro-batch-search", "refine",
                                        "--inject-oom", "rank=0,above=70", steps=5)
        self.assert_equals_reference(checkpoint, steps=5)
        with h5py.File(log, "r") as f:
            budgets = list(f["steps/micro_batch"][:])
            at_first = f["oom/step"][:] == 0
            halved = int(f["oom/next_micro_batch"][:][at_first][-1])  # where step 0 settled
        self.assertLessEqual(halved, 70)
        self.assertGreater(max(budgets[1:]), halved, budgets)  # a probe above the halved budget

    def test_balance_gives_a_slow_rank_fewer_tokens_and_stays_exact(self):
        _, log, checkpoint = self.train(2, "balance", "--balance", "throughput",
                                        "--balance-every", 2, "--inject-slow", "rank=1,factor=20",
                                        "--micro-batch-tokens", 60, steps=6)
        self.assert_equals_reference(checkpoint, steps=6)
        with h5py.File(log, "r") as f:
            g = {c: f[f"rank_sizes/{c}"][:] for c in ("step", "rank", "rows")}
        rows0 = [int(g["rows"][i]) for i in range(len(g["step"])) if g["rank"][i] == 0][-1]
        lengths = [len(d) for d in self.docs]
        last = lengths[60:72]  # step 5: the sixth batch (--shuffle none)
        t0, t1 = sum(last[:rows0]), sum(last[rows0:])
        # 20x slower per token: about a twentieth of the tokens; even would be about half (a margin
        # that holds when the machine is busy and the measured speeds come closer together).
        self.assertLess(t1, 0.6 * t0, (t0, t1))

    def test_cuts_by_predicted_time_equal_pytorch_log_their_cost_and_resume_bit_for_bit(self):
        """--micro-batch-cost: documents cut by predicted time (a fitted or a given cost per
        micro-batch) change which documents go together, never the gradient; the fitted cost is
        in the run log and the checkpoint, and a resume from a checkpoint cuts as the run it
        continues (bit for bit)."""
        limit = ("--memory-limit", "8MiB")
        # A given cost of 0: the least padding whatever the pieces (many more micro-batches).
        r, log, checkpoint = self.train(2, "given", "--micro-batch-cost", "fixed=0", *limit)
        self.assert_equals_reference(checkpoint)
        self.assertIn("by predicted time (--micro-batch-cost fixed=0,width=0)", r.stdout)
        _, fewest_log, _ = self.train(2, "fewest", *limit)
        with h5py.File(log, "r") as f, h5py.File(fewest_log, "r") as g:
            self.assertEqual(f.attrs["micro_batch_cost"],
                             "by predicted time (--micro-batch-cost fixed=0,width=0)")
            given_padded, fewest_padded = f["steps/padded_tokens"][:], g["steps/padded_tokens"][:]
            given_pieces, fewest_pieces_run = f["steps/accumulation"][:], g["steps/accumulation"][:]
        with h5py.File(log, "r") as f:  # a cost of 0 buys every padded token it can
            self.assertLess((f["steps/padded_tokens"][:] - f["steps/tokens"][:]).sum(),
                            (fewest_padded - f["steps/tokens"][:]).sum())
        self.assertTrue((given_padded <= fewest_padded).all())
        self.assertGreater(given_pieces.sum(), fewest_pieces_run.sum())
        # Fitted: every rank's compute time from the time probe, in the run log and the checkpoint.
        r, log, checkpoint = self.train(2, "auto", "--micro-batch-cost", "auto", *limit,
                                        "--checkpoint-every", 2, steps=4)
        self.assertIn("time model: rank 0:", r.stdout)
        with h5py.File(log, "r") as f:
            fit = np.stack([f[f"time_model/{c}"][:] for c in
                            ("fixed_seconds", "seconds_per_token", "seconds_per_square")], 1)
            cost_fixed, cost_width = f["time_model/cost_fixed"][:], f["time_model/cost_width"][:]
            predicted = f["steps/predicted_compute_seconds"][:]
            measured = f["steps/compute_seconds"][:]
        self.assertEqual(fit.shape, (2, 3))
        self.assertTrue((fit >= 0).all() and (fit[:, 1] > 0).all(), fit)
        # The planner's units: a micro-batch's fixed time and the width term per padded token.
        np.testing.assert_allclose(cost_fixed, fit[:, 0] / fit[:, 1], rtol=1e-12)
        np.testing.assert_allclose(cost_width, fit[:, 2] / fit[:, 1], rtol=1e-12)
        self.assertTrue((predicted > 0).all() and (measured > 0).all(), (predicted, measured))
        with h5py.File(checkpoint, "r") as f:
            np.testing.assert_array_equal(f["time_model/ranks"][:], fit)
        self.assert_equals_reference(checkpoint, steps=4)
        summary = autoaccum(1, "log", log)
        self.assertIn("padded tokens' time", summary.stdout)
        self.assertIn("rank 0's compute per step, median over", summary.stdout)
        # At a fixed budget without a limit the time probe still fits (no memory probe to ride on).
        r, _, other = self.train(2, "fixed-timed", "--micro-batch-cost", "auto",
                                 "--micro-batch-tokens", 90)
        self.assertIn("time model: rank 1:", r.stdout)
        self.assertIn("cuts its 90-token budget by predicted time", r.stdout)
        self.assert_equals_reference(other)
        # A time probe's piece that runs out of memory lowers the budget as a step's would; the
        # rank fits at the lower budget and the run equals PyTorch.
        r, log, other = self.train(2, "timed-oom", "--micro-batch-cost", "auto", *limit,
                                   "--inject-oom", "rank=0,above=60")
        self.assert_equals_reference(other)
        with h5py.File(log, "r") as f:
            self.assertGreater(len(f["oom/step"]), 0)
            self.assertEqual(int(f["oom/step"][0]), 0)
            lowered_to = int(f["oom/next_micro_batch"][0])
            budgets = f["time_model/micro_batch"][:]
            self.assertTrue((f["time_model/seconds_per_token"][:] > 0).all())
        self.assertEqual(int(budgets[0]), lowered_to, budgets)
        # With the optimizer state sharded: the cut comes before the reduction, the result alike.
        _, _, other = self.train(2, "sharded-timed", "--micro-batch-cost", "auto",
                                 "--shard", "optimizer", *limit)
        self.assert_equals_reference(other)
        # Resumed from its step-2 checkpoint: the same cuts, the same bits as the whole run.
        resumed = self.path("auto-resumed.ckpt.h5")
        shutil.copy(older_checkpoint(checkpoint, 2), resumed)
        r = autoaccum(2, "train", "--data", self.data, "--model-file", self.lm, "--threads", 1,
                      "--shuffle", "none", "--lr", 0.1, "--momentum", 0, "--global-batch", 12,
                      "--steps", 4, "--micro-batch-cost", "auto", *limit, "--checkpoint",
                      resumed, "--resume", timeout=120)
        self.assertEqual(r.returncode, 0, r)
        self.assertNotIn("time model: rank", r.stdout)  # not fitted again
        a, b = um.checkpoint_tensors(checkpoint)[0], um.checkpoint_tensors(resumed)[0]
        for name in a:
            self.assertTrue(np.array_equal(a[name], b[name]), name)

    @one_core
    def test_a_budget_that_cannot_shrink_names_the_longest_document(self):
        r, _, _ = self.train(2, "stuck", "--inject-oom", "rank=0,above=1", expect=3)
        lines = um.error_lines(r)
        self.assertTrue(any("longest document (3, 30 tokens) does not fit even alone" in line
                            and "--max-length" in line for line in lines), r.stderr)

    @one_core
    def test_per_document_labels_with_the_lengths_as_an_input(self):
        rng = np.random.default_rng(5)
        labels = rng.integers(0, 3, len(self.docs))
        data = write_documents(self.path("labelled.h5"), self.docs, labels=labels, classes=3)
        model = um.save_scripted(DocClassifier(), self.path("cls.pt"))
        initial = {n: p.detach().numpy().copy() for n, p in torch.jit.load(model).named_parameters()}
        _, _, checkpoint = self.train(2, "cls", "--inputs", "tokens,lengths", "--targets", "label",
                                      "--micro-batch-tokens", 45, model=model, data=data)
        ref = reference(model, self.docs, 12, 3, 0.1, labels=labels)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, initial), EXACT)

    def test_evaluation_is_per_token_over_the_validation_documents(self):
        val_docs = documents(20, seed=9)
        val = write_documents(self.path("val.h5"), val_docs)
        _, log, checkpoint = self.train(2, "eval", "--val-data", val, "--eval-micro-batch", 40)
        with h5py.File(log, "r") as f:
            loss = float(f["eval/loss"][-1])
        model = reference(self.lm, self.docs, 12, 3, 0.1)
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for d in val_docs:
                d = torch.from_numpy(d)
                total += float(F.cross_entropy(model(d.view(1, -1))[0][:-1], d[1:],
                                               reduction="sum"))
                count += len(d) - 1
        self.assertAlmostEqual(loss, total / count, delta=1e-5 * loss)

    @one_core
    def test_bad_document_files_are_one_line_and_exit_1(self):
        docs = self.docs[:10]
        good = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        cases = {
            "starts": (dict(offsets=good + 1), "offsets' starts at 1; it must start at 0"),
            "decreases": (dict(offsets=np.array([0, 5, 3] + list(good[3:]), dtype=np.int64)),
                          "decreases at index 2 (5 then 3)"),
            "past": (dict(offsets=np.concatenate([good[:-1], [good[-1] + 4]])),
                     f"ends at {good[-1] + 4} but 'tokens' holds {good[-1]} tokens"),
            "classes": (dict(classes=5), "is at or above num_classes 5"),
        }
        for name, (kw, message) in cases.items():
            with self.subTest(name):
                data = write_documents(self.path(f"baddata-{name}.h5"), docs, **kw)
                r, _, _ = self.train(2, f"bad-{name}", data=data, batch=4, expect=1)
                lines = um.error_lines(r)
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(data, lines[0])
                self.assertIn(message, lines[0])

    @one_core
    def test_options_that_do_not_fit_document_data_are_refused(self):
        rows = um.write_data(self.path("rows.h5"), *um.classification_data(40, (4,), 3, seed=1),
                             classes=3)
        cases = [
            (dict(args=("--micro-batch-tokens", 29)), "--micro-batch-tokens 29 cannot hold "
             "document 3"),
            (dict(args=("--micro-batch", 4)), "--micro-batch counts rows"),
            (dict(args=("--global-batch-tokens", 29), batch=None),
             "--global-batch-tokens 29 is smaller than document 3 (30 tokens)"),
            (dict(args=("--global-batch-tokens", 40)),
             "give --global-batch (documents) or --global-batch-tokens, not both"),
            (dict(args=("--global-batch-tokens", 40), batch=None, data=rows,
                  model=um.save_scripted(um.LinearBn(4, 5, 3), self.path("rows2.pt"))),
             "--global-batch-tokens: --data"),
            (dict(args=("--micro-batch-tokens", 64), data=rows,
                  model=um.save_scripted(um.LinearBn(4, 5, 3), self.path("rows.pt"))),
             "holds rows, not documents"),
            (dict(args=("--micro-batch-cost", "auto"), data=rows,
                  model=um.save_scripted(um.LinearBn(4, 5, 3), self.path("rows3.pt"))),
             "--micro-batch-cost: --data"),
            (dict(args=("--micro-batch-cost", "fixed=-2")), "--micro-batch-cost: 'fixed=-2'"),
            (dict(args=("--micro-batch-cost", "width=0.1")), "gives no fixed=F"),
            (dict(args=("--micro-batch-cost", "fast")), "is not one of the forms"),
        ]
        for kw, message in cases:
            with self.subTest(message):
                r, _, _ = self.train(2, "refused", *kw["args"], data=kw.get("data"),
                                     model=kw.get("model"), batch=kw.get("batch", 8), expect=1)
                lines = um.error_lines(r)
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(message, lines[0])


class ImportDocuments(TempDirTest):
    prefix = "autoaccum-import-documents-"

    @one_core
    def test_fortunes_split_at_percent_lines_with_a_maximum_length(self):
        source = self.path("cookies")
        entries = ["A short one.\n", "Two\nlines.\n", "x" * 50 + "\n", "  \n", "Last.\n"]
        with open(source, "w") as f:
            f.write("%\n".join(entries))
        out = self.path("out")
        r = autoaccum(1, "import", "text", "--documents", "fortune", "--max-length", 20,
                      "--out", out, source)
        self.assertEqual(r.returncode, 0, r)
        expected = []
        for e in entries:
            if e.strip():
                expected += [e[i:i + 20] for i in range(0, len(e), 20)]
        got = []
        for name in ("text-docs-train.h5", "text-docs-val.h5"):
            with h5py.File(os.path.join(out, name), "r") as f:
                tokens, offsets = f["tokens"][:], f["offsets"][:]
                self.assertEqual(f["tokens"].attrs["encoding"], "integer")
                got += [bytes(tokens[offsets[i]:offsets[i + 1]]).decode()
                        for i in range(len(offsets) - 1)]
        self.assertEqual(got, expected)
        r = autoaccum(1, "inspect", os.path.join(out, "text-docs-train.h5"))
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(f"{len(expected) - 1} documents", r.stdout)
        self.assertIn("max 20", r.stdout)


FORTUNES = "/usr/share/games/fortunes"
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def fortune_documents_and_gpt(test):
    """Debian's `computers` fortunes as documents of at most 48 bytes and the example GPT
    (context 48, width 32, 2 layers) in `test`'s folder: (data folder, the documents, the
    model file, its initial parameters)."""
    data = test.path("docs")
    r = autoaccum(1, "import", "text", "--documents", "fortune", "--max-length", 48, "--out",
                  data, os.path.join(FORTUNES, "computers"), timeout=120)
    test.assertEqual(r.returncode, 0, r)
    with h5py.File(f"{data}/text-docs-train.h5", "r") as f:
        tokens, offsets = f["tokens"][:].astype(np.int64), f["offsets"][:]
    docs = [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    model = test.path("gpt.pt")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "jobs/models/gpt.py"), "--out",
                    model, "--context", "48", "--width", "32", "--layers", "2", "--heads", "2",
                    "--dropout", "0"], check=True, capture_output=True)
    initial = {n: p.detach().numpy().copy() for n, p in torch.jit.load(model).named_parameters()}
    return data, docs, model, initial


class GptOnFortuneDocuments(TempDirTest):
    """The GPT of jobs/models (causal self-attention, layer norms, tied nothing) on Debian's
    fortunes imported as documents: right padding never reaches an earlier position through
    the causal mask, so autoaccum's padded, length-ordered, halved micro-batches equal PyTorch's
    steps over each document alone."""
    prefix = "autoaccum-gpt-documents-"

    @unittest.skipUnless(os.path.isdir(FORTUNES), "Debian's fortunes package is not installed")
    @one_core
    def test_two_steps_with_an_out_of_memory_equal_pytorch(self):
        data, docs, model, initial = fortune_documents_and_gpt(self)
        log, checkpoint = self.path("gpt.h5"), self.path("gpt.ckpt.h5")
        r = autoaccum(2, "train", "--data", f"{data}/text-docs-train.h5", "--model-file", model,
                      "--global-batch", 24, "--steps", 2, "--shuffle", "none", "--lr", 0.1,
                      "--momentum", 0, "--threads", 1, "--inject-oom", "rank=1,above=300,step=0",
                      "--run-log", log, "--checkpoint", checkpoint, *PIECES, timeout=180)
        self.assertEqual(r.returncode, 0, r)
        with h5py.File(log, "r") as f:
            self.assertGreater(f["steps/oom_retries"][0], 0)
        ref = reference(model, docs, 24, 2, 0.1)
        params = um.checkpoint_tensors(checkpoint)[0]
        self.assertLess(um.update_distance(params, ref, initial), EXACT)
