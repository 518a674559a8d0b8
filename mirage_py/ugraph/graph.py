"""μGraph types for the three levels: kernel graphs, block graphs and thread graphs.

All types are frozen dataclasses made of tuples, so they are immutable, hashable and compare
structurally. Tensors are referred to by name (SSA: each name is defined once); an elementwise
operand may also be a Python float, a scalar constant.

Kernel level (device tensors in global memory)::

    KernelGraph(name, inputs=(DTensor...), ops=(KernelOp | GraphKernel ...), outputs=(name...))
    KernelOp(op, operands, output: DTensor, attrs)   # a pre-defined kernel: one launch
    GraphKernel(inputs=(name...), outputs=(DTensor...), block: BlockGraph)  # one custom launch

Block level (what one thread block does; tiles live in shared memory)::

    BlockGraph(grid=(gx, gy, gz), threads, forloop, ops=(...))
    InputIter(out, input=i, imap=(dx, dy, dz), fmap=d)   # tile of the kernel's i-th input
    InputIter(out, input=i, imap, fmap, gather=j)        # ... of its rows picked by the index
                                                          # input j: a tile of take(in_i, in_j)
    MaskIter(out, shape, offset, window, imap, fmap, valid) # tile of a 0/1 position mask,
                                                          # made from indices (no memory read)
    BlockOp(out, op, operands, attrs)                     # matmul / elementwise / sum / max /
                                                          # min / concat / slice
    Fused(out, operands, thread: ThreadGraph)             # elementwise chain in registers
    Accum(out, input, kind="sum")                         # for-loop accumulator: sum/max/min
    Accum(out, input, "max", running=True)                # ... readable in the loop (online
    Accum(out, input, "sum", rescale=m)                   # softmax): sums rescaled by exp(m' - m)
    OutputSaver(input, output=j, omap=(ox, oy, oz))       # write a tile into the j-th output

``imap[a]`` is the tensor dim split evenly over grid axis ``a`` (``-1``: every block sees the
whole dim, "replicate"); ``fmap`` the dim split over the ``forloop`` iterations (``-1``: the same
tile each iteration). A dim may be split by a grid axis and by the loop: the block's part is then
split again over the iterations (split-K inside a split, as in flash decoding). ``omap[a]`` the
output dim that grid axis ``a`` indexes (``-1``: none).

Phases: tiles of iterators with ``fmap == -1`` are *invariant*; ops over a per-iteration tile are
the loop *body*; ``Accum`` outputs and ops over them are the *epilogue*, run once after the loop.

Thread level::

    ThreadGraph(ninputs, ops=(ThreadOp(out, op, operands, attrs)...))  # result: the last op's
    # operands: "in0", "in1", ... (the Fused op's operands), earlier outs, or float constants;
    # attrs: the operator's attributes (a clamp's bounds, a pow's exponent), as in the program
"""

from __future__ import annotations

import math

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Union

from ..lax.ops import OPS
from ..lax.tensor import broadcast_shapes

Operand = Union[str, float]
Attrs = tuple[tuple[str, Any], ...]

AXES = ("x", "y", "z")


def attrs_of(d: dict[str, Any] | None = None, **kw: Any) -> Attrs:
    merged = dict(d or {}, **kw)
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in merged.items()))


@dataclass(frozen=True)
class DTensor:
    """A device tensor (global memory)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float16"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


# ---- thread level ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ThreadOp:
    out: str
    op: str  # an elementwise op name
    operands: tuple[Operand, ...]
    attrs: Attrs = ()

    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass(frozen=True)
class ThreadGraph:
    """An elementwise DAG each thread evaluates in registers; its value is the last op's."""

    ninputs: int
    ops: tuple[ThreadOp, ...]

    def describe(self) -> str:
        env = {f"in{i}": f"in{i}" for i in range(self.ninputs)}
        for o in self.ops:
            args = [env.get(a, repr(a)) if isinstance(a, str) else repr(a) for a in o.operands]
            sym = OPS[o.op].symbol if o.op in OPS else ""  # unknown op: still describable
            attrs = "".join(f", {k}={v!r}" for k, v in o.attrs)
            env[o.out] = f"({args[0]} {sym} {args[1]})" if sym and len(args) == 2 else \
                f"{o.op}({', '.join(args)}{attrs})"
        return env[self.ops[-1].out] if self.ops else "in0"


# ---- block level ----------------------------------------------------------------------------

@dataclass(frozen=True)
class InputIter:
    out: str
    input: int
    imap: tuple[int, int, int]
    fmap: int = -1
    # >= 0: the kernel input holding indices (int32 / int64) that pick rows of input ``input``;
    # the iterator then walks ``take(inputs[input], inputs[gather])`` (shape ids.shape +
    # table.shape[1:]) as if it were a tensor in memory: a gathered embedding lookup
    gather: int = -1


