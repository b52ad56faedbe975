#!/usr/bin/env python3
"""Hugging Face transformers models in and out of autoaccum (docs/models.md, "From Hugging Face").

    jobs/models/hf.py export --from FOLDER --out MODEL.pt [--task causal-lm|sequence-classification]
                             [--inputs tokens|tokens,lengths]
    jobs/models/hf.py import --model-file TRAINED.pt --out FOLDER
    jobs/models/hf.py import --checkpoint CK.h5 --model-file MODEL.pt --out FOLDER
    jobs/models/hf.py tokenize --from FOLDER --documents DOCS.h5 --out TOKENS.h5
    jobs/models/hf.py data --from FOLDER --input FILE.jsonl --out DOCS.h5
                           --text-field F | --prompt-field P --completion-field C | --messages-field M
    jobs/models/hf.py tiny --arch gpt2|llama|bert --out FOLDER      (random weights, for trying out)

export: FOLDER is what `save_pretrained` wrote (config.json and, for fine-tuning, the weights;
without weights the model starts from random ones, seeded by --seed). The TorchScript file
returns the logits ([rows, T, vocab] for a causal language model, [rows, labels] for sequence
classification) and its dropout follows autoaccum's mode: the model is traced twice, once in
train mode and once in eval mode, as two methods of one module (one set of parameters), and a
scripted forward picks by `self.training`. Parameters keep their transformers names under the
prefix "model.". The configuration travels inside the file, so `import` needs nothing else.
Nothing is downloaded: FOLDER must be on disk.

import: writes FOLDER with `save_pretrained` (config.json and model.safetensors), tied weights
tied, then loads it back with `from_pretrained` and checks every tensor. From a checkpoint it
runs `autoaccum export` first (which verifies the checkpoint's checksums).

tokenize: re-tokenizes a document file of bytes (`autoaccum import text --documents ...`) with
the folder's own tokenizer, one document at a time, into the same format (tokens, offsets).

data: converts JSONL records (one object a line, optionally gzip-compressed) into document data
with a labels dataset for `--targets labels`: text (the loss on every next token), a prompt and a
completion (the loss on the completion and EOS only), or a chat conversation rendered by the
folder's chat template (or --chat-template), the loss on each assistant turn's content and its
end-of-turn marker only. Every position that predicts nothing to learn is labelled
--ignore-index, so autoaccum's mean over the global batch's counted labels is the mean over the
answers' tokens. A bad record stops the conversion with one line naming the file, line and
field (--skip-bad skips and counts them); nothing is written unless the whole file converts.

transformers comes from the cached environment jobs/models/hf-env.sh installs (pinned); this
script re-runs itself there when the Python that started it has no transformers.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

TRANSFORMERS = "4.35.2"
EXTRA = "autoaccum_hf.json"  # the extra file in the TorchScript archive
PREFIX = "model."
TOKENIZER = "hf_tokenizer."  # extra files carrying the folder's tokenizer files
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
                   "added_tokens.json")
TASKS = ("causal-lm", "sequence-classification")


class Refused(Exception):
    """A one-line error for the user (no traceback)."""


def die(message):
    print(f"hf.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def need_transformers():
    """Imports transformers, or re-runs this script under the cached environment that has it."""
    try:
        import transformers  # noqa: F401
        return
    except ImportError:
        pass
    # hf-env.sh says where its environment is (nothing when it is not installed).
    env = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf-env.sh")
    python = subprocess.run([env, "--python"], capture_output=True, text=True).stdout.strip()
    venv = os.path.dirname(os.path.dirname(python)) if python else ""
    if python and os.path.abspath(sys.prefix) != os.path.abspath(venv):
        os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])
    die(f"transformers is not installed for {sys.executable}: run {env} (installs transformers "
        f"{TRANSFORMERS}, pinned, into a cached environment)")


def quiet():
    """transformers' and the tracer's warnings are about generation and shape-specialised Python
    branches; export checks the graph itself (below), so they are noise here."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


# ---------------------------------------------------------------------------------------------
# Loading a model folder


def task_of(config, asked):
    if asked:
        return asked
    for arch in config.architectures or []:
        if arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel"):
            return "causal-lm"
        if arch.endswith("ForSequenceClassification"):
            return "sequence-classification"
    raise Refused(f"config.json names no architecture autoaccum knows "
                  f"({config.architectures or 'none'}): give --task causal-lm or "
                  f"--task sequence-classification")


