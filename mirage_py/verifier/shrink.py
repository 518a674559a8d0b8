"""Verification at shrunk sizes: the same μGraph structure, fewer blocks or shorter tiles (issue
#29, item 4).

A region of a model-size program (an 8B layer's MLP: three 4096 x 14336 weights) needs its
inputs as field values at full size -- gigabytes -- although what decides equivalence is the
structure, not the extents. :func:`shrink` builds, for a program ``P`` and a candidate ``G``, a
smaller pair ``(P', G')`` whose equivalence implies ``G = P``, or says why it cannot
(:class:`Shrink` with ``why``):

* every long extent ``E`` (at least :data:`LONG` elements; at least :data:`SHORT` when the
  program's largest tensor as field values is over :data:`FULL_SIZE_BYTES`, e.g. a
  ``16 x 64 x 256 x 256`` input, 512 MiB, none of whose extents is long) becomes ``E / k_E``
  (``k_E`` a power of two, the largest that works); ``P'`` is ``P`` with its dims of extent ``E`` made
  ``E / k_E``, every node re-inferred, every constant kept (a mean's ``1/4096`` stays
  ``1/4096``: a coefficient, the same in ``P'`` and ``G'``); a program still over
  :data:`FULL_SIZE_BYTES` after that shrinks its shorter extents too, longest first, until it
  fits (an average pooling whose window pins every long extent);
* ``G'`` is ``G`` with every tensor dim of extent ``E`` made ``E / k_E`` and the same kernels and
  block programs; each cut of such a dim either keeps its tile, the grid axis or loop that cuts
  it making ``k_E`` times fewer parts (``_fewer_blocks``), or keeps its parts with a ``k_E``
  times shorter tile; every shortened range (parts or tile) keeps at least
  ``max(2, delta)``, ``delta`` the degree bound of the check at full size (numerator and
  denominator degrees of the difference, the largest exp and uninterpreted-function argument).

Why ``G' = P'`` implies ``G = P`` (docs/verifier.md, "Verification at shrunk sizes"): an index
``i`` of a shrunk dim is ``(block, iteration, offset)`` at both sizes, only the ranges' lengths
changed. The allowed operators never read an index value: each acts position-wise or reduces a
whole range (sum, max, min, matmul contraction); iterators hand each block and iteration its
slice, accumulators fold iterations with the same step, savers write each block's slice; masks,
gathers, the pre-defined ``rms_norm`` (a ``1/extent`` of its own) and slices and concatenations
of tiles are refused (``why``); slices, concatenations and reshapes of whole tensors *pin* the
extents they move data along (:func:`pinned`: never shrunk) and pass every other dim through
unchanged; a reshape of tiles is kept when the shrunk graph validates (its fixed target shape
then means its tile kept its length). So the difference ``D = P - G`` is built the same way at every
length: a monomial of its expansion (exp values and function values as variables, their
arguments by induction) names at most ``delta`` distinct values of each range, and its
coefficient depends on which of them coincide (and their order), never on the range's length;
every such pattern occurs in a range of at least ``delta``. So ``D' == 0`` forces every
coefficient to vanish, and ``D == 0``. The degree bound is recomputed at the shrunk size and must
be the same (a bound that grew with the extent -- distinct denominators summed -- refuses).
A known gap (docs/verifier.md): a summand independent of a summed index contributes once per
element of the range, so coefficients are polynomials in the range lengths; a candidate right
only through ``m = S / n`` (a mean's kept ``1/n``) is rejected at the shrunk size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from ..errors import MirageError
from ..lax.ops import OPS
from ..lax.program import Program
from ..generator.labels import unit_reshape
from .degree import reshape_runs
from ..ugraph.graph import GraphKernel, InputIter, KernelGraph, KernelOp, MaskIter, \
    OutputSaver, iter_source

#: extents at least this long are shrunk
LONG = 1024
#: ... and extents at least this long too, in a program whose largest tensor takes more than
#: FULL_SIZE_BYTES as float64 field values (the argument holds for any range of at least
#: ``max(2, delta)``; LONG only keeps small programs checked at their own size)
SHORT = 128
FULL_SIZE_BYTES = 1 << 28

# block and kernel operators that read positions or carry extents of their own
_POSITIONAL = frozenset({"slice", "concat", "reshape", "mask", "take", "rms_norm"})
# ... of which these move data along some dims only and pass the others through unchanged: the
# extents of the dims they move are pinned (never shrunk), the rest may shrink (``pinned``)
_PINNING = frozenset({"slice", "concat", "reshape"})


@dataclass(frozen=True)
class Shrink:
    """What :func:`shrink` made: ``sizes`` (long extent -> shrunk extent; for a sample,
    verifier/sample.py, sampled label -> sampled extent), the shrunk program and candidate; or
    ``why`` it does not apply (then ``program`` and ``graph`` are None)."""

    sizes: dict[Any, int] = field(default_factory=dict)
    program: Program | None = None
    graph: KernelGraph | None = None
    why: str = ""

    def __bool__(self) -> bool:
        return self.program is not None


def moves_no_data(src: tuple, dst: tuple) -> bool:
    """Is a reshape of ``src`` into ``dst`` a view that moves no data: the same shape, or only
    size-1 dims added or dropped?"""
    return tuple(src) == tuple(dst) or unit_reshape(tuple(src), tuple(dst))


def view_reshape_target(src: tuple, dst: tuple, resized: tuple) -> tuple:
    """The target of a reshape of ``src`` into ``dst`` that moves no data
    (:func:`moves_no_data`), once its operand is ``resized``: each dim of ``dst`` other than
    the added size-1 ones is the operand's dim it came from, resized."""
    sources = iter([r for d, r in zip(src, resized) if d != 1])
    return tuple(1 if d == 1 else next(sources) for d in dst)


