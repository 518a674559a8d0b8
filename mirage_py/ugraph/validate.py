"""Validity of μGraphs, per level, with one typed error per broken rule.

Rules (the ``rule`` attribute of :class:`~mirage_py.errors.ValidationError`):

``ssa``             every tensor / tile name is defined exactly once and before it is used
``operator``        the operator is known at that level, with the right number of operands and
                    the attributes it needs
``shape``           operand shapes fit the operator; declared output shapes match inferred ones
``dtype``           device tensors are float16 / bfloat16 / float32; operands' dtypes may combine
``grid``            grid dims >= 1 and within the target's limits
``threads``         thread count a multiple of 32, between 32 and the target's maximum
``forloop``         loop range >= 1
``imap``            imap / fmap / omap name existing dims, no dim split twice
``tile-divides``    every split (grid axis or loop) divides the dim evenly
``phase``           no operator mixes loop-body tiles with accumulated ones; accumulators take
                    body (or invariant) tiles; per-iteration tiles are saved only when forloop == 1;
                    a running accumulator (max / min) may be read in the loop and after it; a
                    sum rescaled by one (online softmax) names a running accumulator
``output-coverage`` the blocks together write every output element exactly once; every graph
                    output has exactly one producer
``smem``            the tiles live at the same time fit the target's shared memory per block
``binding``         a graph-defined kernel's iterators and savers refer to existing inputs/outputs
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import MirageError, ShapeError, ValidationError
from ..lax.ops import DTYPES, OPS, is_index
from ..lax.precision import MatmulMath
from ..lax.shapes import Affine
from ..lax.tensor import broadcast_shapes
from ..targets import Target, get_target
from .graph import (ACCUM_KINDS, AXES, Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                    InputIter, KernelGraph, KernelOp, MaskIter, OutputSaver, ThreadGraph,
                    iter_source, iter_tile_shape, matmul_shape, sum_shape, tiles_read)
from .phase import Phase, combine

REDUCTIONS = ("sum", "max", "min")
BLOCK_OPS = ("matmul", *REDUCTIONS, "concat", "slice", "reshape", "transpose")
KERNEL_OPS = ("matmul", *REDUCTIONS, "rms_norm", "reshape", "transpose", "slice", "concat",
              "mask", "take")


def _err(msg: str, rule: str, op: str | None) -> ValidationError:
    return ValidationError(f"{op + ': ' if op else ''}{msg} [rule: {rule}]", rule=rule, op=op)


@dataclass
class BlockInfo:
    """What validation learns about a block graph, reused by the interpreter and codegen."""

    shapes: dict[str, tuple[int, ...]]  # tile shapes
    dtypes: dict[str, str]  # tile dtypes: device dtype for loaded tiles, float32 otherwise
    phases: dict[str, Phase]  # when each tile is computed (ugraph.phase)
    smem_bytes: int


def _elementwise_shape(who: str, label: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    # ``who`` (the block node) goes into the message, ``label`` (the kernel) is the error's op,
    # as for every other block-level error
    try:
        return broadcast_shapes(who, *shapes) if shapes else ()
    except ShapeError as e:
        raise _err(str(e), "shape", label) from None


def _check_attrs(op: str, attrs: Any, who: str, label: str) -> None:
    """The attributes an elementwise operator needs (a clamp's bounds, a pow's exponent)."""
    spec = OPS[op]
    have = {k for k, _ in attrs}
    missing = set(spec.attrs) - set(spec.optional) - have
    extra = have - set(spec.attrs)
    if missing or extra:
        raise _err(f"{who}: {op} needs attributes {sorted(set(spec.attrs) - set(spec.optional))}"
                   f"{' (optional ' + str(sorted(spec.optional)) + ')' if spec.optional else ''}"
                   f", got {sorted(have)}", "operator", label)


def _mask_attrs_ok(offset: Any, window: Any, valid: Any) -> bool:
    """A mask's offset and window are ints (a window >= 0) or expressions of dims; ``valid``,
    if any, two of those."""
    def expr(v: Any) -> bool:
        return isinstance(v, Affine) or (isinstance(v, int) and not isinstance(v, bool))
    return expr(offset) and expr(window) and (not isinstance(window, int) or window >= 0) and \
        (valid is None or (isinstance(valid, tuple) and len(valid) == 2 and all(map(expr, valid))))


def _check_matmul_attrs(attrs: Any, who: str, label: str) -> None:
    """A matmul may say how it multiplies (``math``: lax/precision.py), and nothing else."""
    extra = {k for k, _ in attrs} - {"math"}
    math_ = dict(attrs).get("math")
    if extra or (math_ is not None and math_ not in {m.value for m in MatmulMath}):
        raise _err(f"{who}: a matmul takes only a math attribute (one of "
                   f"{', '.join(m.value for m in MatmulMath)}), got {dict(attrs)}", "operator",
                   label)


def _slice_shape(shape: tuple[int, ...], attrs: dict[str, Any], who: str,
                 label: str) -> tuple[int, ...]:
    ax, lo, hi = attrs.get("axis"), attrs.get("start"), attrs.get("stop")
    if not all(isinstance(v, int) for v in (ax, lo, hi)) or not 0 <= ax < len(shape) or \
            not 0 <= lo < hi <= shape[ax]:
        raise _err(f"{who}: axis={ax} {lo}:{hi} does not fit {shape}", "shape", label)
    return shape[:ax] + (hi - lo,) + shape[ax + 1:]


def _concat_shape(shapes: list[tuple[int, ...]], axis: Any, who: str,
                  label: str) -> tuple[int, ...]:
    if len({len(s) for s in shapes}) != 1 or not isinstance(axis, int) or \
            not -len(shapes[0]) <= axis < len(shapes[0]):
        raise _err(f"{who}: concat needs tiles of one rank and an axis within it", "shape", label)
    ax = axis % len(shapes[0])
    rest = {tuple(d for i, d in enumerate(s) if i != ax) for s in shapes}
    if len(rest) != 1:
        raise _err(f"{who}: tiles {shapes} differ outside axis {ax}", "shape", label)
    return tuple(sum(s[ax] for s in shapes) if i == ax else d for i, d in enumerate(shapes[0]))


def _thread_shape(tg: ThreadGraph, who: str, label: str,
                  in_shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    if tg.ninputs != len(in_shapes):
        raise _err(f"{who}: thread graph takes {tg.ninputs} inputs, given {len(in_shapes)}",
                   "operator", label)
    if not tg.ops:
        raise _err(f"{who}: thread graph has no operators", "operator", label)
    env = {f"in{i}": s for i, s in enumerate(in_shapes)}
    for t in tg.ops:
        spec = OPS.get(t.op)
        if spec is None or not spec.elementwise:
            raise _err(f"{who}: thread op {t.out!r}: {t.op!r} is not an elementwise operator",
                       "operator", label)
        if len(t.operands) != spec.arity:
            raise _err(f"{who}: thread op {t.out!r}: {t.op} takes {spec.arity} operand(s)",
                       "operator", label)
        _check_attrs(t.op, t.attrs, f"{who}: thread op {t.out!r}", label)
        shapes = []
        for o in t.operands:
            if isinstance(o, str):
                if o not in env:
                    raise _err(f"{who}: thread op {t.out!r} uses undefined value {o!r}", "ssa",
                               label)
                shapes.append(env[o])
            elif not isinstance(o, (int, float)) or isinstance(o, bool):
                raise _err(f"{who}: thread op {t.out!r}: operand {o!r} is neither a value name "
                           "nor a number", "operator", label)
        if t.out in env:
            raise _err(f"{who}: thread value {t.out!r} defined twice", "ssa", label)
        env[t.out] = _elementwise_shape(f"{who}: thread op {t.out!r} = {t.op}", label, shapes)
    return env[tg.ops[-1].out]


def check_block(bg: BlockGraph, ins: list[DTensor], outs: list[DTensor], target: Target,
                label: str = "graph kernel") -> BlockInfo:
    """Validate one block graph against the kernel's input and output tensors."""
    if len(bg.grid) != 3 or any(not isinstance(g, int) or g < 1 for g in bg.grid):
        raise _err(f"grid {bg.grid} must be three ints >= 1", "grid", label)
    for a in range(3):
        if bg.grid[a] > target.max_grid[a]:
            raise _err(f"grid.{AXES[a]} = {bg.grid[a]} exceeds {target.name}'s limit "
                       f"{target.max_grid[a]}", "grid", label)
    if bg.threads % 32 or not 32 <= bg.threads <= target.max_threads:
        raise _err(f"{bg.threads} threads: must be a multiple of 32 in [32, {target.max_threads}]",
                   "threads", label)
    if not isinstance(bg.forloop, int) or bg.forloop < 1:
        raise _err(f"forloop range {bg.forloop} must be >= 1", "forloop", label)

    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    phases: dict[str, Phase] = {}
    saved: dict[int, OutputSaver] = {}

    def use(name: Any, who: str) -> None:
        if isinstance(name, str) and name not in shapes:
            raise _err(f"{who} uses undefined tile {name!r}", "ssa", label)

    def define(name: str, shape: tuple[int, ...], dtype: str, phase: Phase, who: str) -> None:
        if name in shapes:
            raise _err(f"{who}: tile {name!r} is defined twice", "ssa", label)
        shapes[name], dtypes[name], phases[name] = shape, dtype, phase

    def phase_of(operands: tuple[Any, ...], who: str) -> Phase:
        ph = combine(*(phases[o] for o in operands if isinstance(o, str)))
        if ph is None:
            raise _err(f"{who} mixes per-iteration tiles with accumulated tiles", "phase", label)
        return ph

    for node in bg.ops:
        if isinstance(node, InputIter):
            who = f"input iterator {node.out!r}"
            if not 0 <= node.input < len(ins) or not -1 <= node.gather < len(ins):
                raise _err(f"{who} reads input #{node.input} (gather {node.gather}), the "
                           f"kernel has {len(ins)}", "binding", label)
            if is_index(ins[node.input].dtype):
                raise _err(f"{who} reads the index tensor {ins[node.input].name!r} as data; "
                           "indices only pick rows (gather=)", "dtype", label)
            if node.gather >= 0 and (not is_index(ins[node.gather].dtype) or
                                     not ins[node.input].shape):
                raise _err(f"{who} gathers rows of {ins[node.input].name!r} "
                           f"{ins[node.input].shape} by {ins[node.gather].name!r} "
                           f"{ins[node.gather].dtype}, which is not an index tensor",
                           "dtype", label)
            t = iter_source(node, ins)
            nd = len(t.shape)
            dims = [d for d in node.imap if d >= 0]
            if len(node.imap) != 3 or any(d >= nd or d < -1 for d in node.imap) or \
                    not -1 <= node.fmap < nd:
                raise _err(f"{who}: imap {node.imap} / fmap {node.fmap} name dims outside "
                           f"{t.name} {t.shape}", "imap", label)
            if len(set(dims)) != len(dims):
                raise _err(f"{who}: imap {node.imap} splits one dim of {t.name} over two grid "
                           "axes", "imap", label)
            for a in range(3):
                if node.imap[a] >= 0 and t.shape[node.imap[a]] % bg.grid[a]:
                    raise _err(f"{who}: dim {node.imap[a]} of {t.name} {t.shape} does not split "
                               f"evenly over grid.{AXES[a]} = {bg.grid[a]}", "tile-divides", label)
            tile = iter_tile_shape(t.shape, bg.grid, node.imap, -1, 1)
            if node.fmap >= 0 and tile[node.fmap] % bg.forloop:
                raise _err(f"{who}: dim {node.fmap} of {t.name} (tile size {tile[node.fmap]}) "
                           f"does not split evenly over forloop = {bg.forloop}",
                           "tile-divides", label)
            define(node.out, iter_tile_shape(t.shape, bg.grid, node.imap, node.fmap, bg.forloop),
                   t.dtype, Phase.BODY if node.fmap >= 0 else Phase.PRE, who)
        elif isinstance(node, MaskIter):
            who = f"mask iterator {node.out!r}"
            shape = tuple(node.shape)
            if len(shape) != 2 or any(not isinstance(d, int) or d < 1 for d in shape) or \
                    not _mask_attrs_ok(node.offset, node.window, node.valid):
                raise _err(f"{who}: shape {node.shape} offset {node.offset} window "
                           f"{node.window} is not a (rows, cols) mask", "shape", label)
            if len(node.imap) != 3 or any(not -1 <= d < 2 for d in node.imap) or \
                    not -1 <= node.fmap < 2:
                raise _err(f"{who}: imap {node.imap} / fmap {node.fmap} name dims outside the "
                           f"mask {shape}", "imap", label)
            dims = [d for d in node.imap if d >= 0]
            if len(set(dims)) != len(dims):
                raise _err(f"{who}: imap {node.imap} splits one dim of the mask over two grid "
                           "axes", "imap", label)
            for a in range(3):
                if node.imap[a] >= 0 and shape[node.imap[a]] % bg.grid[a]:
                    raise _err(f"{who}: dim {node.imap[a]} of the mask {shape} does not split "
                               f"evenly over grid.{AXES[a]} = {bg.grid[a]}", "tile-divides",
                               label)
            tile = iter_tile_shape(shape, bg.grid, node.imap, -1, 1)
            if node.fmap >= 0 and tile[node.fmap] % bg.forloop:
                raise _err(f"{who}: dim {node.fmap} of the mask (tile size {tile[node.fmap]}) "
                           f"does not split evenly over forloop = {bg.forloop}", "tile-divides",
                           label)
            define(node.out, iter_tile_shape(shape, bg.grid, node.imap, node.fmap, bg.forloop),
                   "float16", Phase.BODY if node.fmap >= 0 else Phase.PRE, who)
        elif isinstance(node, BlockOp):
            who = f"block op {node.op} -> {node.out!r}"
            for o in node.operands:
                use(o, who)
            spec = OPS.get(node.op)
            if node.op not in BLOCK_OPS and (spec is None or not spec.elementwise):
                raise _err(f"{who}: {node.op!r} is not a block operator", "operator", label)
            tiles = [shapes[o] for o in node.operands if isinstance(o, str)]
            if not tiles:
                raise _err(f"{who}: needs at least one tile operand", "operator", label)
            if node.op == "matmul":
                if len(node.operands) != 2 or len(tiles) != 2:
                    raise _err(f"{who}: matmul takes two tiles", "operator", label)
                _check_matmul_attrs(node.attrs, who, label)
                try:
                    shape = matmul_shape(who, tiles[0], tiles[1])
                except ShapeError as e:
                    raise _err(str(e), "shape", label) from None
            elif node.op in REDUCTIONS:
                axes = tuple(node.attr("axes", ()))
                if len(node.operands) != 1 or not axes or \
                        any(not 0 <= a < len(tiles[0]) for a in axes):
                    raise _err(f"{who}: {node.op} needs one tile and axes within {tiles[0]}",
                               "shape", label)
                shape = sum_shape(tiles[0], axes, bool(node.attr("keepdims", True)))
            elif node.op == "concat":
                if len(tiles) != len(node.operands):
                    raise _err(f"{who}: concat takes tiles only", "shape", label)
                shape = _concat_shape(tiles, node.attr("axis", -1), who, label)
            elif node.op == "slice":
                if len(node.operands) != 1 or len(tiles) != 1:
                    raise _err(f"{who}: slice takes one tile", "operator", label)
                shape = _slice_shape(tiles[0], dict(node.attrs), who, label)
            elif node.op == "transpose":
                perm = tuple(node.attr("perm", ()))
                if len(node.operands) != 1 or len(tiles) != 1 or \
                        sorted(perm) != list(range(len(tiles[0]))):
                    raise _err(f"{who}: cannot permute tile {tiles[0]} by {perm}", "shape",
                               label)
                shape = tuple(tiles[0][p] for p in perm)
            elif node.op == "reshape":
                shape = tuple(node.attr("shape", ()))
                n = 1
                for d in shape:
                    n *= d if isinstance(d, int) and d > 0 else 0
                if len(node.operands) != 1 or len(tiles) != 1 or \
                        n != math.prod(tiles[0]) or not shape:
                    raise _err(f"{who}: cannot reshape tile {tiles[0]} into {shape}", "shape",
                               label)
            else:
                if len(node.operands) != spec.arity:
                    raise _err(f"{who}: takes {spec.arity} operand(s)", "operator", label)
                _check_attrs(node.op, node.attrs, who, label)
                shape = _elementwise_shape(who, label, tiles)
            define(node.out, shape, "float32", phase_of(node.operands, who), who)
        elif isinstance(node, Fused):
            who = f"fused thread graph -> {node.out!r}"
            for o in node.operands:
                use(o, who)
                if not isinstance(o, str):
                    raise _err(f"{who}: operands must be tiles (constants go inside the thread "
                               "graph)", "operator", label)
            shape = _thread_shape(node.thread, who, label, [shapes[o] for o in node.operands])
            define(node.out, shape, "float32", phase_of(node.operands, who), who)
        elif isinstance(node, Accum):
            who = f"accumulator {node.kind} -> {node.out!r}"
            use(node.input, who)
            if node.kind not in ACCUM_KINDS:
                raise _err(f"{who}: unknown kind {node.kind!r} (known: {ACCUM_KINDS})",
                           "operator", label)
            if phases[node.input] is Phase.POST:
                raise _err(f"{who}: accumulates {node.input!r}, which is already after the loop",
                           "phase", label)
            if node.running and node.kind not in ("max", "min"):
                raise _err(f"{who}: only a max or min accumulator can be running", "operator",
                           label)
            if node.rescale is not None:
                use(node.rescale, who)
                m = next((o for o in bg.ops if isinstance(o, Accum) and o.out == node.rescale),
                         None)
                if node.kind != "sum" or m is None or not m.running:
                    raise _err(f"{who}: only a sum is rescaled, and by a running max / min "
                               f"accumulator ({node.rescale!r} is not one)", "operator", label)
                try:
                    fits = broadcast_shapes(who, shapes[node.rescale], shapes[node.input]) == \
                        tuple(shapes[node.input])
                except ShapeError:
                    fits = False
                if not fits:
                    raise _err(f"{who}: the running value {node.rescale!r} "
                               f"{shapes[node.rescale]} does not broadcast to the sum's "
                               f"{shapes[node.input]}", "shape", label)
            define(node.out, shapes[node.input], "float32",
                   Phase.RUN if node.running else Phase.POST, who)
        elif isinstance(node, OutputSaver):
            who = f"output saver {node.input!r} -> output #{node.output}"
            use(node.input, who)
            if not 0 <= node.output < len(outs):
                raise _err(f"{who}: the kernel has {len(outs)} outputs", "binding", label)
            if node.output in saved:
                raise _err(f"{who}: output #{node.output} is saved twice", "output-coverage",
                           label)
            saved[node.output] = node
            if phases[node.input] is Phase.BODY and bg.forloop > 1:  # (RUN: its final value)
                raise _err(f"{who}: {node.input!r} changes every loop iteration; save an "
                           "accumulated tile", "phase", label)
            _check_omap(node, shapes[node.input], outs[node.output], bg.grid, who, label)
        else:
            raise _err(f"unknown block node {type(node).__name__}", "operator", label)
    for j, t in enumerate(outs):
        if j not in saved:
            raise _err(f"output #{j} ({t.name}) is never saved", "output-coverage", label)
    smem = shared_memory_bytes(bg, shapes, dtypes, phases)
    if smem > target.smem_per_block:
        raise _err(f"live tiles need {smem} bytes of shared memory, {target.name} allows "
                   f"{target.smem_per_block} per block", "smem", label)
    return BlockInfo(shapes, dtypes, phases, smem)


