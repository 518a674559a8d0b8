"""Eager PyTorch's time for a traced module on a target, priced by the analytic cost model.

Each kernel is a library kernel (:func:`mirage_py.cost_model.library_kernel_us`): a launch plus
the larger of its bytes at the target's bandwidth and its flops at the rate of the units it runs
on -- CUDA cores for GEMMs (float32, no TF32) and element-wise work, TF32 tensor cores for cuDNN
convolutions on parts that have them. A kernel that gives each row to one block (layer norm,
softmax) streams at most ``rows`` blocks' worth of bandwidth (:func:`row_bw`: Little's law for
one block), so a few huge rows cannot use the whole GPU. :class:`EagerConstants` scale those
figures (globally, and bandwidth, GEMM and convolution efficiency per target); the defaults
(every efficiency 1) are the analytic model as it is, a calibration (``mirage_py.learned``)
fits them to measurements.

Host and device overlap as on a CUDA stream: the host spends ``host_call_us`` on every aten
call (views included: Python, the dispatcher) and ``host_kernel_us`` more on every launch; a
kernel starts when the host has launched it and the kernel before it has finished::

    host_k  = host time when kernel k is launched
    start_k = max(host_k, end_{k-1});   end_k = start_k + kernel_us(k)
    eager   = max(end_last, host time after the last call)

so a program of many small kernels costs its host time, one of a few large kernels their GPU time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..cost_model import library_kernel_us
from ..targets import Target, get_target
from .kernels import EagerKernel, KernelClass


@dataclass(frozen=True)
class EagerConstants:
    """The figures of the eager pricing; each efficiency multiplies a target figure."""

    mem_eff: float = 1.0  # of target.mem_bw, every kernel
    reduce_mem_eff: float = 1.0  # more, for reductions, scans, softmax and normalisations
    gemm_eff: float = 1.0  # of target.fp32_flops, cuBLAS float32 GEMMs
    conv_eff: float = 1.0  # of target.tf32_flops (fp32_flops without TF32), cuDNN convolutions
    launch_scale: float = 1.0  # of target.launch_us
    host_kernel_us: float = 5.0  # host time of one launch (beyond the call's)
    host_call_us: float = 1.0  # host time of one aten call, views included
    row_bw_scale: float = 1.0  # of ROW_BW: what one block streaming one row reaches
    # per target (name, factor): more on mem_eff / gemm_eff for the targets measured
    target_mem_eff: tuple[tuple[str, float], ...] = ()
    target_gemm_eff: tuple[tuple[str, float], ...] = ()
    target_conv_eff: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {f.name: dict(getattr(self, f.name)) if f.name.startswith("target_")
                else float(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EagerConstants":
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            kw[f.name] = tuple(sorted((str(k), float(x)) for k, x in dict(v).items())) \
                if f.name.startswith("target_") else float(v)
        return replace(cls(), **kw)

    def mem(self, target: str) -> float:
        """The bandwidth efficiency on ``target``."""
        return self.mem_eff * dict(self.target_mem_eff).get(target, 1.0)

    def gemm(self, target: str) -> float:
        return self.gemm_eff * dict(self.target_gemm_eff).get(target, 1.0)

    def conv(self, target: str) -> float:
        return self.conv_eff * dict(self.target_conv_eff).get(target, 1.0)


ROW_THREADS, ROW_LOAD = 512, 16  # a row-per-block kernel: threads, bytes per load


def row_bw(t: Target) -> float:
    """Bytes/s one block streaming a row reaches: its loads in flight over one memory latency
    (Little's law: 512 threads x 16 bytes / 0.5 us = 16 GB/s on an H100)."""
    return ROW_THREADS * ROW_LOAD / (t.mem_latency_us * 1e-6)


DEFAULT = EagerConstants()
_REDUCING = (KernelClass.REDUCTION, KernelClass.SCAN, KernelClass.SOFTMAX, KernelClass.NORM)


def kernel_us(k: EagerKernel, target: Target | str, c: EagerConstants = DEFAULT) -> float:
    """One eager kernel's GPU time (launch included), microseconds."""
    t = get_target(target)
    eff = c.mem(t.name) * (c.reduce_mem_eff if k.kind in _REDUCING else 1.0)
    rows = getattr(k, "rows", 0)
    if rows:  # one block per row: at most `rows` blocks stream
        eff = min(eff, rows * row_bw(t) * c.row_bw_scale / t.mem_bw)
    nbytes = k.bytes / eff
    launch = t.launch_us * (c.launch_scale - 1.0)
    if k.kind is KernelClass.GEMM:
        return launch + library_kernel_us(t, nbytes, simt_flops=k.flops / c.gemm(t.name))
    if k.kind is KernelClass.CONV:
        if k.tensor_core:
            return launch + library_kernel_us(t, nbytes, tc_flops=k.flops / c.conv(t.name),
                                              tc_rate=t.tf32_flops)
        return launch + library_kernel_us(t, nbytes, simt_flops=k.flops / c.conv(t.name))
    return launch + library_kernel_us(t, nbytes, simt_flops=k.flops)


@dataclass(frozen=True)
class EagerTime:
    """A predicted eager run: total, GPU busy time and host time, microseconds."""

    us: float
    gpu_us: float
    host_us: float
    kernels: int


def eager_time(kernels: list[EagerKernel], calls: int, target: Target | str,
               c: EagerConstants = DEFAULT) -> EagerTime:
    """The stream simulation of the module docstring; ``calls`` is the number of aten calls of
    the trace (the kernels' ``call`` fields index them)."""
    t = get_target(target)
    end = busy = 0.0
    for i, k in enumerate(kernels):
        host = c.host_call_us * (k.call + 1) + c.host_kernel_us * (i + 1)
        d = kernel_us(k, t, c)
        end = max(end, host) + d
        busy += d
    host_total = c.host_call_us * calls + c.host_kernel_us * len(kernels)
    return EagerTime(max(end, host_total), busy, host_total, len(kernels))
