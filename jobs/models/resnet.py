#!/usr/bin/env python3
"""Writes a small ResNet-style CNN with BatchNorm for Fashion-MNIST (1x28x28, 10 classes) as a
TorchScript file for `autoaccum train --model-file`. Copy it and change the sizes.

    /usr/bin/python3 jobs/models/resnet.py --out resnet.pt --width 32
"""
import argparse

import torch
import torch.nn.functional as F


class Residual(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ResNet(torch.nn.Module):
    def __init__(self, width=32, classes=10, dropout=0.2):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(width)
        self.block1 = Residual(width)
        self.widen = torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(2 * width)
        self.block2 = Residual(2 * width)
        self.drop = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = F.max_pool2d(self.block1(x), 2)
        x = self.block2(F.relu(self.bn2(self.widen(x))))
        return self.head(self.drop(x.mean((2, 3))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    torch.manual_seed(a.seed)
    model = ResNet(a.width)
    torch.jit.script(model).save(a.out)
    print(f"wrote {a.out}: ResNet-style CNN, width {a.width}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
