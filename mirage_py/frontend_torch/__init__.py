"""PyTorch in, PyTorch out: capture models as programs, superoptimise their regions, run them.

* :func:`from_torch` -- one :class:`~mirage_py.Program` from a module or function (``torch.export``,
  ``make_fx`` where export fails, decomposed to aten and mapped onto the operator table);
* :func:`compile` -- a ``torch.nn.Module`` whose supported regions run superoptimised kernels
  (CUDA tensors) or the μGraph interpreter (CPU tensors), with eager PyTorch in between;
* the ``"mirage_py"`` backend of ``torch.compile`` (registered on import of this package, and by
  the ``torch_dynamo_backends`` entry point of an installed mirage_py).

This package imports torch; ``import mirage_py`` does not import it (``mp.from_torch`` and
``mp.compile`` import it on first use). docs/torch.md describes capture, the aten mapping, regions,
recompiles and the CPU / CUDA paths.
"""

from ..errors import TorchCaptureError

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - the test extra installs torch
    raise TorchCaptureError("the torch frontend needs PyTorch (pip install torch)") from e

from .api import CompiledModule, TorchProgram, compile, from_torch  # noqa: E402
from .aten import TABLE  # noqa: E402
from .backend import mirage_backend  # noqa: E402  -- registers "mirage_py" with torch.compile
from .capture import decomposition_table  # noqa: E402
from .runtime import clear_cache  # noqa: E402

__all__ = ["from_torch", "compile", "CompiledModule", "TorchProgram", "mirage_backend",
           "decomposition_table", "clear_cache", "TABLE"]
