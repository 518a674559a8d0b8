"""Which dim of an intermediate tensor is innermost (contiguous) in device memory.

Graph inputs and outputs are the caller's row-major arrays; intermediates are ours to lay out.
Every kernel that writes or reads an intermediate moves it in tiles: an output saver writes one
tile per block, an input iterator reads one per block (and iteration), a pre-defined kernel
walks it in logical row-major order. Memory moves whole 32-byte sectors, so a tile costs
``(elements / run) * ceil(run * itemsize / 32) * 32`` bytes, where ``run`` is how many of its
elements, taken in the tile's logical order (as threads and 16-byte vectors take them), lie at
consecutive addresses: along the tile's last dim wider than 1 if that dim is contiguous,
continuing outward while the tile spans a dim whole and the layout nests the next one around
it. A layout whose contiguous dim is not the one the tile walks costs a sector per element.

For each intermediate the candidates are row-major, the orders that move just one dim of size
> 1 innermost, and every other order of the dims of size > 1 (up to five of them); exact
enumeration picks the one that moves the fewest bytes over all its accesses, row-major on ties
and simpler orders before others. Example: a
flash-decoding kernel saves one float per row as a ``(rows, 1)`` tile of a ``(heads, rows,
parts)`` partial-sum tensor -- 4 useful bytes per 32-byte sector row-major; with ``rows``
innermost the tile is one contiguous run and the saver stores 16 bytes at a time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..ugraph.graph import GraphKernel, InputIter, KernelGraph, OutputSaver
from .tensors import TensorLayout, padded_layout

SECTOR = 32  # bytes


@dataclass(frozen=True)
class TileAccess:
    """``count`` moves of a tile of shape ``tile`` (same rank as the tensor)."""

    tile: tuple[int, ...]
    count: int


def contiguous_run(layout: TensorLayout, tile: tuple[int, ...]) -> int:
    """How many consecutive elements of a tile -- in its logical row-major order, the order in
    which threads and 16-byte vectors take them -- lie at consecutive addresses of ``layout``
    (a tile starting on tile boundaries): along the tile's last dim wider than 1 when that dim
    is contiguous, continuing outward while the tile spans a dim whole and the layout nests the
    next dim right around it."""
    dims = [d for d in range(len(tile)) if tile[d] > 1]
    if not dims:
        return 1
    run, span = 1, 1
    for d in reversed(dims):
        if layout.strides[d] != span:
            break
        run *= tile[d]
        if tile[d] != layout.shape[d]:
            break
        span = layout.strides[d] * layout.shape[d]
    return run


def moved_bytes(layout: TensorLayout, accesses: list[TileAccess]) -> int:
    """Sector bytes the accesses move in ``layout``."""
    total = 0
    for a in accesses:
        n = math.prod(a.tile)
        run = max(1, contiguous_run(layout, a.tile))
        total += a.count * -(-n // run) * (-(-run * layout.itemsize // SECTOR) * SECTOR)
    return total


def tile_accesses(graph: KernelGraph, infos: dict) -> dict[str, list[TileAccess]]:
    """Every tile move of every device tensor by the graph's kernels."""
    tensors = graph.tensors()
    out: dict[str, list[TileAccess]] = {}
    for k, op in enumerate(graph.ops):
        if isinstance(op, GraphKernel):
            bg, info = op.block, infos[k]
            for n in bg.ops:
                if isinstance(n, InputIter) and n.gather >= 0:  # rows of the table, one by one
                    reps = bg.forloop if n.fmap >= 0 else 1
                    tile = tuple(info.shapes[n.out])
                    table = tensors[op.inputs[n.input]]
                    row = (1,) * (len(table.shape) - 1) + (tile[-1],)
                    out.setdefault(op.inputs[n.input], []).append(
                        TileAccess(row, bg.num_blocks * reps * math.prod(tile[:-1])))
                elif isinstance(n, InputIter):
                    reps = bg.forloop if n.fmap >= 0 else 1
                    out.setdefault(op.inputs[n.input], []).append(
                        TileAccess(tuple(info.shapes[n.out]), bg.num_blocks * reps))
                elif isinstance(n, OutputSaver):
                    out.setdefault(op.outputs[n.output].name, []).append(
                        TileAccess(tuple(info.shapes[n.input]), bg.num_blocks))
        else:
            for name in (*op.inputs, op.output.name):
                shape = tensors[name].shape
                if shape:
                    row = (1,) * (len(shape) - 1) + (shape[-1],)
                    out.setdefault(name, []).append(TileAccess(row, math.prod(shape[:-1])))
    return out


MAX_PERMUTED = 5  # dims of size > 1 up to which every order is a candidate (5! = 120)


def candidate_orders(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Row-major first, then each other dim of size > 1 moved innermost, then every other order
    of the dims of size > 1 (size-1 dims keep their places; they do not change addresses) --
    all of them while there are at most ``MAX_PERMUTED``. Earlier candidates win ties."""
    ident = tuple(range(len(shape)))
    out = [ident]
    big = [d for d in ident if shape[d] > 1]
    for d in big[:-1]:
        out.append(tuple(x for x in ident if x != d) + (d,))
    if len(big) <= MAX_PERMUTED:
        seen = {tuple(d for d in o if shape[d] > 1) for o in out}  # what addresses depend on
        for perm in itertools.permutations(big):
            if perm not in seen:
                seen.add(perm)
                it = iter(perm)
                out.append(tuple(next(it) if shape[d] > 1 else d for d in ident))
    return out


def choose_order(name: str, shape: tuple[int, ...], dtype: str,
                 accesses: list[TileAccess]) -> tuple[tuple[int, ...], dict]:
    """The cheapest candidate order and the cost of every candidate (sector bytes)."""
    table = {o: moved_bytes(padded_layout(name, shape, dtype, o), accesses)
             for o in candidate_orders(shape)}
    return min(table, key=lambda o: table[o]), table  # first minimum: row-major on ties


def choose_orders(graph: KernelGraph, infos: dict) -> dict[str, tuple[int, ...]]:
    """Intermediate -> chosen dim order, for the intermediates where it is not row-major."""
    tensors = graph.tensors()
    ends = {t.name for t in graph.inputs} | set(graph.outputs)
    out = {}
    for name, acc in tile_accesses(graph, infos).items():
        if name in ends:
            continue
        t = tensors[name]
        order, _ = choose_order(name, tuple(t.shape), t.dtype, acc)
        if order != tuple(range(len(t.shape))):
            out[name] = order
    return out
