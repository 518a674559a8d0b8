# A KernelBench-format problem written for mirage_py's tests: a linear layer, GELU, a scale.
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """y = gelu(x @ W^T + b) * scale"""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return F.gelu(self.proj(x)) * self.scale


batch = 64
in_features = 512
out_features = 256
scale = 0.5


def get_inputs():
    return [torch.rand(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
