#!/usr/bin/env python3
"""Writes a small GPT as a TorchScript file for `autoaccum train --model-file`.

Byte-level (vocabulary 256, for `autoaccum import text`): token and position embeddings,
pre-norm blocks of causal self-attention and an MLP, and an output head tied to the token
embedding. forward(x [rows, T] int64) -> logits [rows, T, 256]. Copy it and change the sizes.

    /usr/bin/python3 jobs/models/gpt.py --out gpt.pt --context 128 --width 128 --layers 4
"""
import argparse
import math

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, h, mask):
        rows, steps, width = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(width, dim=2)
        per_head = width // self.heads
        q = q.view(rows, steps, self.heads, per_head).transpose(1, 2)
        k = k.view(rows, steps, self.heads, per_head).transpose(1, 2)
        v = v.view(rows, steps, self.heads, per_head).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(per_head)
        scores = scores.masked_fill(mask[:steps, :steps], float("-inf"))
        attended = (self.drop(F.softmax(scores, dim=-1)) @ v).transpose(1, 2)
        h = h + self.drop(self.proj(attended.reshape(rows, steps, width)))
        return h + self.drop(self.down(F.gelu(self.up(self.norm2(h)))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=256, context=128, width=128, layers=4, heads=4, dropout=0.1):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([Block(width, heads, dropout) for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one tensor, trained once
        self.register_buffer(
            "mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, x):
        positions = torch.arange(x.size(1), device=x.device)
        h = self.tok(x) + self.pos(positions)
        for block in self.blocks:
            h = block(h, self.mask)
        return self.head(self.norm(h))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    torch.manual_seed(a.seed)
    model = GPT(256, a.context, a.width, a.layers, a.heads, a.dropout)
    torch.jit.script(model).save(a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: GPT, {a.layers} layers, width {a.width}, context {a.context}, "
          f"{n} parameters")


if __name__ == "__main__":
    main()
