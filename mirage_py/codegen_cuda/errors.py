"""Errors of code generation and of the tools it drives (nvcc, NVRTC, the host compiler)."""

from __future__ import annotations

from ..errors import MirageError


class CodegenError(MirageError, RuntimeError):
    """The emitted code could not be built or run."""


class CompileError(CodegenError):
    """A compiler (nvcc, NVRTC, g++) rejected the emitted code; the message holds its output."""


class ToolMissing(CodegenError):
    """A tool or library this step needs (nvcc, CuPy, a GPU, g++) is not available."""


class DisassemblyError(CodegenError):
    """cuobjdump could not read a compiled file; the message holds its output."""
