"""The program frontend: tensors, operators, programs, the op table and the Lax partitioner."""

from .ops import DTYPES, OPS, OpSpec
from .partition import Partition, partition
from .program import Output, Program
from .tensor import (Tensor, add, broadcast_shapes, const, div, exp, gelu, matmul, mean, mul, neg,
                     relu, reshape, rms_norm, silu, sqrt, square, sub, sum, topo_order, transpose)

__all__ = ["DTYPES", "OPS", "OpSpec", "Partition", "partition", "Output", "Program", "Tensor",
           "add", "broadcast_shapes", "const", "div", "exp", "gelu", "matmul", "mean", "mul", "neg",
           "relu", "reshape", "rms_norm", "silu", "sqrt", "square", "sub", "sum", "topo_order",
           "transpose"]
