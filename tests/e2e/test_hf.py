"""Hugging Face transformers models through autoaccum and back (jobs/models/hf.py,
docs/models.md "From Hugging Face"). Runs under the Python of jobs/models/hf-env.sh (transformers
4.35.2 pinned, beside Debian's PyTorch), or the CUDA platform's environment.

Tiny configurations with random weights (nothing downloaded): GPT-2 (learned positions, tied
embedding and head), Llama (rotary positions, RMSNorm, SwiGLU, grouped-query attention) and BERT
for sequence classification (the padding mask built from --inputs tokens,lengths). Each model is
exported to TorchScript by hf.py and trained by autoaccum on document data at world 2 with an
automatic token budget under a memory limit that cuts each rank's share into several
micro-batches. The reference is the transformers model itself, eager, loaded with
from_pretrained from the same folder: one document at a time with no padding, the loss summed
over the batch's counted tokens (or documents) and divided by the count, one SGD step. EXACT is
1e-5 of the update (fp32 sums in another order); padding counted or a micro-batch lost lies 1e-2
or more away."""
import importlib.util
import json
import os
import subprocess
import sys
import types
import unittest

import h5py
import numpy as np
import torch
import torch.nn.functional as F

try:
    import transformers
except ImportError:  # not skipped: CI must run these
    raise SystemExit(f"e2e.hf needs transformers: {sys.executable} has none; run "
                     f"jobs/models/hf-env.sh (tests/run.sh does) and configure again")

import user_models as um
from harness import TempDirTest, autoaccum, one_core

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "..", "..", "jobs", "models", "hf.py")
VOCAB = 64
EXACT = 1e-5
BATCH = 16
LR = 0.1


def hf(*args, expect=0):
    r = subprocess.run([sys.executable, HF, *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != expect:
        raise AssertionError(f"hf.py {' '.join(map(str, args))} exited {r.returncode}, "
                             f"expected {expect}:\n{r.stdout}\n{r.stderr}")
    return r


def documents(count, seed, shortest=2, longest=40):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, count)
    lengths[1] = longest
    return [rng.integers(0, VOCAB, n).astype(np.int64) for n in lengths]


def write_documents(path, docs, labels=None):
    with h5py.File(path, "w") as f:
        f["tokens"] = np.concatenate(docs).astype(np.int32)
        f["offsets"] = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        if labels is not None:
            f["label"] = np.asarray(labels, dtype=np.int64)
        f.attrs["num_classes"] = 3 if labels is not None else VOCAB
    return path


def write_byte_documents(path, texts):
    """A document file of bytes (as `autoaccum import text --documents` writes), one per text."""
    raw = [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts]
    with h5py.File(path, "w") as f:
        f["tokens"] = np.concatenate(raw)
        f["offsets"] = np.concatenate([[0], np.cumsum([len(r) for r in raw])]).astype(np.int64)
    return path


def load(folder, task):
    cls = (transformers.AutoModelForCausalLM if task == "causal-lm"
           else transformers.AutoModelForSequenceClassification)
    return cls.from_pretrained(folder, local_files_only=True)


def document_loss(model, doc, label=None):
    """(summed loss, count) of one document, unpadded, as autoaccum counts it."""
    ids = torch.from_numpy(doc).view(1, -1)
    if label is None:
        logits = model(input_ids=ids, return_dict=False)[0][0]
        return F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"), len(doc) - 1
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=False)[0]
    return F.cross_entropy(logits, torch.tensor([label]), reduction="sum"), 1


def reference(folder, task, docs, steps, labels=None):
    """transformers' own model, eager, train mode, SGD on each batch's mean over counted items."""
    model = load(folder, task)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        total, count = 0.0, 0
        for i in range(step * BATCH, (step + 1) * BATCH):
            loss, n = document_loss(model, docs[i], None if labels is None else labels[i])
            total, count = total + loss, count + n
        (total / count).backward()
        opt.step()
    return model


