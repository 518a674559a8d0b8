# A KernelBench-format problem written for mirage_py's tests: a running sum along the rows
# (no mirage_py operator for it), then a ReLU.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.relu(torch.cumsum(x, dim=self.dim) - 1.0)


batch_size = 32
length = 256
dim = 1


def get_inputs():
    return [torch.rand(batch_size, length) * 0.1]


def get_init_inputs():
    return [dim]