def _check_omap(node: OutputSaver, tile: tuple[int, ...], out: DTensor, grid: tuple[int, int, int],
                who: str, label: str) -> None:
    nd = len(out.shape)
    if len(node.omap) != 3 or any(not -1 <= d < nd for d in node.omap):
        raise _err(f"{who}: omap {node.omap} names dims outside {out.name} {out.shape}",
                   "imap", label)
    mapped = [d for d in node.omap if d >= 0]
    if len(set(mapped)) != len(mapped):
        raise _err(f"{who}: omap {node.omap} maps two grid axes to one dim", "imap", label)
    for a in range(3):
        if grid[a] > 1 and node.omap[a] < 0:
            raise _err(f"{who}: the {grid[a]} blocks along grid.{AXES[a]} would all write the "
                       f"same elements of {out.name}", "output-coverage", label)
    if len(tile) != nd:
        raise _err(f"{who}: tile {tile} and output {out.name} {out.shape} differ in rank",
                   "shape", label)
    want = list(tile)
    for a in range(3):
        if node.omap[a] >= 0:
            want[node.omap[a]] *= grid[a]
    if tuple(want) != out.shape:
        raise _err(f"{who}: tiles {tile} over grid {grid} with omap {node.omap} cover "
                   f"{tuple(want)}, not {out.name} {out.shape}", "output-coverage", label)


