"""CPU interpreter for μGraphs: executes a kernel graph literally, tile by tile.

Two precisions:

* ``"float64"`` -- every value in float64: the exact meaning of the graph, compared with the
  program's float64 reference.
* ``"gpu"`` -- what the GPU computes: device tensors (inputs, kernel outputs, saved tiles) are
  rounded to their storage dtype (float16 / bfloat16 / float32), loaded tiles keep those values,
  and block intermediates and accumulators are float32.

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

from ..errors import ProgramError, ShapeError, ValidationError
from ..lax.ops import OPS, storage_round
from .graph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                    KernelGraph, KernelOp, OutputSaver, ThreadGraph)
from .validate import check_block
from ..targets import get_target

PRECISIONS = ("float64", "gpu")


def _store(x: np.ndarray, dtype: str, precision: str) -> np.ndarray:
    if precision == "gpu":
        return storage_round(x, dtype)
    return np.asarray(x, dtype=np.float64)


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


def assemble(blocks: np.ndarray, omap: tuple[int, int, int], grid: tuple[int, int, int],
             out_shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`blocked_view` for an output saver: ``blocks`` is ``(gx, gy, gz, *tile)``."""
    blocks = np.broadcast_to(blocks, tuple(grid) + blocks.shape[3:])
    mapped = {omap[a]: a for a in range(3) if omap[a] >= 0}
    order: list[int] = []
    for j in range(len(out_shape)):
        if j in mapped:
            order.append(mapped[j])
        order.append(3 + j)
    order += [a for a in range(3) if a not in order]  # unmapped grid axes have size 1
    return blocks.transpose(order).reshape(out_shape)


def _align(args: list[Any]) -> list[Any]:
    """Give batched tiles of lower rank size-1 dims after the grid axes, so that NumPy's
    right-aligned broadcasting matches broadcasting of the tiles themselves."""
    ranks = [a.ndim for a in args if isinstance(a, np.ndarray)]
    top = max(ranks) if ranks else 0
    out = []
    for a in args:
        if isinstance(a, np.ndarray) and a.ndim < top:
            a = a.reshape(a.shape[:3] + (1,) * (top - a.ndim) + a.shape[3:])
        out.append(a)
    return out


def _scalar(v: float, precision: str) -> Any:
    return np.float32(v) if precision == "gpu" else float(v)


def _eval_thread(tg: ThreadGraph, args: list[np.ndarray], precision: str) -> np.ndarray:
    env: dict[str, Any] = {f"in{i}": a for i, a in enumerate(_align(args))}
    for t in tg.ops:
        vals = [env[o] if isinstance(o, str) else _scalar(o, precision) for o in t.operands]
        env[t.out] = _compute(t.op, vals, {})
    return env[tg.ops[-1].out]


