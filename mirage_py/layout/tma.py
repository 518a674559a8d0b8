"""Which tiles arrive by TMA (the Tensor Memory Accelerator, sm_90+), and how.

A tile of the cp.async software pipeline (see :mod:`.plan`) may instead be fetched whole by one
``cp.async.bulk.tensor`` instruction that a single thread issues; its bytes are counted on an
``mbarrier`` per pipeline stage, which every thread waits on before reading the tile. The
instruction reads a *tensor map*: the global tensor's dims and byte strides, the box (the tile)
and the shared-memory swizzle, innermost dim first. The box lands in shared memory dense, in
the map's dim order, with the swizzle applied to absolute shared-memory addresses.

A tile qualifies when all of this holds (otherwise it keeps its 16-byte cp.async copies):

* the target has TMA (``Target.tma``) and the tile is loaded with 16-byte copies either in the
  software pipeline (the loop body, two or more stages in flight: one mbarrier per stage) or
  once per block (loop-invariant tiles, or the body of a one-iteration loop: one more mbarrier,
  used once);
* the map's dims are the tensor's dims of size > 1 in reverse order, at most five; the innermost
  one is contiguous (stride 1) and the tile's box along it is a multiple of 16 bytes; every
  other stride is a multiple of 16 bytes and spans at least the dims inside it (the driver's
  rule for ``globalStrides``); every box dim is at most 256. Then the dense box *is* the tile's
  row-major layout;
* the tile's XOR swizzle is none or the TMA swizzle of its row width: 32, 64 or 128-byte rows
  with ``Swizzle<B, log2(16 / element bytes), 3>`` (16-byte chunks XOR the row bits 7.. of the
  byte address -- the modes ``CU_TENSOR_MAP_SWIZZLE_32B/64B/128B``, the same layouts wgmma
  reads). A wider row with a swizzle cannot be expressed (the box's inner dim may not exceed
  the swizzle span) and stays on cp.async;
* the tile's bytes are a multiple of its shared-memory alignment (:func:`tma_alignment`: 128
  bytes, or the swizzle's repeat of 8 rows), so every pipeline buffer starts aligned;
* it loads in the same barrier stage as the other TMA tiles of its kind (the stage with the most
  TMA bytes wins): each mbarrier is armed once per phase, with the bytes of all of them, by the
  code that issues them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..lax.ops import DTYPES
from ..targets import Target
from ..ugraph.graph import GraphKernel, InputIter
from ..ugraph.phase import Phase
from ..ugraph.validate import BlockInfo
from .schedule import LOAD, BlockSchedule
from .swizzle import CANONICAL_ROW_BYTES, Swizzle, canonical_swizzle
from .tensors import DevicePlan

MAX_RANK = 5
MAX_BOX = 256


@dataclass(frozen=True)
class TmaCopy:
    """One tile's tensor map and copy, map dims innermost first."""

    tile: str
    input: int  # position of the tensor among the graph kernel's inputs
    tensor: str
    dtype: str
    dims: tuple[int, ...]  # global sizes
    strides: tuple[int, ...]  # bytes, of dims 1.. (the innermost is contiguous)
    box: tuple[int, ...]  # the tile's sizes
    logical: tuple[int, ...]  # the tensor dim behind each map dim
    swizzle: int  # CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3 128B

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def nbytes(self) -> int:
        return math.prod(self.box) * DTYPES[self.dtype]


def tma_alignment(shape: tuple[int, ...], dtype: str) -> int:
    """Shared-memory alignment of a TMA destination: 128 bytes, or 8 rows when the rows are 32,
    64 or 128 bytes wide (the repeat of the swizzle such rows may carry)."""
    row = shape[-1] * DTYPES[dtype] if shape else 0
    return 8 * row if row in CANONICAL_ROW_BYTES else 128


def tma_swizzle(shape: tuple[int, ...], dtype: str, swz: Swizzle | None) -> int | None:
    """The CUtensorMapSwizzle that stores the tile as ``swz`` does (0 none, 1 32B, 2 64B,
    3 128B: the B of the mode's canonical swizzle), or None if none can."""
    if swz is None or swz.is_identity:
        return 0
    return swz.bits if swz == canonical_swizzle(shape[-1] * DTYPES[dtype], DTYPES[dtype]) \
        else None