def _positional_program(program: Program, pins: bool = True) -> list[str]:
    """The operators of ``program`` that refuse the argument (``_POSITIONAL`` -- but a reshape
    that only adds or drops size-1 dims, a view that moves no data, e.g. BatchNorm's
    per-channel ``(C,) -> (1, C, 1, 1)`` -- and any the operator table does not know).
    ``pins``: slices, concatenations and reshapes pin the extents they move instead
    (``pinned``); False for a sample (verifier/sample.py), which keeps fewer rows of a label
    and so refuses them too."""
    return sorted({t.op for t in program.nodes()
                   if (t.op in _POSITIONAL and not (pins and t.op in _PINNING) and
                       not (t.op == "reshape" and moves_no_data(t.inputs[0].shape, t.shape))) or
                   (t.op not in ("input", "const") and t.op not in OPS)})


def _positional_graph(graph: KernelGraph, pins: bool = True) -> list[str]:
    """The operators of ``graph`` that refuse the argument: masks, gathers, ``rms_norm``, and
    tile slices and concatenations (their offsets are positions within a tile, which may
    shorten). A kernel-level slice, concat or reshape pins extents instead (``pinned``; unless
    not ``pins``, as for :func:`_positional_program`); a tile reshape is checked by the shrunk
    graph's validation (module doc)."""
    bad = set()
    tensors = graph.tensors()
    for op in graph.ops:
        if isinstance(op, KernelOp):
            if op.op in _POSITIONAL and not (pins and op.op in _PINNING) and not (
                    op.op == "reshape" and moves_no_data(tensors[op.operands[0]].shape,
                                                          op.output.shape)):
                bad.add(op.op)
            continue
        for n in op.block.ops:
            if isinstance(n, MaskIter):
                bad.add("mask")
            elif isinstance(n, InputIter) and n.gather >= 0:
                bad.add("take")
            elif getattr(n, "op", None) in _POSITIONAL and n.op != "reshape":
                bad.add(n.op)
    return sorted(bad)


def _pinned_by(op: str, ins: list[tuple], out: tuple, attrs: dict) -> set[int]:
    """Extents a slice, concat or reshape moves data along (not passed through unchanged)."""
    if op == "reshape":  # the runs of several dims (of extent > 1) it maps onto each other
        held = set()
        for src, dst in reshape_runs(ins[0], out):
            ea = [ins[0][a] for a in src if ins[0][a] != 1]
            eb = [out[b] for b in dst if out[b] != 1]
            if len(ea) > 1 or len(eb) > 1:
                held |= set(ea) | set(eb)
        return held
    axis = attrs.get("axis", 0)
    return {s[axis % len(s)] for s in ins + [out] if len(s)}