def iter_source(node: "InputIter", ins: "list[DTensor] | tuple[DTensor, ...]") -> DTensor:
    """The tensor an input iterator walks: its input, or for a gathering iterator the rows of
    its input picked by the index input (``ids.shape + table.shape[1:]``, the table's dtype)."""
    t = ins[node.input]
    if node.gather < 0:
        return t
    ids = ins[node.gather]
    return DTensor(f"{t.name}[{ids.name}]", tuple(ids.shape) + tuple(t.shape[1:]), t.dtype)


@dataclass(frozen=True)
class MaskIter:
    """A tile of a 0/1 position mask of ``shape`` (rows, cols) -- the mask of
    :func:`mirage_py.lax.ops.mask_values` with ``offset`` and ``window`` -- split like an input
    iterator's tensor (``imap``, ``fmap``). Its values are known data, computed from indices."""

    out: str
    shape: tuple[int, int]
    offset: Any  # an int, or an expression of dims (lax.shapes.Affine) bound when it runs
    window: Any
    imap: tuple[int, int, int]
    fmap: int = -1
    # (rows_valid, cols_valid): 0 past them (a padded program's valid part, lax/family.py)
    valid: tuple | None = None

    def values(self, sizes: Any = None):
        """The whole mask's 0/1 values, its expressions bound to ``sizes``."""
        from ..lax.ops import mask_values  # noqa: PLC0415 -- a leaf module
        return mask_values(tuple(self.shape), offset=self.offset, window=self.window,
                           valid=self.valid, sizes=sizes)


@dataclass(frozen=True)
class BlockOp:
    out: str
    op: str  # "matmul", elementwise names, "sum", "max", "min", "concat", "slice"
    operands: tuple[Operand, ...]
    attrs: Attrs = ()

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)


@dataclass(frozen=True)
class Fused:
    out: str
    operands: tuple[Operand, ...]
    thread: ThreadGraph


@dataclass(frozen=True)
class Accum:
    """``out`` combines ``input`` over the for-loop iterations: their sum, maximum or minimum
    (``kind``).

    Online softmax (FlashAttention) adds two settings:

    * ``running=True`` (max / min only): the value is also readable *inside* the loop, where it
      is the running value after this iteration's update, ``m_i = max(m_{i-1}, input_i)``;
      after the loop it is the final value, as for any accumulator;
    * ``rescale=m`` (sum only; ``m`` a running accumulator): before this iteration's input is
      added, the sum is multiplied by ``exp(m_{i-1} - m_i)`` (element-wise, ``m`` broadcast to
      the sum's shape): ``acc_i = acc_{i-1} * exp(m_{i-1} - m_i) + input_i``. If ``input_i``
      carries a factor ``exp(-m_i)``, the sums telescope to ``exp(-m_n) * sum_i (...)``: the
      numerator and denominator of a softmax then share one factor, which cancels
      (docs/verifier.md).
    """

    out: str
    input: str
    kind: str = "sum"
    running: bool = False
    rescale: str | None = None

    def describe(self) -> str:
        extra = ", running" if self.running else ""
        extra += f", rescale={self.rescale}" if self.rescale else ""
        return f"accum.{self.kind}({self.input}{extra})"


@dataclass(frozen=True)
class OutputSaver:
    input: str
    output: int
    omap: tuple[int, int, int]


BlockNode = Union[InputIter, MaskIter, BlockOp, Fused, Accum, OutputSaver]
ACCUM_KINDS = ("sum", "max", "min")


def tiles_read(node: BlockNode) -> tuple[str, ...]:
    """Names of the tiles a block node reads (constants and iterators read none)."""
    if isinstance(node, (BlockOp, Fused)):
        return tuple(x for x in node.operands if isinstance(x, str))
    if isinstance(node, Accum):
        return (node.input,) + ((node.rescale,) if node.rescale else ())
    if isinstance(node, OutputSaver):
        return (node.input,)
    return ()


@dataclass(frozen=True)
class BlockGraph:
    grid: tuple[int, int, int]
    threads: int
    forloop: int
    ops: tuple[BlockNode, ...]

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def iterators(self) -> list[InputIter]:
        return [o for o in self.ops if isinstance(o, InputIter)]

    def masks(self) -> list[MaskIter]:
        return [o for o in self.ops if isinstance(o, MaskIter)]

    def savers(self) -> list[OutputSaver]:
        return [o for o in self.ops if isinstance(o, OutputSaver)]


# ---- kernel level ---------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelOp:
    """A pre-defined kernel operator, one launch: matmul, elementwise, sum / max / min, rms_norm,
    reshape, transpose, slice, concat, mask (attrs as in the program IR; rms_norm has ``eps``,
    over the last axis; a mask has no operands and writes its 0/1 values)."""

    op: str
    operands: tuple[Operand, ...]
    output: DTensor
    attrs: Attrs = ()

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    @property
    def outputs(self) -> tuple[DTensor, ...]:
        return (self.output,)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(o for o in self.operands if isinstance(o, str))


