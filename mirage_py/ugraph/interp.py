"""CPU interpreter for μGraphs: executes a kernel graph literally, tile by tile.

Two precisions:

* ``"float64"`` -- every value in float64: the exact meaning of the graph, compared with the
  program's float64 reference.
* ``"gpu"`` -- what the GPU computes: device tensors (inputs, kernel outputs, saved tiles) are
  rounded to their storage dtype (float16 / bfloat16 / float32), loaded tiles keep those values,
  and block intermediates and accumulators are float32. The operands of a matmul (tile or
  pre-defined kernel) are what the hardware multiplies (its ``math``, lax/precision.py): rounded
  to the tensor cores' input type as the generated code does -- bfloat16 or float16 in 16-bit
  programs (so the exp of an attention score beyond ~11 that meets ``@ V`` overflows here as it
  would on the GPU), TF32 or bfloat16 where a float32 program allows it -- and float32 as they
  are for a float32 matmul's FMA.

All arithmetic goes through a backend object (:mod:`mirage_py.lax.backend`): the two precisions
are :class:`~mirage_py.lax.backend.NumpyBackend`; ``run(..., backend=...)`` runs the same walk on
any other backend, e.g. the verifier's finite-field one (this package never imports the
verifier: the caller passes the backend in). The interpreter itself only moves data.

Blocks of a graph-defined kernel are independent and run the same operators on different tiles,
so by default all blocks execute at once: a tensor is viewed as an array of tiles with three
leading grid axes ``(gx, gy, gz, *tile)`` (size 1 where an iterator replicates), every block
operator works on those batched tiles, and output savers scatter them back. ``literal=True``
runs the same code one block at a time (slow; used by tests to check the batched execution).
The for-loop always runs iteration by iteration, so accumulation order matches the GPU's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import DTypeError, ProgramError, ShapeError, ValidationError
from ..lax.backend import Backend, NumpyBackend
from ..lax.ops import mask_values
from ..lax.precision import MatmulMath, op_math
from .graph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                    KernelGraph, KernelOp, MaskIter, ThreadGraph)
from .phase import Phase
from .validate import check_block
from ..targets import get_target

PRECISIONS = ("float64", "gpu")


def blocked_view(arr: np.ndarray, imap: tuple[int, int, int],
                 grid: tuple[int, int, int]) -> np.ndarray:
    """View ``arr`` as tiles: shape ``(Gx, Gy, Gz, *tile)``, G = grid[a] where imap[a] splits a
    dim and 1 where the iterator replicates along that grid axis."""
    split_by = {imap[a]: a for a in range(3) if imap[a] >= 0}
    shape: list[int] = []
    pos: dict[int, int] = {}
    for j, d in enumerate(arr.shape):
        if j in split_by:
            a = split_by[j]
            pos[a] = len(shape)
            shape += [grid[a], d // grid[a]]
        else:
            shape.append(d)
    x = arr.reshape(shape)
    gpos = [pos[a] for a in range(3) if a in pos]
    x = x.transpose(gpos + [i for i in range(len(shape)) if i not in gpos])
    for a in range(3):
        if a not in pos:
            x = np.expand_dims(x, a)
    return x


def gathered(blocks: np.ndarray, omap: tuple[int, int, int], grid: tuple[int, int, int]
             ) -> np.ndarray:
    """Inverse of :func:`blocked_view` for an output saver, up to a reshape: ``blocks``
    (``(gx, gy, gz, *tile)``) as a view with each grid axis moved before the tile dim it cuts
    (``omap``), unmapped grid axes (size 1) last; reshaped to the output's shape, each (grid
    axis, tile dim) pair merges into the output's dim."""
    blocks = np.broadcast_to(blocks, tuple(grid) + blocks.shape[3:])
    mapped = {omap[a]: a for a in range(3) if omap[a] >= 0}
    order: list[int] = []
    for j in range(blocks.ndim - 3):
        if j in mapped:
            order.append(mapped[j])
        order.append(3 + j)
    order += [a for a in range(3) if a not in order]  # unmapped grid axes have size 1
    return blocks.transpose(order)


