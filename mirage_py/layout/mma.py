"""How a tile matmul runs on tensor cores: the warp tiling and the operand type.

``tile_mma`` (prelude.cuh) computes ``C (+)= A @ B`` for tiles in shared memory with
``mma.sync.m16n8k16`` (fp16 or bf16 operands, fp32 accumulation). Its output is cut into
16 x 8 tiles; a warp owns a *unit* of one 16-row tile by ``ng`` consecutive 8-column tiles, loads
the unit's A fragment once per k step and reuses it for the ``ng`` column tiles. ``ng`` is the
largest of 4, 2, 1 that divides the column tiles and still leaves a unit for every warp (more
reuse of A against fewer idle warps).

The operand type is the matmul's math (lax/precision.py): in 16-bit programs bf16 when an operand
is stored as bf16, otherwise fp16; in float32 programs TF32 (``mma.sync.m16n8k8``, one operand
per register, rounded by ``cvt.rna``; the C fragments are the same, so register accumulators
and epilogues are too) or bf16 where the program allows it, and no tensor cores at all for
float32 products (the FMA tile matmul). Tiles stored in that
type are read with ``ldmatrix`` unchanged; fp32 tiles (values computed in the block, such as the
exp of a score tile) are rounded to it when their fragments are loaded -- the same rounding
FlashAttention-style kernels apply to probabilities before the second matmul. Tensor cores need
whole warps: a block whose thread count is not a multiple of 32 keeps the fp32 FMA tile matmul.
On sm_90a a tile matmul can run as Hopper's warpgroup MMA instead (``wgmma.mma_async``
m64nNk16, operands read from shared memory through matrix descriptors; ``tile_wgmma`` in
prelude.cuh) where it pays (:func:`wgmma_config`): each warpgroup of four warps takes whole
64-row blocks of the output with all its columns, which is exactly the ``mma.sync`` tiling with
units of 16 x N (``ng = N / 8``), so the register fragments, epilogues and the code compiled for
other architectures (the same template falls back to ``mma.sync``) are unchanged.

Attention's probabilities can skip shared memory (:func:`register_operand_pairs`): when the
score tile's matmul and the matmul that takes the probabilities as A both get *row tilings*
(units of 16 rows by all columns, unit u of either on the same warp), the C fragments of the
first are the A fragments of the second, thread for thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..lax.ops import DTYPES
from ..lax.precision import MatmulMath, fma_micro_tile, op_math  # noqa: F401 (re-exported)
from ..ugraph.phase import Phase
from .swizzle import CANONICAL_ROW_BYTES

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16


# the C type a tensor-core math takes its operands in (prelude.cuh), and the k of one MMA
ETYPES = {MatmulMath.FP16: "fp16_t", MatmulMath.BF16: "bf16_t", MatmulMath.TF32: "tf32_t"}
MMA_K_OF = {"fp16_t": MMA_K, "bf16_t": MMA_K, "tf32_t": 8}


@dataclass(frozen=True)
class MmaConfig:
    warps: int
    ng: int  # 8-column tiles per warp unit
    etype: str  # C type of the operands: fp16_t, bf16_t (m16n8k16) or tf32_t (m16n8k8)
    wgmma: bool = False  # warpgroup MMA on sm_90a (units of 16 x N, whole 64-row blocks)

    @property
    def k_step(self) -> int:
        """k of one MMA instruction (16 for 16-bit operands, 8 for TF32)."""
        return MMA_K_OF[self.etype]

    @property
    def sixteen_bit(self) -> bool:
        """Two operands per register (fp16 / bf16): what ldmatrix, warpgroup MMA and
        probabilities in registers need."""
        return self.etype != "tf32_t"

    def units(self, batch: int, m: int, n: int) -> int:
        return batch * -(-m // MMA_M) * (-(-n // MMA_N) // self.ng)

    def rounds(self, batch: int, m: int, n: int) -> int:
        """Units per warp (``MmaTiling::ROUNDS`` in prelude.cuh)."""
        return -(-self.units(batch, m, n) // self.warps)

    def register_floats(self, batch: int, m: int, n: int) -> int:
        """Accumulator registers per thread when the whole output stays in registers."""
        return self.rounds(batch, m, n) * self.ng * 4


def register_budget(threads: int) -> int:
    """Accumulator floats a thread may keep in registers across a for-loop: at most 64, and a
    quarter of its share of the register file (64K registers per block at most)."""
    return min(64, 65536 // max(threads, 1) // 4)


def mma_config(batch: int, m: int, n: int, threads: int, math_: MatmulMath) -> MmaConfig | None:
    """The tensor-core plan of a (batch of) (m, k) @ (k, n) tile matmul multiplied as ``math_``
    (lax/precision.py) in a block of ``threads`` threads, or None when it does not run on
    tensor cores (float32 FMA, or a block that is not whole warps)."""
    if threads % WARP or threads <= 0 or not math_.tensor_cores:
        return None
    warps = threads // WARP
    mt, nt = -(-m // MMA_M), -(-n // MMA_N)
    ng = 1
    for cand in (4, 2):
        if nt % cand == 0 and batch * mt * (nt // cand) >= warps:
            ng = cand
            break
    return MmaConfig(warps, ng, ETYPES[math_])


WARPGROUP = 4  # warps


def wgmma_config(batch: int, m: int, n: int, k: int, threads: int, dtype_a: str,
                 dtype_b: str, math_: MatmulMath) -> MmaConfig | None:
    """The warpgroup-MMA plan of a (batch of) (m, k) @ (k, n) tile matmul, or None where it does
    not apply or does not pay. It applies when both operands are stored in the mma type
    (fp16 or bf16 tiles in shared memory, read by descriptors), the rows of A (k elements) and
    of B (n elements) are 32, 64 or 128 bytes -- one swizzle atom wide, the canonical layouts
    of the 32B / 64B / 128B modes -- m is a multiple of 64 and the block is whole warpgroups.
    It pays when every warpgroup gets a 64-row block: with fewer blocks than warpgroups the
    finer ``mma.sync`` tiling keeps more warps busy."""
    etype = ETYPES.get(math_)
    ctype = {"float16": "fp16_t", "bfloat16": "bf16_t"}
    # float32 FMA has no operand type: float32 tiles must not match it (no ctype either)
    if etype is None or ctype.get(dtype_a) != etype or ctype.get(dtype_b) != etype:
        return None
    if threads <= 0 or threads % (WARP * WARPGROUP) or m % 64:
        return None
    if 2 * k not in CANONICAL_ROW_BYTES or 2 * n not in CANONICAL_ROW_BYTES:
        return None
    groups = threads // (WARP * WARPGROUP)
    if batch * (m // 64) < groups:
        return None
    return MmaConfig(threads // WARP, n // MMA_N, etype, wgmma=True)


def ldmatrix_operands(m: int, k: int, n: int, dtype_a: str, dtype_b: str,
                      cfg: MmaConfig) -> tuple[bool, bool]:
    """Does ``tile_mma`` read A / B with ldmatrix? Only tiles stored in the operand type whose
    sizes are whole fragments (the same test as ``LDSM_A`` / ``LDSM_B`` in prelude.cuh)."""
    ctype = {"float16": "fp16_t", "bfloat16": "bf16_t"}
    a = ctype.get(dtype_a) == cfg.etype and m % MMA_M == 0 and k % MMA_K == 0
    b = ctype.get(dtype_b) == cfg.etype and n % MMA_N == 0 and k % MMA_K == 0
    return a, b


@dataclass(frozen=True)
class RegisterAccumulator:
    """A tensor-core tile matmul's result kept in registers (mma fragments), written by
    ``tile_mma_regs``: a for-loop sum accumulator (``carried``: zeroed before the loop, added to
    each iteration) or one iteration's product whose readers all compute on the fragments."""

    batch: int
    m: int
    n: int
    k: int
    cfg: MmaConfig
    carried: bool = True

    @property
    def tiling(self) -> str:
        """The template arguments of ``MmaTiling`` (prelude.cuh)."""
        return f"{self.batch}, {self.m}, {self.n}, {self.k}, {self.cfg.warps}, {self.cfg.ng}"

    @property
    def dims(self) -> str:
        """The register array's C dims."""
        return f"[{self.cfg.rounds(self.batch, self.m, self.n)}][{self.cfg.ng}][4]"


