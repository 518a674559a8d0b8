"""mirage_py: a multi-level superoptimizer for GPU tensor programs.

Pipeline (data flows one way): ``lax`` (programs, partition) -> ``generator`` (candidate μGraphs)
-> ``verifier`` (finite-field random testing) -> ``layout`` -> ``codegen_cuda``. The μGraph types
in ``ugraph`` are the language every stage shares.
"""

from .errors import (DatabaseError, DTypeError, MirageError, OptionError, ProgramError,
                     SerializationError, ShapeError, TargetError, ValidationError)
from .lax import (Output, Partition, Program, Tensor, abs, batch_norm, cast, causal_mask, clamp,
                  concat, exp, gelu, group_norm, hardtanh, layer_norm, leaky_relu, log,
                  log_softmax, logsumexp, matmul, max, maximum, mean, min, minimum, mish,
                  partition, pow, relu, reshape, rms_norm, sigmoid, silu, slice,
                  sliding_window_mask, softmax, softplus, split, sqrt, square, sum, tanh,
                  transpose, where)
from .verifier import check_numerics, verify
from .superopt import OptimizedProgram, load, superopt
from . import regions

__version__ = "0.4.0"

__all__ = ["DatabaseError", "DTypeError", "MirageError", "OptionError", "ProgramError",
           "SerializationError", "ShapeError", "TargetError", "ValidationError", "Output", "Partition", "Program",
           "Tensor", "abs", "batch_norm", "cast", "causal_mask", "clamp", "concat", "exp", "gelu",
           "group_norm", "hardtanh", "layer_norm", "leaky_relu", "log", "log_softmax",
           "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "mish",
           "partition", "pow", "relu", "reshape", "rms_norm", "sigmoid", "silu", "slice",
           "sliding_window_mask", "softmax", "softplus", "split", "sqrt", "square", "sum", "tanh",
           "transpose", "where", "verify", "check_numerics", "superopt", "OptimizedProgram",
           "load", "__version__"]
