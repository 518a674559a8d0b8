"""Block-level search: given the device tensors available and a grid/loop plan, find the tiles a
graph-defined kernel can compute, and the kernels worth building from them.

A plan assigns dimension labels (see :mod:`labels`) to grid axes with a part count each, and a
label to the for-loop with an iteration count. Every available tensor gets an input iterator
(imap/fmap follow the labels; a mask of the program gets a mask iterator, its tile computed from
indices), and then block operators are added one at a time -- tile matmuls, sums (and the max /
min reductions the target uses; dropping the dim where the target does) over a tile dim,
for-loop accumulators (sum; max / min of a
value that is a maximum / minimum over the loop's label, also as a *running* value the loop body
reads -- FlashAttention's online normalisation: a sum of a value computed from a running maximum
is rescaled by it), and elementwise templates taken from
the target (fused thread graphs) -- each kept only if its abstract expression is a
subexpression of the target's (the oracle), its labels line up, and it is new. A value is identified by (abstract
expression, dim labels, phase), so every distinct value is built once: the enumeration saturates
instead of exploring orderings, and is cheap.

Values become kernel outputs through output savers: a final output when its expression and labels
equal a target output's, otherwise a partial result (a split reduction saved with the split
concatenated along the last dim) that a later kernel can finish.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field, replace

from ..errors import MirageError
from ..ugraph.graph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                            MaskIter, OutputSaver, ThreadGraph, ThreadOp, attrs_of, tiles_read)
from ..ugraph.phase import BODY, POST, PRE, RUN, Phase, combine
from ..ugraph.validate import check_block
from . import absexpr as ae

Dim = tuple  # tuple of (label, size) components, outermost first; () is a size-1 dim


def dim_size(d: Dim) -> int:
    n = 1
    for _, s in d:
        n *= s
    return n


def _outer(d: Dim) -> str | None:
    return d[0][0] if d else None


@dataclass(frozen=True)
class Avail:
    """A device tensor available to later kernels; ``mask`` (offset, window): a position mask
    of the program instead, which iterators compute from indices (no tensor in memory)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    expr: ae.Poly
    dims: tuple[Dim, ...]
    mask: tuple | None = None  # (offset, window, valid), as the program's mask says
    # (table, indices): the rows of a program input picked by an index input (a take of two
    # program inputs), which iterators gather as they load (no tensor in memory)
    gather: tuple[DTensor, DTensor] | None = None
    # a partial sum computed relative to its split's own running maximum (an online
    # normalisation over a split of the loop's label): the name of the saved partial maximum it
    # carries exp(-m_p) of
    shift: str | None = None


@dataclass(frozen=True)
class Plan:
    grid: tuple[tuple[str | None, int], ...]  # three (label, parts)
    loop: tuple[str | None, int]  # (label, iterations)

    @property
    def sizes(self) -> tuple[int, int, int]:
        return tuple(p for _, p in self.grid)  # type: ignore[return-value]

    def describe(self) -> str:
        g = ", ".join(f"{l}/{p}" for l, p in self.grid if l)
        return f"grid[{g}] loop[{self.loop[0]}/{self.loop[1]}]"


@dataclass
class Val:
    vid: int
    dims: tuple[Dim, ...]
    expr: ae.Poly
    phase: Phase
    consumed: frozenset
    # ("iter", i, imap, fmap) | ("op", name, operands, attrs) | ("fused", tpl, operands)
    # | ("accum", a, kind, running, rescale, shift) -- running: readable in the loop body
    # (phase RUN); rescale: the id of the running value a sum is rescaled by, or None;
    # shift: the id of the partial maximum ``a`` is relative to (each iteration's input is
    # brought to the running maximum first: ``a * exp(shift - running)``), or None
    node: tuple
    cost: int = 0
    runs: frozenset = frozenset()  # ids of the running values this one is computed from
    shifts: frozenset = frozenset()  # ids of the partial maxima it is relative to
    # after the loop: ids of the running values whose final value it carries exp(-m) of (a
    # rescaled sum, and what is computed from one)
    rel: frozenset = frozenset()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(dim_size(d) for d in self.dims)

    @property
    def key(self) -> tuple:
        return (self.expr, self.dims, self.phase)

    @property
    def operands(self) -> tuple[int, ...]:
        """Ids of the values this one is computed from."""
        if self.node[0] in ("op", "fused"):
            return tuple(self.node[2])
        if self.node[0] == "accum":
            return (self.node[1],) + tuple(x for x in self.node[4:6] if x is not None)
        return ()


