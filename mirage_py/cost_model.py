"""A simple analytic cost model: predicted microseconds of a kernel graph on a target.

Used to rank candidates where no GPU measures them. Per kernel launch::

    time = launch_us + max(bytes / bw_eff, tc_flops / tc_rate, simt_flops / fp32_rate)

* ``bytes``: every input tile each block loads (a tile re-read every loop iteration when the
  iterator follows the loop; replicated iterators are read by every block that uses them): the
  first read of each element at DRAM price, re-reads at 1/``L2_SPEEDUP`` of it when the tensor
  fits in L2; plus every output element written once. Pre-defined
  operators read each operand once and write their output, and are assumed to keep every SM
  busy (library kernels split their work well).
* ``tc_flops``: 2*m*n*k of every tile matmul (all blocks, all iterations) at the measured
  tensor-core rate; ``simt_flops``: one flop per element per elementwise/sum/accumulate
  operator at the CUDA-core fp32 rate.
* ``bw_eff``: the measured copy bandwidth scaled by how much of the machine is busy -- a kernel
  whose blocks occupy ``active`` SMs gets ``min(1, 4 * active / sm_count)`` of it (one SM can
  pull a few times its fair share), and wave quantisation: ``blocks / (waves * slots)`` of the
  slots of the last wave are used, where ``slots = sm_count * blocks_per_sm`` from the shared
  memory each block needs.

The numbers come from :mod:`mirage_py.targets`. The model is deliberately simple and documented
so its rankings can be explained; the cost-model issue replaces it with a calibrated one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .lax.ops import DTYPES
from .targets import Target, get_target
from .ugraph.graph import (Accum, BlockOp, Fused, GraphKernel, InputIter, KernelGraph, KernelOp,
                           )
from .ugraph.validate import validate


L2_SPEEDUP = 3.0


@dataclass(frozen=True)
class KernelCost:
    name: str
    us: float
    bytes: float
    tc_flops: float
    simt_flops: float
    blocks: int


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _bw_eff(t: Target, blocks: int, smem: int, threads: int) -> float:
    per_sm = t.max_blocks_per_sm
    if smem > 0:
        per_sm = min(per_sm, max(1, t.smem_per_sm // smem))
    per_sm = min(per_sm, max(1, 2048 // max(threads, 32)))
    slots = t.sm_count * per_sm
    waves = max(1, math.ceil(blocks / slots))
    active = min(blocks, t.sm_count)
    busy = min(1.0, 4.0 * active / t.sm_count)
    quant = blocks / (waves * slots) if blocks >= slots else 1.0
    return t.mem_bw * busy * max(quant, 0.5)


def kernel_costs(graph: KernelGraph, target: Any = "h100") -> list[KernelCost]:
    t = get_target(target)
    infos = validate(graph, t)
    tensors = graph.tensors()
    out = []
    for k, op in enumerate(graph.ops):
        if isinstance(op, KernelOp):
            nbytes = sum(_size(tensors[n].shape) * DTYPES[tensors[n].dtype] for n in op.inputs)
            nbytes += op.output.size * DTYPES[op.output.dtype]
            tc = simt = 0.0
            if op.op == "matmul":
                a = tensors[op.inputs[0]]
                tc = 2.0 * op.output.size * a.shape[-1]
            else:
                simt = float(sum(_size(tensors[n].shape) for n in op.inputs) or op.output.size)
            # a library kernel is assumed to spread any operator over the whole GPU
            blocks = t.sm_count
            us = t.launch_us + 1e6 * max(nbytes / _bw_eff(t, blocks, 0, 256), tc / t.tc_flops,
                                         simt / t.fp32_flops)
            out.append(KernelCost(f"{op.op}->{op.output.name}", us, nbytes, tc, simt, blocks))
            continue
        info = infos[k]
        bg = op.block
        blocks = bg.num_blocks
        shapes = info.shapes
        nbytes = 0.0
        tc = simt = 0.0
        for n in bg.ops:
            reps = bg.forloop if info.phases.get(getattr(n, "out", ""), "") == "body" else 1
            if isinstance(n, InputIter):
                src = tensors[op.inputs[n.input]]
                loads = _size(shapes[n.out]) * DTYPES[src.dtype] * reps * blocks
                unique = min(loads, src.size * DTYPES[src.dtype])
                # the first read of each element comes from DRAM; re-reads by other blocks hit
                # L2 when the tensor fits in it (L2 bandwidth ~ L2_SPEEDUP x DRAM)
                again = loads - unique
                if src.size * DTYPES[src.dtype] <= t.l2_bytes:
                    again /= L2_SPEEDUP
                nbytes += unique + again
            elif isinstance(n, BlockOp):
                if n.op == "matmul":
                    a = shapes[n.operands[0]]
                    tc += 2.0 * _size(shapes[n.out]) * a[-1] * reps * blocks
                else:
                    src = [shapes[o] for o in n.operands if isinstance(o, str)]
                    simt += max(_size(s) for s in src) * reps * blocks
            elif isinstance(n, Fused):
                simt += _size(shapes[n.out]) * len(n.thread.ops) * reps * blocks
            elif isinstance(n, Accum):
                simt += _size(shapes[n.out]) * bg.forloop * blocks
        for o in op.outputs:
            nbytes += o.size * DTYPES[o.dtype]
        us = t.launch_us + 1e6 * max(nbytes / _bw_eff(t, blocks, info.smem_bytes, bg.threads),
                                     tc / t.tc_flops, simt / t.fp32_flops)
        names = ",".join(o.name for o in op.outputs)
        out.append(KernelCost(f"graph_kernel->{names}", us, nbytes, tc, simt, blocks))
    return out


def estimate_us(graph: KernelGraph, target: Any = "h100") -> float:
    """Predicted time of the whole kernel graph (kernels run one after another)."""
    return sum(c.us for c in kernel_costs(graph, target))


def bytes_moved(graph: KernelGraph, target: Any = "h100") -> float:
    return sum(c.bytes for c in kernel_costs(graph, target))


