"""Writes the scripted models the C++ tests load (run at build time by CMake)."""
import sys

import torch


class BatchNormDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.out(self.drop(torch.relu(self.bn(self.a(x)))))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = BatchNormDropout()
    model.eval()  # saved in eval mode, as users often do
    torch.jit.script(model).save(sys.argv[1])