def _align(args: list[Any], be: Backend) -> list[Any]:
    """Give batched tiles of lower rank size-1 dims after the grid axes, so that NumPy's
    right-aligned broadcasting matches broadcasting of the tiles themselves. Scalars (rank 0)
    are left alone; batched tiles always have the three grid axes."""
    ranks = [a.ndim for a in args if _is_tile(a)]
    top = max(ranks) if ranks else 0
    out = []
    for a in args:
        if _is_tile(a) and a.ndim < top:
            shape = a.shape[:3] + (1,) * (top - a.ndim) + a.shape[3:]
            a = be.layout(a, lambda x, s=shape: x.reshape(s))
        out.append(a)
    return out


def _is_tile(a: Any) -> bool:
    return getattr(a, "ndim", 0) >= 3


def _widen(v: Any, be: Backend) -> Any:
    """A float value as the backend computes on it (float16 input data kept as it is stored,
    ``NumpyBackend.store``, widened where it is read); indices stay integers."""
    if isinstance(v, np.ndarray) and v.dtype == np.float16:
        return be.tile(v)
    return v


def _operand(o: Any, env: Mapping[str, Any], be: Backend) -> Any:
    return env[o] if isinstance(o, str) else be.scalar(o)


def _eval_thread(tg: ThreadGraph, args: list[Any], be: Backend) -> Any:
    env: dict[str, Any] = {f"in{i}": a for i, a in enumerate(_align(args, be))}
    for t in tg.ops:
        env[t.out] = be.elementwise(t.op, [_operand(o, env, be) for o in t.operands],
                                    dict(t.attrs))
    return env[tg.ops[-1].out]


def _mma_operands(a: Any, b: Any, attrs: Any, dtypes: list[str], be: Backend,
                  where: str) -> tuple[Any, Any]:
    """Matmul operands as the hardware multiplies them (``op_math``: the operator's ``math``
    attribute, else the tensor cores' operand rule): rounded to float16 / bfloat16 / TF32 for
    the tensor cores -- a tile already stored in that type is exact --, unchanged for float32
    FMA (a no-op outside "gpu")."""
    math_ = op_math(attrs, dtypes[0], dtypes[1])
    if math_ is MatmulMath.FP32:
        return a, b
    be.annotate(f"{where}: operands rounded to {math_.value} for the tensor cores")
    exact = _EXACT_IN.get(math_)
    a, b = (x if dt == exact else be.mma_operand(x, math_) for x, dt in zip((a, b), dtypes))
    be.annotate(where)
    return a, b


# the storage dtype whose values a tensor-core math takes unchanged
_EXACT_IN = {MatmulMath.FP16: "float16", MatmulMath.BF16: "bfloat16"}


def _block_op(node: BlockOp, env: dict[str, Any], be: Backend,
              dtypes: dict[str, str] | None = None) -> Any:
    args = [_operand(o, env, be) for o in node.operands]
    if node.op in ("sum", "max", "min"):
        axes = tuple(3 + a for a in node.attr("axes"))
        return be.reduce(node.op, args[0], axes, bool(node.attr("keepdims", True)))
    if node.op == "slice":
        key = (slice(None),) * (3 + node.attr("axis")) + \
            (slice(node.attr("start"), node.attr("stop")),)
        return be.layout(args[0], lambda x: x[key])
    if node.op == "reshape":
        shape = tuple(node.attr("shape"))
        return be.layout(args[0], lambda x: x.reshape(x.shape[:3] + shape))
    if node.op == "transpose":  # the tile dims permuted; the three grid dims stay in front
        perm = (0, 1, 2) + tuple(3 + p for p in node.attr("perm"))
        return be.layout(args[0], lambda x: x.transpose(perm))
    if node.op == "concat":
        arrs = _align(args, be)
        lead = tuple(np.broadcast_shapes(*[a.shape[:3] for a in arrs]))
        arrs = [be.layout(a, lambda x: np.broadcast_to(x, lead + x.shape[3:])) for a in arrs]
        ax = node.attr("axis", -1) % (arrs[0].ndim - 3)
        return be.concat(arrs, 3 + ax)
    if node.op == "matmul":
        a, b = _align(args, be)
        if dtypes is not None:
            a, b = _mma_operands(a, b, node.attrs, [dtypes[o] for o in node.operands], be,
                                 be.where)
        return be.matmul(a, b)
    return be.elementwise(node.op, _align(args, be), dict(node.attrs))