@dataclass(frozen=True)
class GraphKernel:
    """A graph-defined kernel: one custom launch whose body is a block graph."""

    inputs: tuple[str, ...]
    outputs: tuple[DTensor, ...]
    block: BlockGraph


KernelNode = Union[KernelOp, GraphKernel]


@dataclass(frozen=True)
class KernelGraph:
    name: str
    inputs: tuple[DTensor, ...]
    ops: tuple[KernelNode, ...]
    outputs: tuple[str, ...]
    # memo (structural hash); init=False so that dataclasses.replace() starts a fresh one
    _cache: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    # -- views ----------------------------------------------------------------------------------
    def tensors(self) -> dict[str, DTensor]:
        """Every device tensor by name (inputs and op outputs)."""
        out = {t.name: t for t in self.inputs}
        for op in self.ops:
            for t in op.outputs:
                out[t.name] = t
        return out

    @property
    def num_kernels(self) -> int:
        """Kernel launches (reshape/transpose of contiguous data count too: they copy)."""
        return len(self.ops)

    def graph_kernels(self) -> list[GraphKernel]:
        return [o for o in self.ops if isinstance(o, GraphKernel)]

    def producer(self, name: str) -> KernelNode | None:
        for op in self.ops:
            if any(t.name == name for t in op.outputs):
                return op
        return None

    # -- identity -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        from .serialize import kernel_graph_to_json
        return kernel_graph_to_json(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "KernelGraph":
        from .serialize import kernel_graph_from_json
        return kernel_graph_from_json(doc)

    @classmethod
    def loads(cls, text: str) -> "KernelGraph":
        from .serialize import loads
        return loads(text)

    def canonical(self) -> "KernelGraph":
        """The same graph with intermediates renamed t0, t1, ... and tiles s0, s1, ... in order
        of definition (input and output names kept), so renamings compare equal."""
        from .serialize import canonicalize
        return canonicalize(self)

    def structural_hash(self) -> str:
        """SHA-256 of the canonical JSON (graph name excluded); equal across processes."""
        if "hash" not in self._cache:
            doc = self.canonical().to_json()
            doc.pop("name")
            key = json.dumps(doc, sort_keys=True, separators=(",", ":"))
            self._cache["hash"] = hashlib.sha256(key.encode()).hexdigest()
        return self._cache["hash"]

    # -- behaviour (thin wrappers; the work lives in sibling modules) ----------------------------
    def validate(self, target: Any = "h100") -> "KernelGraph":
        from .validate import validate
        validate(self, target)
        return self

    def run(self, inputs: dict[str, Any], precision: str = "float64", **kw: Any) -> dict[str, Any]:
        """Execute on the CPU interpreter (see :func:`mirage_py.ugraph.interp.run`)."""
        from .interp import run
        return run(self, inputs, precision=precision, **kw)

    def to_dot(self) -> str:
        from .dot import to_dot
        return to_dot(self)

    def __str__(self) -> str:
        from .printing import format_kernel_graph
        return format_kernel_graph(self)


# ---- shape inference shared by validation and the interpreter ---------------------------------

def index_bounds(graph: "KernelGraph") -> dict[str, int]:
    """For every index input of ``graph`` (int32 / int64), the fewest rows of a table it picks
    from (take kernels and gathering iterators); valid indices are ``[0, bound)``."""
    tensors = graph.tensors()
    out: dict[str, int] = {t.name: 0 for t in graph.inputs if t.dtype in ("int32", "int64")}

    def see(ids: str, table: str) -> None:
        if ids in out:
            rows = tensors[table].shape[0]
            out[ids] = rows if out[ids] == 0 else min(out[ids], rows)

    for op in graph.ops:
        if isinstance(op, KernelOp) and op.op == "take":
            see(op.operands[1], op.operands[0])
        elif isinstance(op, GraphKernel):
            for n in op.block.ops:
                if isinstance(n, InputIter) and n.gather >= 0:
                    see(op.inputs[n.gather], op.inputs[n.input])
    return {n: max(b, 1) for n, b in out.items()}


def iter_tile_shape(shape: tuple[int, ...], grid: tuple[int, int, int], imap: tuple[int, int, int],
                    fmap: int, forloop: int) -> tuple[int, ...]:
    """Tile shape an input iterator yields (assumes the splits divide; validate checks)."""
    tile = list(shape)
    for a in range(3):
        if imap[a] >= 0:
            tile[imap[a]] //= grid[a]
    if fmap >= 0:
        tile[fmap] //= forloop
    return tuple(tile)


def matmul_shape(opname: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    from ..errors import ShapeError
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ShapeError(f"{opname}: cannot multiply {a} @ {b}")
    return broadcast_shapes(opname, a[:-2], b[:-2]) + (a[-2], b[-1])


def sum_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def walk_block_ops(g: BlockGraph) -> Iterator[BlockNode]:
    yield from g.ops


def node_fields(node: Any) -> dict[str, Any]:
    return {f.name: getattr(node, f.name) for f in fields(node) if f.name != "_cache"}
