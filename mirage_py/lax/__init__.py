"""The program frontend: tensors, operators, programs, the op table and the Lax partitioner."""

from .ops import DTYPES, FLOAT_DTYPES, INDEX_DTYPES, OPS, OpSpec, lax_class
from .partition import Partition, partition
from .program import Output, Program
from .shapes import Affine, Dim, dim
from .tensor import (Tensor, abs, add, amax, amin, broadcast_shapes, cast, causal_mask, clamp,
                     concat, const, div, exp, gelu, hardtanh, leaky_relu, log, matmul, maximum,
                     minimum, mish, mul, neg, pow, relu, reshape, sigmoid, silu, sin, cos,
                     sliding_window_mask, slice_axis, valid_mask, softplus, split, sqrt, square,
                     sub, sum,
                     take, tanh, topo_order, transpose, where)
from .composites import (batch_norm, group_norm, layer_norm, log_softmax, logsumexp, mean,
                         rms_norm, softmax)

max = amax  # noqa: A001 -- mp.max / mp.min / mp.slice, as in NumPy and PyTorch
min = amin  # noqa: A001
slice = slice_axis  # noqa: A001

__all__ = ["Dim", "Affine", "dim", "DTYPES", "FLOAT_DTYPES", "INDEX_DTYPES", "OPS", "OpSpec", "lax_class", "Partition", "partition", "Output", "Program",
           "Tensor", "abs", "add", "amax", "amin", "batch_norm", "broadcast_shapes", "cast",
           "causal_mask", "clamp", "concat", "const", "div", "exp", "gelu", "group_norm",
           "hardtanh", "layer_norm", "leaky_relu", "log", "log_softmax", "logsumexp", "matmul",
           "max", "maximum", "mean", "min", "minimum", "mish", "mul", "neg", "pow", "relu",
           "reshape", "rms_norm", "sigmoid", "silu", "sin", "cos", "slice", "slice_axis",
           "sliding_window_mask", "valid_mask", "softmax", "softplus", "split", "sqrt", "square",
           "sub", "sum",
           "take", "tanh", "topo_order", "transpose", "where"]
