"""Ordinary PyTorch models as users write them, scripted to files, and the PyTorch computations
that autoaccum's results are compared with (shared by the user-model end-to-end tests)."""
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F

# The reference computations run the scripted models in the plain interpreter. Debian 13's
# python3-torch 2.6 spins forever in the first backward pass after its graph executor has
# optimised a scripted model with tied weights (measured in the Debian 13 CI root; autoaccum's
# LibTorch 2.6 trains the same file fine); the interpreter computes the same values.
torch._C._set_graph_executor_optimize(False)


class ConvBnDropout(torch.nn.Module):
    """conv + BatchNorm + dropout, the kind of model the issue's users bring."""

    def __init__(self, channels=1, side=8, classes=4, width=8, dropout=0.25):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, width, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(width)
        self.drop = torch.nn.Dropout(dropout)
        self.fc = torch.nn.Linear(width * (side // 2) * (side // 2), classes)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


class FashionNet(torch.nn.Module):
    """Two conv + BatchNorm blocks, dropout, two linear layers: a Fashion-MNIST model."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(32)
        self.drop = torch.nn.Dropout(0.25)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(torch.relu(self.fc1(self.drop(x.flatten(1)))))
        return self.fc2(x)


class SmallConv(torch.nn.Module):
    """A convolution and a linear layer, no BatchNorm: its gradient does not depend on how a
    batch is cut into micro-batches."""

    def __init__(self, channels=1, side=8, classes=4, width=8, logit_scale=1.0, gain=None):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, width, 3, padding=1)
        self.fc = torch.nn.Linear(width * side * side, classes)
        self.logit_scale = logit_scale
        # gain: a fixed buffer applied by linear(), which autocast runs in bf16/fp16; a gain that
        # rounds to 1 there (1.0038 in bf16) scales the logits only in an fp32 evaluation.
        self.use_gain = gain is not None
        self.register_buffer("gain", torch.eye(classes) * (1.0 if gain is None else gain))

    def forward(self, x):
        logits = self.fc(torch.relu(self.conv(x)).flatten(1)) * self.logit_scale
        if self.use_gain:
            logits = torch.nn.functional.linear(logits, self.gain)
        return logits


class LinearBn(torch.nn.Module):
    def __init__(self, features=6, hidden=5, classes=3):
        super().__init__()
        self.a = torch.nn.Linear(features, hidden)
        self.bn = torch.nn.BatchNorm1d(hidden)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.a(x))))


class Tied(torch.nn.Module):
    def __init__(self, features=8, classes=3):
        super().__init__()
        self.enc = torch.nn.Linear(features, features)
        self.dec = torch.nn.Linear(features, features)
        self.dec.weight = self.enc.weight  # tied: one tensor, two names
        self.head = torch.nn.Linear(features, classes)

    def forward(self, x):
        return self.head(torch.relu(self.dec(torch.relu(self.enc(x)))))


class TokenLm(torch.nn.Module):
    """Token ids [B, T] to next-token logits [B, T, vocab]: an embedding and a linear head."""

    def __init__(self, vocab=256, width=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x)))


class RowCounter(torch.nn.Module):
    """Counts in a buffer how often each row was trained on; x[:, 0] is the row's index. The
    ranks' buffer changes are averaged, so the buffer times the ranks is the count."""

    def __init__(self, rows):
        super().__init__()
        self.lin = torch.nn.Linear(1, 2)
        self.register_buffer("seen", torch.zeros(rows))

    def forward(self, x):
        if self.training:
            self.seen.index_add_(0, x[:, 0].long(), torch.ones(x.shape[0]))
        return self.lin(x / 100.0)


class DocumentCounter(torch.nn.Module):
    """Counts in a buffer how often each document was trained on: a document's first token is
    its index (the vocabulary is the number of documents). Averaged over the ranks, so the
    buffer times the ranks is the count."""

    def __init__(self, documents):
        super().__init__()
        self.tok = torch.nn.Embedding(documents, 4)
        self.head = torch.nn.Linear(4, documents)
        self.register_buffer("seen", torch.zeros(documents))

    def forward(self, x):
        if self.training:
            self.seen.index_add_(0, x[:, 0], torch.ones(x.shape[0]))
        return self.head(torch.tanh(self.tok(x)))


class DoubleTally(torch.nn.Module):
    """Tallies in a float64 buffer what its training rows hold (sums of x and of x squared,
    in double): the ranks' changes have more bits than a float32 carries."""

    def __init__(self, features=8, classes=3):
        super().__init__()
        self.lin = torch.nn.Linear(features, classes)
        self.register_buffer("tally", torch.full((2,), 1.0e6, dtype=torch.float64))

    def forward(self, x):
        if self.training:
            xd = x.double()
            self.tally += torch.stack([xd.sum() * 1000.0, (xd * xd).sum() / 3.0])
        return self.lin(x)


class PartlyFrozen(torch.nn.Module):
    def __init__(self, features=8, classes=3):
        super().__init__()
        self.body = torch.nn.Linear(features, 6)
        self.head = torch.nn.Linear(6, classes)
        for p in self.body.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class DropoutWitness(torch.nn.Module):
    """Dropout whose first row's mask is kept in a buffer: averaged over the ranks, it shows
    whether the ranks drew the same masks (values 0 or 2 only) or different ones (some 1)."""

    def __init__(self, features=8, classes=3, width=64):
        super().__init__()
        self.a = torch.nn.Linear(features, width)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(width, classes)
        self.register_buffer("mask", torch.zeros(width))

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.training:
            self.mask.copy_(self.drop(torch.ones_like(h[0])))
        return self.out(self.drop(h))


def save_scripted(module, path, eval_mode=False, seed=0):
    torch.manual_seed(seed)
    m = module() if isinstance(module, type) else module
    if eval_mode:
        m.eval()
    torch.jit.script(m).save(path)
    return path


def write_data(path, x, y, classes=None):
    with h5py.File(path, "w") as f:
        f["x"] = x
        f["y"] = y
        if classes is not None:
            f.attrs["num_classes"] = classes
    return path


def classification_data(rows, shape, classes, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, *shape)).astype(np.float32)
    y = rng.integers(0, classes, rows).astype(np.int64)
    return x, y


def rank_parts(rows, world):
    """autoaccum's split of a batch: rank r takes [floor(r*B/W), floor((r+1)*B/W))."""
    return [(r * rows // world, (r + 1) * rows // world) for r in range(world)]


def reference_steps(model_path, x, y, world, micro_batch, global_batch, steps, lr,
                    momentum=0.0, weight_decay=0.0, optimizer="sgd", parts=None, autocast=None,
                    first_step=0, skip_steps=()):
    """PyTorch's own computation of what autoaccum promises, with --shuffle none: each rank
    walks its part of each batch in micro-batches (BatchNorm in train mode sees one
    micro-batch at a time and updates its statistics each time), the gradient is the sum over
    ranks and micro-batches of (summed loss / B), and floating buffers end each step as the
    mean over the ranks of what each rank's micro-batches made of them.

    `micro_batch`: one size, or a function (step, rank) -> size (per-rank sizes). `parts`: a
    function step -> [(begin, end) per rank] (uneven shares); default rank_parts. `autocast`: a
    dtype (torch.bfloat16): each micro-batch's forward and loss run under
    torch.autocast("cpu", dtype), the backward outside it, as --precision bf16 promises.
    `model_path`: a TorchScript file, or a module to train in place. `first_step`: the step the
    model's state is at (a checkpoint's), for the data order. `skip_steps`: steps computed but
    not applied (an fp16 overflow)."""
    size_of = micro_batch if callable(micro_batch) else (lambda step, rank: micro_batch)
    parts_of = parts or (lambda step: rank_parts(global_batch, world))
    model = model_path if isinstance(model_path, torch.nn.Module) else torch.jit.load(model_path)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    buffers = dict(model.named_buffers())
    for step in range(first_step, first_step + steps):
        start = step % (len(x) // global_batch) * global_batch  # --shuffle none, epochs wrap
        opt.zero_grad()
        before = {n: b.clone() for n, b in buffers.items()}
        after = {n: [] for n in buffers}
        for rank, (lo, hi) in enumerate(parts_of(step)):
            for n, b in buffers.items():
                b.copy_(before[n])
            size = size_of(step, rank)
            for m0 in range(lo, hi, size):
                m1 = min(hi, m0 + size)
                xb = torch.from_numpy(x[start + m0:start + m1])
                yb = torch.from_numpy(y[start + m0:start + m1])
                with torch.autocast("cpu", dtype=autocast or torch.bfloat16,
                                    enabled=autocast is not None):
                    loss = F.cross_entropy(model(xb), yb, reduction="sum") / global_batch
                loss.backward()
            for n, b in buffers.items():
                after[n].append(b.clone())
        with torch.no_grad():
            for n, b in buffers.items():
                if b.dtype.is_floating_point:
                    b.copy_(before[n] + sum(a - before[n] for a in after[n]) / world)
                else:
                    b.copy_(before[n] + torch.round(
                        sum((a - before[n]).double() for a in after[n]) / world).to(b.dtype))
        if step not in skip_steps:
            opt.step()
    return model


def rank_sizes(run_log):
    """From a run log's rank_sizes group (schema 3): (micro-batch(step, rank), parts(step)) as
    the reference wants them, and the raw rows."""
    with h5py.File(run_log, "r") as f:
        g = {c: f[f"rank_sizes/{c}"][:] for c in ("step", "rank", "micro_batch", "rows")}
        world = int(f.attrs["world_size"])

    def latest(step, rank, column):
        rows = [i for i in range(len(g["step"])) if g["rank"][i] == rank and g["step"][i] <= step]
        return int(g[column][rows[-1]])

    def parts(step):
        out, begin = [], 0
        for r in range(world):
            out.append((begin, begin + latest(step, r, "rows")))
            begin = out[-1][1]
        return out
    return (lambda step, rank: latest(step, rank, "micro_batch")), parts, g


def checkpoint_tensors(path):
    with h5py.File(path, "r") as f:
        params = {n: f[f"params/{n}"][()] for n in f.attrs["params_names"]}
        buffers = {n: f[f"buffers/{n}"][()] for n in f.attrs["buffers_names"]}
    return params, buffers


def assert_close_to_model(test, checkpoint, model, rtol=1e-5, atol=1e-6):
    params, buffers = checkpoint_tensors(checkpoint)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(params[name].reshape(p.shape), p.detach().numpy(), rtol=rtol,
                                   atol=atol, err_msg=name)
    for name, b in model.named_buffers():
        np.testing.assert_allclose(buffers[name].reshape(b.shape), b.numpy(), rtol=rtol,
                                   atol=atol, err_msg=name)


def update_distance(params, reference, initial):
    """How far parameters `params` (name -> array, as checkpoint_tensors gives them) lie from a
    reference model's, relative to how far the reference moved from `initial` (name -> array):
    ||params - reference|| / ||reference - initial||, over all trainable parameters at once."""
    diff = moved = 0.0
    for name, p in reference.named_parameters():
        ref = p.detach().numpy()
        diff += float(np.sum((params[name].reshape(ref.shape) - ref) ** 2))
        moved += float(np.sum((ref - initial[name].reshape(ref.shape)) ** 2))
    return (diff / moved) ** 0.5


def builtin_model(kind, input_shape, classes, hidden=(64, 64)):
    """autoaccum's built-in mlp or cnn as PyTorch modules with the same parameter names."""
    nn = torch.nn
    if kind == "mlp":
        layers, width = [nn.Flatten()], int(np.prod(input_shape))
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return nn.Sequential(*layers, nn.Linear(width, classes))
    c, h, w = input_shape
    return nn.Sequential(nn.Conv2d(c, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * (h // 4) * (w // 4), 128), nn.ReLU(),
                         nn.Linear(128, classes))


def error_lines(result):
    """The lines autoaccum printed as errors (mpirun's own help text aside)."""
    return [line for line in result.stderr.splitlines() if line.startswith("autoaccum")]


def exists(path):
    return os.path.exists(path)