def auto_class(task):
    import transformers
    return (transformers.AutoModelForCausalLM if task == "causal-lm"
            else transformers.AutoModelForSequenceClassification)


def has_weights(folder):
    names = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
             "pytorch_model.bin.index.json")
    return any(os.path.exists(os.path.join(folder, n)) for n in names)


def load_folder(folder, asked_task, seed):
    import torch
    import transformers
    if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, "config.json")):
        raise Refused(f"--from '{folder}': not a folder with config.json (a model on the Hub "
                      f"must be downloaded first, on a machine with network: huggingface-cli "
                      f"download NAME --local-dir FOLDER)")
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    task = task_of(config, asked_task)
    cls = auto_class(task)
    torch.manual_seed(seed)
    try:
        if has_weights(folder):
            model = cls.from_pretrained(folder, local_files_only=True, torch_dtype=torch.float32)
            origin = "the folder's weights"
        else:
            model = cls.from_config(config, torch_dtype=torch.float32)
            origin = f"random weights (no weights in the folder; seed {seed})"
    except ValueError as e:
        raise Refused(f"--from '{folder}': transformers cannot build a {task} model from it: "
                      f"{str(e).splitlines()[0]}")
    return model.float(), task, origin


# ---------------------------------------------------------------------------------------------
# Export


def check_supported(model, task, inputs):
    name = type(model).__name__
    if task == "sequence-classification" and inputs != "tokens,lengths":
        raise Refused(f"{name}: sequence classification needs the padding mask: export with "
                      f"--inputs tokens,lengths and train with --inputs tokens,lengths")
    if task == "sequence-classification" and hasattr(model, "score"):
        raise Refused(f"{name}: a decoder's sequence classification pools the token before the "
                      f"first pad_token_id, and autoaccum pads with 0: not supported; export the "
                      f"causal language model, or an encoder (BERT-like) for classification")


def build_wrapper(model):
    import torch

    class Graphs(torch.nn.Module):
        """Two methods traced over one model: train_logits (dropout on) and eval_logits."""

        def __init__(self, m):
            super().__init__()
            self.model = m

        def logits(self, tokens, lengths=None):
            if lengths is None:
                return self.model(input_ids=tokens, return_dict=False)[0]
            positions = torch.arange(tokens.size(1), device=tokens.device).view(1, -1)
            mask = (positions < lengths.view(-1, 1)).to(torch.long)
            return self.model(input_ids=tokens, attention_mask=mask, return_dict=False)[0]

        def in_mode(self, training, args):
            was = self.model.training
            self.model.train(training)
            try:
                return self.logits(*args)
            finally:
                self.model.train(was)

        def train_logits(self, *args):
            return self.in_mode(True, args)

        def eval_logits(self, *args):
            return self.in_mode(False, args)

    return Graphs(model)


def example(rows, length, vocab, with_lengths, generator):
    import torch
    tokens = torch.randint(0, vocab, (rows, length), generator=generator)
    if not with_lengths:
        return (tokens,)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    lengths[0] = length
    return (tokens, lengths)


def eager(model, args, training=False):
    import torch
    with torch.no_grad():
        model.train(training)
        if len(args) == 1:
            return model(input_ids=args[0], return_dict=False)[0]
        positions = torch.arange(args[0].size(1)).view(1, -1)
        mask = (positions < args[1].view(-1, 1)).to(torch.long)
        return model(input_ids=args[0], attention_mask=mask, return_dict=False)[0]


def longest_position(config):
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return 1 << 16