def tma_geometry(it: InputIter, info: BlockInfo, device: DevicePlan, tensor: str,
                 swz: Swizzle | None) -> TmaCopy | None:
    """The tensor map of iterator ``it``'s tile, or None when TMA cannot fetch it exactly."""
    if it.gather >= 0:  # rows picked through indices: no box of the table
        return None
    lay = device.layouts[tensor]
    shape = info.shapes[it.out]
    dtype = info.dtypes[it.out]
    if dtype != lay.dtype or len(shape) != len(lay.shape):
        return None
    eb = DTYPES[dtype]
    dims = [d for d in reversed(range(len(lay.shape))) if lay.shape[d] > 1]
    if not dims or len(dims) > MAX_RANK or dims[0] != len(shape) - 1 or lay.strides[dims[0]] != 1:
        return None
    box = tuple(shape[d] for d in dims)
    if any(b > MAX_BOX for b in box) or (box[0] * eb) % 16:
        return None
    strides = tuple(lay.strides[d] * eb for d in dims[1:])
    span = lay.shape[dims[0]] * eb
    for d, s in zip(dims[1:], strides):
        if s % 16 or s < span or s >= 2**40:
            return None
        span = s * lay.shape[d]
    mode = tma_swizzle(shape, dtype, swz)
    if mode is None:
        return None
    if (math.prod(shape) * eb) % tma_alignment(shape, dtype):
        return None
    return TmaCopy(it.out, it.input, tensor, dtype, tuple(lay.shape[d] for d in dims), strides,
                   box, tuple(dims), mode)


def plan_tma(gk: GraphKernel, info: BlockInfo, sched: BlockSchedule, device: DevicePlan,
             pipelined: tuple[str, ...], target: Target,
             swizzles: dict[str, Swizzle] | None) -> dict[str, TmaCopy]:
    """tile -> its TMA copy, for the pipelined tiles that qualify. ``swizzles``: the chosen
    swizzles, or None to assume each tile gets one TMA can write (the cost model's quick plan,
    which skips choosing them)."""
    if not target.tma or not pipelined or not sched.loop_barrier:
        return {}
    return _one_stage(gk, info, sched, device, swizzles,
                      [st for st in sched.steps if st.writes in pipelined])


def plan_tma_once(gk: GraphKernel, info: BlockInfo, sched: BlockSchedule, device: DevicePlan,
                  pipelined: tuple[str, ...], target: Target,
                  swizzles: dict[str, Swizzle] | None) -> dict[str, TmaCopy]:
    """tile -> its TMA copy, for the tiles loaded once per block -- loop-invariant tiles (the
    queries of attention), or body tiles of a one-iteration loop -- with 16-byte copies that
    qualify (the same rules; one mbarrier, armed once, parity 0)."""
    if not target.tma:
        return {}
    once = [st for st in sched.steps
            if st.kind == LOAD and st.vector > 1 and not st.into and st.writes not in pipelined
            and (st.segment is Phase.PRE or st.segment is Phase.BODY and gk.block.forloop == 1)]
    return _one_stage(gk, info, sched, device, swizzles, once)


def _one_stage(gk: GraphKernel, info: BlockInfo, sched: BlockSchedule, device: DevicePlan,
               swizzles: dict[str, Swizzle] | None, steps: list) -> dict[str, TmaCopy]:
    """The TMA copies of the load ``steps`` that qualify, keeping those of one barrier stage."""
    by_stage: dict[int, dict[str, TmaCopy]] = {}
    for st in steps:
        if not isinstance(st.node, InputIter):
            continue
        shape, eb = info.shapes[st.writes], DTYPES[info.dtypes[st.writes]]
        swz = canonical_swizzle(shape[-1] * eb, eb) if swizzles is None else \
            swizzles.get(st.writes)
        copy = tma_geometry(st.node, info, device, gk.inputs[st.node.input], swz)
        if copy is not None:
            by_stage.setdefault(st.stage, {})[st.writes] = copy
    # each mbarrier is armed once per phase by the code that issues the copies: TMA tiles must
    # load in one stage (a serialised schedule loads each tile in its own stage; the tiles of
    # the others keep cp.async)
    return max(by_stage.values(), key=lambda cs: (sum(c.nbytes for c in cs.values()), len(cs)),
               default={})