@dataclass(frozen=True)
class TileMatmul:
    """A block matmul node's operand tiles, sizes and tensor-core plan (``cfg`` None: no tensor
    cores in this block)."""

    a: str
    b: str
    batch: int
    m: int
    k: int
    n: int
    cfg: MmaConfig | None

    @property
    def cfg_is_wgmma(self) -> bool:
        return self.cfg is not None and self.cfg.wgmma


def tile_matmul(node: Any, info: Any, threads: int, bg: Any = None) -> TileMatmul:
    """The geometry of a block matmul ``node`` (BlockInfo ``info``, ``threads`` per block).
    ``bg``: its block graph, when the matmul may take part in a register-operand pair
    (:func:`register_operand_pairs`), whose two matmuls get row tilings (units of 16 x N)."""
    a, b = node.operands
    sa, sb = info.shapes[a], info.shapes[b]
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = math.prod(info.shapes[node.out][:-2])
    da, db = info.dtypes[a], info.dtypes[b]
    math_ = op_math(node.attrs, da, db)
    cfg = wgmma_config(batch, m, n, k, threads, da, db, math_) or \
        mma_config(batch, m, n, threads, math_)
    if bg is not None and cfg is not None and cfg.ng * MMA_N != n and \
            any(node.out in (p.producer, p.consumer) for p in register_operand_pairs(bg, info)):
        cfg = MmaConfig(cfg.warps, n // MMA_N, cfg.etype)
    return TileMatmul(a, b, batch, m, k, n, cfg)


@dataclass(frozen=True)
class RegisterOperand:
    """FlashAttention-2's P in registers: ``value`` is computed element-wise from the fragments
    of ``producer`` (a tile matmul of the loop body) and is the A operand of ``consumer``,
    another tile matmul, taken straight from those fragments. Both matmuls get row tilings --
    units of 16 rows by all columns, unit u of either on the same warp -- so the thread that
    holds C fragment (row, 2t..2t+1) of columns 8j.. holds what the A fragment of the same rows
    and k = 8j.. needs. ``sums``: operators summing ``value`` over its last axis (row sums of
    the probabilities), computed from the fragments by quad shuffles."""

    producer: str  # matmul output: the score tile
    value: str  # the element-wise result on its fragments: the probabilities
    consumer: str  # matmul output whose A operand is ``value``
    sums: tuple[str, ...]


_PAIRS: dict[tuple[int, int], tuple[Any, Any, tuple]] = {}  # (id(bg), id(info)) -> answer


def register_operand_pairs(bg: Any, info: Any) -> tuple[RegisterOperand, ...]:
    """:func:`find_register_operand_pairs`, remembered for the block graph and BlockInfo
    objects (planning asks once per tile matmul)."""
    key = (id(bg), id(info))
    hit = _PAIRS.get(key)
    if hit is not None and hit[0] is bg and hit[1] is info:
        return hit[2]
    if len(_PAIRS) > 512:
        _PAIRS.clear()
    pairs = find_register_operand_pairs(bg, info)
    _PAIRS[key] = (bg, info, pairs)  # holding both keeps their ids from being reused
    return pairs


def find_register_operand_pairs(bg: Any, info: Any) -> tuple[RegisterOperand, ...]:
    """The (score, probabilities, output) patterns of block graph ``bg`` whose probabilities
    can stay in registers: a body tile matmul ``s`` read only by one element-wise or fused
    operator ``e`` (``s`` its only tile operand of ``s``'s shape); every reader of ``e`` is
    either a tensor-core matmul taking it as its A operand only, with the same batch and rows,
    or a sum over the last axis; K (the score tile's columns) a multiple of 16; and the row
    tilings give every warp a unit and fit the register budget (scores, and the product when
    it stays in registers too)."""
    from ..ugraph.graph import BlockOp, Fused, tiles_read  # noqa: PLC0415 -- a layer below
    readers: dict[str, list[Any]] = {}
    for node in bg.ops:
        for t in tiles_read(node):
            readers.setdefault(t, []).append(node)
    out = []
    warps = bg.threads // WARP if bg.threads % WARP == 0 else 0
    for s in bg.ops:
        if not warps or getattr(s, "op", None) != "matmul" or info.phases.get(s.out) is not Phase.BODY:
            continue
        rs = readers.get(s.out, [])
        if len(rs) != 1 or not isinstance(rs[0], (BlockOp, Fused)) or rs[0].out == s.out:
            continue
        e = rs[0]
        if isinstance(e, BlockOp) and getattr(e, "op", None) in ("matmul", "sum", "concat"):
            continue
        if isinstance(e, BlockOp):
            from ..lax.ops import OPS  # noqa: PLC0415
            if not (OPS.get(e.op) and OPS[e.op].elementwise):
                continue
        shape = tuple(info.shapes[s.out])
        if tuple(info.shapes[e.out]) != shape or info.phases.get(e.out) is not Phase.BODY or \
                any(t != s.out and tuple(info.shapes[t]) == shape for t in tiles_read(e)):
            continue
        batch, m, ks = math.prod(shape[:-2]), shape[-2], shape[-1]
        if ks % MMA_K:  # whole k steps (ragged rows are fine: fragment loops skip them)
            continue
        consumers, sums, ok = [], [], True
        for r in readers.get(e.out, []):
            if getattr(r, "op", None) == "matmul" and r.operands[0] == e.out and \
                    r.operands[1] != e.out and info.phases.get(r.out) is Phase.BODY and \
                    math.prod(info.shapes[r.out][:-2]) == batch and info.shapes[r.out][-2] == m:
                consumers.append(r)
            elif getattr(r, "op", None) == "sum" and \
                    tuple(a % len(shape) for a in r.attr("axes")) == (len(shape) - 1,):
                sums.append(r.out)
            else:
                ok = False
        if not ok or len(consumers) != 1:
            continue
        c = consumers[0]
        n = info.shapes[c.out][-1]
        units = batch * -(-m // MMA_M)
        rounds = -(-units // warps)
        budget = register_budget(bg.threads)
        if units < warps or n % MMA_N or rounds * ks // 2 > budget or rounds * n // 2 > budget:
            continue
        cfg = mma_config(batch, m, n, bg.threads,
                         op_math(c.attrs, info.dtypes[e.out], info.dtypes[c.operands[1]]))
        if cfg is None or not cfg.sixteen_bit:  # TF32 A fragments are not C fragments
            continue
        out.append(RegisterOperand(s.out, e.out, c.out, tuple(sums)))
    return tuple(out)


def wgmma_operands(bg: Any, info: Any) -> dict[str, int]:
    """Operand tile of a warpgroup MMA in block graph ``bg`` -> its row bytes (one swizzle atom
    wide: the atom is 8 such rows, the alignment its offset needs, and the row width selects
    the canonical swizzle, see :func:`.swizzle.canonical_swizzle`)."""
    out: dict[str, int] = {}
    for node in bg.ops:
        if getattr(node, "op", None) == "matmul":
            t = tile_matmul(node, info, bg.threads, bg)
            if t.cfg_is_wgmma:
                for tile in (t.a, t.b):
                    out[tile] = info.shapes[tile][-1] * DTYPES[info.dtypes[tile]]
    return out


def register_tile(node: Any, info: Any, threads: int, carried: bool,
                  bg: Any = None) -> RegisterAccumulator | None:
    """The register form of a tile matmul node's result, or None when it does not run on tensor
    cores or its fragments exceed :func:`register_budget`. ``bg``: see :func:`tile_matmul`."""
    t = tile_matmul(node, info, threads, bg)
    if t.cfg is None or t.cfg.register_floats(t.batch, t.m, t.n) > register_budget(threads):
        return None
    return RegisterAccumulator(t.batch, t.m, t.n, t.k, t.cfg, carried)


def register_accumulators(bg: Any, info: Any,
                          folded: dict[str, str]) -> dict[str, RegisterAccumulator]:
    """Accumulators that stay in registers over the loop: a tile matmul folded into a sum
    accumulator (``folded``: tile -> accumulator) that runs on tensor cores and whose fragments
    fit :func:`register_budget`."""
    out: dict[str, RegisterAccumulator] = {}
    for node in bg.ops:
        if getattr(node, "op", None) == "matmul" and node.out in folded:
            reg = register_tile(node, info, bg.threads, carried=True, bg=bg)
            if reg is not None:
                out[folded[node.out]] = reg
    return out