def accum_copies(node: Any) -> int:
    """Tiles of its shape a block node keeps: 2 for a running accumulator (the value, then the
    rescale factor ``exp(m_{i-1} - m_i)`` of this iteration), else 1."""
    return 2 if isinstance(node, Accum) and node.running else 1


def _tile_bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPES[dtype]


def shared_memory_bytes(bg: BlockGraph, shapes: dict[str, tuple[int, ...]],
                        dtypes: dict[str, str], phases: dict[str, Phase]) -> int:
    """Peak bytes of tiles live at once: invariant tiles and accumulators stay for the whole
    kernel (a running accumulator twice: its value and this iteration's rescale factor); body
    and epilogue tiles live from definition to last use (a fused thread graph keeps its
    intermediates in registers)."""
    fixed = sum(_tile_bytes(shapes[o.out], dtypes[o.out]) * accum_copies(o) for o in bg.ops
                if isinstance(o, (InputIter, MaskIter, BlockOp, Fused, Accum)) and
                (phases[o.out] is Phase.PRE or isinstance(o, Accum)))
    last: dict[str, int] = {}
    for i, o in enumerate(bg.ops):
        for a in tiles_read(o):
            last[a] = i
    peak = 0
    for phase in (Phase.BODY, Phase.POST):
        live: dict[str, int] = {}
        for i, o in enumerate(bg.ops):
            if isinstance(o, (InputIter, MaskIter, BlockOp, Fused)) and phases[o.out] == phase:
                live[o.out] = _tile_bytes(shapes[o.out], dtypes[o.out])
                peak = max(peak, sum(live.values()))
            for name in [n for n in live if last.get(n, -1) <= i]:
                del live[name]
    return fixed + peak