def _slice_iteration(v: Any, fmap: int, forloop: int, it: int, be: Backend) -> Any:
    c = v.shape[3 + fmap] // forloop
    sl = [slice(None)] * v.ndim
    sl[3 + fmap] = slice(it * c, (it + 1) * c)
    key = tuple(sl)
    return be.layout(v, lambda x: x[key])


def _labels(bg: BlockGraph, label: str) -> dict[str, str]:
    """Where each block node sits, for diagnostics (``Backend.annotate``)."""
    out = {}
    for n in bg.ops:
        if isinstance(n, BlockOp):
            out[n.out] = f"{label}block op {n.op} -> {n.out!r}"
        elif isinstance(n, Fused):
            out[n.out] = f"{label}fused {n.thread.describe()} -> {n.out!r}"
        elif isinstance(n, Accum):
            out[n.out] = f"{label}accumulator {n.describe()} -> {n.out!r}"
    return out


def _run_block(bg: BlockGraph, views: dict[str, Any], phases: dict[str, Phase],
               be: Backend, label: str = "", dtypes: dict[str, str] | None = None
               ) -> dict[str, Any]:
    """Run the loop and epilogue on batched tiles; returns every tile by name (last iteration's
    value for body tiles)."""
    env: dict[str, Any] = {}
    where = _labels(bg, label)

    def step(node: Any, local: dict[str, Any], it: int) -> None:
        if isinstance(node, (InputIter, MaskIter)):
            v = views[node.out]
            if node.fmap >= 0:
                v = _slice_iteration(v, node.fmap, bg.forloop, it, be)
            local[node.out] = _widen(v, be)  # a float16 input widens one iteration's tiles
        elif isinstance(node, BlockOp):
            be.annotate(where[node.out])
            local[node.out] = be.tile(_block_op(node, local, be, dtypes))
        elif isinstance(node, Fused):
            be.annotate(where[node.out])
            local[node.out] = be.tile(_eval_thread(node.thread, [local[o] for o in node.operands],
                                                   be))

    compute_nodes = [n for n in bg.ops if isinstance(n, (InputIter, MaskIter, BlockOp, Fused))]
    for n in compute_nodes:
        if phases[n.out] is Phase.PRE:
            step(n, env, 0)
    # the body in graph order: running accumulators update where they stand (later body
    # nodes read the new value); the others after the body, sums rescaled by
    # exp(m_{i-1} - m_i) of their running accumulator first
    body = [n for n in bg.ops if isinstance(n, Accum) and n.running or
            not isinstance(n, Accum) and n in compute_nodes and phases[n.out] is Phase.BODY]
    accums = [n for n in bg.ops if isinstance(n, Accum) and not n.running]
    acc: dict[str, Any] = {}
    prev: dict[str, Any] = {}  # a running accumulator's value before this iteration
    local = dict(env)
    for it in range(bg.forloop):
        local = dict(env)
        for n in body:
            if isinstance(n, Accum):
                be.annotate(where[n.out])
                prev[n.out] = acc.get(n.out)
                acc[n.out] = local[n.out] = be.accumulate(acc.get(n.out), local[n.input],
                                                          n.kind)
            else:
                step(n, local, it)
        for a in accums:
            be.annotate(where[a.out])
            old = acc.get(a.out)
            if a.rescale is not None and old is not None:
                old = be.rescale(old, prev[a.rescale], acc[a.rescale])
            acc[a.out] = be.accumulate(old, local[a.input], a.kind)
    local.update(acc)
    for n in compute_nodes:
        if phases[n.out] is Phase.POST:
            step(n, local, 0)
    return local


