# A KernelBench-format problem written for mirage_py's tests: a softmax over the rows of a
# projection, added back to the input (sizes divisible: hidden % heads).
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        assert hidden % heads == 0
        self.weight = nn.Parameter(torch.randn(hidden, hidden) / hidden ** 0.5)
        self.heads = heads

    def forward(self, x, r):
        y = torch.softmax(x @ self.weight, dim=-1)
        return y + r


rows = 128
hidden = 384
heads = 12


def get_inputs():
    return [torch.rand(rows, hidden), torch.rand(rows, hidden)]


def get_init_inputs():
    return [hidden, heads]
