"""Grids and loop trip counts computed at launch for a padded graph (a shape family's bucket).

A padded graph (lax/family.py) runs at the bucket's sizes; the valid sizes ``V`` are known only
when it runs. A call at ``V`` well inside the bucket need not do the bucket's work: blocks along
a grid-split dim and loop iterations along a loop dim that lie wholly past ``V`` may be left out
where what they would write is never read. The rule (docs/codegen.md, "Sizes at run time"):

* **Grid**: along grid axis ``a`` a block ``b`` writes elements ``b * P .. (b + 1) * P`` of dim
  ``omap[a]`` of each output (``P`` the output's part). Blocks with ``b * P >= V`` are left out
  -- the grid is ``ceil(V / P)`` -- when every output saver of the kernel maps ``a`` to a padded
  dim of a *graph output* with the same valid size ``V`` and part ``P``, and no later kernel reads
  that output: the caller cuts outputs back to ``V``, so nothing reads those elements. A kernel
  that writes an intermediate runs its whole grid: a later kernel may read the padding
  unmasked -- a contraction over a padded dim (``p @ v``) relies on ``v``'s padding being the
  zero-filled inputs carried through ``f(0) = 0`` operators, and ``0 * garbage`` is not 0.
* **Loop**: iteration ``it`` of a loop reads positions ``it * T ..`` of its iterators' loop dim
  (plus the block's part ``b * P`` where a grid axis splits that dim too). Iterations with every
  position at or past ``V`` are left out -- the trip count is ``ceil((V - b * P) / T)``, at least
  1 and at most the bucket's -- when every iterator that walks a padded dim agrees on ``V``,
  ``T`` and ``P``, and such an iteration adds each accumulator's identity: an abstract
  evaluation of the block graph in which padded tiles of graph inputs are 0 (zero-filled) and
  padded tiles of masks are 0, other tiles unknown, must give every sum accumulator 0, every max
  accumulator a value at or below -65504 (the padder's fill, lax/family.py) and every min one at
  or above 65504. At least one iteration runs, so the state the skipped iterations would have
  left alone exists (a block wholly past ``V`` along a split loop dim runs its first iteration,
  as the whole-bucket code did).

Static graphs, and padded graphs run without :class:`PaddedExtents`, launch exactly as before.
Tensor maps keep the bucket's dims (a TMA box that starts inside the tensor is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..cost_model import LaunchWork
from ..lax.ops import OPS
from ..lax.ops import compute as op_compute
from ..lax.shapes import Affine, Dim, resolve
from ..ugraph.graph import (Accum, BlockGraph, BlockOp, Fused, GraphKernel, InputIter,
                            KernelGraph, MaskIter)
from .cexpr import size_expr

#: the fills the padder gives a max / min over padding (float16's extremes; float32's are
#: beyond them): a max accumulator's input at or below the first is taken as its identity
LOWEST, HIGHEST = -65504.0, 65504.0


def _symbolic(v: Any) -> Affine | None:
    """``v`` as an expression of dims, or None for a static size."""
    if isinstance(v, (Dim, Affine)):
        a = Affine.of(v)
        return a if a.terms else None
    return None


@dataclass(frozen=True)
class PaddedExtents:
    """The valid size of every dim of a padded graph's inputs and outputs: ``tensors`` maps a
    tensor name to one entry per dim, an int (static) or an expression of dims (padded to the
    bucket's size when the graph runs). Built from the symbolic program
    (:meth:`of_program`)."""

    tensors: Mapping[str, tuple]

    @classmethod
    def of_program(cls, program: Any) -> "PaddedExtents":
        """The extents of a symbolic ``lax.Program``'s inputs and outputs (the names the
        padded program's graph keeps)."""
        out = {t.name: tuple(t.shape) for t in program.inputs}
        out.update({n: tuple(t.shape) for n, t in program.output_tensors.items()})
        return cls(out)

    def valid(self, tensor: str, dim: int) -> Affine | None:
        """Dim ``dim`` of ``tensor``'s valid size if it is padded (an expression), else None."""
        shape = self.tensors.get(tensor)
        if shape is None or dim >= len(shape):
            return None
        return _symbolic(shape[dim])


@dataclass(frozen=True)
class RunCount:
    """A grid size or loop trip count computed when the kernel runs: ``ceil((valid - start) /
    part)`` clamped to ``1 .. whole`` (``whole``: the bucket's count). ``start_axis`` >= 0: the
    count is per block, ``start = blockIdx[start_axis] * start_part`` (a loop over a dim a grid
    axis also splits)."""

    valid: Affine
    part: int
    whole: int
    start_axis: int = -1
    start_part: int = 0

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.valid.terms)

    def at(self, sizes: Mapping[str, int], block: int = 0) -> int:
        """The count for ``sizes`` (in block ``block`` along ``start_axis``)."""
        left = int(resolve(self.valid, sizes)) - block * self.start_part
        return max(1, min(self.whole, -(-left // self.part)))

    def c(self, dim_value: Any = None) -> str:
        """The count as a C expression; ``dim_value(name)`` gives a dim's C value (default: the
        kernel's ``mp_dim_<name>`` parameter)."""
        return self.clamp(self.c_unclamped(dim_value))

    def clamp(self, n: str) -> str:
        """``n`` (a C expression) clamped to ``1 .. whole``."""
        return f"({n} < 1 ? 1 : {n} > {self.whole} ? {self.whole} : {n})"

    def c_unclamped(self, dim_value: Any = None) -> str:
        """``ceil((valid - start) / part)`` as C, before the clamp."""
        v = size_expr(self.valid, dim_value)
        if self.start_axis >= 0:
            axis = ("blockIdx.x", "blockIdx.y", "blockIdx.z")[self.start_axis]
            v = f"({v} - static_cast<int>({axis}) * {self.start_part})"
        return f"({v} + {self.part - 1}) / {self.part}" if self.part > 1 else v


@dataclass(frozen=True)
class KernelCounts:
    """What of one graph-defined kernel is computed at launch: a count per grid axis (None: the
    bucket's) and the loop's trip count (None: the bucket's)."""

    grid: tuple[RunCount | None, RunCount | None, RunCount | None] = (None, None, None)
    loop: RunCount | None = None

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(sorted({n for c in (*self.grid, self.loop) if c is not None
                             for n in c.dims}))

    def work(self, block: BlockGraph, sizes: Mapping[str, int] | None) -> LaunchWork:
        """The blocks launched and loop iterations run summed over them of a kernel with block
        graph ``block`` at ``sizes`` (None: the bucket's whole grid and loop)."""
        grid = [g if c is None or sizes is None else c.at(sizes)
                for g, c in zip(block.grid, self.grid)]
        blocks = grid[0] * grid[1] * grid[2]
        loop = self.loop
        if loop is None or sizes is None:
            return LaunchWork(blocks, blocks * block.forloop)
        if loop.start_axis < 0:
            return LaunchWork(blocks, blocks * loop.at(sizes))
        per = blocks // grid[loop.start_axis]
        return LaunchWork(blocks, per * sum(loop.at(sizes, b)
                                            for b in range(grid[loop.start_axis])))


def kernel_counts(graph: KernelGraph, extents: PaddedExtents | None) -> dict[int, KernelCounts]:
    """Per graph-defined kernel (by its index in ``graph.ops``) the counts the rule (module
    doc) lets it compute at launch; kernels it leaves as they are are absent."""
    if extents is None:
        return {}
    inputs = {t.name for t in graph.inputs}
    shapes = {n: t.shape for n, t in graph.tensors().items()}
    read_after: dict[int, set[str]] = {}
    later: set[str] = set()
    for k in range(len(graph.ops) - 1, -1, -1):
        read_after[k] = set(later)
        later |= set(graph.ops[k].inputs)
    out: dict[int, KernelCounts] = {}
    for k, op in enumerate(graph.ops):
        if not isinstance(op, GraphKernel):
            continue
        grid = tuple(_grid_count(op, a, extents, set(graph.outputs), read_after[k])
                     for a in range(3))
        loop = _loop_count(op, extents, inputs, shapes)
        counts = KernelCounts(grid, loop)  # type: ignore[arg-type]
        if counts.dims:
            out[k] = counts
    return out


def launch_work(graph: KernelGraph, extents: PaddedExtents | None,
                sizes: Mapping[str, int] | None) -> dict[int, LaunchWork]:
    """Per graph-defined kernel (by index in ``graph.ops``) what it runs when launched at the
    valid ``sizes`` (None: the bucket's whole grids and loops) -- what the cost model prices a
    call inside a bucket by (``cost_model.predict_launched``)."""
    counts = kernel_counts(graph, extents)
    return {k: counts.get(k, KernelCounts()).work(op.block, sizes)
            for k, op in enumerate(graph.ops) if isinstance(op, GraphKernel)}


def _grid_count(gk: GraphKernel, a: int, ext: PaddedExtents, outputs: set[str],
                read_later: set[str]) -> RunCount | None:
    bg = gk.block
    savers = bg.savers()
    if bg.grid[a] <= 1 or not savers:
        return None
    found = set()
    for s in savers:
        t = gk.outputs[s.output]
        d = s.omap[a]
        if t.name not in outputs or t.name in read_later or d < 0:
            return None
        v = ext.valid(t.name, d)
        if v is None:
            return None
        found.add((v, t.shape[d] // bg.grid[a]))
    if len(found) != 1:
        return None
    v, part = found.pop()
    return RunCount(v, part, bg.grid[a])


def _loop_count(gk: GraphKernel, ext: PaddedExtents, inputs: set[str],
                shapes: Mapping[str, tuple[int, ...]]) -> RunCount | None:
    bg = gk.block
    if bg.forloop <= 1:
        return None
    # each iterator along the loop: (valid, tile, split axis, part) where its loop dim is padded
    walks: dict[str, tuple] = {}
    for n in bg.ops:
        if isinstance(n, InputIter) and n.fmap >= 0 and n.gather < 0:
            name = gk.inputs[n.input]
            v = ext.valid(name, n.fmap) if name in inputs else None  # zero-filled past v
            if v is not None:
                walks[n.out] = _walk(bg, n.imap, n.fmap, v, shapes[name][n.fmap])
        elif isinstance(n, MaskIter) and n.fmap >= 0 and n.valid is not None:
            v = _symbolic(n.valid[n.fmap])
            if v is not None:
                walks[n.out] = _walk(bg, n.imap, n.fmap, v, n.shape[n.fmap])
    if not walks or None in walks.values() or len(set(walks.values())) != 1:
        return None
    v, tile, axis, part = next(iter(walks.values()))
    if not _identity_iteration(bg, set(walks)):
        return None
    return RunCount(v, tile, bg.forloop, axis, part)


def _walk(bg: Any, imap: tuple, fmap: int, v: Affine, full: int) -> tuple | None:
    """(valid, tile along the loop, grid axis splitting the loop dim or -1, its part)."""
    axes = [a for a in range(3) if imap[a] == fmap and bg.grid[a] > 1]
    if len(axes) > 1:
        return None
    part = full // bg.grid[axes[0]] if axes else full
    if part % bg.forloop:
        return None
    return (v, part // bg.forloop, axes[0] if axes else -1, part if axes else 0)


def _identity_iteration(bg: Any, padded: set[str]) -> bool:
    """Does an iteration whose ``padded`` tiles lie wholly past the valid size add every
    accumulator's identity? (abstract evaluation: a tile's value is a constant every element
    has, or None for unknown)."""
    val: dict[str, float | None] = {t: 0.0 for t in padded}

    def get(o: Any) -> float | None:
        return val.get(o) if isinstance(o, str) else float(o)

    for n in bg.ops:
        if isinstance(n, (InputIter, MaskIter)):
            val.setdefault(n.out, None)
        elif isinstance(n, Fused):
            env = {f"in{k}": get(o) for k, o in enumerate(n.operands)}
            for t in n.thread.ops:
                env[t.out] = _elementwise(t.op, [env.get(o) if isinstance(o, str) else float(o)
                                                 for o in t.operands], dict(t.attrs))
            val[n.out] = env[n.thread.ops[-1].out] if n.thread.ops else env.get("in0")
        elif isinstance(n, BlockOp):
            args = [get(o) for o in n.operands]
            if n.op == "matmul":
                val[n.out] = 0.0 if 0.0 in args else None
            elif n.op in ("max", "min"):
                val[n.out] = args[0]
            elif n.op == "sum":
                val[n.out] = 0.0 if args[0] == 0.0 else None
            elif n.op in ("slice", "reshape", "transpose"):
                val[n.out] = args[0]
            elif n.op == "concat":
                val[n.out] = args[0] if len(set(args)) == 1 else None
            elif n.op in OPS and OPS[n.op].elementwise:
                val[n.out] = _elementwise(n.op, args, dict(n.attrs))
            else:
                val[n.out] = None
        elif isinstance(n, Accum):
            x = val.get(n.input)
            ok = {"sum": x == 0.0, "max": x is not None and x <= LOWEST,
                  "min": x is not None and x >= HIGHEST}[n.kind]
            if not ok:  # (an accumulator of a loop-invariant tile counts iterations too)
                return False
            val[n.out] = None
    return True


def _elementwise(op: str, args: list[float | None], attrs: dict) -> float | None:
    """An element-wise operator on known constants (None: unknown). ``0 * x`` and ``0 / x`` are
    0 and ``where`` with a known condition picks its branch, whatever the unknown operand (a
    finite value, as in the whole-bucket code)."""
    if op == "mul" and 0.0 in args:
        return 0.0
    if op == "div" and args[0] == 0.0:
        return 0.0
    if op == "where" and args[0] is not None:
        return args[1] if args[0] != 0.0 else args[2]
    if any(a is None for a in args):
        return None
    y = op_compute(op, [np.full(1, a, np.float32) for a in args], attrs)
    y = float(np.asarray(y, np.float32).reshape(-1)[0])
    return y if np.isfinite(y) else None


__all__ = ["PaddedExtents", "RunCount", "KernelCounts", "kernel_counts"]
