"""mirage_py: a multi-level superoptimizer for GPU tensor programs.

Pipeline (data flows one way): ``lax`` (programs, partition) -> ``generator`` (candidate μGraphs)
-> ``verifier`` (finite-field random testing) -> ``layout`` -> ``codegen_cuda``. The μGraph types
in ``ugraph`` are the language every stage shares.
"""

from .errors import (DatabaseError, DTypeError, MirageError, OptionError, ProgramError,
                     SerializationError, ShapeError, TargetError, ValidationError)
from .lax import (Output, Partition, Program, Tensor, exp, gelu, matmul, mean, partition, relu,
                  reshape, rms_norm, silu, sqrt, square, sum, transpose)
from .verifier import check_numerics, verify
from .superopt import OptimizedProgram, load, superopt
from . import regions

__version__ = "0.4.0"

__all__ = ["DatabaseError", "DTypeError", "MirageError", "OptionError", "ProgramError",
           "SerializationError", "ShapeError", "TargetError", "ValidationError", "Output", "Partition", "Program", "Tensor", "exp",
           "gelu", "matmul", "mean", "partition", "relu", "reshape", "rms_norm", "silu", "sqrt",
           "square", "sum", "transpose", "verify", "check_numerics", "superopt",
           "OptimizedProgram", "load", "__version__"]
