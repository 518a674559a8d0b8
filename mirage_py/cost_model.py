"""Analytic cost model: predicted microseconds of a (planned) kernel graph on a target.

Interface (habit 7: pluggable parts with test doubles)::

    model.predict(graph, target) -> us        graph: a KernelGraph, or an annotated graph
                                              (anything with .graph and .stages, e.g.
                                              mirage_py.tuning.AnnotatedGraph)
    create("analytic") / create("random")     the model, or a deterministic random test double

``estimate_us``, ``kernel_costs`` and ``bytes_moved`` are the analytic model as functions (the
generator and the benchmarks call them). Kernels run one after another; the graph's time is the
sum of its kernels'. All figures come from :mod:`mirage_py.targets`.

Pre-defined kernel operator (a library kernel, assumed to keep the whole GPU busy)::

    t = launch_us + max(bytes / mem_bw, tc_flops / tc_rate, simt_flops / fp32_rate)

with ``bytes`` every operand read once plus the output written once, and a matmul's flops padded
to the tensor-core MMA shape (m to 16, n to 8, k to 16), so a GEMV with 2 rows is charged 16;
a TF32 or float32 matmul is priced by its math as in graph-defined kernels (below).

Graph-defined kernel: ``B`` blocks of ``T`` threads, ``F`` loop iterations, ``s`` pipeline stages
(the ``stages`` annotation, at most ``F``; ``DEFAULT_STAGES`` = 2 when absent), one block's live
tiles ``S`` bytes (validation's shared-memory plan). Double buffering is the default because it
is what a generated loop should do, and because a single-stage default makes every loop look
latency-bound, so the search's branch and bound would drop looped structures that win once tuned.

* **bytes really moved**: every tile an input iterator loads (per iteration when it follows the
  loop, otherwise once per block), over all blocks (``load_bytes``). The first read of each
  element comes from DRAM; re-reads of the same element by the blocks an iterator replicates
  over hit L2 when the tensor fits in L2, or else when those blocks run at about the same time
  (blocks launch x fastest: sharers along grid axis a are ``prod(grid[:a])`` launches apart; more
  than one wave of ``slots`` apart means DRAM again). Plus every output element written once.
  A tile moves in whole 32-byte sectors: its contiguous runs (the innermost dim, merged with
  outer dims it spans whole) are rounded up to sectors (``sector_factor``), so a tile of 4-byte
  rows costs 8 times its size in L2 traffic -- its neighbours' bytes come along. DRAM reads are
  not inflated: the neighbouring blocks that use the rest of each sector hit L2.
  ``dram_bytes`` counts what reaches DRAM; ``bytes`` reports DRAM bytes plus L2 re-reads at
  ``1 / L2_SPEEDUP`` of their size (DRAM-equivalent traffic). Intermediates -- tensors one
  kernel writes and a later one reads -- are therefore paid twice (write, read back); their share
  is reported as ``intermediate_bytes``. A reduction split over the grid saves float32 partials
  (``parts`` times the output, 4 bytes each) and a later kernel combines them: that *combine
  step* is its own kernel (a launch, reading the partials back, the adds), so it is charged
  exactly like any other kernel and shows in the total.
* **flops**: tile matmuls by their math (lax/precision.py, :func:`matmul_work`): 16-bit ones on
  tensor cores, ``2 m n k`` per tile and iteration with m, n, k padded to the MMA shape; TF32
  ones padded to theirs (k to 8) at the TF32 rate (``tf32_flops``); float32 ones on CUDA cores,
  ``2 m n k`` at ``FMA_MATMUL_EFFICIENCY`` of the fp32 rate; elementwise, reduction, accumulator and fused thread-graph operators on CUDA
  cores, the operator's ``cost`` per element (the op table: one for +, exp, max, ...; the
  operations of its CUDA expression for composite rows such as silu 3, mish 7), charged in steps
  of ``T`` elements (a 64-element tile on 256 threads costs 256: idle threads are not free). An
  accumulator of a tile matmul is free: the MMA accumulates in its registers. A mask iterator
  reads nothing: it costs two operations per element (compare, select).
* **occupancy**: resident blocks per SM
  ``r = min(max_blocks_per_sm, max_threads_per_sm // T, regs_per_sm // (T * REGS_PER_THREAD),
  smem_per_sm // (S_s + smem_reserved_per_block))`` with ``S_s = S + (s - 1) * S_body``
  (each extra pipeline stage holds another copy of the per-iteration input tiles). ``r = 0``
  (the stages do not fit) makes the kernel impossible: infinite time. With a ``smem_planner``
  (what ``superopt`` ranks and tunes with) ``S_s`` and ``s`` are instead the layout planner's:
  buffers reused across stages, register accumulators left out, the pipeline depth code
  generation really uses (lowered until the buffers fit; 1 for loops whose loads go straight
  into accumulators). Validation's bound overestimates that by 1-2.5x (mqa bs 1: 98 KB bound
  vs 56 KB planned); the search's pruning keeps the bound, which costs nothing to compute.
  Registers: 64 per thread (``REGS_PER_THREAD``), or with the planner the estimate of
  :func:`estimated_registers` for kernels that keep register tiles (40 + 2 per tile float).
* **waves**: ``slots = sm_count * r``; the grid runs as ``B // slots`` full waves and one partial
  wave of ``B % slots`` blocks. A wave of ``n`` blocks puts ``q = ceil(n / sm_count)`` blocks on
  the busiest SM, so a partial wave costs as much as a full one whenever ``q`` is the same
  (wave quantisation).
* **one wave of n blocks** (per block: ``dram_b`` DRAM bytes, ``load_b`` all bytes loaded and
  stored, ``read_b`` bytes loaded, ``tc_b`` and ``simt_b`` flops)::

      per_sm_bw = min(SM_BW_FACTOR * mem_bw / sm_count,          one SM's share, a few times over
                      q * s * stage_bytes / mem_latency)         Little's law: bytes in flight
      t_mem  = max(n * dram_b / mem_bw,                          DRAM
                   n * load_b / (L2_SPEEDUP * mem_bw),           L2 (every load passes it)
                   q * read_b / per_sm_bw)                       the busiest SM's loads
      t_tc   = q * tc_b   / (tc_rate   / sm_count * min(1, q * T/32 / TC_WARPS))
      t_simt = q * simt_b / (fp32_rate / sm_count * min(1, q * T/32 / SIMT_WARPS))
      e      = 1 / (q * s)^2                                     loads and compute not overlapped
      t_thr  = max(t_mem, t_tc, t_simt) + e * (sum - max)
      t_lat  = mem_latency * (1 + (F - 1) / s)                   the loop's dependent loads
      t_wave = max(t_thr, t_lat)

  ``stage_bytes`` is what one block loads per loop iteration (all its tiles when ``F = 1``).
  With one stage and one block per SM, loading and computing alternate (e = 1); each more
  resident block or stage hides most of what is left. Deeper pipelines also hide the
  per-iteration latency.
* ``t = launch_us + (B // slots) * t_wave(slots) + t_wave(B % slots)``.
* **work at launch**: a padded bucket's kernel may launch fewer blocks and run fewer loop
  iterations than its block graph says (codegen_cuda/extents.py sizes grids and trip counts from
  the valid sizes). Given the :class:`LaunchWork` of such a kernel -- ``B'`` blocks, ``I'``
  iterations summed over them -- everything a block does once (its prologue, epilogue, output
  tiles) counts ``B'`` times, everything its loop body does ``I'`` times, the waves are those of
  ``B'`` blocks and the latency term's ``F`` is ``I' / B'``. Without it, ``B' = B`` and
  ``I' = B * F``: the formulas above.

The constants are rough hardware facts, not fitted: they make the model rank the effects the
tuner controls (grid split, loop chunk, threads, stages) in the right direction. Unit tests check
cases with known answers (a pure copy, a large matmul, a launch-bound tiny kernel). A learned or
calibrated model can replace this one behind the same ``predict``; see docs/tuning.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Protocol

from .errors import MirageError
from .lax.cone import cone_bytes
from .lax.ops import DTYPES, OPS
from .lax.precision import MatmulMath, fma_micro_tile, op_math
from .targets import Target, get_target
from .ugraph.graph import (Accum, BlockOp, Fused, GraphKernel, InputIter, KernelGraph, KernelOp,
                           MaskIter, iter_source)
from .ugraph.phase import Phase
from .ugraph.validate import validate

SECTOR = 32  # bytes: the unit in which L2 and DRAM move data
L2_SPEEDUP = 4.0  # L2 bandwidth over DRAM bandwidth (about 7 TB/s on an A100, 12 on an H100)
SM_BW_FACTOR = 4.0  # one SM can pull this many times its fair share of DRAM bandwidth
REGS_PER_THREAD = 64  # register use assumed for a generated kernel's thread (no ptxas here)
REGS_BASE, REGS_PER_TILE_FLOAT = 40, 2  # with register tiles (see estimated_registers)
TC_WARPS = 8  # resident warps per SM that keep its tensor cores busy
SIMT_WARPS = 16  # resident warps per SM that keep its CUDA cores busy
MMA = (16, 8, 16)  # m, n, k of the fp16/bf16 tensor-core MMA (sm_80, sm_90)
MMA_TF32 = (16, 8, 8)  # m, n, k of the TF32 tensor-core MMA
# float32 matmuls on CUDA cores reach this fraction of the fp32 FMA peak: the register-blocked
# tile FMA of a generated kernel (each thread a micro-tile of outputs, operands from shared
# memory) and the pre-defined kernel alike. An assumption until a GPU measures it.
FMA_MATMUL_EFFICIENCY = 0.5
DEFAULT_STAGES = 2  # a graph-defined kernel without a stages annotation is double-buffered


@dataclass(frozen=True)
class LaunchWork:
    """What of one graph-defined kernel runs when it is launched: ``blocks`` launched and loop
    ``iterations`` summed over them (a padded bucket's kernel at valid sizes inside the bucket,
    codegen_cuda/extents.py; without one, ``num_blocks`` and ``num_blocks * forloop``)."""

    blocks: int
    iterations: int


@dataclass(frozen=True)
class KernelCost:
    """One kernel's prediction and the quantities behind it (features for learned models)."""

    name: str
    us: float
    bytes: float
    tc_flops: float
    simt_flops: float
    blocks: int
    threads: int = 0
    smem: int = 0  # bytes per block, pipeline stages included
    stages: int = 1
    forloop: int = 1
    blocks_per_sm: int = 0
    waves: float = 0.0  # blocks / slots
    mem_us: float = 0.0
    tc_us: float = 0.0
    simt_us: float = 0.0
    latency_us: float = 0.0
    intermediate_bytes: float = 0.0
    kind: str = "graph"  # "graph" | "op"
    dram_bytes: float = 0.0
    load_bytes: float = 0.0  # everything loaded and stored, L2 hits included
    # bytes through shared memory, all blocks: every block operator's operand tiles read and
    # result tile written, input tiles stored, accumulators read and written (the default
    # model leaves it out; the calibrated one prices it when fitted, ``smem_eff``)
    smem_traffic: float = 0.0

    @property
    def bound(self) -> str:
        """What limits the kernel: launch, memory, tensor, simt or latency."""
        body = {"memory": self.mem_us, "tensor": self.tc_us, "simt": self.simt_us,
                "latency": self.latency_us}
        top = max(body, key=body.get)
        return "launch" if self.us <= 2 * (self.us - body[top]) else top