def trace_checked(model, with_lengths, trace_length, seed):
    """The two graphs behind a scripted forward, checked against the eager model at shapes other
    than the traced one, in both modes: (module, worst relative difference, traced length).
    Train mode is compared with the same random stream on both sides (dropout draws the same
    masks in the same order)."""
    import torch
    name = type(model).__name__
    vocab = int(model.config.vocab_size)
    longest = longest_position(model.config)
    trace_length = min(trace_length, longest)
    generator = torch.Generator().manual_seed(seed)
    traced_args = example(2, trace_length, vocab, with_lengths, generator)
    graphs = build_wrapper(model)
    graphs.eval()
    try:
        module = torch.jit.trace_module(
            graphs, {"train_logits": traced_args, "eval_logits": traced_args}, check_trace=False)
    except Exception as e:  # a forward TorchScript's tracer cannot follow
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Refused(f"{name}: torch.jit.trace cannot record its forward: {first}")
    names = ", ".join(f"a{i}" for i in range(len(traced_args)))
    module.define(f"def forward(self, {names}):\n"
                  f"    if self.training:\n"
                  f"        return self.train_logits({names})\n"
                  f"    return self.eval_logits({names})\n")

    # The graph must hold for every micro-batch autoaccum will cut, not only the traced shape:
    # compare with eager transformers at other rows and lengths (a forward that branches on its
    # input's values or length would differ here).
    worst = 0.0
    for rows, length in ((3, min(trace_length + 7, longest)), (1, min(3, longest))):
        args = example(rows, length, vocab, with_lengths, generator)
        for training in (False, True):
            torch.manual_seed(seed + length)
            want = eager(model, args, training)
            module.train(training)
            torch.manual_seed(seed + length)
            with torch.no_grad():
                got = module(*args)
            mode = "train" if training else "eval"
            if got.shape != want.shape:
                raise Refused(f"{name}: the traced graph gives shape {list(got.shape)} at "
                              f"[{rows}, {length}] in {mode} mode where transformers gives "
                              f"{list(want.shape)}: its forward depends on the traced shape")
            diff = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
            worst = max(worst, diff)
            if not diff <= 1e-4:
                raise Refused(f"{name}: the traced graph differs from transformers by "
                              f"{diff:.2g} at [{rows}, {length}] in {mode} mode (traced at "
                              f"[2, {trace_length}]): its forward branches on its input's "
                              f"values or length")
    model.train(False)
    return module, worst, trace_length


