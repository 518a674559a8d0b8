"""One exception hierarchy for the whole package.

Every error a user can trigger derives from :class:`MirageError`, and its message names the
operator and the shapes involved, so that a mistake in a program reads as one line.
"""

from __future__ import annotations


class MirageError(Exception):
    """Root of every error raised by mirage_py on bad input or an invalid graph."""


class ShapeError(MirageError, ValueError):
    """Shapes that do not fit an operator (matmul inner dims, broadcasting, reshape sizes, ...)."""


class DTypeError(MirageError, TypeError):
    """An unsupported dtype, or dtypes that may not be combined."""


class IndexRangeError(MirageError, ValueError):
    """An index tensor (token ids, positions) holding a value outside the table it gathers from
    (``mp.take``): the message names the operator, the table's shape and the bad index."""


class ProgramError(MirageError, ValueError):
    """A malformed program: unknown or missing inputs, duplicate names, foreign tensors."""


class SerializationError(MirageError, ValueError):
    """A JSON document that is not a valid serialized program or μGraph."""


class ValidationError(MirageError, ValueError):
    """A μGraph that breaks a validity rule; ``rule`` names it and ``op`` the operator."""

    def __init__(self, message: str, *, rule: str, op: str | None = None):
        super().__init__(message)
        self.rule = rule
        self.op = op


class TargetError(MirageError, ValueError):
    """An unknown target name."""


class ToolError(MirageError, RuntimeError):
    """An external program (Graphviz ``dot``, ``nvcc``, ...) failed or cannot do what was asked."""


class ToolNotFoundError(ToolError):
    """An external program is not installed; the message says what to install."""


class DatabaseError(MirageError, RuntimeError):
    """A results database that cannot be used: a corrupt or foreign file, a newer schema, or a
    path that cannot be opened. The message names the file and what to do."""


class OptionError(MirageError, ValueError):
    """A bad option to an entry point (``superopt(time_budget_s=0)``, ``workers=0``, ...)."""


class TorchCaptureError(MirageError, RuntimeError):
    """A PyTorch model that the torch frontend (``mp.from_torch``, ``mp.compile``, the
    ``"mirage_py"`` torch.compile backend) cannot capture or run: tracing failed, inputs that do
    not match the compiled signature, a torch that is not installed. The message names the
    module or node and what to do."""


class UnsupportedOperatorError(TorchCaptureError, ValueError):
    """``mp.from_torch`` met an operator (or a dtype) it cannot express as one ``Program``.
    ``op`` is the aten operator (``aten.sort.default``), ``node`` the FX node's name,
    ``module`` the module path (``attn.q_proj``) and ``location`` the source line, where known.
    ``mp.compile`` runs such operators in eager PyTorch instead of raising."""

    def __init__(self, message: str, *, op: str = "", node: str = "", module: str = "",
                 location: str = ""):
        super().__init__(message)
        self.op = op
        self.node = node
        self.module = module
        self.location = location


class ClusterError(MirageError, RuntimeError):
    """A Ray cluster that cannot do what a run needs: no connection, no CPUs, no GPU of the
    target's type for a measuring runner, measurements that never finish, or workers running
    another version of mirage_py. The message names what is missing and how to add it."""


class EagerTraceError(TorchCaptureError):
    """A module whose eager run cannot be traced on the meta device (``mirage_py.eager``): an
    operator without a meta kernel, ``.item()`` on a tensor, data-dependent control flow. The
    message names the module and the failing call."""


class LearnedModelError(MirageError, ValueError):
    """A learned cost model that cannot be trained or used (``mirage_py.learned``): no records,
    a missing optional dependency (``pip install 'mirage_py[learned]'``), a model file of another
    format. The message says what to do."""
