"""CUDA code generation: μGraph -> .cu text -> (nvcc / NVRTC) -> run on a GPU or the CPU emulator.

* :func:`emit_cuda` -- the CUDA C++ of a kernel graph (one translation unit), from the layout plan.
* :class:`CompiledGraph` -- the graph compiled through CuPy/NVRTC, called with device arrays.
* :func:`export_cuda` -- self-contained .cu/.h files plus a PyTorch extension.
* :func:`compile_with_nvcc` -- nvcc + the ptxas resource report (CPU only, used by tests).
* :func:`sass_stats` -- the SASS of each kernel (cuobjdump): tensor-core ops, local memory,
  vector widths of global loads and stores (CPU only).
* :class:`EmulatedGraph` -- the emitted kernels compiled for the CPU and run thread by thread.

See docs/codegen.md for how the emitted code maps the μGraph.
"""

from .emit import CudaSource, emit_cuda, translation_unit
from .emulator import EmulatedGraph
from .errors import CodegenError, CompileError, ToolMissing
from .export import export_cuda
from .launch import KernelParam, LaunchSpec
from .nvcc import KernelResources, check_resources, compile_with_nvcc, parse_ptxas
from .runtime import CompiledGraph, bf16_bits_to_float32, gpu_available
from .sass import SassStats, compile_cubin, disassemble, find_cuobjdump, sass_stats

__all__ = ["CudaSource", "emit_cuda", "translation_unit", "EmulatedGraph", "CodegenError",
           "CompileError", "ToolMissing", "export_cuda", "KernelParam", "LaunchSpec",
           "KernelResources", "check_resources", "compile_with_nvcc", "parse_ptxas",
           "CompiledGraph", "bf16_bits_to_float32", "gpu_available", "SassStats",
           "compile_cubin", "disassemble", "find_cuobjdump", "sass_stats"]
