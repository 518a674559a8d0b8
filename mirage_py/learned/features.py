"""Feature vectors of records for the learned models: per kernel, and the hardware's.

Per kernel (a node of the operator graph): its class (one-hot), log bytes read and written,
log flops, arithmetic intensity, tensor cores or not, a graph-defined kernel's launch shape, a
row-per-block kernel's rows, the analytic model's log time for it on the record's target and
its bound there (log of memory time over compute time: what a model would otherwise have to
rediscover, bandwidth and rates dividing bytes and flops), and a library GEMM's shape as
cuBLAS sees it (log m, n, k, batch; operands transposed; the bias epilogue; 128 x 128 output
tiles per SM and the last wave's fill: cuBLAS's efficiency varies by these, not by flops
alone). Every node also carries the target's
figures (log bandwidth, fp32 / TF32 rates, SMs, L2, launch, the architecture), so one model
serves every GPU. Each record gets one extra *host* node (log aten calls, log kernels, the
target): eager PyTorch's Python and dispatcher time, which no kernel carries.
"""

from __future__ import annotations

import math

import numpy as np

from ..eager import (DEFAULT, EagerConstants, EagerKernel, GemmShape, KernelClass,
                     kernel_us)
from ..targets import Target, get_target
from .records import KernelNode, Record

KINDS = tuple(KernelClass) + ("host",)
GEMM_NAMES = ("gemm_log_m", "gemm_log_n", "gemm_log_k", "gemm_log_batch", "gemm_a_t",
              "gemm_b_t", "gemm_bias", "gemm_log_tiles_per_sm", "gemm_wave_fill")
GEMM_TILE = 128  # output tile edge for the wave features (cuBLAS's SGEMM tiles are 64-256)
HW_NAMES = ("log_mem_bw", "log_fp32", "log_tf32", "sm_count", "log_l2", "launch_us", "arch")
NODE_NAMES = tuple(f"kind_{k.value if isinstance(k, KernelClass) else k}" for k in KINDS) + (
    "log_read", "log_write", "log_flops", "log_intensity", "tensor_core", "log_blocks",
    "log_threads", "log_smem", "stages", "log_forloop", "log_rows", "log_calls", "log_kernels",
    "log_analytic_us", "log_mem_over_compute") + GEMM_NAMES + HW_NAMES


def hardware(target: Target | str) -> list[float]:
    t = get_target(target)
    return [math.log(t.mem_bw), math.log(t.fp32_flops), math.log(t.tf32_flops),
            float(t.sm_count), math.log(t.l2_bytes), t.launch_us,
            float(t.arch.split("_")[1].rstrip("a"))]


def _l(x: float) -> float:
    return math.log1p(max(x, 0.0))


def node_us(node: KernelNode, target: Target | str, c: EagerConstants = DEFAULT) -> float:
    """The analytic (or calibrated, with ``c``) time of one kernel node, microseconds."""
    k = EagerKernel("", node.kind, node.read_bytes, node.write_bytes, node.flops,
                    node.tensor_core, rows=node.rows)
    return kernel_us(k, target, c)


def bound(node: KernelNode, target: Target | str) -> float:
    """log(memory time / compute time) of a kernel at the target's figures: > 0 memory-bound
    (0 when it has no flops)."""
    t = get_target(target)
    if node.flops <= 0 or node.bytes <= 0:
        return 0.0
    rate = t.tf32_flops if node.tensor_core else t.fp32_flops
    return math.log((node.bytes / t.mem_bw) / (node.flops / rate))


def gemm_features(g: GemmShape | None, target: Target | str) -> list[float]:
    """``GEMM_NAMES`` of a library GEMM (zeros for any other kernel)."""
    if g is None:
        return [0.0] * len(GEMM_NAMES)
    sms = get_target(target).sm_count
    tiles = g.batch * -(-g.m // GEMM_TILE) * -(-g.n // GEMM_TILE)
    waves = -(-tiles // sms)
    return [_l(g.m), _l(g.n), _l(g.k), _l(g.batch), float(g.a_transposed),
            float(g.b_transposed), float(g.bias), _l(tiles / sms), tiles / (waves * sms)]


def host_us(record: Record, c: EagerConstants = DEFAULT) -> float:
    return c.host_call_us * record.calls + c.host_kernel_us * len(record.kernels)


def node_features(record: Record, c: EagerConstants = DEFAULT) -> np.ndarray:
    """One row per kernel and a last row for the host node (``NODE_NAMES`` columns)."""
    hw = hardware(record.target)
    rows = []
    calls, n = _l(record.calls), _l(len(record.kernels))
    for k in record.kernels:
        onehot = [1.0 if k.kind is kind else 0.0 for kind in KINDS]
        rows.append(onehot + [
            _l(k.read_bytes), _l(k.write_bytes), _l(k.flops),
            _l(k.flops / k.bytes if k.bytes else 0.0), float(k.tensor_core), _l(k.blocks),
            _l(k.threads), _l(k.smem), float(k.stages), _l(k.forloop), _l(k.rows), calls, n,
            math.log(node_us(k, record.target, c)), bound(k, record.target)] +
            gemm_features(k.gemm, record.target) + hw)
    onehot = [0.0] * (len(KINDS) - 1) + [1.0]
    rows.append(onehot + [0.0] * 11 + [calls, n, math.log(max(host_us(record, c), 1e-3)), 0.0] +
                [0.0] * len(GEMM_NAMES) + hw)
    return np.asarray(rows, dtype=np.float64)


def edges(record: Record) -> np.ndarray:
    """(2, E) array of data edges source -> reader between kernel nodes; the host node
    (index ``len(kernels)``) is joined to every kernel."""
    pairs = [(s, i) for i, k in enumerate(record.kernels) for s in k.sources
             if 0 <= s < len(record.kernels)]
    h = len(record.kernels)
    pairs += [(i, h) for i in range(h)]
    return np.asarray(pairs, dtype=np.int64).T.reshape(2, -1)
