"""What eager PyTorch does with a module at full size, and what that costs on a GPU.

``trace_module`` records the aten calls eager PyTorch dispatches (meta tensors: nothing is
allocated), ``eager_kernels`` turns them into the kernels CUDA PyTorch launches, and
``eager_time`` prices those with the analytic cost model, host overhead included. The
published-measurement benchmark (``benchmarks/published_gpu.py``) and the learned cost models
(``mirage_py.learned``) build on it; see docs/learned.md.
"""

from .kernels import EagerKernel, GemmShape, KernelClass, call_kernels, eager_kernels
from .predict import DEFAULT, EagerConstants, EagerTime, eager_time, kernel_us
from .trace import INPUT, AtenCall, TensorMeta, trace_module

__all__ = ["EagerKernel", "GemmShape", "KernelClass", "call_kernels", "eager_kernels", "DEFAULT",
           "EagerConstants", "EagerTime", "eager_time", "kernel_us", "INPUT", "AtenCall",
           "TensorMeta", "trace_module"]
