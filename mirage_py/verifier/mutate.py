"""Structural mutants of a μGraph, for testing the verifier.

``mutants(graph)`` applies every single-point mutation below to every place it fits, keeps the
mutants that pass :func:`~mirage_py.ugraph.validate` (an invalid graph is no candidate), drops
duplicates (by structural hash, and the original itself) and returns them as :class:`Mutant`
records, interleaved by kind so that a prefix is varied.

=====================  ==========================================================================
kind                   what changes
=====================  ==========================================================================
``imap``               an input iterator splits another dim over a grid axis, replicates, or
                       has two grid axes swapped
``fmap``               an input iterator walks another dim in the for-loop, or none
``omap``               an output saver writes along other dims
``split``              a grid dim or the for-loop range times / over 2 or 4 (wrong split count)
``swap``               the operands of a binary operator swapped (block, thread or kernel level)
``axis``               a sum over another axis, or keepdims flipped
``op``                 an operator replaced by a related one (add/sub, mul/div, exp/square,
                       max/min, sigmoid/tanh, ...), or given other attributes (a clamp's
                       bounds, a slope, an exponent)
``drop``               an elementwise operator dropped (its first operand passed on): a missing
                       division, a missing scale, a missing exp
``scale``              an extra scale (by 1.5, by -1, by 1 + 2^-20) after a loaded tile, a
                       matmul, a fused chain or an accumulator
``operand``            a block operator reads another tile in place of one of its operands
``const``              a constant changed (doubled, or by a relative 1e-3)
``accum``              an accumulation doubled, fed another tile, of another kind (sum, max,
                       min), or (single-iteration loops) dropped
``mask``               a mask iterator with another offset or window, or split differently
``input``              an iterator or kernel reads another input of the same shape
``saver``              an output saver saves another tile
``take``               a gather reads the neighbouring row (its table rolled by one row), or a
                       transposed square table
=====================  ==========================================================================
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Iterator

from ..errors import MirageError
from ..lax.ops import OPS
from ..ugraph.graph import (ACCUM_KINDS, Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                            InputIter, KernelGraph, KernelOp, MaskIter, OutputSaver, ThreadGraph,
                            ThreadOp, attrs_of)
from ..ugraph.validate import validate

SWAP_OP = {"add": "sub", "sub": "add", "mul": "div", "div": "mul", "exp": "square",
           "square": "neg", "neg": "square", "sqrt": "square", "silu": "relu", "relu": "silu",
           "gelu": "silu", "maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max",
           "sigmoid": "tanh", "tanh": "sigmoid", "sin": "cos", "cos": "sin", "log": "exp", "abs": "neg", "softplus": "relu",
           "mish": "silu", "leaky_relu": "relu", "clamp": "relu", "pow": "square",
           "where": "add", "cast": "neg"}


def related(op: str, operands: tuple, attrs: tuple = ()) -> list[tuple[str, tuple, tuple]]:
    """Related forms of an operator node: another operator (``SWAP_OP``; operands and attributes
    adapted to its arity), or the same one with other attributes."""
    out = []
    if op in SWAP_OP:
        new = SWAP_OP[op]
        arity = OPS[new].arity or 1
        ops = tuple(operands[1:]) if op == "where" else tuple(operands)
        ops = ops[:arity] if len(ops) >= arity else ops + (2.0,) * (arity - len(ops))
        keep = attrs if new in ("max", "min", "sum") else ()
        out.append((new, ops, keep))
    a = dict(attrs)
    for k in ("lo", "hi", "negative_slope", "exponent"):
        if k in a:
            out.append((op, operands, attrs_of(a, **{k: a[k] + 1.0})))
    if op == "gelu":
        out.append((op, operands, attrs_of(approximate="tanh") if not a else ()))
    return out


@dataclass(frozen=True)
class Mutant:
    kind: str
    where: str
    graph: KernelGraph

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}"


# ---- helpers ------------------------------------------------------------------------------------

def _with_op(g: KernelGraph, k: int, op: Any) -> KernelGraph:
    ops = list(g.ops)
    ops[k] = op
    return replace(g, ops=tuple(ops))


def _with_block(g: KernelGraph, k: int, block: BlockGraph) -> KernelGraph:
    return _with_op(g, k, replace(g.ops[k], block=block))


def _with_nodes(g: KernelGraph, k: int, nodes: list[Any]) -> KernelGraph:
    return _with_block(g, k, replace(g.ops[k].block, ops=tuple(nodes)))


def _fresh(name: str, taken: set[str]) -> str:
    n = name + "_m"
    while n in taken:
        n += "_"
    return n


def _scale_thread(scale: float) -> ThreadGraph:
    return ThreadGraph(1, (ThreadOp("y", "mul", ("in0", scale)),))


SCALES = (1.5, -1.0, 1.0 + 2.0 ** -20)  # an extra scale, a sign error, a tiny constant


def _alt_constants(c: float) -> list[float]:
    return [2.0 * c if c != 0 else 1.0, c * (1 + 1e-3) if c != 0 else 1e-3]


# ---- block-level mutations ---------------------------------------------------------------------

def _block_mutations(g: KernelGraph, k: int) -> Iterator[tuple[str, str, KernelGraph]]:
    gk: GraphKernel = g.ops[k]
    bg = gk.block
    nodes = list(bg.ops)
    tensors = g.tensors()
    ins = [tensors[n] for n in gk.inputs]
    tile_names = {n.out for n in nodes if hasattr(n, "out")}
    label = f"kernel #{k}"

    for i, n in enumerate(nodes):
        here = f"{label} {type(n).__name__} {getattr(n, 'out', getattr(n, 'input', ''))!r}"
        if isinstance(n, InputIter):
            nd = len(ins[n.input].shape) if 0 <= n.input < len(ins) else 0
            for a in range(3):
                if bg.grid[a] == 1:
                    continue  # a split over one block changes nothing
                for d in [-1] + list(range(nd)):
                    if d != n.imap[a]:
                        imap = tuple(d if j == a else n.imap[j] for j in range(3))
                        yield "imap", f"{here} imap {n.imap}->{imap}", \
                            _with_nodes(g, k, nodes[:i] + [replace(n, imap=imap)] + nodes[i + 1:])
            for d in [-1] + list(range(nd)):
                if d != n.fmap:
                    yield "fmap", f"{here} fmap {n.fmap}->{d}", \
                        _with_nodes(g, k, nodes[:i] + [replace(n, fmap=d)] + nodes[i + 1:])
            for j, t in enumerate(ins):
                if j != n.input and t.shape == ins[n.input].shape:
                    yield "input", f"{here} reads input #{j} instead of #{n.input}", \
                        _with_nodes(g, k, nodes[:i] + [replace(n, input=j)] + nodes[i + 1:])
            for a, b in itertools.combinations(range(3), 2):
                if n.imap[a] != n.imap[b]:
                    imap = list(n.imap)
                    imap[a], imap[b] = imap[b], imap[a]
                    yield "imap", f"{here} imap {n.imap}->{tuple(imap)}", _with_nodes(
                        g, k, nodes[:i] + [replace(n, imap=tuple(imap))] + nodes[i + 1:])
            inner = _fresh(n.out, tile_names)
            for c in SCALES:
                scaled = [replace(n, out=inner), Fused(n.out, (inner,), _scale_thread(c))]
                yield "scale", f"{here} loaded tile scaled by {c}", _with_nodes(
                    g, k, nodes[:i] + scaled + nodes[i + 1:])
        elif isinstance(n, OutputSaver):
            nd = len(gk.outputs[n.output].shape) if 0 <= n.output < len(gk.outputs) else 0
            for a in range(3):
                if bg.grid[a] == 1:
                    continue
                for d in [-1] + list(range(nd)):
                    if d != n.omap[a]:
                        omap = tuple(d if j == a else n.omap[j] for j in range(3))
                        yield "omap", f"{here} omap {n.omap}->{omap}", \
                            _with_nodes(g, k, nodes[:i] + [replace(n, omap=omap)] + nodes[i + 1:])
            for a, b in itertools.combinations(range(3), 2):
                if n.omap[a] != n.omap[b]:
                    omap = list(n.omap)
                    omap[a], omap[b] = omap[b], omap[a]
                    yield "omap", f"{here} omap {n.omap}->{tuple(omap)}", \
                        _with_nodes(g, k, nodes[:i] + [replace(n, omap=tuple(omap))] +
                                    nodes[i + 1:])
            for m in nodes[:i]:
                if hasattr(m, "out") and m.out != n.input:
                    yield "saver", f"{here} saves {m.out!r} instead", \
                        _with_nodes(g, k, nodes[:i] + [replace(n, input=m.out)] + nodes[i + 1:])
        elif isinstance(n, BlockOp):
            if len(n.operands) == 2 and n.operands[0] != n.operands[1]:
                yield "swap", f"{here} {n.op} operands swapped", _with_nodes(
                    g, k, nodes[:i] + [replace(n, operands=n.operands[::-1])] + nodes[i + 1:])
            if n.op in ("sum", "max", "min"):
                axes = tuple(n.attr("axes", ()))
                rank = _tile_rank(nodes, i, ins)
                for ax in range(rank):
                    if (ax,) != axes:
                        yield "axis", f"{here} sum over axis {ax} instead of {axes}", _with_nodes(
                            g, k, nodes[:i] + [replace(n, attrs=attrs_of(dict(n.attrs), axes=(ax,)))]
                            + nodes[i + 1:])
                kd = bool(n.attr("keepdims", True))
                yield "axis", f"{here} keepdims {kd}->{not kd}", _with_nodes(
                    g, k, nodes[:i] + [replace(n, attrs=attrs_of(dict(n.attrs), keepdims=not kd))]
                    + nodes[i + 1:])
            for op, operands, attrs in related(n.op, n.operands, n.attrs):
                yield "op", f"{here} {n.op}{dict(n.attrs)}->{op}{dict(attrs)}", _with_nodes(
                    g, k, nodes[:i] + [replace(n, op=op, operands=operands, attrs=attrs)] +
                    nodes[i + 1:])
            if n.op in SWAP_OP:
                if isinstance(n.operands[0], str):
                    yield "drop", f"{here} {n.op} dropped", _with_nodes(
                        g, k, nodes[:i] + [BlockOp(n.out, "mul", (n.operands[0], 1.0))] +
                        nodes[i + 1:])
            for j, o in enumerate(n.operands):
                if not isinstance(o, str):
                    for c in _alt_constants(float(o)):
                        ops = tuple(c if jj == j else oo for jj, oo in enumerate(n.operands))
                        yield "const", f"{here} constant {o}->{c}", _with_nodes(
                            g, k, nodes[:i] + [replace(n, operands=ops)] + nodes[i + 1:])
            if n.op == "matmul":
                inner = _fresh(n.out, tile_names)
                yield "op", f"{here} matmul result squared", _with_nodes(
                    g, k, nodes[:i] + [replace(n, out=inner), Fused(n.out, (inner,), ThreadGraph(
                        1, (ThreadOp("y", "square", ("in0",)),)))] + nodes[i + 1:])
                for c in SCALES:
                    scaled = [replace(n, out=inner), Fused(n.out, (inner,), _scale_thread(c))]
                    yield "scale", f"{here} matmul result scaled by {c}", _with_nodes(
                        g, k, nodes[:i] + scaled + nodes[i + 1:])
            yield from _operand_mutations(g, k, nodes, i, n, here)
        elif isinstance(n, Fused):
            yield from _thread_mutations(g, k, nodes, i, n, here)
            for c in SCALES:
                yield "scale", f"{here} fused result scaled by {c}", _with_nodes(
                    g, k, nodes[:i] + [replace(n, thread=ThreadGraph(
                        n.thread.ninputs, n.thread.ops + (
                            ThreadOp(_fresh("y", {t.out for t in n.thread.ops}), "mul",
                                     (n.thread.ops[-1].out, c)),)))] + nodes[i + 1:])
            yield from _operand_mutations(g, k, nodes, i, n, here)
        elif isinstance(n, MaskIter):
            for kw in (dict(offset=n.offset + 1), dict(offset=n.offset - 1),
                       dict(window=n.window + 1 if n.window else 2)):
                yield "mask", f"{here} {kw}", _with_nodes(
                    g, k, nodes[:i] + [replace(n, **kw)] + nodes[i + 1:])
            for a in range(3):
                if bg.grid[a] > 1:
                    for d in (-1, 0, 1):
                        if d != n.imap[a]:
                            imap = tuple(d if j == a else n.imap[j] for j in range(3))
                            yield "mask", f"{here} imap {n.imap}->{imap}", _with_nodes(
                                g, k, nodes[:i] + [replace(n, imap=imap)] + nodes[i + 1:])
            for d in (-1, 0, 1):
                if d != n.fmap:
                    yield "mask", f"{here} fmap {n.fmap}->{d}", _with_nodes(
                        g, k, nodes[:i] + [replace(n, fmap=d)] + nodes[i + 1:])
        elif isinstance(n, Accum):
            for kind in ACCUM_KINDS:
                if kind != n.kind:
                    yield "accum", f"{here} kind {n.kind}->{kind}", _with_nodes(
                        g, k, nodes[:i] + [replace(n, kind=kind)] + nodes[i + 1:])
            inner = _fresh(n.input, tile_names)
            doubled = [Fused(inner, (n.input,), _scale_thread(2.0)), replace(n, input=inner)]
            yield "accum", f"{here} accumulation doubled", _with_nodes(
                g, k, nodes[:i] + doubled + nodes[i + 1:])
            for m in nodes[:i]:
                if isinstance(m, (BlockOp, Fused, InputIter)) and m.out != n.input:
                    yield "accum", f"{here} accumulates {m.out!r} instead of {n.input!r}", \
                        _with_nodes(g, k, nodes[:i] + [replace(n, input=m.out)] + nodes[i + 1:])
            yield "accum", f"{here} accumulation dropped", _with_nodes(
                g, k, nodes[:i] + [Fused(n.out, (n.input,), _scale_thread(1.0))] + nodes[i + 1:])
            outer = _fresh(n.out, tile_names)
            for c in SCALES:
                scaled = [replace(n, out=outer), Fused(n.out, (outer,), _scale_thread(c))]
                yield "scale", f"{here} accumulator scaled by {c}", _with_nodes(
                    g, k, nodes[:i] + scaled + nodes[i + 1:])

    for a in range(3):
        for grid_a in sorted({bg.grid[a] * 2, bg.grid[a] * 4, bg.grid[a] // 2, bg.grid[a] // 4}):
            if grid_a >= 1 and grid_a != bg.grid[a]:
                grid = tuple(grid_a if j == a else bg.grid[j] for j in range(3))
                yield "split", f"{label} grid {bg.grid}->{grid}", _with_block(
                    g, k, replace(bg, grid=grid))
    for f in sorted({bg.forloop * 2, bg.forloop * 4, bg.forloop // 2, bg.forloop // 4}):
        if f >= 1 and f != bg.forloop:
            yield "split", f"{label} forloop {bg.forloop}->{f}", _with_block(
                g, k, replace(bg, forloop=f))
    for a, b in itertools.combinations(range(len(gk.inputs)), 2):
        if tensors[gk.inputs[a]].shape == tensors[gk.inputs[b]].shape and \
                gk.inputs[a] != gk.inputs[b]:
            names = list(gk.inputs)
            names[a], names[b] = names[b], names[a]
            yield "input", f"{label} inputs {gk.inputs[a]!r} and {gk.inputs[b]!r} swapped", \
                _with_op(g, k, replace(gk, inputs=tuple(names)))


def _operand_mutations(g: KernelGraph, k: int, nodes: list[Any], i: int, n: Any,
                       here: str) -> Iterator[tuple[str, str, KernelGraph]]:
    """A block operator reading another (earlier) tile in place of one of its operands."""
    for j, o in enumerate(n.operands):
        if not isinstance(o, str):
            continue
        for m in nodes[:i]:
            name = getattr(m, "out", None)
            if name is None or name == o or isinstance(m, OutputSaver):
                continue
            ops = tuple(name if jj == j else oo for jj, oo in enumerate(n.operands))
            yield "operand", f"{here} reads {name!r} instead of {o!r}", _with_nodes(
                g, k, nodes[:i] + [replace(n, operands=ops)] + nodes[i + 1:])


def _tile_rank(nodes: list[Any], i: int, ins: list[DTensor]) -> int:
    """Rank of the first operand of nodes[i] (tiles keep the rank of their tensors, sums with
    keepdims too; good enough for proposing axes, validation filters the rest)."""
    target = nodes[i].operands[0]
    for n in nodes[:i]:
        if getattr(n, "out", None) == target:
            if isinstance(n, InputIter) and 0 <= n.input < len(ins):
                return len(ins[n.input].shape)
            if isinstance(n, (BlockOp, Fused)) and n.operands and isinstance(n.operands[0], str):
                return _tile_rank(nodes, nodes.index(n), ins)
    return 2


def _thread_mutations(g: KernelGraph, k: int, nodes: list[Any], i: int, n: Fused,
                      here: str) -> Iterator[tuple[str, str, KernelGraph]]:
    tops = list(n.thread.ops)

    def with_thread(new_ops: list[ThreadOp]) -> KernelGraph:
        return _with_nodes(g, k, nodes[:i] + [replace(n, thread=ThreadGraph(n.thread.ninputs,
                                                                             tuple(new_ops)))]
                           + nodes[i + 1:])

    for j, t in enumerate(tops):
        at = f"{here} thread op {t.out!r} = {t.op}"
        if len(t.operands) == 2 and t.operands[0] != t.operands[1]:
            yield "swap", f"{at} operands swapped", with_thread(
                tops[:j] + [replace(t, operands=t.operands[::-1])] + tops[j + 1:])
        for op, operands, attrs in related(t.op, t.operands, t.attrs):
            yield "op", f"{at}{dict(t.attrs)} -> {op}{dict(attrs)}", with_thread(
                tops[:j] + [ThreadOp(t.out, op, operands, attrs)] + tops[j + 1:])
        if t.op in SWAP_OP:
            yield "drop", f"{at} dropped", with_thread(
                tops[:j] + [ThreadOp(t.out, "mul", (t.operands[0], 1.0))] + tops[j + 1:])
        for m, o in enumerate(t.operands):
            if not isinstance(o, str):
                for c in _alt_constants(float(o)):
                    ops = tuple(c if mm == m else oo for mm, oo in enumerate(t.operands))
                    yield "const", f"{at} constant {o}->{c}", with_thread(
                        tops[:j] + [replace(t, operands=ops)] + tops[j + 1:])


# ---- kernel-level mutations --------------------------------------------------------------------

def _kernel_mutations(g: KernelGraph, k: int) -> Iterator[tuple[str, str, KernelGraph]]:
    op: KernelOp = g.ops[k]
    here = f"kernel #{k} {op.op} -> {op.output.name!r}"
    tensors = g.tensors()
    if len(op.operands) == 2 and op.operands[0] != op.operands[1]:
        yield "swap", f"{here} operands swapped", _with_op(
            g, k, replace(op, operands=op.operands[::-1]))
    for new, operands, attrs in related(op.op, op.operands, op.attrs):
        yield "op", f"{here}{dict(op.attrs)} -> {new}{dict(attrs)}", _with_op(
            g, k, replace(op, op=new, operands=operands, attrs=attrs))
    if op.op in SWAP_OP and op.operands:
        yield "drop", f"{here} dropped", _with_op(
            g, k, KernelOp("mul", (op.operands[0], 1.0), op.output))
    if op.op == "mask":
        for kw in (dict(offset=op.attr("offset") + 1), dict(window=op.attr("window", 0) + 2)):
            yield "mask", f"{here} {kw}", _with_op(
                g, k, replace(op, attrs=attrs_of(dict(op.attrs), **kw)))
    if op.op in ("sum", "max", "min"):
        axes = tuple(op.attr("axes", ()))
        src = tensors.get(op.operands[0])
        for ax in range(len(src.shape) if src is not None else 0):
            if (ax,) != axes:
                yield "axis", f"{here} over axis {ax} instead of {axes}", _with_op(
                    g, k, replace(op, attrs=attrs_of(dict(op.attrs), axes=(ax,))))
    if op.op == "transpose":
        perm = tuple(op.attr("perm", ()))
        for alt in itertools.permutations(range(len(perm))):
            if alt != perm:
                yield "axis", f"{here} perm {perm}->{alt}", _with_op(
                    g, k, replace(op, attrs=attrs_of(dict(op.attrs), perm=alt)))
    for j, o in enumerate(op.operands):
        if isinstance(o, str):
            for name, t in tensors.items():
                if name != o and t.shape == tensors[o].shape and _defined_before(g, name, k):
                    ops = tuple(name if jj == j else oo for jj, oo in enumerate(op.operands))
                    yield "input", f"{here} reads {name!r} instead of {o!r}", _with_op(
                        g, k, replace(op, operands=ops))
        else:
            for c in _alt_constants(float(o)):
                ops = tuple(c if jj == j else oo for jj, oo in enumerate(op.operands))
                yield "const", f"{here} constant {o}->{c}", _with_op(g, k, replace(op, operands=ops))
    if op.op == "take" and isinstance(op.operands[0], str):
        table = tensors[op.operands[0]]
        rows = table.shape[0]
        taken = set(tensors)
        pre: list[tuple[str, list[KernelOp]]] = []
        if rows > 1:  # row i of the rolled table is row i + 1 of the table
            lo, hi, rolled = (_fresh(f"{table.name}_{s}", taken) for s in ("lo", "hi", "roll"))
            pre.append(("the neighbouring row", [
                KernelOp("slice", (table.name,), DTensor(lo, (rows - 1,) + table.shape[1:],
                                                         table.dtype),
                         attrs_of(axis=0, start=1, stop=rows)),
                KernelOp("slice", (table.name,), DTensor(hi, (1,) + table.shape[1:],
                                                         table.dtype),
                         attrs_of(axis=0, start=0, stop=1)),
                KernelOp("concat", (lo, hi), DTensor(rolled, table.shape, table.dtype),
                         attrs_of(axis=0))]))
        if len(table.shape) == 2 and table.shape[0] == table.shape[1]:
            tr = _fresh(f"{table.name}_t", taken)
            pre.append(("the transposed table", [
                KernelOp("transpose", (table.name,), DTensor(tr, table.shape, table.dtype),
                         attrs_of(perm=(1, 0)))]))
        for what, extra in pre:
            ops = list(g.ops)
            ops[k:k + 1] = [*extra, replace(op, operands=(extra[-1].output.name,
                                                          op.operands[1]))]
            yield "take", f"{here} gathers {what}", replace(g, ops=tuple(ops))
    if op.op == "rms_norm":
        eps = float(op.attr("eps", 1e-6))
        for c in _alt_constants(eps):
            yield "const", f"{here} eps {eps}->{c}", _with_op(
                g, k, replace(op, attrs=attrs_of(dict(op.attrs), eps=c)))
    if op.op == "matmul":
        inner = DTensor(op.output.name + "_m", op.output.shape, op.output.dtype)
        ops = list(g.ops)
        ops[k:k + 1] = [replace(op, output=inner), KernelOp("mul", (inner.name, 1.5), op.output)]
        yield "scale", f"{here} result scaled by 1.5", replace(g, ops=tuple(ops))


def _defined_before(g: KernelGraph, name: str, k: int) -> bool:
    if any(t.name == name for t in g.inputs):
        return True
    return any(t.name == name for op in g.ops[:k] for t in op.outputs)


# ---- driver ------------------------------------------------------------------------------------

def candidates(graph: KernelGraph) -> Iterator[tuple[str, str, KernelGraph]]:
    """Every single-point mutation (valid or not), as (kind, where, graph)."""
    for k, op in enumerate(graph.ops):
        if isinstance(op, GraphKernel):
            yield from _block_mutations(graph, k)
        else:
            yield from _kernel_mutations(graph, k)


def mutants(graph: KernelGraph, limit: int | None = None, target: Any = "h100") -> list[Mutant]:
    """Valid, distinct mutants of ``graph``, interleaved by kind (see module docstring)."""
    seen = {graph.structural_hash()}
    by_kind: dict[str, list[Mutant]] = {}
    for kind, where, m in candidates(graph):
        try:
            validate(m, target)
        except MirageError:
            continue
        h = m.structural_hash()
        if h in seen:
            continue
        seen.add(h)
        by_kind.setdefault(kind, []).append(Mutant(kind, where, m))
    out: list[Mutant] = []
    queues = [iter(v) for v in by_kind.values()]
    while queues and (limit is None or len(out) < limit):
        nxt = []
        for q in queues:
            m = next(q, None)
            if m is not None:
                out.append(m)
                nxt.append(q)
                if limit is not None and len(out) >= limit:
                    break
        queues = nxt
    return out


__all__ = ["Mutant", "mutants", "candidates", "related", "SWAP_OP"]