def pinned(program: Program, graph: KernelGraph) -> set[int]:
    """The extents no dim may shrink by: those that the program's or the graph's kernel-level
    slices, concatenations and reshapes move data along (the axis sliced or joined; a reshape's
    runs of several dims, :func:`~mirage_py.verifier.degree.reshape_runs`). Every other dim passes through them
    unchanged, so they act on it as position-blind operators do."""
    out: set[int] = set()
    for t in program.nodes():
        if t.op in _PINNING:
            out |= _pinned_by(t.op, [x.shape for x in t.inputs], t.shape, dict(t.attrs))
    if _largest_bytes(program, {}) <= FULL_SIZE_BYTES:  # a full-size check is affordable
        out |= _counted(program)
    tensors = graph.tensors()
    for op in graph.ops:
        if isinstance(op, KernelOp) and op.op in _PINNING:
            ins = [tensors[o].shape for o in op.operands if isinstance(o, str)]
            out |= _pinned_by(op.op, ins, op.output.shape, dict(op.attrs))
    return out


def _counted(program: Program) -> set[int]:
    """The extents a mean is subtracted over: a ``sub`` one of whose operands is a sum over an
    extent ``n`` scaled by a constant ``1 / n`` (or divided by ``n`` or ``n - 1``) -- a
    LayerNorm's, InstanceNorm's or a variance's centring. Shrinking such an extent sums fewer
    elements while keeping the full size's count, and centred sums rely on that count:
    ``mean((x - m) * x)`` equals ``mean((x - m)^2)`` only because ``m``'s ``1 / n`` is the
    reciprocal of the summed length, so a correct LayerNorm + projection candidate was rejected
    at the shrunk size (and a wrong one that differs only through the count could pass). Such
    extents are pinned where the program fits ``FULL_SIZE_BYTES`` at full size (:func:`pinned`;
    a larger one -- KernelBench's 112 x 64 x 512 x 512 LayerNorm -- could not be checked at all
    otherwise, and keeps the documented gap); a mean that is not subtracted (RMSNorm's) does not
    pin."""
    out: set[int] = set()

    def counts(n: int, v: Any, divides: bool) -> bool:
        if not isinstance(v, (int, float)):
            return False
        v = float(v)
        return (divides and (math.isclose(v, n, rel_tol=1e-9) or
                             math.isclose(v, n - 1, rel_tol=1e-9))) or \
            (not divides and math.isclose(v * n, 1.0, rel_tol=1e-6))

    def mean_extents(t: Any) -> set[int]:
        if t.op not in ("div", "mul") or len(t.inputs) != 2:
            return set()
        consts = [i for i in t.inputs if i.op == "const"]
        sums = [i for i in t.inputs if i.op == "sum"]
        if len(consts) != 1 or len(sums) != 1 or (t.op == "div" and t.inputs[0].op != "sum"):
            return set()
        v = dict(consts[0].attrs).get("value")
        s = sums[0]
        axes = dict(s.attrs).get("axes") or ()
        shape = s.inputs[0].shape
        ns = {shape[a] for a in axes if isinstance(shape[a], int)}
        return {n for n in ns if counts(n, v, t.op == "div")}

    for t in program.nodes():
        if t.op == "sub":
            for o in t.inputs:
                out |= mean_extents(o)
    return out