def update_distance(checkpoint, model, initial):
    """||autoaccum - reference|| / ||reference - initial|| over all parameters; checkpoint names
    are transformers' under the export's prefix 'model.'."""
    params = um.checkpoint_tensors(checkpoint)[0]
    diff = moved = 0.0
    for name, p in model.named_parameters():
        ref = p.detach().numpy()
        mine = params["model." + name].reshape(ref.shape)
        diff += float(np.sum((mine - ref) ** 2))
        moved += float(np.sum((ref - initial[name]) ** 2))
    return (diff / moved) ** 0.5


CHAT_WORDS = ("the model learns from answers only while prompts count for nothing at all "
              "since every global batch averages over its counted tokens exactly").split()
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] "
                 "%}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
                 "<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat(rng):
    """A conversation: an optional system message, then one to three user/assistant turns of
    random words."""
    say = lambda: " ".join(rng.choice(CHAT_WORDS, rng.integers(1, 8)))
    messages = [{"role": "system", "content": say()}] if rng.random() < 0.5 else []
    for _ in range(rng.integers(1, 4)):
        messages += [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]
    return messages


def answer_labels(tokenizer, template, messages):
    """(ids, labels) found without hf.py: the text transformers renders, each assistant
    content located in it with its end-of-turn marker, the tokens whose characters lie inside
    those spans; each position labelled with the next token where that one is learnt."""
    with open(template) as f:
        text = tokenizer.apply_chat_template(messages, chat_template=f.read(), tokenize=False)
    spans, at = [], 0
    for m in messages:
        at = text.index(f"<|{m['role']}|>\n{m['content']}<|end|>\n", at)
        start = at + len(f"<|{m['role']}|>\n")
        at = start + len(m["content"]) + len("<|end|>\n")
        if m["role"] == "assistant":
            spans.append((start, at))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    learnt = [e > b and any(s <= b and e <= t for s, t in spans)
              for b, e in encoded["offset_mapping"]]
    labels = np.full(len(ids), -100, dtype=np.int64)
    for j in range(len(ids) - 1):
        if learnt[j + 1]:
            labels[j] = ids[j + 1]
    return ids, labels


def answers_reference(folder, docs, labels, steps, per_micro_batch):
    """transformers' eager model, SGD: each global batch's loss summed over its learnt labels and
    divided by their count (per_micro_batch None), or, as Trainer did before
    num_items_in_batch, the mean of each micro-batch of `per_micro_batch` documents averaged
    over the micro-batches."""
    model = load(folder, "causal-lm")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        batch = range(step * BATCH, (step + 1) * BATCH)
        groups = [list(batch)] if per_micro_batch is None else [
            list(batch)[g:g + per_micro_batch] for g in range(0, BATCH, per_micro_batch)]
        loss = 0.0
        for group in groups:
            total, count = 0.0, 0
            for i in group:
                logits = model(input_ids=torch.from_numpy(docs[i]).view(1, -1),
                               return_dict=False)[0][0]
                target = torch.from_numpy(labels[i])
                total = total + F.cross_entropy(logits, target, ignore_index=-100,
                                                reduction="sum")
                count += int((target != -100).sum())
            loss = loss + total / count / len(groups)
        loss.backward()
        opt.step()
    return model