class CostModel(Protocol):
    """Anything that predicts a kernel graph's time in microseconds."""

    name: str

    def predict(self, graph: Any, target: Any) -> float: ...


def predict_launched(model: Any, graph: Any, target: Any,
                     work: Mapping[int, LaunchWork]) -> float:
    """``model``'s prediction of ``graph`` when its kernels run the ``work`` given (a padded
    bucket at valid sizes): the analytic models price it (module docstring, "work at launch");
    a model that cannot (a learned or test model) prices the graph whole, as launched at the
    bucket's sizes."""
    if work and isinstance(model, AnalyticModel):
        return sum(c.us for c in model.kernel_costs(graph, target, work))
    return model.predict(graph, target)


_size = math.prod


def _pad(x: int, m: int) -> int:
    return -(-x // m) * m


def _mma_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    return 2.0 * batch * _pad(m, MMA[0]) * _pad(n, MMA[1]) * _pad(k, MMA[2])


def matmul_work(math: MatmulMath, m: int, n: int, k: int, batch: int, t: Target,
                threads: int = 0) -> tuple[float, float]:
    """(tensor-core flops at the 16-bit rate, CUDA-core operations) of one (batch of) (m, k) @
    (k, n) matmul multiplied as ``math`` (lax/precision.py): 16-bit MMAs padded to their shape;
    TF32 MMAs padded to theirs and scaled by the 16-bit over the TF32 rate, so one tensor-core
    term prices both; float32 FMA as ``2 m n k`` operations over ``FMA_MATMUL_EFFICIENCY`` --
    in a block of ``threads``, in steps of ``threads`` micro-tiles (``fma_micro_tile``: a block
    tile of fewer outputs than threads leaves the rest idle, as ``tile_fma`` does)."""
    if math is MatmulMath.FP32:
        if threads:
            tm, tn = fma_micro_tile(batch, m, n, threads)
            units = _steps(batch * (m // tm) * (n // tn), threads)
            return 0.0, 2.0 * units * tm * tn * k / FMA_MATMUL_EFFICIENCY
        return 0.0, 2.0 * batch * m * n * k / FMA_MATMUL_EFFICIENCY
    if math is MatmulMath.TF32:
        flops = 2.0 * batch * _pad(m, MMA_TF32[0]) * _pad(n, MMA_TF32[1]) * _pad(k, MMA_TF32[2])
        return flops * t.tc_flops / t.tf32_flops, 0.0
    return _mma_flops(m, n, k, batch), 0.0


def _steps(elements: int, threads: int) -> int:
    """Elements charged for an elementwise pass over ``elements`` on ``threads`` threads."""
    return _pad(max(elements, 1), threads)


def unpack(graph: Any) -> tuple[KernelGraph, tuple[int, ...]]:
    """(kernel graph, pipeline stages per graph-defined kernel) of a graph or annotated graph."""
    if isinstance(graph, KernelGraph):
        return graph, ()
    g = getattr(graph, "graph", None)
    if not isinstance(g, KernelGraph):
        raise MirageError(f"cost model: expected a KernelGraph or an annotated graph, got "
                          f"{type(graph).__name__}")
    return g, tuple(getattr(graph, "stages", ()) or ())


def estimated_registers(tile_floats: int) -> int:
    """Registers per thread of a kernel keeping ``tile_floats`` accumulator / fragment floats per
    thread in registers: ``REGS_BASE + REGS_PER_TILE_FLOAT * floats``, at least
    ``REGS_PER_THREAD`` (what a kernel without register tiles is assumed to use), at most 255.
    Fitted to ptxas on the 46 graph-defined kernels of the benchmarks' fixtures and superopt
    answers at bs 1 and 8 (sm_90): within about 30% where it exceeds 64."""
    return min(255, max(REGS_PER_THREAD, REGS_BASE + REGS_PER_TILE_FLOAT * tile_floats))


def occupancy(t: Target, threads: int, smem: int, regs: int = REGS_PER_THREAD) -> int:
    """Resident blocks per SM (0: the block does not fit) at ``regs`` registers per thread."""
    r = min(t.max_blocks_per_sm, t.max_threads_per_sm // threads,
            t.regs_per_sm // (threads * regs))
    if threads * regs > t.regs_per_block:
        return 0
    if smem > t.smem_per_block:
        return 0
    if smem > 0:
        r = min(r, t.smem_per_sm // (smem + t.smem_reserved_per_block))
    return max(r, 0)


def _wave_us(t: Target, n: int, threads: int, stages: int, forloop: float, stage_bytes: float,
             dram_b: float, load_b: float, read_b: float, tc_b: float,
             simt_b: float) -> tuple[float, float, float, float, float]:
    """(time, t_mem, t_tc, t_simt, t_lat) of one wave of ``n`` blocks, microseconds."""
    q = -(-n // t.sm_count)
    warps = q * threads / 32
    lat = t.mem_latency_us * 1e-6
    per_sm_bw = t.mem_bw / t.sm_count * SM_BW_FACTOR
    if stage_bytes > 0:
        per_sm_bw = min(per_sm_bw, q * stages * stage_bytes / lat)
    t_mem = max(n * dram_b / t.mem_bw, n * load_b / (L2_SPEEDUP * t.mem_bw),
                q * read_b / per_sm_bw) if load_b else 0.0
    t_tc = q * tc_b / (t.tc_flops / t.sm_count * min(1.0, warps / TC_WARPS))
    t_simt = q * simt_b / (t.fp32_flops / t.sm_count * min(1.0, warps / SIMT_WARPS))
    parts = (t_mem, t_tc, t_simt)
    top = max(parts)
    exposed = 1.0 / (q * stages) ** 2
    t_thr = top + exposed * (sum(parts) - top)
    t_lat = lat * (1.0 + (forloop - 1) / stages)
    return (1e6 * max(t_thr, t_lat), 1e6 * t_mem, 1e6 * t_tc, 1e6 * t_simt, 1e6 * t_lat)


def _read_bytes(op: KernelOp, j: int, tensors: dict) -> int:
    """Bytes a pre-defined kernel reads of its ``j``-th operand: all of it, except the table of
    a take, of which only the gathered rows (one per index, as many bytes as it writes)."""
    src = tensors[op.operands[j]]
    if op.op == "take" and j == 0:
        return op.output.size * DTYPES[src.dtype]
    return _size(src.shape) * DTYPES[src.dtype]


def _op_cost(op: KernelOp, tensors: dict, t: Target, inter: set[str]) -> KernelCost:
    reads = [(o, _read_bytes(op, j, tensors)) for j, o in enumerate(op.operands)
             if isinstance(o, str)]
    nbytes = sum(b for _, b in reads)
    nbytes += op.output.size * DTYPES[op.output.dtype]
    ib = sum(b for n, b in reads if n in inter)
    if op.output.name in inter:
        ib += op.output.size * DTYPES[op.output.dtype]
    tc = simt = 0.0
    if op.op == "matmul":
        a, b = tensors[op.inputs[0]], tensors[op.inputs[1]]
        out = op.output.shape
        tc, simt = matmul_work(op_math(op.attrs, a.dtype, b.dtype), out[-2], out[-1],
                               a.shape[-1], _size(out[:-2]), t)
    else:
        per = OPS[op.op].cost if op.op in OPS else 1
        simt = float(sum(_size(tensors[n].shape) for n in op.inputs) or op.output.size) * per
    mem, tcu, simu = 1e6 * nbytes / t.mem_bw, 1e6 * tc / t.tc_flops, 1e6 * simt / t.fp32_flops
    us = t.launch_us + max(mem, tcu, simu)
    return KernelCost(f"{op.op}->{op.output.name}", us, nbytes, tc, simt, t.sm_count, 0, 0, 1, 1,
                      0, 1.0, mem, tcu, simu, 0.0, ib, "op", nbytes, nbytes)


def sector_factor(src: Any, tile: tuple[int, ...]) -> float:
    """Bytes the memory system moves per byte of a tile loaded from ``src`` (row-major): the
    tile is made of contiguous runs (its innermost dim, merged with outer dims the tile spans
    whole), and every run costs whole 32-byte sectors. A tile of 4-byte rows moves 8 times its
    size through L2."""
    if not tile:
        return 1.0
    shape = src.shape[-len(tile):]
    run, d = tile[-1], len(tile) - 1
    while d > 0 and tile[d] == shape[d]:
        d -= 1
        run *= tile[d]
    nbytes = run * DTYPES[src.dtype]
    return -(-nbytes // SECTOR) * SECTOR / nbytes if nbytes else 1.0


def _graph_kernel_cost(op: GraphKernel, info, tensors: dict, t: Target, stages: int,
                       inter: set[str], planned: tuple[int, int, int] | None = None,
                       work: LaunchWork | None = None) -> KernelCost:
    bg = op.block
    B, T, F = bg.num_blocks, bg.threads, bg.forloop
    # blocks launched and loop iterations run over them (module docstring, "work at launch")
    launched, iterations = (work.blocks, work.iterations) if work is not None else (B, B * F)
    if launched < 1 or not launched <= iterations <= launched * F or launched > B:
        raise MirageError(f"cost model: {launched} blocks running {iterations} iterations for a "
                          f"kernel of {B} blocks of {F} iterations")
    shapes, phases = info.shapes, info.phases
    tc = simt = traffic = 0.0
    body_tiles = all_tiles = 0.0
    iters = []
    mm_outs = set()

    def tile_bytes(name: Any) -> float:
        return _size(shapes[name]) * DTYPES[info.dtypes[name]] if isinstance(name, str) and \
            name in shapes else 0.0
    for n in bg.ops:
        body = phases.get(getattr(n, "out", "")) is Phase.BODY
        reps = F if body else 1
        runs = iterations if body else launched  # how often the kernel computes this node
        # shared-memory traffic: what the node reads and writes there, per run
        if isinstance(n, Accum):  # reads the product and itself, writes itself, per iteration
            traffic += (tile_bytes(n.input) + 2 * tile_bytes(n.out)) * iterations
        else:
            reads_of = getattr(n, "operands", None) or (getattr(n, "input", None),)
            traffic += (sum(tile_bytes(x) for x in reads_of) +
                        tile_bytes(getattr(n, "out", None))) * runs
        if isinstance(n, InputIter) and n.gather >= 0:
            # a gather: the tile's rows, each a run of its own (sectors per row), and the
            # indices that pick them
            ins = [tensors[x] for x in op.inputs]
            src, ids = iter_source(n, ins), ins[n.gather]
            tile = _size(shapes[n.out]) * DTYPES[src.dtype]
            all_tiles += tile
            if reps > 1:
                body_tiles += tile
            iters.append((src, tile * runs * sector_factor(src, shapes[n.out][-1:]), n.imap))
            k = len(ids.shape)
            iters.append((ids, _size(shapes[n.out][:k]) * DTYPES[ids.dtype] * runs,
                          n.imap))
        elif isinstance(n, InputIter):
            src = tensors[op.inputs[n.input]]
            tile = _size(shapes[n.out]) * DTYPES[src.dtype]
            all_tiles += tile
            if reps > 1:
                body_tiles += tile
            iters.append((src, tile * runs * sector_factor(src, shapes[n.out]), n.imap))
        elif isinstance(n, BlockOp):
            if n.op == "matmul":
                a, o = shapes[n.operands[0]], shapes[n.out]
                mma, fma = matmul_work(op_math(n.attrs, *(info.dtypes[x] for x in n.operands)),
                                       o[-2], o[-1], a[-1], _size(o[:-2]), t, T)
                tc += mma * runs
                simt += fma * runs
                mm_outs.add(n.out)
            else:
                src_shapes = [shapes[x] for x in n.operands if isinstance(x, str)]
                per = OPS[n.op].cost if n.op in OPS else 1
                simt += _steps(max(_size(s) for s in src_shapes), T) * per * runs
        elif isinstance(n, MaskIter):
            simt += _steps(_size(shapes[n.out]), T) * 2 * runs
        elif isinstance(n, Fused):
            per = sum(OPS[t.op].cost for t in n.thread.ops)
            simt += _steps(_size(shapes[n.out]), T) * per * runs
        elif isinstance(n, Accum):
            if n.input not in mm_outs:  # MMAs accumulate in place
                simt += _steps(_size(shapes[n.out]), T) * (3 if n.running else 1) * iterations
            if n.rescale is not None:  # online softmax: acc *= exp(m_old - m_new) per iteration
                simt += _steps(_size(shapes[n.out]), T) * iterations
    if planned is not None:  # the layout planner's footprint, pipeline depth, register tiles
        smem, stages, floats = planned
        regs = estimated_registers(floats)
    else:
        stages = min(stages, F)  # a loop of F iterations has at most F of them in flight
        smem = info.smem_bytes + (stages - 1) * int(body_tiles)
        regs = REGS_PER_THREAD
    r = occupancy(t, T, smem, regs)
    slots = t.sm_count * max(r, 1)
    nbytes = dram = loaded = reads = ib = 0.0
    for src, loads, imap in iters:
        size = src.size * DTYPES[src.dtype]
        unique = min(loads, size)
        loaded += loads
        reads += loads
        if size <= t.l2_bytes:
            far = 1
        else:  # sharers launched more than a wave apart miss L2 (blocks launch x fastest)
            far, dist = 1, 1
            for ax in range(3):
                if imap[ax] < 0 and bg.grid[ax] > 1 and dist >= slots:
                    far *= bg.grid[ax]
                dist *= bg.grid[ax]
        first = min(loads, unique * far)
        dram += first
        nbytes += first + (loads - first) / L2_SPEEDUP
        if src.name in inter:
            ib += unique
    for o in op.outputs:
        ob = o.size * DTYPES[o.dtype] * launched / B  # each block writes its own tiles
        nbytes += ob
        dram += ob
        loaded += ob
        if o.name in inter:
            ib += ob
    names = ",".join(o.name for o in op.outputs)
    name = f"graph_kernel->{names}"
    if r == 0:
        return KernelCost(name, math.inf, nbytes, tc, simt, launched, T, smem, stages, F, 0,
                          math.inf, intermediate_bytes=ib, dram_bytes=dram, load_bytes=loaded,
                          smem_traffic=traffic)
    full, rem = divmod(launched, slots)
    stage_bytes = body_tiles if body_tiles else all_tiles
    per = (stage_bytes, dram / launched, loaded / launched, reads / launched, tc / launched,
           simt / launched)
    loop = iterations / launched  # a block's iterations, on average
    total = [0.0] * 5
    for count, n in ((full, slots), (1 if rem else 0, rem)):
        if count:
            w = _wave_us(t, n, T, stages, loop, *per)
            total = [a + count * b for a, b in zip(total, w)]
    us = t.launch_us + total[0]
    return KernelCost(name, us, nbytes, tc, simt, launched, T, smem, stages, F, r,
                      launched / slots, total[1], total[2], total[3], total[4], ib, "graph", dram,
                      loaded, traffic)


def kernel_costs(graph: Any, target: Any = "h100", smem_planner: Any = None,
                 work: Mapping[int, LaunchWork] | None = None) -> list[KernelCost]:
    """Per-kernel predictions, in launch order (see the module docstring for the formulas).

    ``work`` gives, by index in ``graph.ops``, what of a graph-defined kernel runs when fewer
    blocks or iterations than its block graph's are launched (a padded bucket at valid sizes;
    ``codegen_cuda.extents.launch_work``); other kernels run whole.

    ``smem_planner(graph, target, stages, infos) -> {kernel index: (bytes, pipeline depth,
    register-tile floats)}`` gives graph-defined kernels' shared memory as code generation lays
    it out (buffers reused across stages, register accumulators left out;
    ``layout.planned_shared_memory``) instead of validation's bound plus pipeline copies, and
    the floats a thread keeps in register tiles, for :func:`estimated_registers`. A graph the
    planner cannot lay out costs infinite time."""
    g, stages = unpack(graph)
    t = get_target(target)
    infos = validate(g, t)
    planned: dict = {}
    if smem_planner is not None:
        try:
            planned = smem_planner(g, t, stages, infos)
        except MirageError:
            planned = {k: (t.smem_per_block + 1, 1, 0) for k, op in enumerate(g.ops)
                       if isinstance(op, GraphKernel)}
    tensors = g.tensors()
    produced = {x.name for op in g.ops for x in op.outputs}
    inter = produced - set(g.outputs)
    out = []
    gi = 0
    for k, op in enumerate(g.ops):
        if isinstance(op, KernelOp):
            out.append(_op_cost(op, tensors, t, inter))
        else:
            s = stages[gi] if gi < len(stages) else DEFAULT_STAGES
            gi += 1
            if s < 1:
                raise MirageError(f"cost model: {s} pipeline stages for graph kernel {gi - 1}")
            out.append(_graph_kernel_cost(op, infos[k], tensors, t, s, inter, planned.get(k),
                                          (work or {}).get(k)))
    return out


def estimate_us(graph: Any, target: Any = "h100", smem_planner: Any = None) -> float:
    """Predicted time of the whole kernel graph (kernels run one after another)."""
    return sum(c.us for c in kernel_costs(graph, target, smem_planner))


def bytes_moved(graph: Any, target: Any = "h100") -> float:
    return sum(c.bytes for c in kernel_costs(graph, target))


def lower_bound_us(program: Any, target: Any = "h100", kernels: int | None = None) -> float:
    """A lower bound on the predicted time of any kernel graph of ``kernels`` graph-defined
    kernels (None: any number) that computes ``program`` (a :class:`~mirage_py.lax.Program`).
    Flops are left out: the search may find a form with fewer.

    * **one kernel**: one launch, plus the largest of one memory round trip (every wave waits
      for one), the time to read every input once and write every output once at DRAM
      bandwidth (the model charges the first read of every element loaded, and every output
      element written, to DRAM), and the time one block needs to load the *read cone* of one
      output element (:func:`mirage_py.lax.cone.cone_bytes`) at the most one SM can pull
      (``SM_BW_FACTOR`` times its share; the wave formula's ``q * read_b / per_sm_bw``). Blocks
      of one kernel share nothing, so the block that computes an element loads its whole cone:
      a row statistic taken after a matmul needs the whole weight in one block (a decoder's
      down projection, residual add and next RMSNorm: 1.4 MB, 16 us on an H100).
    * **k kernels**: k launches, plus the larger of k memory round trips and every input read
      and every output written once -- the least for k = 2, which is the bound for "two or
      more".

    The region layer searches a region only when the cover could still get cheaper with the
    region at this bound."""
    t = get_target(target)
    if kernels is not None and kernels < 1:
        raise MirageError(f"lower bound: {kernels} kernels; give at least 1 (or None: any)")
    nbytes = sum(_size(x.shape) * DTYPES[x.dtype] for x in program.inputs)
    nbytes += sum(_size(o.shape) * DTYPES[o.dtype] for o in
                  {o.tensor.digest: o for o in program.outputs}.values())
    mem = 1e6 * nbytes / t.mem_bw

    def several(k: int) -> float:
        return k * t.launch_us + max(k * t.mem_latency_us, mem)

    if kernels is not None and kernels > 1:
        return several(kernels)
    per_sm_bw = SM_BW_FACTOR * t.mem_bw / t.sm_count
    one = t.launch_us + max(t.mem_latency_us, mem, 1e6 * cone_bytes(program) / per_sm_bw)
    return one if kernels == 1 else min(one, several(2))


class AnalyticModel:
    """The formulas above behind the ``predict`` interface; ``smem_planner`` as in
    :func:`kernel_costs` (``superopt`` passes the layout planner's)."""

    name = "analytic"

    def __init__(self, smem_planner: Any = None):
        self.smem_planner = smem_planner

    def predict(self, graph: Any, target: Any) -> float:
        return estimate_us(graph, target, self.smem_planner)

    def kernel_costs(self, graph: Any, target: Any,
                     work: Mapping[int, LaunchWork] | None = None) -> list[KernelCost]:
        return kernel_costs(graph, target, self.smem_planner, work)

    def lower_bound(self, program: Any, target: Any, kernels: int | None = None) -> float:
        """What any graph-defined kernel graph computing ``program`` (with ``kernels``
        kernels; None: any number) costs at least: see :func:`lower_bound_us`."""
        return lower_bound_us(program, target, kernels)


class RandomModel:
    """Test double: a deterministic pseudo-random time per (graph, stages, target, seed) in
    [1, 1001) us. Ranks candidates arbitrarily but repeatably, so search and tuning can be tested
    without trusting any formula."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def predict(self, graph: Any, target: Any) -> float:
        g, stages = unpack(graph)
        key = f"{self.seed}:{get_target(target).name}:{g.structural_hash()}:{stages}"
        h = int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)
        return 1.0 + (h % 1_000_000) / 1000.0


CALIBRATION = Path(__file__).with_name("calibration.json")


class CalibratedModel(AnalyticModel):
    """The analytic model with the figures calibrated on measured GPU times
    (``benchmarks/published_gpu.py`` fits them on KernelBench's published eager timings and
    writes ``calibration.json`` beside this file; docs/learned.md): a target's bandwidth times
    ``mem_eff`` (and its own fitted factor where it was measured, ``target_mem_eff``) and its
    launch cost times ``launch_scale`` -- the fitted figures that describe any kernel;
    cuBLAS's and cuDNN's efficiencies and PyTorch's host time do not apply to generated
    kernels. ``superopt(cost_model="calibrated")`` ranks with it."""

    name = "calibrated"

    def __init__(self, smem_planner: Any = None, mem_eff: float | None = None,
                 launch_scale: float | None = None, smem_eff: float | None = None):
        super().__init__(smem_planner)
        fitted = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
        self.mem_eff = float(mem_eff if mem_eff is not None else fitted.get("mem_eff", 1.0))
        self.launch_scale = float(launch_scale if launch_scale is not None
                                  else fitted.get("launch_scale", 1.0))
        self.target_mem_eff = {} if mem_eff is not None else \
            {str(k): float(v) for k, v in fitted.get("target_mem_eff", {}).items()}
        # the fraction of the SMs' shared-memory bandwidth a graph-defined kernel's traffic
        # gets (None: shared memory unpriced, as the analytic model)
        self.smem_eff = smem_eff

    def target(self, target: Any) -> Target:
        t = get_target(target)
        eff = self.mem_eff * self.target_mem_eff.get(t.name, 1.0)
        return replace(t, mem_bw=t.mem_bw * eff, launch_us=t.launch_us * self.launch_scale)

    def predict(self, graph: Any, target: Any) -> float:
        if self.smem_eff is None:
            return estimate_us(graph, self.target(target), self.smem_planner)
        t = self.target(target)
        return sum(max(c.us, t.launch_us + smem_us(c, t, self.smem_eff))
                   for c in kernel_costs(graph, t, self.smem_planner))

    def kernel_costs(self, graph: Any, target: Any,
                     work: Mapping[int, LaunchWork] | None = None) -> list[KernelCost]:
        return kernel_costs(graph, self.target(target), self.smem_planner, work)

    def lower_bound(self, program: Any, target: Any, kernels: int | None = None) -> float:
        return lower_bound_us(program, self.target(target), kernels)


SMEM_BYTES_PER_CLOCK = 128  # an SM's shared-memory bandwidth (32 banks of 4 bytes)


def smem_us(cost: KernelCost, t: Target, eff: float = 1.0) -> float:
    """The time a kernel's shared-memory traffic takes on the SMs its blocks occupy, at
    ``eff`` of their bandwidth (bank conflicts and the traffic the count leaves out lower it)."""
    if not cost.smem_traffic or not cost.blocks:
        return 0.0
    sms = min(cost.blocks, t.sm_count)
    return cost.smem_traffic / (sms * SMEM_BYTES_PER_CLOCK * t.clock_ghz * 1e9 * eff) * 1e6


_MODELS = {"analytic": AnalyticModel, "random": RandomModel, "calibrated": CalibratedModel}


def create(name: str = "analytic", **kw: Any) -> CostModel:
    """A cost model by name: ``analytic`` (default), ``calibrated`` (the analytic model with
    figures fitted to measurements) or ``random`` (test double)."""
    try:
        return _MODELS[name](**kw)
    except KeyError:
        raise MirageError(f"unknown cost model {name!r}; choose one of {', '.join(_MODELS)}") \
            from None


def library_kernel_us(target: Any, nbytes: float, simt_flops: float = 0.0,
                      tc_flops: float = 0.0, tc_rate: float | None = None) -> float:
    """A pre-defined (library) kernel that keeps the whole GPU busy, as the model prices one:
    ``launch_us + max(bytes / mem_bw, tc_flops / tc_rate, simt_flops / fp32_rate)`` with
    ``tc_rate`` the target's fp16 tensor-core rate unless given (a float32 convolution on TF32
    tensor cores passes ``tf32_flops``). The eager predictor (``mirage_py.eager``) prices the
    kernels PyTorch launches with it."""
    t = get_target(target)
    rate = t.tc_flops if tc_rate is None else tc_rate
    body = max(nbytes / t.mem_bw, tc_flops / rate if tc_flops else 0.0,
               simt_flops / t.fp32_flops)
    return t.launch_us + 1e6 * body