def _cuts(graph: KernelGraph) -> list[tuple[int, int]]:
    """Every (extent, tile) the graph cuts, in graph order: a graph kernel's iterators and
    savers (the extent over the grid axes and the loop that split the dim), a pre-defined
    kernel's operands and output (whole)."""
    tensors = graph.tensors()
    out: list[tuple[int, int]] = []
    for op in graph.ops:
        if isinstance(op, KernelOp):
            out += [(e, e) for name in op.inputs + (op.output.name,)
                    for e in tensors[name].shape]
            continue
        b = op.block
        for shape, imap, fmap in _iterated(op, tensors):
            for d, e in enumerate(shape):
                parts = 1
                for a in range(3):
                    if imap[a] == d:
                        parts *= b.grid[a]
                if fmap == d:
                    parts *= b.forloop
                out.append((e, e // max(parts, 1)))
    return out


def _iterated(op: GraphKernel, tensors: dict) -> Iterator[tuple[tuple, tuple, int]]:
    """``(shape, imap, fmap)`` of each input iterator and output saver of a graph kernel: the
    dims its grid axes and loop cut (``fmap`` -1 for a saver)."""
    ins = [tensors[n] for n in op.inputs]
    for n in op.block.ops:
        if isinstance(n, InputIter):
            yield iter_source(n, ins).shape, n.imap, n.fmap
        elif isinstance(n, OutputSaver):
            yield op.outputs[n.output].shape, n.omap, -1


def long_extent(program: Program) -> int:
    """The shortest extent :func:`shrink` shrinks in ``program``: :data:`LONG`, or
    :data:`SHORT` when its largest tensor is over :data:`FULL_SIZE_BYTES` as float64."""
    largest = max((math.prod(t.shape) for t in program.nodes()), default=0)
    return SHORT if 8 * largest > FULL_SIZE_BYTES else LONG


def tiles(graph: KernelGraph, long: int = LONG) -> dict[int, set[int]]:
    """Per long extent (at least ``long``), the tile extents the graph cuts from its dims."""
    out: dict[int, set[int]] = {}
    for e, t in _cuts(graph):
        if e >= long:
            out.setdefault(e, set()).add(t)
    return out


def _resized(shape: tuple, sizes: dict[int, int]) -> tuple:
    return tuple(sizes.get(d, d) if isinstance(d, int) else d for d in shape)


def small_program(program: Program, sizes: dict[Any, int],
                  node_dims: dict[str, tuple[str | None, ...]] | None = None) -> Program:
    """``program`` with every dim of an extent in ``sizes`` shrunk, constants and attributes
    kept; the format's own reader re-infers every node and refuses (``SerializationError``) a
    node whose shape does not follow. With ``node_dims`` (node digest -> label per dim,
    :func:`~mirage_py.generator.labels.infer_labels`), ``sizes`` is keyed by label instead: each
    dim whose label is in ``sizes`` takes that size, every other dim keeps its extent (a
    sample's reduced dims of a sampled label's extent, verifier/sample.py)."""
    doc = program.to_json()  # its nodes in the order of program.nodes()
    for t, nd in zip(program.nodes(), doc["nodes"]):
        if node_dims is None:
            nd["shape"] = list(_resized(tuple(nd["shape"]), sizes))
            if nd.get("op") == "reshape":  # its target shape (its shrunk dims pass through)
                nd["attrs"]["shape"] = list(_resized(tuple(nd["attrs"]["shape"]), sizes))
            continue
        shape = [sizes.get(lab, d) if lab is not None else d
                 for d, lab in zip(t.shape, node_dims[t.digest])]
        if nd["shape"] != shape and nd.get("op") == "reshape":
            nd["attrs"]["shape"] = shape  # a reshape's target is its shape
        nd["shape"] = shape
    return Program.from_json(doc)


def _split_extents(op: GraphKernel, tensors: dict) -> dict[Any, set[int]]:
    """Per grid axis (0, 1, 2) and the loop ("loop"): the extents of the dims it cuts."""
    out: dict[Any, set[int]] = {}
    for shape, imap, fmap in _iterated(op, tensors):
        for a in range(3):
            if imap[a] >= 0:
                out.setdefault(a, set()).add(shape[imap[a]])
        if fmap >= 0:
            out.setdefault("loop", set()).add(shape[fmap])
    return out


def _fewer_blocks(op: GraphKernel, tensors: dict, factors: dict[int, int],
                  least: int) -> GraphKernel:
    """``op`` with each grid axis and loop that cuts dims of one long extent ``E`` only, and has
    at least ``least * k_E`` parts, cut into ``k_E`` times fewer (at most one per extent): its
    tiles along that extent keep their length."""
    grid, loop = list(op.block.grid), op.block.forloop
    done = set()
    for axis, extents in sorted(_split_extents(op, tensors).items(), key=lambda x: str(x[0])):
        if len(extents) != 1:
            continue
        e = next(iter(extents))
        k = factors.get(e, 1)
        if k == 1 or e in done:
            continue
        count = loop if axis == "loop" else grid[axis]
        if count % k or count // k < least:
            continue
        done.add(e)
        if axis == "loop":
            loop //= k
        else:
            grid[axis] //= k
    return replace(op, block=replace(op.block, grid=tuple(grid), forloop=loop))


def small_graph(graph: KernelGraph, sizes: dict[int, int], least: int | None = None
                ) -> KernelGraph:
    """``graph`` with every tensor dim of an extent in ``sizes`` shrunk; with ``least``, grid
    axes and loops with at least ``least`` parts left cut into fewer (``_fewer_blocks``)
    instead of their tiles shortened; nothing else changed."""
    tensors = graph.tensors()
    factors = {e: e // n for e, n in sizes.items()}
    ops = []
    for op in graph.ops:
        if least is not None and isinstance(op, GraphKernel):
            op = _fewer_blocks(op, tensors, factors, least)
        if isinstance(op, KernelOp):
            attrs = tuple((k, _resized(tuple(v), sizes) if op.op == "reshape" and k == "shape"
                           else v) for k, v in op.attrs)
            ops.append(replace(op, output=replace(op.output,
                                                  shape=_resized(op.output.shape, sizes)),
                               attrs=attrs))
        else:
            ops.append(replace(op, outputs=tuple(replace(t, shape=_resized(t.shape, sizes))
                                                 for t in op.outputs)))
    return KernelGraph(graph.name, tuple(replace(t, shape=_resized(t.shape, sizes))
                                         for t in graph.inputs), tuple(ops), graph.outputs)


def shrink(program: Program, graph: KernelGraph, delta: int, target: Any = "h100") -> Shrink:
    """The shrunk pair for ``program`` and ``graph`` (module doc), ``delta`` the degree bound of
    their check at full size; a :class:`Shrink` saying why not when the argument does not
    apply or nothing is long enough to shrink."""
    if program.params or program.symbolic:
        return Shrink(why="a symbolic or padded program")
    bad = _positional_program(program) + _positional_graph(graph)
    if bad:
        return Shrink(why=f"operators that read positions or extents: {sorted(set(bad))}")
    least = max(2, int(delta))
    factors: dict[int, int] = {}
    long = tiles(graph, long_extent(program))
    held = pinned(program, graph)
    why = "no long extent can be shrunk" if not set(long) & held else \
        f"the long extents {sorted(set(long) & held)} are sliced, joined or reshaped"
    for e in sorted(set(long) - held, reverse=True):
        factors, why = _shrink_extent(graph, factors, e, least, target, why)
    # still over the size (the long dims pinned: a pooling window's slice and reshape): the
    # shorter dims too, longest first, until it fits
    short = sorted(set(tiles(graph, 2 * least)) - set(long) - held, reverse=True)
    for e in short:
        if _largest_bytes(program, {x: x // k for x, k in factors.items()}) <= FULL_SIZE_BYTES:
            break
        factors, why = _shrink_extent(graph, factors, e, least, target, why)
    if not factors:
        return Shrink(why=why)
    sizes = {e: e // k for e, k in factors.items()}
    g, why = _shrunk_graph(graph, factors, least, target)
    if g is None:
        return Shrink(why=why)
    try:
        p = small_program(program, sizes)
    except MirageError as e:
        return Shrink(why=f"the shrunk program is not valid: {e}")
    return Shrink(sizes, p, g)


def _shrink_extent(graph: KernelGraph, factors: dict[int, int], e: int, least: int,
                   target: Any, why: str) -> tuple[dict[int, int], str]:
    """``factors`` with extent ``e`` shrunk by the largest power of two the graph allows
    (every range left at least ``least``), or unchanged and why not."""
    k = 2 ** max(0, (e // least).bit_length() - 1)
    while k > 1:
        trial = {**factors, e: k}
        got, why_not = _shrunk_graph(graph, trial, least, target)
        if got is not None:
            return trial, why
        why = why_not
        k //= 2
    return factors, why


def _largest_bytes(program: Program, sizes: dict[int, int]) -> int:
    """The largest tensor of ``program`` at ``sizes``, as float64 field values."""
    return 8 * max((math.prod(_resized(t.shape, sizes)) for t in program.nodes()), default=0)


def _shrunk_graph(graph: KernelGraph, factors: dict[int, int], least: int,
                  target: Any) -> tuple[KernelGraph | None, str]:
    """The shrunk candidate for ``factors`` (long extent -> k), or None and why: every cut of
    an extent ``E`` either keeps its tile (fewer blocks or iterations, at least ``least``) or
    gets a tile ``k_E`` times shorter, at least ``least`` long; valid on the target."""
    from ..ugraph.validate import validate
    if any(e % k for e, k in factors.items()):
        return None, "an extent is not divisible"
    sizes = {e: e // k for e, k in factors.items()}
    g = small_graph(graph, sizes, least)
    try:
        validate(g, target)
    except MirageError as e:
        return None, f"the shrunk graph is not valid: {e}"
    for (e, t), (e2, t2) in zip(_cuts(graph), _cuts(g)):
        k = factors.get(e, 1)
        if e2 * k != e or not (t2 == t or (t2 * k == t and t2 >= least)):
            return None, f"extent {e}: a tile of {t} became {t2}"
    return g, ""


__all__ = ["shrink", "Shrink", "moves_no_data", "view_reshape_target", "small_program", "small_graph", "tiles", "long_extent", "pinned",
           "LONG", "SHORT", "FULL_SIZE_BYTES"]