class HuggingFace(TempDirTest):
    prefix = "autoaccum-hf-"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.docs = documents(6 * BATCH, seed=5)
        cls.data = write_documents(cls.path("docs.h5"), cls.docs)
        rng = np.random.default_rng(9)
        cls.labels = rng.integers(0, 3, len(cls.docs))
        cls.labelled = write_documents(cls.path("labelled.h5"), cls.docs, cls.labels)
        cls.val_docs = documents(24, seed=6)
        cls.val = write_documents(cls.path("val.h5"), cls.val_docs)
        cls.val_labels = np.random.default_rng(10).integers(0, 3, len(cls.val_docs))
        cls.val_labelled = write_documents(cls.path("val-labelled.h5"), cls.val_docs,
                                           cls.val_labels)
        cls.models = {}

    @classmethod
    def model(cls, arch, dropout):
        """(folder, exported file) of a tiny model, made on first use (each ctest test is a
        process of its own: it makes only the models it trains)."""
        if (arch, dropout) not in cls.models:
            folder = cls.path(f"{arch}-{dropout}")
            hf("tiny", "--arch", arch, "--out", folder, "--dropout", dropout, "--labels", 3,
               "--seed", 1, "--vocab", VOCAB, "--context", 64, "--width", 32, "--layers", 2,
               "--heads", 4)
            exported = folder + ".pt"
            hf("export", "--from", folder, "--out", exported)
            cls.models[(arch, dropout)] = (folder, exported)
        return cls.models[(arch, dropout)]

    def train(self, name, model, *args, data=None, steps=3, ranks=2, limit="2MiB", expect=0):
        log, checkpoint = self.path(f"{name}.h5"), self.path(f"{name}.ckpt.h5")
        r = autoaccum(ranks, "train", "--data", data or self.data, "--model-file", model,
                      "--threads", 1, "--shuffle", "none", "--optimizer", "sgd", "--lr", LR,
                      "--momentum", 0, "--global-batch", BATCH, "--steps", steps,
                      "--memory-limit", limit, "--run-log", log, "--checkpoint", checkpoint,
                      *args, timeout=180)
        self.assertEqual(r.returncode, expect, r)
        return r, log, checkpoint

    def assert_micro_batched(self, log):
        """The automatic budget cut some rank's share into more than one micro-batch."""
        with h5py.File(log, "r") as f:
            self.assertEqual(f.attrs["micro_batch_unit"], "tokens")
            self.assertGreater(int(f["steps/accumulation_max"][:].max()), 1)

    def check_update(self, arch, task, *args, labels=None, data=None, name=None):
        """The update of 3 steps equals eager transformers per document; (output, run log)."""
        folder, exported = self.model(arch, 0)
        r, log, checkpoint = self.train(name or arch, exported, *args, data=data)
        self.assertIn("micro-batch tokens auto", r.stdout)
        self.assertNotIn("torch.jit.trace", r.stdout + r.stderr)  # the mode is a switch
        self.assert_micro_batched(log)
        initial = {n: p.detach().numpy().copy() for n, p in load(folder, task).named_parameters()}
        ref = reference(folder, task, self.docs, 3, labels)
        self.assertLess(update_distance(checkpoint, ref, initial), EXACT)
        return r, log

    @one_core
    def test_gpt2_update_equals_transformers_per_document(self):
        self.check_update("gpt2", "causal-lm")

    @one_core
    def test_llama_update_equals_transformers_per_document(self):
        self.check_update("llama", "causal-lm")

    @one_core
    def test_bert_classifier_update_equals_transformers_per_document(self):
        self.check_update("bert", "sequence-classification", "--inputs", "tokens,lengths",
                          "--targets", "label", labels=self.labels, data=self.labelled)

    def test_traced_models_cut_by_predicted_time_equal_transformers_per_document(self):
        # --micro-batch-cost auto: the time probe times the traced graphs (a causal LM on tokens,
        # a classifier on tokens and lengths), fits each rank's cost and cuts by it; the cut
        # changes which documents go together, never the update.
        for arch, task, args, labels, data in (
                ("llama", "causal-lm", (), None, None),
                ("bert", "sequence-classification",
                 ("--inputs", "tokens,lengths", "--targets", "label"), self.labels, self.labelled)):
            with self.subTest(arch):
                r, log = self.check_update(arch, task, "--micro-batch-cost", "auto", *args,
                                           labels=labels, data=data, name=f"{arch}-timed")
                self.assertIn("time model: rank 1:", r.stdout)
                with h5py.File(log, "r") as f:
                    self.assertTrue((f["time_model/seconds_per_token"][:] > 0).all())
                    self.assertTrue((f["steps/predicted_compute_seconds"][:] > 0).all())

    def check_eval_with_dropout(self, arch, task, *args, data=None, val=None, labels=None):
        """Evaluation with dropout 0.1 follows eval mode: autoaccum's validation loss equals
        model.eval() of the imported folder on the same documents, and the exported file's
        train mode does drop (two calls differ)."""
        folder, exported = self.model(arch, 0.1)
        m = torch.jit.load(exported)
        ids = torch.from_numpy(self.val_docs[1]).view(1, -1)
        extra = (torch.tensor([ids.size(1)]),) if labels is not None else ()
        with torch.no_grad():
            self.assertFalse(torch.equal(m(ids, *extra), m(ids, *extra)))
            m.eval()
            self.assertTrue(torch.equal(m(ids, *extra), m(ids, *extra)))
        _, log, checkpoint = self.train(f"{arch}-eval", exported, "--val-data", val or self.val,
                                        "--eval-every", 2, *args, data=data, steps=4)
        with h5py.File(log, "r") as f:
            evaluated = dict(zip(f["eval/step"][:], f["eval/loss"][:]))
        out = self.path(f"{arch}-eval-imported")
        hf("import", "--checkpoint", checkpoint, "--model-file", exported, "--out", out,
           "--autoaccum", os.environ["AUTOACCUM_BIN"])
        model = load(out, task)
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for i, doc in enumerate(self.val_docs):
                loss, n = document_loss(model, doc, None if labels is None else labels[i])
                total, count = total + float(loss), count + n
        self.assertAlmostEqual(evaluated[4], total / count, delta=1e-5 * total / count)

    @one_core
    def test_gpt2_evaluation_with_dropout_equals_the_imported_model_in_eval_mode(self):
        self.check_eval_with_dropout("gpt2", "causal-lm")

    @one_core
    def test_bert_evaluation_with_dropout_equals_the_imported_model_in_eval_mode(self):
        self.check_eval_with_dropout("bert", "sequence-classification", "--inputs",
                                     "tokens,lengths", "--targets", "label",
                                     data=self.labelled, val=self.val_labelled,
                                     labels=self.val_labels)

    @one_core
    def test_resume_with_dropout_is_bit_for_bit(self):
        _, exported = self.model("gpt2", 0.1)
        # Two fresh starts: the cut from the data alone (auto's fits are timed at each start).
        pieces = ("--micro-batch-cost", "pieces")
        _, _, whole = self.train("whole", exported, *pieces, steps=5)
        self.train("halves", exported, *pieces, steps=2)
        _, _, halves = self.train("halves", exported, *pieces, "--resume", steps=5)
        a, b = um.checkpoint_tensors(whole)[0], um.checkpoint_tensors(halves)[0]
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(np.array_equal(a[name], b[name]), name)

    @one_core
    def test_round_trip_gives_from_pretrained_the_trained_weights(self):
        for arch in ("gpt2", "llama"):
            folder, exported = self.model(arch, 0)
            _, _, checkpoint = self.train(f"{arch}-trip", exported, steps=2)
            out = self.path(f"{arch}-trip-imported")
            r = hf("import", "--checkpoint", checkpoint, "--model-file", exported, "--out", out,
                   "--autoaccum", os.environ["AUTOACCUM_BIN"])
            self.assertIn("from_pretrained gives them back", r.stdout)
            self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))
            trained = um.checkpoint_tensors(checkpoint)[0]
            before = load(folder, "causal-lm").state_dict()
            model = load(out, "causal-lm")
            moved = 0
            state = model.state_dict()  # tied weights under each name
            self.assertTrue(set(n for n, _ in model.named_parameters()) <= set(state))
            for name, p in state.items():
                np.testing.assert_array_equal(p.numpy(), trained["model." + name].reshape(p.shape),
                                              name)
                moved += not torch.equal(p, before[name])
            self.assertGreater(moved, 0)
            if arch == "gpt2":  # tied in the folder as in transformers
                self.assertEqual(model.lm_head.weight.data_ptr(),
                                 model.transformer.wte.weight.data_ptr())

    @one_core
    def test_text_tokenized_by_the_folders_tokenizer_and_the_tokenizer_travels_back(self):
        """tokenize re-tokenizes a byte document file with the folder's tokenizer (each
        document decodes back to its text); the exported file carries the tokenizer, and the
        imported folder has it, encoding as the original does."""
        texts = ["Hello, world.\n", "A longer document about training, checkpoints and "
                 "micro-batches.\n", "ok\n", "Zwei Wörter: ünïcode too.\n"] * 6
        raw = [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts]
        corpus = write_byte_documents(self.path("bytes.h5"), texts)
        folder = self.path("gpt2-bpe")
        hf("tiny", "--arch", "gpt2", "--out", folder, "--vocab", 300, "--context", 64,
           "--width", 32, "--heads", 4, "--tokenizer-from", corpus, "--dropout", 0)
        tokens = self.path("bpe-docs.h5")
        r = hf("tokenize", "--from", folder, "--documents", corpus, "--out", tokens)
        self.assertIn(f"{len(texts)} documents", r.stdout)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        with h5py.File(tokens, "r") as f:
            ids, offsets = f["tokens"][:], f["offsets"][:]
            self.assertEqual(int(f.attrs["num_classes"]), len(tokenizer))
        self.assertEqual(len(offsets), len(texts) + 1)
        for i, text in enumerate(texts):
            self.assertEqual(tokenizer.decode(ids[offsets[i]:offsets[i + 1]].tolist()), text)
        self.assertLess(len(ids), sum(len(r) for r in raw))  # merges learnt: fewer than bytes
        exported = self.path("gpt2-bpe.pt")
        self.assertIn("tokenizer carried", hf("export", "--from", folder, "--out",
                                              exported).stdout)
        _, _, checkpoint = self.train("bpe", exported, data=tokens, steps=1, limit="64MiB")
        out = self.path("gpt2-bpe-imported")
        r = hf("import", "--checkpoint", checkpoint, "--model-file", exported, "--out", out,
               "--autoaccum", os.environ["AUTOACCUM_BIN"])
        self.assertIn("and its tokenizer", r.stdout)
        back = transformers.AutoTokenizer.from_pretrained(out)
        for text in texts[:4]:
            self.assertEqual(back(text)["input_ids"], tokenizer(text)["input_ids"])

    def chat_model(self):
        """A tiny GPT-2 with a byte-level BPE tokenizer learnt from chat-like text, and a chat
        template file (the tiny folder has none) that refuses roles it does not know."""
        texts = [" ".join(CHAT_WORDS[i:] + CHAT_WORDS[:i]) + "\n" for i in range(len(CHAT_WORDS))]
        corpus = write_byte_documents(self.path("chat-bytes.h5"), [t * 4 for t in texts])
        folder = self.path("gpt2-chat")
        hf("tiny", "--arch", "gpt2", "--out", folder, "--vocab", 300, "--context", 256,
           "--width", 32, "--heads", 4, "--layers", 2, "--tokenizer-from", corpus,
           "--dropout", 0, "--seed", 2)
        template = self.path("chat.jinja")
        with open(template, "w") as f:
            f.write(CHAT_TEMPLATE)
        return folder, template

    def test_chat_records_learn_the_answers_only_exactly_at_two_and_three_ranks(self):
        """hf.py data renders each conversation with the chat template and labels only the
        assistant turns (content and end-of-turn marker); the test finds those tokens itself
        (the rendered text's character spans, the tokenizer's offsets) and gets the same
        tokens and labels. autoaccum's update at world 2 and 3, several micro-batches per rank
        under an automatic token budget, equals transformers' eager model on each global
        batch's mean over the answers' tokens; averaging per micro-batch (what Trainer did
        before num_items_in_batch) gives a visibly different update."""
        folder, template = self.chat_model()
        rng = np.random.default_rng(11)
        conversations = [chat(rng) for _ in range(3 * BATCH)]
        jsonl = self.path("chat.jsonl")
        with open(jsonl, "w") as f:
            for messages in conversations:
                f.write(json.dumps({"id": len(messages), "messages": messages}) + "\n")
        out = self.path("chat.h5")
        r = hf("data", "--from", folder, "--input", jsonl, "--out", out, "--messages-field",
               "messages", "--chat-template", template)
        self.assertIn(f"{len(conversations)} documents", r.stdout)
        self.assertIn("train with --targets labels", r.stdout)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        docs, labels = [], []
        with h5py.File(out, "r") as f:
            ids, offsets, written = f["tokens"][:], f["offsets"][:], f["labels"][:]
            self.assertEqual(int(f.attrs["num_classes"]), len(tokenizer))
        self.assertEqual(len(offsets), len(conversations) + 1)
        for i, messages in enumerate(conversations):
            want_ids, want_labels = answer_labels(tokenizer, template, messages)
            got = ids[offsets[i]:offsets[i + 1]].astype(np.int64)
            np.testing.assert_array_equal(got, want_ids, err_msg=f"conversation {i}")
            np.testing.assert_array_equal(written[offsets[i]:offsets[i + 1]], want_labels,
                                          err_msg=f"conversation {i}")
            self.assertGreater(int(np.sum(want_labels != -100)), 0)
            self.assertGreater(int(np.sum(want_labels == -100)), 1)
            docs.append(got)
            labels.append(want_labels)
        if importlib.util.find_spec("xxhash"):  # Debian's python3-xxhash (not the CUDA platform's)
            import xxhash
            with h5py.File(out, "r") as f:
                for name in ("tokens", "offsets", "labels"):
                    self.assertEqual(f[name].attrs["checksum"], "xxh3-64:" +
                                     xxhash.xxh3_64_hexdigest(f[name][()].tobytes()), name)
        exported = folder + ".pt"
        hf("export", "--from", folder, "--out", exported)
        model = load(folder, "causal-lm")
        initial = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        exact = answers_reference(folder, docs, labels, 3, per_micro_batch=None)
        averaged = answers_reference(folder, docs, labels, 3, per_micro_batch=4)
        for ranks in (2, 3):
            with self.subTest(ranks=ranks):
                _, log, checkpoint = self.train(f"chat-{ranks}", exported, "--targets", "labels",
                                                data=out, ranks=ranks, limit="6MiB")
                self.assert_micro_batched(log)
                self.assertLess(update_distance(checkpoint, exact, initial), EXACT)
                self.assertGreater(update_distance(checkpoint, averaged, initial), 100 * EXACT,
                                   "averaging per micro-batch would have given the same")

    def test_bad_records_are_one_line_and_nothing_is_written(self):
        folder, template = self.chat_model()
        good = {"messages": [{"role": "user", "content": "hello there"},
                             {"role": "assistant", "content": "general kenobi"}],
                "prompt": "say", "completion": "something"}
        bad = [("{not json", "not JSON"),
               (json.dumps({"other": 1}), "field 'messages' is missing"),
               (json.dumps({"messages": []}), "an empty conversation"),
               (json.dumps({"messages": [{"role": "wizard", "content": "hi"},
                                         {"role": "assistant", "content": "ok"}]}),
                "unknown role wizard"),
               (json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
                "no assistant turn"),
               (json.dumps({"messages": [{"role": "user", "content": 3}]}),
                "message 0 is not {role, content} strings")]
        out = self.path("bad.h5")
        for k, (line, said) in enumerate(bad):
            path = self.path(f"bad-{k}.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps(good) + "\n" + line + "\n" + json.dumps(good) + "\n")
            r = hf("data", "--from", folder, "--input", path, "--out", out, "--messages-field",
                   "messages", "--chat-template", template, expect=1)
            errors = [l for l in r.stderr.splitlines() if l.strip()]
            self.assertEqual(len(errors), 1, r.stderr)
            self.assertIn(f"{path}:2: ", errors[0])
            self.assertIn(said, errors[0])
            self.assertFalse(os.path.exists(out), "nothing written")
        # --skip-bad: every bad line at once, counted and skipped; the good records convert.
        path = self.path("bad-all.jsonl")
        with open(path, "w") as f:
            f.write("".join(json.dumps(good) + "\n" + line + "\n" for line, _ in bad))
        r = hf("data", "--from", folder, "--input", path, "--out", out, "--messages-field",
               "messages", "--chat-template", template, "--skip-bad")
        self.assertIn(f"{len(bad)} documents from {len(bad)} records", r.stdout)
        self.assertIn(f"{len(bad)} bad records skipped, the first: {path}:2:", r.stdout)
        # Prompt and completion: the loss on the completion and EOS only.
        r = hf("data", "--from", folder, "--input", path, "--out", self.path("pc.h5"),
               "--prompt-field", "prompt", "--completion-field", "completion", "--skip-bad")
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        prompt = tokenizer("say")["input_ids"]
        then = tokenizer("something", add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id]
        with h5py.File(self.path("pc.h5"), "r") as f:
            n = len(prompt) + len(then)
            np.testing.assert_array_equal(f["tokens"][:n], prompt + then)
            np.testing.assert_array_equal(
                f["labels"][:n], [-100] * (len(prompt) - 1) + then + [-100])
        # An --out whose folder does not exist: one line, before anything is read.
        r = hf("data", "--from", folder, "--input", path, "--out", self.path("no/such.h5"),
               "--text-field", "prompt", expect=1)
        self.assertIn("its folder does not exist", r.stderr)
        # No chat template anywhere: one line.
        r = hf("data", "--from", folder, "--input", path, "--out", out, "--messages-field",
               "messages", expect=1)
        self.assertIn("its tokenizer has no chat template; give one with --chat-template",
                      r.stderr)

    @one_core
    def test_a_forward_that_branches_on_its_length_is_refused_after_tracing(self):
        """The tracer freezes a Python branch on the input's length; export's check at other
        shapes (eager against traced, both modes) catches it instead of training a graph that
        is wrong for every longer micro-batch."""
        spec = importlib.util.spec_from_file_location("hf", HF)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        class Branchy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = types.SimpleNamespace(vocab_size=VOCAB, n_positions=64)
                self.tok = torch.nn.Embedding(VOCAB, 8)

            def forward(self, input_ids, attention_mask=None, return_dict=False):
                h = self.tok(input_ids)
                if input_ids.size(1) > 16:  # traced at 16: never taken in the graph
                    h = 2 * h
                return (h,)

        with self.assertRaises(module.Refused) as caught:
            module.trace_checked(Branchy(), False, 16, 0)
        self.assertIn("branches on its input's values or length", str(caught.exception))
        self.assertIn("at [3, 23]", str(caught.exception))
        # Without the branch the same model passes.
        Branchy.forward = lambda self, input_ids, attention_mask=None, return_dict=False: (
            self.tok(input_ids),)
        _, worst, _ = module.trace_checked(Branchy(), False, 16, 0)
        self.assertEqual(worst, 0.0)

    @one_core
    def test_what_does_not_export_is_one_line(self):
        folder, _ = self.model("bert", 0)
        cases = [
            (("export", "--from", self.path("nowhere"), "--out", self.path("x.pt")),
             "not a folder with config.json"),
            (("export", "--from", folder, "--out", self.path("x.pt"), "--inputs", "tokens"),
             "needs the padding mask"),
            (("import", "--model-file", self.data, "--out", self.path("y")),
             "not a TorchScript file"),
        ]
        decoder = self.path("gpt2-classifier")
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=1,
                                         n_head=4, architectures=["GPT2ForSequenceClassification"])
        transformers.GPT2ForSequenceClassification(config).save_pretrained(decoder)
        cases.append((("export", "--from", decoder, "--out", self.path("x.pt"), "--inputs",
                       "tokens,lengths"), "pools the token before the first pad_token_id"))
        for args, message in cases:
            r = hf(*args, expect=1)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(self.path("x.pt")))
        # An import never writes over a folder that exists.
        _, exported = self.model("gpt2", 0)
        occupied = self.path("occupied")
        os.makedirs(occupied)
        open(os.path.join(occupied, "keep"), "w").close()
        r = hf("import", "--model-file", exported, "--out", occupied, expect=1)
        self.assertIn("exists and is not empty", r.stderr)
        self.assertEqual(os.listdir(occupied), ["keep"])


if __name__ == "__main__":
    unittest.main()