def run_graph_kernel(gk: GraphKernel, args: list[Any], in_tensors: list[DTensor],
                     precision: str = "float64", literal: bool = False,
                     target: Any = "h100", backend: Backend | None = None,
                     label: str = "graph kernel", sizes: Mapping[str, int] | None = None
                     ) -> list[Any]:
    """Execute one graph-defined kernel; ``args`` are its input values (already stored);
    ``sizes`` binds the dims its masks name."""
    be = backend if backend is not None else NumpyBackend(precision)
    bg = gk.block
    info = check_block(bg, in_tensors, list(gk.outputs), get_target(target))
    prefix = f"{label}: "
    views = {n.out: be.layout(args[n.input] if n.gather < 0 else
                              be.take(args[n.input], args[n.gather]),
                              lambda a, n=n: blocked_view(a, n.imap, bg.grid))
             for n in bg.iterators()}
    for n in bg.masks():  # known data: the mask's values, tiled like an input
        values = n.values(sizes)
        views[n.out] = be.layout(be.data(values), lambda a, n=n: blocked_view(a, n.imap, bg.grid))
    savers = bg.savers()
    if not literal:
        tiles = _run_block(bg, views, info.phases, be, prefix, info.dtypes)
        results = {s.output: tiles[s.input] for s in savers}
    else:
        per_block: dict[int, list[Any]] = {s.output: [] for s in savers}
        gx, gy, gz = bg.grid
        for bx in range(gx):
            for by in range(gy):
                for bz in range(gz):
                    idx = (bx, by, bz)
                    one = {}
                    for k, v in views.items():
                        key = tuple(slice(i, i + 1) if v.shape[a] > 1 else slice(0, 1)
                                    for a, i in enumerate(idx))
                        one[k] = be.layout(v, lambda x, key=key: x[key])
                    tiles = _run_block(bg, one, info.phases, be, prefix, info.dtypes)
                    for s in savers:
                        t = tiles[s.input]
                        per_block[s.output].append(be.layout(
                            t, lambda x: np.broadcast_to(x, (1, 1, 1) + x.shape[3:])[0, 0, 0]))
        grid = tuple(bg.grid)
        results = {j: be.combine(lambda xs: np.stack(xs).reshape(grid + xs[0].shape), ts)
                   for j, ts in per_block.items()}
    outs = []
    for j, t in enumerate(gk.outputs):
        s = next(s for s in savers if s.output == j)
        be.annotate(f"{prefix}output saver {s.input!r} -> {t.name!r}")
        # a view, then a reshape the backend does its own way (the degree backend's keys are
        # merged run by run, never at the output's full size)
        placed = be.compute("reshape", [be.layout(
            results[j], lambda x, s=s: gathered(x, s.omap, bg.grid))], {"shape": t.shape})
        outs.append(be.store(placed, t.dtype))
    return outs


def run_kernel_op(op: KernelOp, env: Mapping[str, Any], precision: str = "float64",
                  backend: Backend | None = None, dtypes: Mapping[str, str] | None = None,
                  sizes: Mapping[str, int] | None = None) -> Any:
    """Execute one pre-defined kernel operator on stored operands (``dtypes``: the device dtype
    of each operand tensor, for the tensor cores' operand rounding of a matmul)."""
    be = backend if backend is not None else NumpyBackend(precision)
    be.annotate(f"kernel {op.op} -> {op.output.name!r}")
    args = [_widen(env[o], be) if isinstance(o, str) else be.scalar(o) for o in op.operands]
    if op.op == "rms_norm":
        y = be.rms_norm(args[0], float(op.attr("eps", 1e-6)))
    elif op.op == "mask":
        y = be.data(mask_values(op.output.shape, offset=op.attr("offset"),
                                window=op.attr("window", 0), valid=op.attr("valid"),
                                sizes=sizes))
    else:
        attrs = {k: v for k, v in op.attrs}
        if op.op in ("sum", "max", "min"):  # validate() reads a missing keepdims as False
            attrs.setdefault("keepdims", False)
        if op.op == "matmul":
            dts = [dtypes[o] for o in op.operands] if dtypes is not None else \
                ["float32", "float32"]
            args = list(_mma_operands(args[0], args[1], op.attrs, dts, be, be.where))
            attrs.pop("math", None)
        y = be.compute(op.op, args, attrs)
    if tuple(y.shape) != op.output.shape:
        raise ValidationError(f"kernel {op.op} -> {op.output.name!r}: computed shape "
                              f"{tuple(y.shape)}, declared {op.output.shape}", rule="shape",
                              op=op.op)
    return be.store(y, op.output.dtype)


MEMO_ENTRIES = 32