@dataclass
class Context:
    oracle: ae.Oracle
    templates: list
    target_exprs: dict  # output name -> Poly
    target_labels: dict  # output name -> tuple of labels
    target_shapes: dict
    target_dtypes: dict
    reduced: frozenset
    # the reductions the target uses, as (operator, keepdims): sums keeping the dim always
    reductions: tuple = (("sum", True),)
    label_sizes: dict = field(default_factory=dict)  # label -> its full size
    slices: dict = field(default_factory=dict)  # (label, start, stop) -> the slice's label
    concats: dict = field(default_factory=dict)  # (part labels...) -> the result's label
    reshapes: frozenset = frozenset()  # component label tuples the target splits / merges
    # the target's transposes and size-1 reshapes: (operand's outer labels, result's, a
    # transpose's permutation or None)
    views: frozenset = frozenset()
    # how every tile matmul multiplies (a float32 program's ``math``, lax/precision.py); none
    # for 16-bit programs, whose tiles follow the tensor cores' operand rule
    matmul_attrs: tuple = ()
    max_values: int = 400
    max_rounds: int = 10
    max_template_combos: int = 64
    deadline: float | None = None
    stats: dict = field(default_factory=lambda: {"states": 0, "pruned": 0})


def _runs(*vs: "Val") -> frozenset:
    return frozenset().union(*(v.runs for v in vs))


