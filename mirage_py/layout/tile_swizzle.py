"""Which shared-memory tiles of a block graph get an XOR swizzle, and which one.

Two kinds of tile are candidates: tiles filled by an iterator load (cp.async or element copies)
and read by ``ldmatrix`` -- 16-bit operands of a tensor-core tile matmul whose sizes are whole
fragments (see :mod:`.mma`) -- and fp32 tiles computed by element-wise operators and read as
element-wise A fragments (attention probabilities). Every access the generated code makes to
such a tile is costed with the wavefront model of :mod:`.swizzle` and the cheapest swizzle is
chosen by exact enumeration: the matmul's fragment reads (each fragment as often as the warp
tiling loads it), the fill or the writes, and element-wise reads by other operators. Batched
operand tiles keep the identity.

Operands of a warpgroup MMA (``wgmma``, see :mod:`.mma`) get no choice: the hardware reads them
in the canonical layout of the swizzle mode their row width selects -- ``Swizzle<B,3,3>`` on
16-bit element offsets (``Swizzle<B,4,3>`` on bytes) with 2^B 16-byte chunks per row -- which is
also conflict-free for their fills.
"""

from __future__ import annotations

import math

from ..lax.ops import DTYPES, OPS
from ..ugraph.graph import BlockGraph, BlockOp, Fused, InputIter, tiles_read
from ..ugraph.validate import BlockInfo
from .mma import (MMA_K, MMA_M, MMA_N, TileMatmul, ldmatrix_operands, tile_matmul,
                  wgmma_operands)
from .schedule import COMPUTE, LOAD, SAVE, BlockSchedule
from .swizzle import (Instruction, Swizzle, canonical_swizzle, choose_swizzle, cp_async_fill,
                      elementwise, fragment_reads_a, ldmatrix_a, ldmatrix_b_trans)


def _matmul_reads(t: TileMatmul, info: BlockInfo) -> dict[str, list]:
    """tile -> [(ldmatrix instructions, weight)] for the operands this matmul reads by ldmatrix."""
    if t.cfg is None or t.batch != 1:
        return {}
    m, k, n = t.m, t.k, t.n
    lda, ldb = ldmatrix_operands(m, k, n, info.dtypes[t.a], info.dtypes[t.b], t.cfg)
    out: dict[str, list] = {}
    mt, nt = -(-m // MMA_M), -(-n // MMA_N)
    if lda:
        ins = [i for m0 in range(0, m, MMA_M) for k0 in range(0, k, MMA_K)
               for i in ldmatrix_a(m, k, 2, m0, k0)]
        out[t.a] = [(ins, nt // t.cfg.ng)]  # once per column block of the unit
    if ldb:
        ins = [i for k0 in range(0, k, MMA_K) for n0 in range(0, n, MMA_N)
               for i in ldmatrix_b_trans(k, n, 2, k0, n0, x4=False)]
        out.setdefault(t.b, []).append((ins, mt))
    return out


def _fragment_a_reads(t: TileMatmul, info: BlockInfo) -> tuple[str, list] | None:
    """The A operand of a tensor-core matmul that is read element by element as fp32 fragments
    (a tile computed in the block, such as attention probabilities): (tile, weighted reads)."""
    if t.cfg is None or not t.cfg.sixteen_bit or t.batch != 1 or \
            info.dtypes[t.a] != "float32" or t.m % MMA_M or t.k % MMA_K:
        return None
    ins = [i for m0 in range(0, t.m, MMA_M) for k0 in range(0, t.k, MMA_K)
           for i in fragment_reads_a(t.m, t.k, 4, m0, k0)]
    return t.a, [(ins, -(-t.n // MMA_N) // t.cfg.ng)]


def _choose(bg: BlockGraph, info: BlockInfo, tile: str, weighted: list) -> Swizzle:
    """The cheapest swizzle of ``tile`` for ``weighted`` accesses plus one element-wise pass per
    operator that reads it other than a matmul."""
    shape, eb = info.shapes[tile], DTYPES[info.dtypes[tile]]
    n = math.prod(shape)
    others = [(elementwise(n, eb, bg.threads), 1.0) for op in bg.ops if tile in tiles_read(op)
              and not (isinstance(op, BlockOp) and op.op == "matmul")]
    return choose_swizzle(shape[-2:], eb, [*weighted, *others])[0]


def plan_swizzles(bg: BlockGraph, info: BlockInfo, sched: BlockSchedule) -> dict[str, Swizzle]:
    """tile -> chosen swizzle, for the tiles that gain from one (identity tiles are left out).

    Candidates: tiles filled by an iterator load and read by ldmatrix, and fp32 tiles computed by
    element-wise operators (in element or fragment order) and read as element-wise A fragments
    -- unless a 16-byte store reads them (it needs 32 contiguous bytes of an fp32 tile)."""
    canonical = {t: canonical_swizzle(row, DTYPES[info.dtypes[t]])
                 for t, row in wgmma_operands(bg, info).items()}
    reads: dict[str, list] = {}
    computed: dict[str, list] = {}
    for op in bg.ops:
        if not (isinstance(op, BlockOp) and op.op == "matmul"):
            continue
        tm = tile_matmul(op, info, bg.threads, bg)
        if not tm.cfg_is_wgmma:
            for t, acc in _matmul_reads(tm, info).items():
                reads.setdefault(t, []).extend(acc)
            frag = _fragment_a_reads(tm, info)
            if frag is not None:
                computed.setdefault(frag[0], []).extend(frag[1])
    loaded = {st.node.out: st for st in sched.steps
              if st.kind == LOAD and isinstance(st.node, InputIter) and not st.into}
    writers = {st.writes: st for st in sched.steps if st.writes is not None}
    vector_saved = {st.node.input for st in sched.steps if st.kind == SAVE and st.vector > 1}
    out: dict[str, Swizzle] = {}
    for t, acc in computed.items():
        w = writers.get(t)
        # element-wise writers store through the swizzle; a matmul or row sum computed from
        # fragments (probabilities in registers) writes its tile plain (frags_to_smem,
        # frag_row_sums), so such a tile keeps the identity
        by_frag = w is not None and w.frag is not None and (
            isinstance(w.node, Fused) or OPS.get(getattr(w.node, "op", None)) is not None and
            OPS[w.node.op].elementwise)
        if w is None or w.kind != COMPUTE or not (w.flat or by_frag) or w.into or \
                t in vector_saved or t in sched.registers:
            continue
        shape = info.shapes[t]
        write = fragment_reads_a(shape[-2], shape[-1], 4) if w.frag else \
            elementwise(math.prod(shape), 4, bg.threads)
        out[t] = _choose(bg, info, t, [*acc, (write, 1.0)])
    for t, acc in reads.items():
        if t not in loaded:
            continue
        n, eb = math.prod(info.shapes[t]), DTYPES[info.dtypes[t]]
        fill: list[Instruction] = cp_async_fill(n, eb, bg.threads) if loaded[t].vector > 1 \
            else elementwise(n, eb, bg.threads)
        out[t] = _choose(bg, info, t, [*acc, (fill, 1.0)])
    out.update(canonical)  # the hardware's layout wins over any choice
    return {t: s for t, s in out.items() if not s.is_identity}