def kernel_op_shape(op: KernelOp, args: list[DTensor | float]) -> tuple[int, ...]:
    """Inferred output shape of a pre-defined kernel operator (raises ValidationError)."""
    who = f"kernel {op.op} -> {op.output.name!r}"
    tensors = [a for a in args if isinstance(a, DTensor)]
    spec = OPS.get(op.op)
    if op.op not in KERNEL_OPS and (spec is None or not spec.elementwise):
        raise _err(f"{op.op!r} is not a kernel operator", "operator", who)
    if op.op == "mask":
        offset, window = op.attr("offset"), op.attr("window", 0)
        if args or len(op.output.shape) != 2 or \
                not _mask_attrs_ok(offset, window, op.attr("valid")):
            raise _err(f"a mask takes no operands, an int offset and window >= 0, and writes a "
                       f"(rows, cols) tensor; got {len(args)} operand(s), offset {offset!r}, "
                       f"window {window!r}, output {op.output.shape}", "shape", who)
        return op.output.shape
    if not tensors:
        raise _err("needs at least one tensor operand", "operator", who)
    for k, t in enumerate(tensors):
        if is_index(t.dtype) and not (op.op == "take" and k == 1):
            raise _err(f"operand {t.name!r} {t.shape} is an index tensor ({t.dtype}); only a "
                       "take reads one, as its indices", "dtype", who)
    try:
        if op.op == "take":
            if len(args) != 2 or len(tensors) != 2 or not is_index(tensors[1].dtype):
                raise _err("take reads a table and an index tensor (int32 / int64)",
                           "operator", who)
            if not tensors[0].shape or is_index(op.output.dtype) or \
                    op.output.dtype != tensors[0].dtype:
                raise _err(f"take of a table {tensors[0].shape} {tensors[0].dtype} writes its "
                           f"rows in the table's dtype, got {op.output.dtype}", "dtype", who)
            return tuple(tensors[1].shape) + tuple(tensors[0].shape[1:])
        if op.op == "matmul":
            if len(args) != 2 or len(tensors) != 2:
                raise _err("matmul takes two tensors", "operator", who)
            _check_matmul_attrs(op.attrs, op.op, who)
            return matmul_shape(who, tensors[0].shape, tensors[1].shape)
        if op.op in REDUCTIONS:
            axes = tuple(op.attr("axes", ()))
            if len(args) != 1 or any(not 0 <= a < len(tensors[0].shape) for a in axes):
                raise _err(f"bad axes {axes} for {tensors[0].shape}", "shape", who)
            return sum_shape(tensors[0].shape, axes, bool(op.attr("keepdims", False)))
        if op.op == "rms_norm":
            if len(args) != 1:
                raise _err("rms_norm takes one tensor", "operator", who)
            return tensors[0].shape
        if op.op == "reshape":
            shape = tuple(op.attr("shape", ()))
            n = 1
            for d in shape:
                n *= d
            if n != tensors[0].size:
                raise _err(f"cannot reshape {tensors[0].shape} into {shape}", "shape", who)
            return shape
        if op.op == "transpose":
            perm = tuple(op.attr("perm", ()))
            if sorted(perm) != list(range(len(tensors[0].shape))):
                raise _err(f"perm {perm} for {tensors[0].shape}", "shape", who)
            return tuple(tensors[0].shape[p] for p in perm)
        if op.op == "slice":
            if len(args) != 1:
                raise _err("slice takes one tensor", "operator", who)
            return _slice_shape(tensors[0].shape, dict(op.attrs), "slice", who)
        if op.op == "concat":
            if len(tensors) != len(args):
                raise _err("concat takes tensors only", "operator", who)
            dts = {t.dtype for t in tensors}
            if len(dts) != 1:
                raise _err(f"concat of dtypes {sorted(dts)}", "dtype", who)
            return _concat_shape([t.shape for t in tensors], op.attr("axis", 0), "concat", who)
        if len(args) != spec.arity:
            raise _err(f"takes {spec.arity} operand(s)", "operator", who)
        _check_attrs(op.op, op.attrs, op.op, who)
        if op.op == "cast" and op.attr("dtype") != op.output.dtype:
            raise _err(f"casts to {op.attr('dtype')!r} but the output is {op.output.dtype}",
                       "dtype", who)
        return broadcast_shapes(who, *[t.shape for t in tensors])
    except ShapeError as e:
        raise _err(str(e), "shape", who) from None