def export(a):
    import torch
    import transformers
    started = time.time()
    model, task, origin = load_folder(a.from_folder, a.task, a.seed)
    inputs = a.inputs or ("tokens,lengths" if task == "sequence-classification" else "tokens")
    if inputs not in ("tokens", "tokens,lengths"):
        raise Refused(f"--inputs '{inputs}': must be tokens or tokens,lengths")
    check_supported(model, task, inputs)
    config = model.config
    use_cache = getattr(config, "use_cache", None)
    if use_cache is not None:
        config.use_cache = False  # no key/value cache in the graph: autoaccum trains, not generates
    try:
        module, worst, trace_length = trace_checked(model, inputs == "tokens,lengths",
                                                    a.trace_length, a.seed)
    finally:
        if use_cache is not None:
            config.use_cache = use_cache
    module.train(True)
    tokenizer = {n: open(os.path.join(a.from_folder, n), "rb").read()
                 for n in TOKENIZER_FILES if os.path.isfile(os.path.join(a.from_folder, n))}
    meta = {
        "tokenizer_files": sorted(tokenizer),
        "task": task,
        "inputs": inputs,
        "prefix": PREFIX,
        "class": type(model).__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": config.to_dict(),
    }
    out_dir = os.path.dirname(os.path.abspath(a.out))
    fd, tmp = tempfile.mkstemp(prefix=".hf-export-", suffix=".pt", dir=out_dir)
    os.close(fd)
    try:
        extra = {TOKENIZER + n: data for n, data in tokenizer.items()}
        extra[EXTRA] = json.dumps(meta)
        torch.jit.save(module, tmp, _extra_files=extra)
        os.replace(tmp, a.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    outputs = "[rows, T, vocab]" if task == "causal-lm" else "[rows, labels]"
    print(f"wrote {a.out}: {type(model).__name__} ({task}) from {a.from_folder}, {origin}; "
          f"{sum(unique.values())} parameters under '{PREFIX}'; forward({inputs}) -> logits "
          f"{outputs}; dropout follows train/eval; "
          + (f"tokenizer carried ({len(tokenizer)} files); " if tokenizer else "")
          + f"traced at [2, {trace_length}], equal to transformers at other shapes in both "
          f"modes to {worst:.1g}; {time.time() - started:.1f} s")


# ---------------------------------------------------------------------------------------------
# Import


def read_meta(path):
    import torch
    if not os.path.exists(path):
        raise Refused(f"--model-file '{path}': no such file")
    extra = {EXTRA: ""}
    try:
        module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    except Exception as e:
        raise Refused(f"--model-file '{path}': not a TorchScript file "
                      f"({str(e).strip().splitlines()[0]})")
    if not extra[EXTRA]:
        raise Refused(f"--model-file '{path}': not written by hf.py export (no {EXTRA} inside)")
    meta = json.loads(extra[EXTRA])
    files = {TOKENIZER + n: "" for n in meta.get("tokenizer_files", [])}
    if files:
        torch.jit.load(path, map_location="cpu", _extra_files=files)
    meta["tokenizer"] = {n[len(TOKENIZER):]: data for n, data in files.items()}
    return module, meta


def run_autoaccum_export(a):
    """A checkpoint goes through `autoaccum export`, the reader that verifies its checksums."""
    binary = a.autoaccum or shutil.which("autoaccum") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "autoaccum")
    if not os.path.exists(binary):
        raise Refused("--checkpoint needs the autoaccum binary: give --autoaccum PATH")
    tmp = tempfile.mkdtemp(prefix="hf-import-")
    out = os.path.join(tmp, "trained.pt")
    done = subprocess.run([binary, "export", "--checkpoint", a.checkpoint, "--model-file",
                           a.model_file, "--out", out], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(tmp)
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise Refused(lines[-1] if lines else f"autoaccum export exited {done.returncode}")
    return out, tmp


def import_(a):
    import torch
    import transformers
    started = time.time()
    cleanup = None
    source = a.model_file
    if a.checkpoint:
        read_meta(a.model_file)  # refuse a file not from hf.py before running anything
        source, cleanup = run_autoaccum_export(a)
    try:
        module, meta = read_meta(source)
        config_dict = dict(meta["config"])
        model_type = config_dict.get("model_type")
        if model_type not in transformers.CONFIG_MAPPING:
            raise Refused(f"--model-file '{a.model_file}': model type '{model_type}' is not "
                          f"known to transformers {transformers.__version__}")
        config = transformers.CONFIG_MAPPING[model_type].from_dict(config_dict)
        model = auto_class(meta["task"]).from_config(config, torch_dtype=torch.float32)
        prefix = meta.get("prefix", PREFIX)
        tensors = {}
        for name, t in module.state_dict().items():  # tied weights under each of their names
            if name.startswith(prefix):
                tensors[name[len(prefix):]] = t.detach()
        state = model.state_dict()
        missing = [k for k in state if k not in tensors]
        if missing:
            raise Refused(f"--model-file '{source}': no tensor for {prefix}{missing[0]} "
                          f"({len(missing)} missing): not the model its configuration describes")
        with torch.no_grad():
            for k, v in state.items():
                if tensors[k].shape != v.shape:
                    raise Refused(f"--model-file '{source}': {prefix}{k} is "
                                  f"{list(tensors[k].shape)}, the configuration makes it "
                                  f"{list(v.shape)}")
                v.copy_(tensors[k])
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        if os.path.isdir(a.out) and os.listdir(a.out) or os.path.isfile(a.out):
            raise Refused(f"--out '{a.out}': exists and is not empty; nothing was written")
        parent = os.path.dirname(os.path.abspath(a.out))
        tmp = tempfile.mkdtemp(prefix=".hf-import-", dir=parent)
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            for name, data in meta["tokenizer"].items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data if isinstance(data, bytes) else data.encode())
            # Read back as a user will, and compare every tensor.
            back = auto_class(meta["task"]).from_pretrained(tmp, local_files_only=True)
            reread = back.state_dict()
            for k, v in model.state_dict().items():
                if k not in reread or not torch.equal(reread[k], v):
                    raise Refused(f"from_pretrained('{a.out}') does not give back {k}")
            if os.path.isdir(a.out):
                os.rmdir(a.out)
            os.replace(tmp, a.out)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
    finally:
        if cleanup:
            shutil.rmtree(cleanup)
    tokenizer = " and its tokenizer" if meta["tokenizer"] else ""
    print(f"wrote {a.out}: {meta['class']} ({meta['task']}){tokenizer}, {len(state)} tensors "
          f"from {a.checkpoint or a.model_file}; from_pretrained gives them back; "
          f"{time.time() - started:.1f} s")


# ---------------------------------------------------------------------------------------------
# Tokenize


def folder_tokenizer(folder):
    import transformers
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise Refused(f"--from '{folder}': no tokenizer transformers can load "
                      f"({str(e).strip().splitlines()[0]})")