def _bcast(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    n = max(len(a), len(b))
    out = []
    for j in range(n):
        da = a[j - n + len(a)] if j - n + len(a) >= 0 else ()
        db = b[j - n + len(b)] if j - n + len(b) >= 0 else ()
        if dim_size(da) == 1 and dim_size(db) == 1:
            out.append(da or db)
        elif dim_size(da) == 1:
            out.append(db)
        elif dim_size(db) == 1:
            out.append(da)
        elif da == db:
            out.append(da)
        else:
            return None
    return tuple(out)


def make_iterator(t: Avail, plan: Plan, forloop: int) -> tuple[tuple, int, tuple[Dim, ...]] | None:
    dims = [list(d) for d in t.dims]
    imap = [-1, -1, -1]
    for a, (label, parts) in enumerate(plan.grid):
        if label is None or parts == 1:
            continue
        for j, d in enumerate(dims):
            if d and d[0][0] == label and d[0][1] % parts == 0:
                imap[a] = j
                d[0] = (label, d[0][1] // parts)
                break
    fmap = -1
    label, f = plan.loop
    if label is not None and f > 1:
        for j, d in enumerate(dims):
            if d and d[0][0] == label and d[0][1] % f == 0:
                fmap = j
                d[0] = (label, d[0][1] // f)
                if d[0][1] == 1 and len(d) > 1:
                    del d[0]  # one split part per iteration: the dim is the inner label again
                break
    return tuple(imap), fmap, tuple(tuple(d) for d in dims)


def saturate(plan: Plan, avail: list[Avail], ctx: Context) -> list[Val]:
    """All useful values one block can compute under ``plan`` (in creation order)."""
    pool: list[Val] = []
    seen: set = set()
    F = plan.loop[1] if plan.loop[0] is not None else 1

    def add(v: Val) -> bool:
        ctx.stats["states"] += 1
        if v.node[0] in ("op", "fused"):  # a body value computed from running values
            body = v.phase is BODY
            v.runs = _runs(*(pool[o] for o in v.operands)) if body else frozenset()
            v.shifts = frozenset().union(*(pool[o].shifts for o in v.operands)) \
                if body else frozenset()
            v.rel = frozenset().union(*(pool[o].rel for o in v.operands)) \
                if v.phase is POST else frozenset()
        elif v.node[0] == "accum" and v.node[4] is not None:
            v.rel = frozenset([v.node[4]])
        if v.key in seen:
            return False
        if v.node[0] != "iter" and not ctx.oracle(v.expr):
            ctx.stats["pruned"] += 1
            return False
        seen.add(v.key)
        pool.append(v)
        return True

    first: dict[str, int] = {}
    for i, t in enumerate(avail):
        imap, fmap, dims = make_iterator(t, plan, F)
        first.setdefault(t.name, len(pool))
        add(Val(len(pool), dims, t.expr, BODY if fmap >= 0 else PRE, frozenset(),
                ("iter", i, imap, fmap)))
    for v in pool:  # a partial relative to its split's maximum, iterated beside that maximum
        t = avail[v.node[1]]
        if t.shift is not None and t.shift in first and v.phase is BODY:
            v.shifts = frozenset([first[t.shift]])
    new_from = 0
    for _ in range(ctx.max_rounds):
        if ctx.deadline is not None and time.perf_counter() > ctx.deadline:
            break
        start = len(pool)
        if new_from >= start or len(pool) >= ctx.max_values:
            break
        _round(pool, new_from, add, ctx, F, plan.loop[0])
        new_from = start
        if len(pool) == start:
            break
    return pool


def _round(pool: list[Val], new_from: int, add, ctx: Context, F: int, loop: str) -> None:
    cur = list(pool)
    n = len(cur)
    # tile matmuls: pair values whose contracted dims carry the same labels
    by_rows: dict = {}
    for b in cur:
        if len(b.dims) >= 2:
            by_rows.setdefault(b.dims[-2], []).append(b)
    for a in cur:
        if len(a.dims) < 2 or dim_size(a.dims[-1]) == 1:
            continue
        for b in by_rows.get(a.dims[-1], ()):
            if a.vid < new_from and b.vid < new_from:
                continue
            ph = combine(a.phase, b.phase)
            batch = _bcast(a.dims[:-2], b.dims[:-2])
            if ph is None or batch is None:
                continue
            add(Val(len(pool), batch + (a.dims[-2], b.dims[-1]),
                    ae.apply("matmul", [a.expr, b.expr], a.dims[-1]), ph,
                    a.consumed | b.consumed | {c[0] for c in a.dims[-1]},
                    ("op", "matmul", (a.vid, b.vid), ctx.matmul_attrs), a.cost + b.cost + 1))
    # sums (and max / min) over one tile dim (kept as a size-1 dim)
    for i in range(new_from, n):
        a = cur[i]
        for j, d in enumerate(a.dims):
            # a dim of one element is no reduction -- unless it is the loop's chunk of one
            # (a batch label looped one entry at a time, as heads summed after a batched
            # matmul): dropping it, the loop's accumulator sums over the label
            if dim_size(d) == 1 and not (loop is not None and _outer(d) == loop):
                continue
            for red, keep in ctx.reductions:
                if dim_size(d) == 1 and keep:
                    continue
                dims = a.dims[:j] + (((),) if keep else ()) + a.dims[j + 1:]
                add(Val(len(pool), dims, ae.apply(red, [a.expr], d), combine(a.phase),
                        a.consumed | {c[0] for c in d},
                        ("op", red, (a.vid,), _reduce_attrs(j, keep)), a.cost + 1))
    # the target's slices and concatenations, inside a tile that holds the whole dim
    _slices_and_concats(cur, new_from, n, add, ctx, len(pool))
    # the target's transposes and size-1 reshapes of a tile
    if ctx.views:
        _views(cur, new_from, n, add, ctx, len(pool))
    # for-loop accumulators: sums of anything; the max / min of a maximum / minimum over the
    # loop's label (the running maximum of chunk maxima), after the loop and as a running value
    # the body reads. Abstractly the running value *is* the full maximum: a sum of a value
    # computed from it (exp(s - m)) is rescaled as m grows, so that after the loop it equals the
    # sum taken with the final maximum -- the verifier checks that it does
    #
    # A partial sum relative to its split's own maximum (``shifts``: a kernel before summed a
    # split of the label with a running maximum and saved that maximum too) is combined the
    # same way: each iteration's partial is brought to the running maximum of the partial
    # maxima, ``partial * exp(m_p - m)``, and summed rescaled by it (flash-decoding, safe)
    if F > 1:
        for i in range(new_from, n):
            a = cur[i]
            kind = _selection_over(a.expr, loop)
            if a.phase is not BODY or kind is None or a.runs or a.shifts:
                continue
            sel = ae.selected(kind, F, a.expr, loop)
            add(Val(len(pool), a.dims, sel, POST, a.consumed | {loop},
                    ("accum", a.vid, kind, False, None, None), a.cost + 1))
            # the running value stands for the maximum of the whole row, also where the grid
            # splits the label and a block sees only its part: any per-row value cancels from
            # a normalised exponential, and the part's maximum is saved beside the part's sums
            # for a combine
            vid = len(pool)
            add(Val(vid, a.dims, _whole_selection(kind, a.expr, loop, ctx), RUN,
                    a.consumed | {loop}, ("accum", a.vid, kind, True, None, None), a.cost + 1,
                    frozenset([vid])))
        running = {v.node[1]: v.vid for v in pool if v.phase is RUN}  # of value id
        for i in range(new_from, n):
            a = cur[i]
            if a.phase is not BODY or len(a.runs) > 1 or len(a.shifts) > 1 or \
                    (a.runs and a.shifts):
                continue
            shift = next(iter(a.shifts)) if a.shifts else None
            rescale = next(iter(a.runs)) if a.runs else running.get(shift)
            if shift is not None and rescale is None:
                continue  # the partial maxima are not iterated: no way to combine
            add(Val(len(pool), a.dims, ae.summed(F, a.expr, loop), POST, a.consumed | {loop},
                    ("accum", a.vid, "sum", False, rescale, shift), a.cost + 1))
    # elementwise templates from the target, as fused thread graphs
    by_len: dict[int, list[Val]] = {}  # a leaf is filled by values with as many monomials
    for v in cur:
        by_len.setdefault(len(v.expr), []).append(v)
    for tp in ctx.templates:
        # leaves are filled by values with the same expression first, then by values that
        # are it scaled or contracted as a whole (x / r applied to x @ w: scaling commutes with
        # the contraction). Such a value must have exactly the leaf's monomials times one
        # cofactor: (x + y) @ w may fill leaf x + y, but not leaf x -- the normal form drops
        # coefficients, so (x + y) @ w + y @ w would pass for (x + y) @ w and, having the same
        # key, shadow the right value (rms_norm(x + y) @ w found no correct kernel)
        # semi-naive: a template is only worth filling when some leaf takes a new value
        if not any(_fills(le, v) for le in tp.leaf_exprs
                   for v in by_len.get(len(le), ()) if v.vid >= new_from):
            continue
        cands = []
        for le in tp.leaf_exprs:
            same = by_len.get(len(le), ())
            cands.append([v for v in same if v.expr == le] +
                         [v for v in same if v.expr != le and ae._embeds(le, v.expr)])
        if any(not c for c in cands):
            continue
        tried = 0
        for combo in _new_combos(cands, new_from):
            if tried >= ctx.max_template_combos:
                break
            tried += 1
            ph = combine(*(v.phase for v in combo))
            if ph is None:
                continue
            dims = combo[0].dims
            for v in combo[1:]:
                dims = _bcast(dims, v.dims)
                if dims is None:
                    break
            if dims is None:
                continue
            expr = tp.expr([v.expr for v in combo])
            add(Val(len(pool), dims, expr, ph, frozenset().union(*(v.consumed for v in combo)),
                    ("fused", tp, tuple(v.vid for v in combo)),
                    sum(v.cost for v in combo) + len(tp.thread.ops)))


@functools.lru_cache(maxsize=None)
def _reduce_attrs(axis: int, keepdims: bool) -> tuple:
    return attrs_of(axes=(axis,), keepdims=keepdims)


def _fills(le: ae.Poly, v: Val) -> bool:
    """Can value ``v`` fill a template leaf of expression ``le`` (the same expression, or it
    times one cofactor; see the templates in ``_round``)?"""
    return v.expr == le or ae._embeds(le, v.expr)


def _whole(d: Dim, ctx: Context) -> str | None:
    """The label of a tile dim that holds its label's whole range, else None."""
    if len(d) == 1 and ctx.label_sizes.get(d[0][0]) == d[0][1]:
        return d[0][0]
    return None


def _slices_and_concats(cur: list[Val], new_from: int, n: int, add, ctx: Context,
                        first_id: int) -> None:
    """Slices of a whole tile dim the target slices (its ``(label, start, stop)``), and
    concatenations of values whose dims are the parts the target concatenates, in its order."""
    if not ctx.slices and not ctx.concats and not ctx.reshapes:
        return
    count = [first_id]

    def new(dims, expr, phase, consumed, node, cost) -> None:
        if add(Val(count[0], dims, expr, phase, consumed, node, cost)):
            count[0] += 1

    # reshapes: a dim made of the components the target splits it into becomes those dims, and
    # consecutive dims the target merges become one (tiles are row-major: the data stays put)
    for i in range(new_from, n):
        a = cur[i]
        for j, d in enumerate(a.dims):
            if len(d) > 1 and tuple(lbl for lbl, _ in d) in ctx.reshapes:
                dims = a.dims[:j] + tuple((c,) for c in d) + a.dims[j + 1:]
                new(dims, a.expr, combine(a.phase), a.consumed,
                    ("op", "reshape", (a.vid,),
                     attrs_of(shape=tuple(dim_size(x) for x in dims))), a.cost + 1)
        for parts in ctx.reshapes:
            k = len(parts)
            for j in range(len(a.dims) - k + 1):
                window = a.dims[j:j + k]
                if all(len(d) == 1 for d in window) and \
                        tuple(d[0][0] for d in window) == parts:
                    dims = a.dims[:j] + (tuple(d[0] for d in window),) + a.dims[j + k:]
                    new(dims, a.expr, combine(a.phase), a.consumed,
                        ("op", "reshape", (a.vid,),
                         attrs_of(shape=tuple(dim_size(x) for x in dims))), a.cost + 1)

    for i in range(new_from, n):
        a = cur[i]
        for j, d in enumerate(a.dims):
            lbl = _whole(d, ctx)
            for (sl, start, stop), out in ctx.slices.items():
                if lbl is None or sl != lbl:
                    continue
                dims = a.dims[:j] + (((out, stop - start),),) + a.dims[j + 1:]
                new(dims, ae.sliced(a.expr, lbl, start, stop), combine(a.phase), a.consumed,
                    ("op", "slice", (a.vid,), attrs_of(axis=j, start=start, stop=stop)),
                    a.cost + 1)
    fresh = {_whole(d, ctx) for v in cur[new_from:n] for d in v.dims} - {None}
    for parts, out in ctx.concats.items():
        # every combination needs a value new in this round; a size-1 part (None: the new row
        # of a KV cache's cat(past, new)) is any value's, so a new value can be it -- the new
        # row made by a concatenation of its own (GPT-NeoX's partial rotary, cat(rope(k[..., :r]),
        # k[..., r:])) came a round after the cache's tile and was never tried
        if not fresh & set(parts) and (None not in parts or new_from >= n):
            continue
        # per part, the values with one dim that is that part whole: (value, axis)
        cands = [[(v, j) for v in cur for j, d in enumerate(v.dims) if _whole(d, ctx) == p]
                 for p in parts]
        if any(not c for c in cands):
            continue
        for combo in itertools.product(*cands):
            if all(v.vid < new_from for v, _ in combo):
                continue
            axes = {j for _, j in combo}
            vals = [v for v, _ in combo]
            ph = combine(*(v.phase for v in vals))
            if len(axes) != 1 or ph is None:
                continue
            j = axes.pop()
            rest = {v.dims[:j] + v.dims[j + 1:] for v in vals}
            if len(rest) != 1 or len({len(v.dims) for v in vals}) != 1:
                continue
            size = sum(dim_size(v.dims[j]) for v in vals)
            expr = vals[0].expr
            for v in vals[1:]:
                expr = ae.add(expr, v.expr)
            new(vals[0].dims[:j] + (((out, size),),) + vals[0].dims[j + 1:], expr, ph,
                frozenset().union(*(v.consumed for v in vals)),
                ("op", "concat", tuple(v.vid for v in vals), attrs_of(axis=j)),
                sum(v.cost for v in vals) + 1)


def _views(cur: list[Val], new_from: int, n: int, add, ctx: Context, first_id: int) -> None:
    """Tiles viewed as the target views its tensors (``Context.views``): a tile whose dims carry
    the operand's outer labels in order gets the result's order -- its dims permuted (a
    transpose: a copy in shared memory), or size-1 dims added or dropped (a reshape: the data
    stays put). The abstract expression is the same; the dims say which is which."""
    count = [first_id]
    for i in range(new_from, n):
        a = cur[i]
        have = tuple(_outer(d) for d in a.dims)
        for src, dst, perm in ctx.views:
            if have != src:
                continue
            if perm is not None:
                dims = tuple(a.dims[p] for p in perm)
                node = ("op", "transpose", (a.vid,), attrs_of(perm=perm))
            else:
                kept = iter(d for d in a.dims if _outer(d) is not None)
                dims = tuple(() if lbl is None else next(kept) for lbl in dst)
                node = ("op", "reshape", (a.vid,),
                        attrs_of(shape=tuple(dim_size(d) for d in dims)))
            if dims == a.dims:
                continue
            if add(Val(count[0], dims, a.expr, combine(a.phase), a.consumed, node, a.cost + 1)):
                count[0] += 1


def _selection_over(e: ae.Poly, label: str | None) -> str | None:
    """"max" / "min" when ``e`` is one selection of that kind over ``label``, else None."""
    if label is None or len(e) != 1:
        return None
    (s, factors), = e
    if s or len(factors) != 1 or factors[0][1] != 1:
        return None
    at = factors[0][0]
    if at[0] == "sel" and at[2][0][0] == ae._base(label):
        return at[1]
    return None


def _whole_selection(kind: str, e: ae.Poly, label: str, ctx: Context) -> ae.Poly:
    """``e`` (one selection of ``kind`` over part of ``label``) as the selection over the
    label's whole range."""
    (_, factors), = e
    part = factors[0][0][2][0][1]
    whole = ctx.label_sizes.get(ae._base(label), part)
    return ae.selected(kind, max(1, whole // part), e, label)


def _new_combos(cands: list[list[Val]], new_from: int):
    """Tuples with one value per leaf and at least one value new in this round (semi-naive
    evaluation: tuples of old values were all tried in earlier rounds)."""
    old = [[v for v in c if v.vid < new_from] for c in cands]
    new = [[v for v in c if v.vid >= new_from] for c in cands]
    for i in range(len(cands)):  # leaf i holds the first new value
        if not new[i]:
            continue
        yield from itertools.product(*old[:i], new[i], *cands[i + 1:])


# ---- turning values into kernels ------------------------------------------------------------

def save_layout(v: Val, plan: Plan) -> tuple[tuple[int, int, int], tuple[Dim, ...]] | None:
    """omap and saved-tensor dims for value ``v``, or None when it cannot be saved. A size-1
    dim without a label (a width-1 slice's, ``((None, 1),)`` in the tile) is saved as ``()``,
    the form every other unlabelled size-1 dim has (a later kernel reads labels off it:
    KernelBench's ConvolutionalVisionTransformer's class token failed there)."""
    dims = [[] if all(c[0] is None and c[1] == 1 for c in d) else list(d) for d in v.dims]
    omap = [-1, -1, -1]
    concat_axis = None
    for a, (label, parts) in enumerate(plan.grid):
        if label is None or parts == 1:
            continue
        for j, d in enumerate(dims):
            if d and d[0][0] == label:
                omap[a] = j
                d[0] = (label, d[0][1] * parts)
                break
        else:
            if label not in v.consumed or concat_axis is not None or not dims:
                return None
            concat_axis = a
            omap[a] = len(dims) - 1
    if concat_axis is not None:
        # the split parts get a label of their own: "<label>/<parts>" (a reduction a later
        # kernel finishes by looping over it)
        label, parts = plan.grid[concat_axis]
        dims[-1] = [(f"{label}/{parts}", parts)] + [c for c in dims[-1]]
    return tuple(omap), tuple(tuple(d) for d in dims)


# exp(in0 - in1): the factor that brings a partial relative to its maximum in0 to in1
_EXP_DIFF = ThreadGraph(2, (ThreadOp("d", "sub", ("in0", "in1")), ThreadOp("e", "exp", ("d",))))


@dataclass
class KernelCandidate:
    kernel: GraphKernel
    outputs: list[Avail]
    finals: list[str]  # target outputs it produces
    plan: Plan


def build_kernel(plan: Plan, avail: list[Avail], pool: list[Val], saves: list[tuple[Val, str, str]],
                 threads: int = 128) -> tuple[GraphKernel, list[Avail]]:
    """Emit the block graph for the cones of ``saves`` = [(value, tensor name, dtype)]."""
    by_id = {v.vid: v for v in pool}
    need: set[int] = set()
    stack = [v.vid for v, _, _ in saves]
    while stack:
        k = stack.pop()
        if k in need:
            continue
        need.add(k)
        stack.extend(by_id[k].operands)
    used_inputs = sorted({by_id[k].node[1] for k in need if by_id[k].node[0] == "iter" and
                          avail[by_id[k].node[1]].mask is None})
    # the kernel's input tensors: an avail's own, or a gathered one's table and indices
    in_names: list[str] = []
    for i in used_inputs:
        for n in ((t.name for t in avail[i].gather) if avail[i].gather else (avail[i].name,)):
            if n not in in_names:
                in_names.append(n)
    F = plan.loop[1] if plan.loop[0] is not None else 1
    ops: list = []
    name = {}
    for k in sorted(need):
        v = by_id[k]
        nm = f"v{k}"
        name[k] = nm
        node = v.node
        if node[0] == "iter" and avail[node[1]].mask is not None:
            a = avail[node[1]]
            ops.append(MaskIter(nm, a.shape, a.mask[0], a.mask[1], node[2], node[3],
                                a.mask[2] if len(a.mask) > 2 else None))
        elif node[0] == "iter" and avail[node[1]].gather is not None:
            table, ids = avail[node[1]].gather
            ops.append(InputIter(nm, in_names.index(table.name), node[2], node[3],
                                 gather=in_names.index(ids.name)))
        elif node[0] == "iter":
            ops.append(InputIter(nm, in_names.index(avail[node[1]].name), node[2], node[3]))
        elif node[0] == "op":
            ops.append(BlockOp(nm, node[1], tuple(name[x] for x in node[2]), node[3]))
        elif node[0] == "fused":
            ops.append(Fused(nm, tuple(name[x] for x in node[2]), node[1].thread))
        elif node[5] is not None:  # a partial relative to its maximum: brought to the running one
            w, y = f"{nm}_w", f"{nm}_y"
            ops.append(Fused(w, (name[node[5]], name[node[4]]), _EXP_DIFF))
            ops.append(BlockOp(y, "mul", (name[node[1]], w)))
            ops.append(Accum(nm, y, "sum", rescale=name[node[4]]))
        else:
            ops.append(Accum(nm, name[node[1]], node[2], running=node[3],
                             rescale=name[node[4]] if node[4] is not None else None))
    outs: list[Avail] = []
    for j, (v, tname, dtype) in enumerate(saves):
        omap, dims = save_layout(v, plan)
        ops.append(OutputSaver(name[v.vid], j, omap))
        outs.append(Avail(tname, tuple(dim_size(d) for d in dims), dtype, v.expr, dims))
    ops = fuse_thread_chains(ops)
    bg = BlockGraph(plan.sizes, threads, F, tuple(ops))
    gk = GraphKernel(tuple(in_names),
                     tuple(DTensor(o.name, o.shape, o.dtype) for o in outs), bg)
    return gk, outs


def fuse_thread_chains(ops: list) -> list:
    """Inline a Fused node into its only consumer when that consumer is Fused too (thread-level
    fusion: the intermediate stays in registers)."""
    changed = True
    while changed:
        changed = False
        uses: dict[str, int] = {}
        for o in ops:
            for a in tiles_read(o):
                uses[a] = uses.get(a, 0) + 1
        producers = {o.out: o for o in ops if isinstance(o, Fused)}
        for idx, o in enumerate(ops):
            if not isinstance(o, Fused):
                continue
            for pos, a in enumerate(o.operands):
                p = producers.get(a)
                if p is None or uses.get(a, 0) != 1:
                    continue
                ops[idx] = _inline(o, pos, p)
                ops.remove(p)
                changed = True
                break
            if changed:
                break
    return ops


def _inline(consumer: Fused, pos: int, producer: Fused) -> Fused:
    """consumer(.., producer(p_args), ..) as one thread graph over the union of operands."""
    operands = list(consumer.operands[:pos]) + list(consumer.operands[pos + 1:])
    cmap: dict[str, str] = {}
    k = 0
    for i in range(consumer.thread.ninputs):
        if i == pos:
            continue
        cmap[f"in{i}"] = f"in{k}"
        k += 1
    pmap: dict[str, str] = {}
    for i, a in enumerate(producer.operands):
        if a in operands:
            pmap[f"in{i}"] = f"in{operands.index(a)}"
        else:
            operands.append(a)
            pmap[f"in{i}"] = f"in{len(operands) - 1}"
    tops: list[ThreadOp] = []
    for t in producer.thread.ops:
        tops.append(ThreadOp("p_" + t.out, t.op, tuple(
            pmap[o] if isinstance(o, str) and o in pmap else ("p_" + o if isinstance(o, str) else o)
            for o in t.operands), t.attrs))
    cmap[f"in{pos}"] = "p_" + producer.thread.ops[-1].out
    for t in consumer.thread.ops:
        tops.append(ThreadOp("c_" + t.out, t.op, tuple(
            cmap[o] if isinstance(o, str) and o in cmap else ("c_" + o if isinstance(o, str) else o)
            for o in t.operands), t.attrs))
    return Fused(consumer.out, tuple(operands), ThreadGraph(len(operands), tuple(tops)))


def kernels_for_plan(plan: Plan, avail: list[Avail], ctx: Context, target, counter: list[int],
                     max_partials: int = 4) -> list[KernelCandidate]:
    """Saturate under ``plan`` and return the kernels worth building: one producing every final
    output it can; else one per complete intermediate, and one saving the partial results of a
    reduction split over the grid, for later kernels to finish."""
    pool = saturate(plan, avail, ctx)
    have = {a.expr for a in avail}
    finals: list[tuple[Val, str, str]] = []
    for name, texpr in ctx.target_exprs.items():
        if any(a.name == name for a in avail):
            continue
        for v in pool:
            if v.expr != texpr or v.node[0] == "iter":
                continue
            if v.phase is BODY and plan.loop[0] is not None and plan.loop[1] > 1:
                continue
            lay = save_layout(v, plan)
            if lay is None:
                continue
            _, dims = lay
            if tuple(dim_size(d) for d in dims) != ctx.target_shapes[name]:
                continue
            if tuple(_outer(d) for d in dims) != ctx.target_labels[name]:
                continue
            finals.append((v, name, ctx.target_dtypes[name]))
            break
    if finals:
        kc = _valid_kernel(plan, avail, pool, finals, [n for _, n, _ in finals], target)
        return [kc] if kc else []
    epi = POST if plan.loop[0] is not None and plan.loop[1] > 1 else None
    saveable = [v for v in pool if v.node[0] != "iter" and (v.phase == epi or epi is None) and
                v.expr not in have and save_layout(v, plan) is not None]
    used = {k for v in pool for k in v.operands}
    groups: list[list[Val]] = []
    # (a) complete intermediates: values equal to a polynomial of the target (an exp(...) or a
    # norm, say), each its own kernel; the largest ones only
    exact = [v for v in saveable if v.expr in ctx.oracle._pool and not _needs_concat(v, plan)]
    for v in exact:
        if not any(v.vid in w.operands for w in exact):
            groups.append([v])
    # (b) partial results of a reduction split over the grid: the sinks, saved together; a sum
    # rescaled by a running maximum is relative to its split's maximum, so it is saved only
    # beside that maximum (the partial max of the same values), and marked relative to it
    partial = [v for v in saveable if v.vid not in used and _needs_concat(v, plan)]
    by_id = {v.vid: v for v in pool}
    shift_of: dict[int, int] = {}
    for v in partial:
        if len(v.rel) > 1:
            partial = []
            break
        for r in (by_id[x].node for x in v.rel):
            m = next((u for u in partial if u.node[0] == "accum" and u.node[1:4] ==
                      (r[1], r[2], False)), None)
            if m is None:
                partial = []
                break
            shift_of[v.vid] = m.vid
    if partial and len(partial) <= max_partials:
        groups.append(partial)
    out: list[KernelCandidate] = []
    for group in groups:
        saves = []
        for v in group:
            counter[0] += 1
            saves.append((v, f"part{counter[0]}", "float32"))
        names = {v.vid: n for v, n, _ in saves}
        kc = _valid_kernel(plan, avail, pool, saves, [], target,
                           {names[v]: names[m] for v, m in shift_of.items() if v in names})
        if kc:
            out.append(kc)
    return out


def _valid_kernel(plan: Plan, avail: list[Avail], pool: list[Val], saves: list, finals: list[str],
                  target, shifts: dict | None = None) -> KernelCandidate | None:
    """The kernel saving ``saves``, or None when it breaks a validity rule (shared memory...);
    ``shifts``: saved partial -> the saved partial maximum it is relative to."""
    try:
        gk, outs = build_kernel(plan, avail, pool, saves)
        if shifts:
            outs = [replace(o, shift=shifts.get(o.name)) for o in outs]
        check_block(gk.block, [_dt(avail, n) for n in gk.inputs], list(gk.outputs), target)
    except MirageError:
        return None
    return KernelCandidate(gk, outs, finals, plan)


def _needs_concat(v: Val, plan: Plan) -> bool:
    """True when saving ``v`` concatenates the blocks of a split reduction."""
    for label, parts in plan.grid:
        if label is None or parts == 1:
            continue
        if not any(d and d[0][0] == label for d in v.dims):
            return True
    return False


def _dt(avail: list[Avail], name: str) -> DTensor:
    for a in avail:
        if a.name == name:
            return DTensor(a.name, a.shape, a.dtype)
        if a.gather is not None:  # a gathered tensor's table or indices
            for t in a.gather:
                if t.name == name:
                    return t
    raise KeyError(name)