def validate(graph: KernelGraph, target: Any = "h100") -> dict[int, BlockInfo]:
    """Check every rule on every level; returns the BlockInfo of each graph-defined kernel
    (keyed by its position in ``graph.ops``). Raises ValidationError on the first violation."""
    tgt = get_target(target)
    env: dict[str, DTensor] = {}
    for t in graph.inputs:
        _check_dtensor(t, "graph input")
        if t.name in env:
            raise _err(f"input {t.name!r} declared twice", "ssa", None)
        env[t.name] = t
    infos: dict[int, BlockInfo] = {}
    for k, op in enumerate(graph.ops):
        if isinstance(op, KernelOp):
            who = f"kernel {op.op} -> {op.output.name!r}"
            args: list[DTensor | float] = []
            for o in op.operands:
                if isinstance(o, str):
                    if o not in env:
                        raise _err(f"uses undefined tensor {o!r}", "ssa", who)
                    args.append(env[o])
                elif isinstance(o, (int, float)) and not isinstance(o, bool):
                    args.append(float(o))
                else:
                    raise _err(f"operand {o!r} is neither a tensor name nor a number",
                               "operator", who)
            shape = kernel_op_shape(op, args)
            _check_dtensor(op.output, who)
            # a where's mask holds 0 and 1, exact in either half type: it mixes nothing
            dts = {a.dtype for i, a in enumerate(args) if isinstance(a, DTensor)
                   and not (op.op == "where" and i == 0)}
            if {"float16", "bfloat16"} <= dts:
                raise _err("mixes float16 and bfloat16 operands", "dtype", who)
            if tuple(shape) != op.output.shape:
                raise _err(f"output declared {op.output.shape}, operator gives {tuple(shape)}",
                           "shape", who)
            outs = [op.output]
        elif isinstance(op, GraphKernel):
            who = f"graph kernel #{k}"
            for n in op.inputs:
                if n not in env:
                    raise _err(f"uses undefined tensor {n!r}", "ssa", who)
            for t in op.outputs:
                _check_dtensor(t, who)
            infos[k] = check_block(op.block, [env[n] for n in op.inputs], list(op.outputs), tgt,
                                   who)
            outs = list(op.outputs)
        else:
            raise _err(f"unknown kernel node {type(op).__name__}", "operator", None)
        for t in outs:
            if t.name in env:
                raise _err(f"tensor {t.name!r} is defined twice", "ssa", who)
            env[t.name] = t
    if len(set(graph.outputs)) != len(graph.outputs):
        raise _err(f"outputs {graph.outputs} repeat a name", "output-coverage", None)
    for n in graph.outputs:
        if n not in env:
            raise _err(f"graph output {n!r} is never produced", "output-coverage", None)
    return infos


def _check_dtensor(t: DTensor, who: str) -> None:
    if t.dtype not in DTYPES:
        raise _err(f"tensor {t.name!r} has dtype {t.dtype!r}; allowed: {', '.join(DTYPES)}",
                   "dtype", who)
    # shape () is a scalar (a full reduction, vector @ vector)
    if not isinstance(t.shape, tuple) or any(not isinstance(d, int) or d < 1 for d in t.shape):
        raise _err(f"tensor {t.name!r} has bad shape {t.shape}", "shape", who)


__all__ = ["validate", "check_block", "BlockInfo", "shared_memory_bytes", "MirageError"]
