"""Order the operators of a block graph into barrier-separated *stages*.

A graph-defined kernel runs in three segments, the phases of :mod:`mirage_py.ugraph.phase`:
``PRE`` (loads of loop-invariant tiles, operators on them, accumulators set to zero), ``BODY``
(the for-loop: per-iteration loads, operators, accumulator updates) and ``POST`` (the epilogue:
operators on accumulated tiles, output savers).
Inside a segment, steps are grouped into stages; one ``__syncthreads()`` separates consecutive
stages. A step goes into the earliest stage after every stage that wrote a tile it reads,
except that it may share the producer's stage when it reads the tile *aligned*: the step and the
producer both map element ``i`` of the tile to thread ``i % threads`` (element-wise loops,
scalar loads, accumulator updates) and the reader sees the tile with its own shape (no
broadcasting), so each thread only reads what it wrote itself. This ASAP grouping needs the fewest
barriers a DAG allows (its longest chain of non-aligned dependencies).

A body operator or load whose only reader is a sum accumulator adds its result straight into
the accumulator (``acc += a @ b``, ``acc += tile loaded from global``): its own tile is never
stored and the accumulator update costs no separate step.

``lean=True`` gives every step a stage of its own, in graph order: more barriers, but tiles live
exactly as long as :func:`~mirage_py.ugraph.validate.shared_memory_bytes` assumes, so the plan
fits wherever validation said the graph fits (the planner's fallback).

The loop needs a barrier at the end of each iteration only when its body has more than one stage
(otherwise every body tile is read by the thread that wrote it).

Online softmax: a running accumulator's update (a ``max``) also stores this iteration's rescale
factor ``exp(m_{i-1} - m_i)`` in the second half of its tile; every sum rescaled by it gets a
``rescale`` step (``acc *= factor``, in shared memory or on its register fragments) right after
that update, and whatever adds into the sum this iteration -- its accumulate step, a matmul
folded into it, a fragment loop adding into its registers -- comes after the rescale.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..lax.ops import DTYPES, OPS
from ..ugraph.graph import (Accum, BlockGraph, BlockOp, Fused, InputIter, MaskIter, OutputSaver,
                            tiles_read)
from ..ugraph.phase import BODY, POST, PRE, SEGMENTS, Phase
from ..ugraph.validate import BlockInfo
from .mma import register_accumulators, register_operand_pairs, register_tile
from .tensors import ROW_ALIGN, TensorLayout


# step kinds
LOAD, COMPUTE, INIT, ACCUMULATE, RESCALE, SAVE = ("load", "compute", "init", "accumulate",
                                                  "rescale", "save")


@dataclass(frozen=True)
class Step:
    """One unit of work of a block: ``writes`` is the tile it defines (None for a saver)."""

    kind: str
    node: Any  # the block node it comes from
    segment: Phase
    stage: int
    writes: str | None
    reads: tuple[str, ...]
    vector: int = 1  # elements per 16-byte copy of a vectorised load or store (1: scalar)
    into: bool = False  # a compute step that adds its result into the accumulator ``writes``
    frag: str | None = None  # an epilogue computed on this register accumulator's fragments
    also: str | None = None  # a register sum accumulator this fragment step also adds into

    @property
    def flat(self) -> bool:
        """Element i of the written tile is produced by thread i % threads."""
        if self.frag is not None:
            return False
        if self.kind == LOAD:
            return self.vector == 1
        if self.kind == COMPUTE:
            return isinstance(self.node, Fused) or OPS.get(self.node.op) is not None and \
                OPS[self.node.op].elementwise
        return self.kind in (INIT, ACCUMULATE, RESCALE)


@dataclass(frozen=True)
class BlockSchedule:
    steps: tuple[Step, ...]  # in emission order (by stage, then graph order)
    stages: dict[Phase, tuple[int, ...]]  # segment -> its stage numbers (consecutive)
    loop_barrier: bool  # a barrier closes every loop iteration
    registers: dict = field(default_factory=dict)  # accumulator -> RegisterAccumulator
    spilled: tuple[str, ...] = ()  # register accumulators also written to shared memory

    @property
    def last_stage(self) -> int:
        return max((s.stage for s in self.steps), default=0)

    def in_stage(self, stage: int) -> list[Step]:
        return [s for s in self.steps if s.stage == stage]

    def program(self) -> list[tuple[str, Any]]:
        """The order of execution as events: ``("stage", n)``, ``("barrier", why)``,
        ``("loop", None)`` (the for-loop opens) and ``("end_loop", None)``."""
        pre, body, post = (self.stages[s] for s in SEGMENTS)
        ev: list[tuple[str, Any]] = []

        def run(stages: tuple[int, ...]) -> None:
            for i, st in enumerate(stages):
                if i:
                    ev.append(("barrier", f"stage {st} reads what stage {st - 1} wrote"))
                ev.append(("stage", st))
        run(pre)
        if pre and (body or post):
            ev.append(("barrier", "loop-invariant tiles and accumulators are ready"))
        if body:
            ev.append(("loop", None))
            run(body)
            if self.loop_barrier:
                ev.append(("barrier", "end of iteration: the next one overwrites body tiles"))
            ev.append(("end_loop", None))
            if post and not self.loop_barrier:
                ev.append(("barrier", "accumulators are complete"))
        run(post)
        return ev

    def barriers(self, forloop: int) -> int:
        """``__syncthreads()`` calls one thread executes."""
        n, inside = 0, False
        for kind, _ in self.program():
            if kind == "loop":
                inside = True
            elif kind == "end_loop":
                inside = False
            elif kind == "barrier":
                n += forloop if inside else 1
        return n


def vector_width(layout: TensorLayout, tile: tuple[int, ...]) -> int:
    """Elements per 16-byte copy between a dense tile in shared memory (16-byte aligned) and a
    tensor of ``layout`` in global memory -- an iterator's load or an output saver's store -- or
    1 when the tile's rows are not 16-byte aligned in global memory. Block offsets along the
    innermost dim are multiples of the tile size, so the tile's innermost size and the tensor's
    row strides decide."""
    per = ROW_ALIGN // DTYPES[layout.dtype]
    big = [d for d, n in enumerate(tile) if n > 1]
    if not big:
        return 1
    d = big[-1]  # consecutive tile elements run along this dim (trailing dims are 1 wide)
    if layout.strides[d] != 1 or tile[d] % per:
        return 1
    return 1 if any(s % per for i, s in enumerate(layout.strides)
                    if i != d and layout.shape[i] > 1) else per


def _aligned_read(step_kind: str, node: Any, tile: str, info: BlockInfo,
                  vector: int = 1) -> bool:
    """Does this step read ``tile`` element i on thread i % threads (given a flat producer)?"""
    if step_kind == SAVE:
        return vector == 1
    if step_kind in (ACCUMULATE, RESCALE):  # a rescale reads its running value broadcast
        return tuple(info.shapes[tile]) == tuple(info.shapes[node.out])
    if step_kind != COMPUTE:
        return False
    elementwise = isinstance(node, Fused) or (OPS.get(node.op) is not None and
                                              OPS[node.op].elementwise)
    if not elementwise:
        return False
    out, shape = info.shapes[node.out], info.shapes[tile]
    return (1,) * (len(out) - len(shape)) + tuple(shape) == tuple(out)


def fold_into_accumulators(bg: BlockGraph, info: BlockInfo) -> dict[str, str]:
    """Body tiles (loaded or computed) read only by one sum accumulator: tile -> accumulator."""
    readers: dict[str, list[Any]] = {}
    for node in bg.ops:
        for t in tiles_read(node):
            readers.setdefault(t, []).append(node)
    out = {}
    for node in bg.ops:
        if isinstance(node, (InputIter, BlockOp, Fused)) and info.phases[node.out] is BODY:
            r = readers.get(node.out, [])
            if len(r) == 1 and isinstance(r[0], Accum) and r[0].kind == "sum":
                out[node.out] = r[0].out
    return out


def _fragment_reader(node: Any, info: BlockInfo, tiles: dict, phase: Phase) -> str | None:
    """The register tile an element-wise (or fused) operator of ``phase`` can compute from:
    its register operands share one warp tiling and have the operator's own shape."""
    if not isinstance(node, (BlockOp, Fused)) or info.phases.get(node.out) != phase:
        return None
    if isinstance(node, BlockOp) and not (OPS.get(node.op) and OPS[node.op].elementwise):
        return None
    regs = [t for t in tiles_read(node) if t in tiles]
    if not regs or len({tiles[t].tiling for t in regs}) != 1:
        return None
    if any(tuple(info.shapes[t]) != tuple(info.shapes[node.out]) for t in regs):
        return None
    return regs[0]