@contextlib.contextmanager
def written_atomically(out):
    """An HDF5 file to fill, written under a temporary name beside `out` and renamed to it only
    when complete: a failure leaves `out` as it was."""
    import h5py
    fd, tmp = tempfile.mkstemp(prefix=".hf-", suffix=".h5",
                               dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            yield f
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def tokenize(a):
    import h5py
    import numpy as np
    started = time.time()
    tokenizer = folder_tokenizer(a.from_folder)
    if not os.path.exists(a.documents):
        raise Refused(f"--documents '{a.documents}': no such file")
    try:
        with h5py.File(a.documents, "r") as f:
            tokens, offsets = f["tokens"][:], f["offsets"][:]
    except (OSError, KeyError) as e:
        raise Refused(f"--documents '{a.documents}': not document data (tokens and offsets): {e}")
    if tokens.dtype != np.uint8:
        raise Refused(f"--documents '{a.documents}': tokens are {tokens.dtype}, not bytes "
                      f"(autoaccum import text --documents writes bytes)")
    ids, lengths, dropped = [], [], 0
    longest = a.max_length
    for i in range(len(offsets) - 1):
        text = tokens[offsets[i]:offsets[i + 1]].tobytes().decode("utf-8", errors="replace")
        piece = tokenizer(text, add_special_tokens=not a.no_special_tokens)["input_ids"]
        for begin in range(0, len(piece), longest or max(1, len(piece))):
            chunk = piece[begin:begin + longest] if longest else piece
            if not chunk:  # text the tokenizer makes nothing of
                dropped += 1
                continue
            ids.extend(chunk)
            lengths.append(len(chunk))
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= 65536 else np.int32
    with written_atomically(a.out) as f:
        f["tokens"] = np.asarray(ids, dtype=dtype)
        f["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        f.attrs["num_classes"] = np.int64(vocab)
        f.attrs["tokens"] = f"tokenizer of {os.path.abspath(a.from_folder)}"
        f.attrs["source"] = os.path.abspath(a.documents)
    lengths = np.asarray(lengths)
    print(f"wrote {a.out}: {len(lengths)} documents, {int(lengths.sum())} tokens of a vocabulary "
          f"of {vocab}; length min {lengths.min()}, p50 {int(np.median(lengths))}, max "
          f"{lengths.max()}" + (f"; {dropped} empty dropped" if dropped else "")
          + f"; {time.time() - started:.1f} s")


# ---------------------------------------------------------------------------------------------
# data: JSONL records (text, prompt and completion, or chat messages) -> document data whose
# per-token labels train only where the model should learn


class BadRecord(Exception):
    """One record that does not convert: the field and what is wrong (the caller adds where)."""


def records(path):
    """(line number, record) of a JSONL file, gzip-compressed when it ends in .gz; a line that is
    not a JSON object is a BadRecord at its line."""
    import gzip
    if path.endswith(".parquet"):
        raise Refused(f"--input '{path}': Parquet is not read yet (it needs pyarrow, which the "
                      "cached environment does not have); convert it to JSONL")
    if not os.path.exists(path):
        raise Refused(f"--input '{path}': no such file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    yield number, BadRecord(f"not JSON ({e.msg} at column {e.colno})")
                    continue
                if not isinstance(record, dict):
                    yield number, BadRecord(f"not a JSON object (a {type(record).__name__})")
                    continue
                yield number, record
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise Refused(f"--input '{path}': cannot be read ({e})")


def text_field(record, name):
    if name not in record:
        raise BadRecord(f"field '{name}' is missing")
    value = record[name]
    if not isinstance(value, str):
        raise BadRecord(f"field '{name}' is a {type(value).__name__}, not a string")
    return value


def rendered(tokenizer, template, messages, generation_prompt):
    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except Exception as e:  # the template's own raise_exception, or a Jinja error
        raise BadRecord(f"the chat template refused it: {str(e).strip().splitlines()[0]}")


def conversation(tokenizer, template, record, name):
    """(text, [character spans to learn]) of a chat record: each assistant turn's content and
    what the template puts after it (its end-of-turn marker), not the role header before it."""
    if name not in record:
        raise BadRecord(f"field '{name}' is missing")
    messages = record[name]
    if not isinstance(messages, list) or not messages:
        raise BadRecord(f"field '{name}' is " + ("an empty conversation" if messages == [] else
                                                  f"a {type(messages).__name__}, not a list"))
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content"), str):
            raise BadRecord(f"field '{name}': message {k} is not {{role, content}} strings")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord(f"field '{name}': no assistant turn to learn from")
    text = rendered(tokenizer, template, messages, False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        asked = rendered(tokenizer, template, messages[:k], True)  # up to the role header
        through = rendered(tokenizer, template, messages[:k + 1], False)
        if not text.startswith(through) or not through.startswith(asked):
            raise BadRecord(f"field '{name}': the chat template does not render the "
                            "conversation turn by turn (its prefixes differ)")
        if not through[len(asked):].startswith(m["content"]):
            raise BadRecord(f"field '{name}': message {k}: the chat template changes the "
                            "assistant's content (trims it?), so its tokens cannot be found")
        spans.append((len(asked), len(through)))
    return text, spans


def learnt_tokens(tokenizer, text, spans, special):
    """The ids of `text` and, per id, whether it lies inside one of the character spans."""
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    ids, learnt = encoded["input_ids"], []
    for begin, end in encoded["offset_mapping"]:
        learnt.append(end > begin and any(a <= begin and end <= b for a, b in spans))
    return ids, learnt


def convert(tokenizer, template, record, a):
    """(ids, learnt) of one record, by the fields asked for."""
    if a.text_field:
        text = text_field(record, a.text_field)
        ids = tokenizer(text, add_special_tokens=not a.no_special_tokens)["input_ids"]
        return ids, [True] * len(ids)
    if a.prompt_field:
        prompt = text_field(record, a.prompt_field)
        completion = text_field(record, a.completion_field)
        first = tokenizer(prompt, add_special_tokens=not a.no_special_tokens)["input_ids"]
        then = tokenizer(completion, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            then = then + [tokenizer.eos_token_id]  # learn to stop
        return first + then, [False] * len(first) + [True] * len(then)
    text, spans = conversation(tokenizer, template, record, a.messages_field)
    # The template writes its own special tokens (a BOS where it wants one).
    return learnt_tokens(tokenizer, text, spans, False)


def pieces(ids, learnt, longest, split):
    """The record as documents: whole, truncated to `longest`, or cut into pieces of it."""
    if not longest or len(ids) <= longest:
        return [(ids, learnt)]
    if not split:
        return [(ids[:longest], learnt[:longest])]
    return [(ids[b:b + longest], learnt[b:b + longest]) for b in range(0, len(ids), longest)]


def labels_of(ids, learnt, ignore):
    """Position j predicts token j + 1 where that token is to be learnt; the last predicts
    nothing."""
    return [ids[j + 1] if learnt[j + 1] else ignore for j in range(len(ids) - 1)] + [ignore]


def data(a):
    import numpy as np
    try:
        import xxhash  # Debian's python3-xxhash; an environment without it writes no checksums
    except ImportError:
        xxhash = None
    started = time.time()
    kinds = [bool(a.text_field), bool(a.prompt_field or a.completion_field),
             bool(a.messages_field)]
    if sum(kinds) != 1:
        raise Refused("data: give exactly one of --text-field, --prompt-field with "
                      "--completion-field, or --messages-field")
    if kinds[1] and not (a.prompt_field and a.completion_field):
        raise Refused("data: --prompt-field and --completion-field go together")
    if a.max_length < 0 or (a.split and not a.max_length):
        raise Refused("data: --max-length must be 0 or more, and --split needs it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        raise Refused(f"--out '{a.out}': its folder does not exist")
    tokenizer = folder_tokenizer(a.from_folder)
    template = None
    if a.messages_field:
        if a.chat_template:
            try:
                with open(a.chat_template, encoding="utf-8") as f:
                    template = f.read()
            except OSError as e:
                raise Refused(f"--chat-template '{a.chat_template}': cannot be read ({e})")
        elif getattr(tokenizer, "chat_template", None):
            template = tokenizer.chat_template
        else:
            raise Refused(f"--from '{a.from_folder}': its tokenizer has no chat template; give "
                          "one with --chat-template FILE")
        try:
            import jinja2  # noqa: F401  (transformers renders chat templates with it)
        except ImportError:
            raise Refused("chat data needs jinja2 to render the chat template (Debian's "
                          "python3-jinja2, which jobs/setup.sh installs)")
        if not tokenizer.is_fast:
            raise Refused(f"--from '{a.from_folder}': chat data needs a fast tokenizer "
                          "(tokenizer.json), for the characters each token covers")
    ids, labels, lengths = [], [], []
    bad, first_bad, count, learnt_count, last_said = 0, None, 0, 0, time.time()
    for number, record in records(a.input):
        try:
            if isinstance(record, BadRecord):
                raise record
            tokens, learnt = convert(tokenizer, template, record, a)
        except BadRecord as e:
            where = f"{a.input}:{number}: {e}"
            if not a.skip_bad:
                raise Refused(where + " (--skip-bad skips such records)")
            bad, first_bad = bad + 1, first_bad or where
            continue
        for piece, marks in pieces(tokens, learnt, a.max_length, a.split):
            if not piece:
                continue
            ids.extend(piece)
            labels.extend(labels_of(piece, marks, a.ignore_index))
            lengths.append(len(piece))
            learnt_count += sum(marks[1:])
        count += 1
        if time.time() - last_said > 5:
            print(f"data: {count} records, {len(ids)} tokens, "
                  f"{count / (time.time() - started):.0f} records/s", file=sys.stderr, flush=True)
            last_said = time.time()
    if not lengths:
        raise Refused(f"--input '{a.input}': no record converted" +
                      (f" ({bad} bad, the first: {first_bad})" if bad else ""))
    vocab = len(tokenizer)
    tokens = np.asarray(ids, dtype=np.uint16 if vocab <= 65536 else np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    label_array = np.asarray(labels, dtype=np.int64)
    with written_atomically(a.out) as f:
        for name, values in (("tokens", tokens), ("offsets", offsets),
                             (a.labels_name, label_array)):
            f[name] = values
            if xxhash:
                f[name].attrs["checksum"] = "xxh3-64:" + xxhash.xxh3_64_hexdigest(
                    values.tobytes())
        f.attrs["num_classes"] = np.int64(vocab)
        f.attrs["tokens"] = f"tokenizer of {os.path.abspath(a.from_folder)}"
        f.attrs["source"] = os.path.abspath(a.input)
    print(f"wrote {a.out}: {len(lengths)} documents from {count} records, {len(ids)} tokens, "
          f"{learnt_count} to learn (the rest labelled {a.ignore_index}); train with --targets "
          f"{a.labels_name}" + (f"; {bad} bad records skipped, the first: {first_bad}"
                                if bad else "")
          + ("" if xxhash else "; no checksums (this Python has no xxhash)")
          + f"; {time.time() - started:.1f} s")


# ---------------------------------------------------------------------------------------------
# Tiny models (random weights, nothing downloaded)


def tiny(a):
    import torch
    import transformers
    d = a.dropout
    if a.arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=a.vocab, n_positions=a.context, n_embd=a.width, n_layer=a.layers,
            n_head=a.heads, resid_pdrop=d, embd_pdrop=d, attn_pdrop=d, bos_token_id=a.vocab - 1,
            eos_token_id=a.vocab - 1, architectures=["GPT2LMHeadModel"])
    elif a.arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=a.vocab, max_position_embeddings=a.context, hidden_size=a.width,
            intermediate_size=2 * a.width, num_hidden_layers=a.layers, num_attention_heads=a.heads,
            num_key_value_heads=max(1, a.heads // 2), bos_token_id=1, eos_token_id=2,
            architectures=["LlamaForCausalLM"])
    else:
        config = transformers.BertConfig(
            vocab_size=a.vocab, max_position_embeddings=a.context, hidden_size=a.width,
            intermediate_size=4 * a.width, num_hidden_layers=a.layers, num_attention_heads=a.heads,
            hidden_dropout_prob=d, attention_probs_dropout_prob=d, num_labels=a.labels,
            pad_token_id=0, architectures=["BertForSequenceClassification"])
    torch.manual_seed(a.seed)
    task = "sequence-classification" if a.arch == "bert" else "causal-lm"
    model = auto_class(task).from_config(config)
    if os.path.isdir(a.out) and os.listdir(a.out) or os.path.isfile(a.out):
        raise Refused(f"--out '{a.out}': exists and is not empty")
    model.save_pretrained(a.out, safe_serialization=True)
    said = ""
    if a.tokenizer_from:
        said = "; " + train_tokenizer(a.tokenizer_from, a.vocab, a.out)
    n = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    print(f"wrote {a.out}: {type(model).__name__}, {a.layers} layers, width {a.width}, "
          f"vocabulary {a.vocab}, {n} parameters (random, seed {a.seed}){said}")


def train_tokenizer(documents, vocab, folder):
    """A byte-level BPE tokenizer of `vocab` ids learnt from a document file of bytes, saved in
    the folder as transformers' fast tokenizer (what a pretrained folder brings)."""
    import h5py
    import tokenizers
    import transformers
    if vocab < 260:
        raise Refused(f"--vocab {vocab}: a byte-level tokenizer needs at least 260 ids")
    with h5py.File(documents, "r") as f:
        tokens, offsets = f["tokens"][:], f["offsets"][:]
    texts = (tokens[offsets[i]:offsets[i + 1]].tobytes().decode("utf-8", errors="replace")
             for i in range(len(offsets) - 1))
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer,
                                                eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return f"a byte-level BPE tokenizer of {len(fast)} ids learnt from {documents}"


def main():
    parser = argparse.ArgumentParser(
        description="Hugging Face transformers models in and out of autoaccum",
        epilog="docs/models.md, 'From Hugging Face'")
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="a save_pretrained folder -> a TorchScript file to train")
    e.add_argument("--from", dest="from_folder", required=True, metavar="FOLDER",
                   help="what save_pretrained wrote: config.json, and the weights to fine-tune")
    e.add_argument("--out", required=True, help="the TorchScript file for --model-file")
    e.add_argument("--task", choices=TASKS)
    e.add_argument("--inputs", help="tokens (default for causal-lm) or tokens,lengths "
                   "(a padding mask built inside; needed for sequence classification)")
    e.add_argument("--trace-length", type=int, default=16,
                   help="the length traced at (the graph is then checked at others)")
    e.add_argument("--seed", type=int, default=0, help="random weights when the folder has none")
    i = sub.add_parser("import", help="a trained TorchScript file (or checkpoint) -> a folder "
                       "that from_pretrained loads")
    i.add_argument("--model-file", required=True,
                   help="written by hf.py export (with --checkpoint), or by autoaccum export")
    i.add_argument("--checkpoint", help="an autoaccum checkpoint of that model")
    i.add_argument("--autoaccum", help="the autoaccum binary (default: on PATH, else build/)")
    i.add_argument("--out", required=True, help="a new folder for from_pretrained")
    t = sub.add_parser("tiny", help="a small model folder with random weights")
    t.add_argument("--arch", choices=("gpt2", "llama", "bert"), required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--vocab", type=int, default=256)
    t.add_argument("--context", type=int, default=256)
    t.add_argument("--width", type=int, default=64)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--labels", type=int, default=2)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tokenizer-from", metavar="DOCS.h5",
                   help="also learn a byte-level BPE tokenizer of --vocab ids from this document "
                        "file of bytes")
    k = sub.add_parser("tokenize", help="a document file of bytes -> the folder's tokens")
    k.add_argument("--from", dest="from_folder", required=True, metavar="FOLDER")
    k.add_argument("--documents", required=True, metavar="DOCS.h5",
                   help="autoaccum import text --documents ... wrote it")
    k.add_argument("--out", required=True)
    k.add_argument("--max-length", type=int, default=0,
                   help="split longer documents into pieces of this many tokens (0: keep)")
    k.add_argument("--no-special-tokens", action="store_true",
                   help="do not add the tokenizer's special tokens (a Llama tokenizer's BOS)")
    d = sub.add_parser("data", help="JSONL records (text, prompt and completion, or chat "
                       "messages) -> document data with per-token labels")
    d.add_argument("--from", dest="from_folder", required=True, metavar="FOLDER",
                   help="the folder whose tokenizer (and chat template) to use")
    d.add_argument("--input", required=True, metavar="FILE", help="JSONL, one object a line "
                   "(.jsonl, or .jsonl.gz)")
    d.add_argument("--out", required=True, metavar="DOCS.h5")
    d.add_argument("--text-field", metavar="NAME", help="documents: the loss on every next token")
    d.add_argument("--prompt-field", metavar="NAME")
    d.add_argument("--completion-field", metavar="NAME",
                   help="with --prompt-field: the loss on the completion (and EOS) only")
    d.add_argument("--messages-field", metavar="NAME",
                   help="chat: a list of {role, content}, rendered by the chat template; the "
                        "loss on the assistant turns only")
    d.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template, for a folder without one (or instead of it)")
    d.add_argument("--max-length", type=int, default=0,
                   help="truncate longer records to this many tokens (0: keep)")
    d.add_argument("--split", action="store_true",
                   help="with --max-length: cut longer records into pieces instead")
    d.add_argument("--skip-bad", action="store_true",
                   help="skip records that do not convert, and count them")
    d.add_argument("--ignore-index", type=int, default=-100,
                   help="the label of positions that predict nothing to learn")
    d.add_argument("--labels-name", default="labels",
                   help="the labels dataset (train with --targets NAME)")
    d.add_argument("--no-special-tokens", action="store_true",
                   help="text and prompts: do not add the tokenizer's special tokens")
    a = parser.parse_args()
    need_transformers()
    quiet()
    try:
        {"export": export, "import": import_, "tiny": tiny, "tokenize": tokenize,
         "data": data}[a.command](a)
    except Refused as r:
        die(str(r))


if __name__ == "__main__":
    main()
