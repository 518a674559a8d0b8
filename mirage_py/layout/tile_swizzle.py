"""Which shared-memory tiles of a block graph get an XOR swizzle, and which one.

A tile is a candidate when it is read by ``ldmatrix`` -- a 16-bit operand of a tensor-core tile
matmul whose sizes are whole fragments (see :mod:`.mma`) -- and it is filled by an iterator load
(cp.async or element copies). Every access the generated code makes to the tile is then costed
with the wavefront model of :mod:`.swizzle` and the cheapest swizzle is chosen by exact
enumeration: the ldmatrix instructions of the matmul (each fragment as often as the warp tiling
loads it), the fill, and element-wise reads by other operators. Computed tiles (fp32) and
batched operand tiles keep the identity.
"""

from __future__ import annotations

import math

from ..lax.ops import DTYPES
from ..ugraph.graph import BlockGraph, BlockOp, InputIter, tiles_read
from ..ugraph.validate import BlockInfo
from .mma import MMA_K, MMA_M, MMA_N, ldmatrix_operands, mma_config
from .schedule import COMPUTE, LOAD, SAVE, BlockSchedule
from .swizzle import (Instruction, Swizzle, choose_swizzle, cp_async_fill, elementwise,
                      fragment_reads_a, ldmatrix_a, ldmatrix_b_trans)


def _matmul_reads(op: BlockOp, info: BlockInfo, threads: int) -> dict[str, list]:
    """tile -> [(ldmatrix instructions, weight)] for the operands this matmul reads by ldmatrix."""
    a, b = op.operands
    sa, sb = info.shapes[a], info.shapes[b]
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = math.prod(info.shapes[op.out][:-2])
    cfg = mma_config(batch, m, n, threads, info.dtypes[a], info.dtypes[b])
    if cfg is None or batch != 1:
        return {}
    lda, ldb = ldmatrix_operands(m, k, n, info.dtypes[a], info.dtypes[b], cfg)
    out: dict[str, list] = {}
    mt, nt = -(-m // MMA_M), -(-n // MMA_N)
    if lda:
        ins = [i for m0 in range(0, m, MMA_M) for k0 in range(0, k, MMA_K)
               for i in ldmatrix_a(m, k, 2, m0, k0)]
        out[a] = [(ins, nt // cfg.ng)]  # once per column block of the unit
    if ldb:
        ins = [i for k0 in range(0, k, MMA_K) for n0 in range(0, n, MMA_N)
               for i in ldmatrix_b_trans(k, n, 2, k0, n0, x4=False)]
        out.setdefault(b, []).append((ins, mt))
    return out


def _fragment_a_reads(op: BlockOp, info: BlockInfo, threads: int) -> tuple[str, list] | None:
    """The A operand of a tensor-core matmul that is read element by element as fp32 fragments
    (a tile computed in the block, such as attention probabilities): (tile, weighted reads)."""
    a, b = op.operands
    sa, sb = info.shapes[a], info.shapes[b]
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = math.prod(info.shapes[op.out][:-2])
    cfg = mma_config(batch, m, n, threads, info.dtypes[a], info.dtypes[b])
    if cfg is None or batch != 1 or info.dtypes[a] != "float32" or m % MMA_M or k % MMA_K:
        return None
    ins = [i for m0 in range(0, m, MMA_M) for k0 in range(0, k, MMA_K)
           for i in fragment_reads_a(m, k, 4, m0, k0)]
    return a, [(ins, -(-n // MMA_N) // cfg.ng)]


def plan_swizzles(bg: BlockGraph, info: BlockInfo, sched: BlockSchedule) -> dict[str, Swizzle]:
    """tile -> chosen swizzle, for the tiles that gain from one (identity tiles are left out).

    Candidates: tiles filled by an iterator load and read by ldmatrix, and fp32 tiles computed by
    element-wise operators (in element or fragment order) and read as element-wise A fragments
    -- unless a 16-byte store reads them (it needs 32 contiguous bytes of an fp32 tile)."""
    reads: dict[str, list] = {}
    computed: dict[str, list] = {}
    for op in bg.ops:
        if isinstance(op, BlockOp) and op.op == "matmul":
            for t, acc in _matmul_reads(op, info, bg.threads).items():
                reads.setdefault(t, []).extend(acc)
            frag = _fragment_a_reads(op, info, bg.threads)
            if frag is not None:
                computed.setdefault(frag[0], []).extend(frag[1])
    loaded = {st.node.out: st for st in sched.steps
              if st.kind == LOAD and isinstance(st.node, InputIter) and not st.into}
    writers = {st.writes: st for st in sched.steps if st.writes is not None}
    vector_saved = {st.node.input for st in sched.steps if st.kind == SAVE and st.vector > 1}
    out: dict[str, Swizzle] = {}
    for t, acc in computed.items():
        w = writers.get(t)
        if w is None or w.kind != COMPUTE or not (w.flat or w.frag) or w.into or \
                t in vector_saved or t in sched.registers:
            continue
        shape = info.shapes[t]
        n = math.prod(shape)
        write = fragment_reads_a(shape[-2], shape[-1], 4) if w.frag else elementwise(n, 4, bg.threads)
        weighted = [*acc, (write, 1.0)]
        weighted += [(elementwise(n, 4, bg.threads), 1.0) for op in bg.ops
                     if t in tiles_read(op) and not (isinstance(op, BlockOp) and op.op == "matmul")]
        best, _ = choose_swizzle(shape[-2:], 4, weighted)
        if not best.is_identity:
            out[t] = best
    for t, acc in reads.items():
        if t not in loaded:
            continue
        shape, eb = info.shapes[t], DTYPES[info.dtypes[t]]
        n = math.prod(shape)
        fill: list[Instruction] = cp_async_fill(n, eb, bg.threads) if loaded[t].vector > 1 \
            else elementwise(n, eb, bg.threads)
        weighted = [*acc, (fill, 1.0)]
        for op in bg.ops:  # element-wise readers besides the matmuls
            if t in tiles_read(op) and not (isinstance(op, BlockOp) and op.op == "matmul"):
                weighted.append((elementwise(n, eb, bg.threads), 1.0))
        best, _ = choose_swizzle(shape[-2:], eb, weighted)
        if not best.is_identity:
            out[t] = best
    return out