def _compute(op: str, args: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return OPS[op].compute(*args, **attrs)


def _block_op(node: BlockOp, env: dict[str, Any], precision: str) -> np.ndarray:
    args = [env[o] if isinstance(o, str) else _scalar(o, precision) for o in node.operands]
    if node.op == "sum":
        axes = tuple(3 + a for a in node.attr("axes"))
        return np.sum(args[0], axis=axes, keepdims=bool(node.attr("keepdims", True)))
    if node.op == "concat":
        arrs = _align(args)
        lead = np.broadcast_shapes(*[a.shape[:3] for a in arrs])
        arrs = [np.broadcast_to(a, lead + a.shape[3:]) for a in arrs]
        ax = node.attr("axis", -1)
        ax = ax % (arrs[0].ndim - 3)
        return np.concatenate(arrs, axis=3 + ax)
    if node.op == "matmul":
        a, b = _align(args)
        return np.matmul(a, b)
    return _compute(node.op, _align(args), {})


def _run_block(bg: BlockGraph, views: dict[str, np.ndarray], phases: dict[str, str],
               precision: str) -> dict[str, np.ndarray]:
    """Run the loop and epilogue on batched tiles; returns every tile by name (last iteration's
    value for body tiles)."""
    ft = np.float32 if precision == "gpu" else np.float64
    env: dict[str, Any] = {}

    def step(node: Any, local: dict[str, Any]) -> None:
        if isinstance(node, InputIter):
            v = views[node.out]
            if node.fmap >= 0:
                c = v.shape[3 + node.fmap] // bg.forloop
                sl = [slice(None)] * v.ndim
                sl[3 + node.fmap] = slice(it * c, (it + 1) * c)
                v = v[tuple(sl)]
            local[node.out] = v
        elif isinstance(node, BlockOp):
            local[node.out] = _block_op(node, local, precision).astype(ft, copy=False)
        elif isinstance(node, Fused):
            local[node.out] = _eval_thread(node.thread, [local[o] for o in node.operands],
                                           precision).astype(ft, copy=False)

    compute_nodes = [n for n in bg.ops if isinstance(n, (InputIter, BlockOp, Fused))]
    it = 0
    for n in compute_nodes:
        if phases[n.out] == "inv":
            step(n, env)
    accums = [n for n in bg.ops if isinstance(n, Accum)]
    acc: dict[str, np.ndarray] = {}
    local = dict(env)
    for it in range(bg.forloop):
        local = dict(env)
        for n in compute_nodes:
            if phases[n.out] == "body":
                step(n, local)
        for a in accums:
            v = np.asarray(local[a.input], dtype=ft)
            acc[a.out] = v.copy() if a.out not in acc else acc[a.out] + v
    local.update(acc)
    for n in compute_nodes:
        if phases[n.out] == "epi":
            step(n, local)
    return local


def run_graph_kernel(gk: GraphKernel, args: list[np.ndarray], in_tensors: list[DTensor],
                     precision: str = "float64", literal: bool = False,
                     target: Any = "h100") -> list[np.ndarray]:
    """Execute one graph-defined kernel; ``args`` are its input arrays (already stored)."""
    bg = gk.block
    info = check_block(bg, in_tensors, list(gk.outputs), get_target(target))
    views = {n.out: blocked_view(args[n.input], n.imap, bg.grid) for n in bg.iterators()}
    savers = bg.savers()
    if not literal:
        tiles = _run_block(bg, views, info.phases, precision)
        results = {s.output: tiles[s.input] for s in savers}
    else:
        results = {}
        gx, gy, gz = bg.grid
        for bx in range(gx):
            for by in range(gy):
                for bz in range(gz):
                    idx = (bx, by, bz)
                    one = {k: v[tuple(slice(i, i + 1) if v.shape[a] > 1 else slice(0, 1)
                                      for a, i in enumerate(idx))]
                           for k, v in views.items()}
                    tiles = _run_block(bg, one, info.phases, precision)
                    for s in savers:
                        t = tiles[s.input]
                        buf = results.setdefault(
                            s.output, np.empty(tuple(bg.grid) + t.shape[3:], dtype=t.dtype))
                        buf[bx, by, bz] = np.broadcast_to(t, (1, 1, 1) + t.shape[3:])[0, 0, 0]
    outs = []
    for j, t in enumerate(gk.outputs):
        s = next(s for s in savers if s.output == j)
        outs.append(_store(assemble(results[j], s.omap, bg.grid, t.shape), t.dtype, precision))
    return outs


def _rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)


def run_kernel_op(op: KernelOp, env: Mapping[str, np.ndarray], precision: str) -> np.ndarray:
    args = [env[o] if isinstance(o, str) else _scalar(o, precision) for o in op.operands]
    if op.op == "rms_norm":
        y = _rms_norm(args[0], _scalar(op.attr("eps", 1e-6), precision))
    else:
        attrs = {k: v for k, v in op.attrs}
        y = _compute(op.op, args, attrs)
    y = np.asarray(y)
    if y.shape != op.output.shape:
        raise ValidationError(f"kernel {op.op} -> {op.output.name!r}: computed shape {y.shape}, "
                              f"declared {op.output.shape}", rule="shape", op=op.op)
    return _store(y, op.output.dtype, precision)


def run(graph: KernelGraph, inputs: Mapping[str, Any], precision: str = "float64",
        literal: bool = False, target: Any = "h100") -> dict[str, np.ndarray]:
    """Execute ``graph`` on NumPy ``inputs`` (dict name -> array); returns outputs by name
    (float64 arrays in "float64" precision, float32 arrays holding device-dtype values in "gpu")."""
    if precision not in PRECISIONS:
        raise ProgramError(f"run: precision {precision!r} must be one of {PRECISIONS}")
    env: dict[str, np.ndarray] = {}
    tensors = graph.tensors()
    for t in graph.inputs:
        if t.name not in inputs:
            raise ProgramError(f"μGraph {graph.name!r}: missing input {t.name!r}")
        a = np.asarray(inputs[t.name])
        if a.shape != t.shape:
            raise ShapeError(f"μGraph {graph.name!r}: input {t.name!r} has shape {a.shape}, "
                             f"declared {t.shape}")
        env[t.name] = _store(a, t.dtype, precision)
    extra = set(inputs) - {t.name for t in graph.inputs}
    if extra:
        raise ProgramError(f"μGraph {graph.name!r}: unknown input(s) {sorted(extra)}")
    for op in graph.ops:
        if isinstance(op, KernelOp):
            env[op.output.name] = run_kernel_op(op, env, precision)
        else:
            outs = run_graph_kernel(op, [env[n] for n in op.inputs],
                                    [tensors[n] for n in op.inputs], precision, literal, target)
            for t, v in zip(op.outputs, outs):
                env[t.name] = v
    return {n: env[n] for n in graph.outputs}