def run(graph: KernelGraph, inputs: Mapping[str, Any], precision: str = "float64",
        literal: bool = False, target: Any = "h100", backend: Backend | None = None,
        memo: dict | None = None, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Execute ``graph`` on ``inputs`` (dict name -> array); returns outputs by name (float64
    arrays in "float64" precision, float32 arrays holding device-dtype values in "gpu").

    ``backend`` replaces the float arithmetic (``precision`` is then ignored); inputs are whatever
    that backend's ``input`` accepts, outputs are its values.

    ``memo``: a dict kept by the caller across runs of *related graphs on the same input
    objects with the same arithmetic* (e.g. the mutants of one graph, or a search's candidates):
    a kernel that is structurally identical and reads the very same values (by identity) as in
    an earlier run is not executed again. Values are never mutated, so this is safe; at most
    ``MEMO_ENTRIES`` kernels are kept.

    ``sizes`` binds the dims that masks name (a padded program's valid sizes, lax/family.py).
    """
    if backend is None:
        if precision not in PRECISIONS:
            raise ProgramError(f"run: precision {precision!r} must be one of {PRECISIONS}")
        be: Backend = NumpyBackend(precision)
    else:
        be = backend
    env: dict[str, Any] = {}
    raw: dict[str, DTensor] = {}
    tensors = graph.tensors()
    if not isinstance(inputs, Mapping):
        raise ProgramError(f"μGraph {graph.name!r}: inputs must be a dict name -> array, got "
                           f"{type(inputs).__name__}")
    for t in graph.inputs:
        if t.name not in inputs:
            raise ProgramError(f"μGraph {graph.name!r}: missing input {t.name!r}")
        raw[t.name] = t

    def fetch(t: DTensor) -> Any:
        """An input, checked, at its first reader (inputs may be drawn lazily)."""
        a = inputs[t.name]
        if backend is None:
            a = np.asarray(a)
            if a.dtype.kind not in "biuf":
                raise DTypeError(f"μGraph {graph.name!r}: input {t.name!r} has non-numeric "
                                 f"dtype {a.dtype}")
        if tuple(a.shape) != t.shape:
            raise ShapeError(f"μGraph {graph.name!r}: input {t.name!r} has shape "
                             f"{tuple(a.shape)}, declared {t.shape}")
        return a

    extra = set(inputs) - {t.name for t in graph.inputs}
    if extra:
        raise ProgramError(f"μGraph {graph.name!r}: unknown input(s) {sorted(extra)}")
    # an input enters the backend at its first reader; a value no later kernel reads and no
    # output is leaves after its last reader (memory follows the live values)
    last: dict[str, int] = {}
    for k, op in enumerate(graph.ops):
        for n in op.inputs:
            last[n] = k
    kept = set(graph.outputs)

    def enter(names: Any) -> None:
        for n in names:
            if n in raw and n not in env:
                a = fetch(raw[n])
                be.annotate(f"input {n!r}")
                env[n] = be.input(a, raw[n].dtype)

    def leave(k: int, op: Any) -> None:
        for n in set(op.inputs):
            if last[n] == k and n not in kept:
                del env[n]

    for k, op in enumerate(graph.ops):
        enter(op.inputs)
        if memo is not None:
            args = tuple(env[n] if isinstance(n, str) else n
                         for n in (op.operands if isinstance(op, KernelOp) else op.inputs))
            key = (op, tuple(id(a) for a in args), tuple(sorted((sizes or {}).items())))
            hit = memo.get(key)
            if hit is not None:
                for t, v in zip(op.outputs, hit[1]):
                    env[t.name] = v
                leave(k, op)
                continue
        if isinstance(op, KernelOp):
            outs = [run_kernel_op(op, env, backend=be,
                                  dtypes={n: tensors[n].dtype for n in op.inputs},
                                  sizes=sizes)]
        else:
            outs = run_graph_kernel(op, [env[n] for n in op.inputs],
                                    [tensors[n] for n in op.inputs], literal=literal,
                                    target=target, backend=be, label=f"graph kernel #{k}",
                                    sizes=sizes)
        for t, v in zip(op.outputs, outs):
            env[t.name] = v
        if memo is not None:
            while len(memo) >= MEMO_ENTRIES:
                memo.pop(next(iter(memo)))
            memo[key] = (args, tuple(outs))  # args kept alive: their ids stay theirs
        leave(k, op)
    enter(graph.outputs)
    for n, t in raw.items():  # inputs no kernel reads are still checked
        if n not in last and n not in env:
            fetch(t)
    # an output that is an input must not hand back the caller's own array
    inputs_set = {t.name for t in graph.inputs}
    return {n: (env[n].copy() if n in inputs_set and hasattr(env[n], "copy") else env[n])
            for n in graph.outputs}
