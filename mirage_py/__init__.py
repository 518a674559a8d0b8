"""mirage_py: a multi-level superoptimizer for GPU tensor programs.

Pipeline (data flows one way): ``lax`` (programs, partition) -> ``generator`` (candidate μGraphs)
-> ``verifier`` (finite-field random testing) -> ``layout`` -> ``codegen_cuda``. The μGraph types
in ``ugraph`` are the language every stage shares.
"""

from .errors import (ClusterError, DatabaseError, DTypeError, IndexRangeError, MirageError,
                     OptionError,
                     ProgramError, SerializationError, ShapeError, TargetError,
                     TorchCaptureError, UnsupportedOperatorError, ValidationError)
from .lax import (Dim, Output, Partition, Program, Tensor, dim, abs, batch_norm, cast, causal_mask, clamp,
                  concat, exp, gelu, group_norm, hardtanh, layer_norm, leaky_relu, log,
                  log_softmax, logsumexp, matmul, max, maximum, mean, min, minimum, mish,
                  partition, pow, relu, reshape, rms_norm, sigmoid, silu, sin, cos, slice,
                  sliding_window_mask, softmax, softplus, split, sqrt, square, sum, take, tanh,
                  transpose, where)
from .verifier import check_numerics, verify
from .superopt import FamilyProgram, OptimizedProgram, RayExecutor, load, superopt
from . import regions
from .version import __version__


def from_torch(fn_or_module, example_inputs, example_kwargs=None, **options):
    """One ``Program`` from a PyTorch module or function (``mirage_py.frontend_torch``; imports
    torch on first use; docs/torch.md)."""
    from .frontend_torch import from_torch as _from_torch
    return _from_torch(fn_or_module, example_inputs, example_kwargs, **options)


def compile(module, example_inputs=None, example_kwargs=None, **superopt_options):  # noqa: A001
    """A ``torch.nn.Module`` running ``module`` with its supported regions superoptimised
    (``mirage_py.frontend_torch``; imports torch on first use; docs/torch.md)."""
    from .frontend_torch import compile as _compile
    return _compile(module, example_inputs, example_kwargs, **superopt_options)



__all__ = ["ClusterError", "DatabaseError", "DTypeError", "IndexRangeError", "MirageError", "OptionError",
           "ProgramError", "SerializationError", "ShapeError", "TargetError",
           "TorchCaptureError", "UnsupportedOperatorError", "ValidationError", "Output",
           "Partition", "Program",
           "Tensor", "Dim", "dim", "abs", "batch_norm", "cast", "causal_mask", "clamp", "concat", "exp", "gelu",
           "group_norm", "hardtanh", "layer_norm", "leaky_relu", "log", "log_softmax",
           "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "mish",
           "partition", "pow", "relu", "reshape", "rms_norm", "sigmoid", "silu", "sin", "cos",
           "slice",
           "sliding_window_mask", "softmax", "softplus", "split", "sqrt", "square", "sum", "take",
           "tanh",
           "transpose", "where", "verify", "check_numerics", "superopt", "OptimizedProgram", "FamilyProgram",
           "load", "RayExecutor", "from_torch", "compile", "__version__"]