def register_tiles(bg: BlockGraph, info: BlockInfo,
                   folded: dict[str, str]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """Tiles held as mma fragments in registers, and the operators that compute from them.

    * loop accumulators of tensor-core matmuls (:func:`register_accumulators`), read after the
      loop by *register epilogues* -- element-wise or fused operators on their fragments;
    * one iteration's tensor-core matmul result (such as an attention score tile) whose every
      reader is an element-wise or fused operator of the loop body that can compute on its
      fragments (the exp of the scores): it never touches shared memory;
    * a sum accumulator of a value computed on such fragments (the running sum of the exp of
      the scores): it keeps the fragments' tiling and is added to where the value is computed,
      with no accumulate step of its own;
    * a value computed on such fragments that is the A operand of another tile matmul and
      otherwise only summed over its rows (the probabilities of attention,
      :func:`~.mma.register_operand_pairs`): it stays in registers, and the matmul and the row
      sums read its fragments.

    Returns (tile -> RegisterAccumulator, operator output -> the register tile it reads,
    value -> the register sum accumulator it is added into)."""
    tiles = register_accumulators(bg, info, folded)
    readers: dict[str, list[Any]] = {}
    for node in bg.ops:
        for t in tiles_read(node):
            readers.setdefault(t, []).append(node)
    for node in bg.ops:
        if getattr(node, "op", None) != "matmul" or node.out in folded or \
                info.phases.get(node.out) is not BODY:
            continue
        reg = register_tile(node, info, bg.threads, carried=False, bg=bg)
        rs = readers.get(node.out, [])
        if reg is not None and rs and all(
                _fragment_reader(r, info, {node.out: reg}, BODY) == node.out for r in rs):
            tiles[node.out] = reg
    frags = {}
    for node in bg.ops:
        for phase in (POST, BODY):
            owners = {t: r for t, r in tiles.items() if r.carried == (phase is POST)}
            t = _fragment_reader(node, info, owners, phase)
            if t is not None:
                frags[node.out] = t
    adds: dict[str, str] = {}
    for node in bg.ops:
        if not isinstance(node, Accum) or node.kind != "sum" or node.out in tiles:
            continue
        owner = tiles.get(frags.get(node.input, ""))
        if owner is not None and not owner.carried and \
                tuple(info.shapes[node.out]) == tuple(info.shapes[node.input]):
            tiles[node.out] = replace(owner, carried=True)
            adds[node.input] = node.out
    # probabilities in registers (FlashAttention-2): the value computed on the score tile's
    # fragments stays there, and the matmul taking it as A and its row sums read the fragments
    for p in register_operand_pairs(bg, info):
        owner = tiles.get(p.producer)
        if owner is None or owner.carried or frags.get(p.value) != p.producer or \
                p.value in adds:
            continue
        tiles[p.value] = owner
        for reader in (p.consumer, *p.sums):
            frags[reader] = p.value
    return tiles, frags, adds


def schedule_block(bg: BlockGraph, info: BlockInfo, input_layouts: list[TensorLayout],
                   lean: bool = False,
                   output_layouts: list[TensorLayout] | None = None,
                   tensor_cores: bool = True) -> BlockSchedule:
    """Group the block graph's steps into stages (see the module docstring)."""
    folded = fold_into_accumulators(bg, info)
    registers, frags, adds = register_tiles(bg, info, folded) if tensor_cores else ({}, {}, {})
    rescaled: dict[str, list[Accum]] = {}  # running accumulator -> the sums it rescales
    for node in bg.ops:
        if isinstance(node, Accum) and node.rescale is not None:
            rescaled.setdefault(node.rescale, []).append(node)
    raw: list[tuple[str, Phase, Any, str | None, tuple[str, ...], int, bool]] = []
    for node in bg.ops:
        if isinstance(node, InputIter):
            seg = info.phases[node.out]  # an iterator's: BODY or PRE
            acc = folded.get(node.out)
            # a gathering iterator copies element by element (each row's address is read from
            # the indices: no 16-byte cp.async runs or TMA boxes across rows)
            vec = 1 if node.gather >= 0 else \
                vector_width(input_layouts[node.input], info.shapes[node.out])
            raw.append((LOAD, seg, node, acc or node.out, (), vec, acc is not None))
        elif isinstance(node, MaskIter):  # computed from indices, element i on thread i % T
            raw.append((LOAD, info.phases[node.out], node, node.out, (), 1, False))
        elif isinstance(node, (BlockOp, Fused)):
            seg = info.phases[node.out]  # an operator's: PRE, BODY or POST
            acc = folded.get(node.out)
            reads = tuple(t for t in tiles_read(node) if not (node.out in frags and
                                                            t in registers))
            raw.append((COMPUTE, seg, node, acc or node.out, reads, 1, acc is not None))
        elif isinstance(node, Accum):
            raw.append((INIT, PRE, node, node.out, (), 1, False))
            if node.input not in folded and adds.get(node.input) != node.out:
                raw.append((ACCUMULATE, BODY, node, node.out, (node.input,), 1, False))
            for acc in rescaled.get(node.out, ()):  # before anything adds into them
                raw.append((RESCALE, BODY, acc, acc.out, (node.out,), 1, False))
        elif isinstance(node, OutputSaver):
            vec = 1 if output_layouts is None else \
                vector_width(output_layouts[node.output], info.shapes[node.input])
            raw.append((SAVE, POST, node, None, (node.input,), vec, False))

    stages: dict[Phase, tuple[int, ...]] = {}
    placed: list[Step] = []
    writer: dict[str, Step] = {}
    rescaler: dict[str, Step] = {}  # a rescaled sum -> this iteration's rescale step
    start = 0
    for seg in SEGMENTS:
        mine = [r for r in raw if r[1] is seg]
        top = start - 1
        for kind, _, node, out, reads, vec, into in mine:
            stage = top + 1 if lean else start
            frag = frags.get(getattr(node, "out", None)) if kind == COMPUTE else None
            if kind == RESCALE and out in registers:
                frag = out  # the factor applied to the sum's own fragments
            also = adds.get(node.out) if frag is not None and not into and kind == COMPUTE \
                else None
            flat_probe = Step(kind, node, seg, 0, out, reads, vec, into, frag, also)
            for t in (out if kind != RESCALE and (into or kind == ACCUMULATE) else None, also):
                r = rescaler.get(t) if t is not None else None
                if r is not None:  # adds into a rescaled sum: after this iteration's rescale
                    same = t in registers or (kind == ACCUMULATE and r.flat)
                    stage = max(stage, r.stage if same else r.stage + 1)
            if frag is not None:  # after the fragments' producer (its stage is fine)
                w = writer.get(frag)
                if w is not None and w.segment == seg:
                    stage = max(stage, w.stage)
            for t in reads:
                w = writer.get(t)
                if w is None or w.segment != seg:
                    continue  # written in an earlier segment: a barrier already separates them
                if (kind == ACCUMULATE and w.kind == INIT) or \
                        (w.flat and frag is None and _aligned_read(kind, node, t, info, vec) and
                         (kind == SAVE or flat_probe.flat)):
                    stage = max(stage, w.stage)
                else:
                    stage = max(stage, w.stage + 1)
            step = Step(kind, node, seg, stage, out, reads, vec, into, frag, also)
            placed.append(step)
            if kind == RESCALE:
                rescaler[out] = step
            elif out is not None:
                writer[out] = step
            top = max(top, stage)
        stages[seg] = tuple(range(start, top + 1))
        start = top + 1
    steps = tuple(sorted(placed, key=lambda s: (s.stage, placed.index(s))))
    # a register accumulator goes to shared memory after the loop unless every reader of it
    # computes from its fragments
    spilled = tuple(a for a in registers if any(a in st.reads for st in steps))
    return BlockSchedule(steps, stages, loop_barrier=len(stages[BODY]) > 1,
                         registers=registers, spilled=spilled)
