"""Small hand-written μGraphs shared by the μGraph tests, each with its NumPy meaning.

``CASES`` maps a name to a builder returning ``(graph, reference)``; ``reference(inputs)`` gives
the outputs in float64 with plain NumPy. ``inputs_for(graph)`` draws inputs. Shapes are tiny so
that literal block-by-block execution stays fast.
"""

from __future__ import annotations

import numpy as np

from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                              KernelGraph, KernelOp, OutputSaver, ThreadGraph, ThreadOp, attrs_of)

R = -1  # replicate (imap / omap) or no loop split (fmap)


def thread(*ops: tuple, ninputs: int) -> ThreadGraph:
    """``thread(("v0", "mul", "in0", 2.0), ..., ninputs=1)``."""
    return ThreadGraph(ninputs, tuple(ThreadOp(o[0], o[1], tuple(o[2:])) for o in ops))


def one_kernel(name: str, inputs: list[DTensor], outputs: list[DTensor], grid: tuple[int, int, int],
               forloop: int, ops: list, threads: int = 128) -> KernelGraph:
    gk = GraphKernel(tuple(t.name for t in inputs), tuple(outputs),
                     BlockGraph(grid, threads, forloop, tuple(ops)))
    return KernelGraph(name, tuple(inputs), (gk,), tuple(t.name for t in outputs))


def tiled_matmul(M: int = 64, K: int = 128, N: int = 96, grid: tuple[int, int, int] = (2, 3, 1),
                 forloop: int = 4) -> tuple[KernelGraph, object]:
    """C = A @ B: blocks tile (M, N), the for-loop splits K and an accumulator sums the parts."""
    g = one_kernel("tiled_matmul", [DTensor("A", (M, K)), DTensor("B", (K, N))],
                   [DTensor("C", (M, N))], grid, forloop, [
                       InputIter("a", 0, (0, R, R), fmap=1),
                       InputIter("b", 1, (R, 1, R), fmap=0),
                       BlockOp("c", "matmul", ("a", "b")),
                       Accum("acc", "c"),
                       OutputSaver("acc", 0, (0, 1, R)),
                   ])
    return g, lambda x: {"C": x["A"] @ x["B"]}


EPS = 1e-6


def rms_matmul(M: int = 8, K: int = 256, N: int = 128, nsplit: int = 4,
               forloop: int = 4) -> tuple[KernelGraph, object]:
    """Y = rms_norm(X) @ W in one kernel: every block reads all rows of X (a replicated
    iterator) and its own columns of W; the loop accumulates X@W and the sum of squares (a fused
    thread graph squares in registers); the epilogue divides by the norm in a second thread
    graph."""
    g = one_kernel("rms_matmul", [DTensor("X", (M, K)), DTensor("W", (K, N))],
                   [DTensor("Y", (M, N))], (nsplit, 1, 1), forloop, [
                       InputIter("x", 0, (R, R, R), fmap=1),
                       InputIter("w", 1, (1, R, R), fmap=0),
                       BlockOp("xw", "matmul", ("x", "w")),
                       Fused("sq", ("x",), thread(("q", "square", "in0"), ninputs=1)),
                       BlockOp("ss", "sum", ("sq",), attrs_of(axes=(1,), keepdims=True)),
                       Accum("acc_xw", "xw"),
                       Accum("acc_ss", "ss"),
                       Fused("y", ("acc_xw", "acc_ss"),
                             thread(("m", "div", "in1", float(K)), ("v", "add", "m", EPS),
                                    ("r", "sqrt", "v"), ("o", "div", "in0", "r"), ninputs=2)),
                       OutputSaver("y", 0, (1, R, R)),
                   ])

    def ref(x):
        X = x["X"]
        return {"Y": X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + EPS) @ x["W"]}
    return g, ref


def bias_add(M: int = 64, N: int = 128) -> tuple[KernelGraph, object]:
    """Y = X + b on a 2-D grid; the row vector b is replicated along grid.x."""
    g = one_kernel("bias_add", [DTensor("X", (M, N)), DTensor("b", (1, N))],
                   [DTensor("Y", (M, N))], (4, 2, 1), 1, [
                       InputIter("x", 0, (0, 1, R)),
                       InputIter("bb", 1, (R, 1, R)),
                       BlockOp("y", "add", ("x", "bb")),
                       OutputSaver("y", 0, (0, 1, R)),
                   ])
    return g, lambda x: {"Y": x["X"] + x["b"]}


def row_sum(M: int = 32, N: int = 256) -> tuple[KernelGraph, object]:
    """Y = X.sum(-1) (keepdims=False at block level) and Z = (2 * X).sum(-1, keepdims=True); the
    loop splits the reduced dim."""
    g = one_kernel("row_sum", [DTensor("X", (M, N))],
                   [DTensor("Y", (M,)), DTensor("Z", (M, 1))], (4, 1, 1), 4, [
                       InputIter("x", 0, (0, R, R), fmap=1),
                       BlockOp("s", "sum", ("x",), attrs_of(axes=(1,), keepdims=False)),
                       BlockOp("x2", "mul", (2.0, "x")),
                       BlockOp("s2", "sum", ("x2",), attrs_of(axes=(1,), keepdims=True)),
                       Accum("acc", "s"),
                       Accum("acc2", "s2"),
                       OutputSaver("acc", 0, (0, R, R)),
                       OutputSaver("acc2", 1, (0, R, R)),
                   ])
    return g, lambda x: {"Y": x["X"].sum(-1), "Z": 2 * x["X"].sum(-1, keepdims=True)}


def concat_mm(M: int = 16, K: int = 64, N: int = 32) -> tuple[KernelGraph, object]:
    """Y = concat(A @ W, 0.5 * B, axis=1): an accumulated tile (epilogue) beside an invariant
    one scaled by a fused thread graph."""
    g = one_kernel("concat_mm",
                   [DTensor("A", (M, K)), DTensor("B", (M, K)), DTensor("W", (K, N))],
                   [DTensor("Y", (M, N + K))], (2, 1, 1), 2, [
                       InputIter("a", 0, (0, R, R), fmap=1),
                       InputIter("w", 2, (R, R, R), fmap=0),
                       BlockOp("p", "matmul", ("a", "w")),
                       Accum("acc", "p"),
                       InputIter("b", 1, (0, R, R)),
                       Fused("e", ("b",), thread(("h", "mul", "in0", 0.5), ninputs=1)),
                       BlockOp("c", "concat", ("acc", "e"), attrs_of(axis=1)),
                       OutputSaver("c", 0, (0, R, R)),
                   ])
    return g, lambda x: {"Y": np.concatenate([x["A"] @ x["W"], 0.5 * x["B"]], axis=1)}


def split_k(M: int = 16, K: int = 256, N: int = 32, splits: int = 4,
            forloop: int = 2) -> tuple[KernelGraph, object]:
    """C = A @ B in two kernels: the first splits K over grid.y (and each part again over the
    loop) and stores the partial products stacked in P (splits*M, N), float32; the second, a
    combine step, sums the partials with its own loop; then a pre-defined kernel scales by 1/3."""
    P = DTensor("P", (splits * M, N), "float32")
    k1 = GraphKernel(("A", "B"), (P,), BlockGraph((1, splits, 1), 128, forloop, (
        InputIter("a", 0, (R, 1, R), fmap=1),
        InputIter("b", 1, (R, 0, R), fmap=0),
        BlockOp("p", "matmul", ("a", "b")),
        Accum("acc", "p"),
        OutputSaver("acc", 0, (R, 0, R)),
    )))
    k2 = GraphKernel(("P",), (DTensor("S", (M, N)),), BlockGraph((2, 1, 1), 128, splits, (
        InputIter("p", 0, (1, R, R), fmap=0),
        Accum("s", "p"),
        OutputSaver("s", 0, (1, R, R)),
    )))
    k3 = KernelOp("div", ("S", 3.0), DTensor("C", (M, N)))
    g = KernelGraph("split_k", (DTensor("A", (M, K)), DTensor("B", (K, N))), (k1, k2, k3),
                    ("C",))
    return g, lambda x: {"C": x["A"] @ x["B"] / 3.0}


CASES = {
    "tiled_matmul": tiled_matmul,
    "rms_matmul": rms_matmul,
    "bias_add": bias_add,
    "row_sum": row_sum,
    "concat_mm": concat_mm,
    "split_k": split_k,
}


def inputs_for(graph: KernelGraph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in graph.inputs}


def narrowed_rms_norm():
    """``(program, naive, narrowed)``: an RMSNorm over float16 rows, its naive lowering, and the
    same lowering with the sum of squares stored in float16 -- equivalent, but overflowing on
    outlier features where the program's own float32 statistic does not (the numerics tests)."""
    from dataclasses import replace
    import mirage_py as mp
    from mirage_py.ugraph import naive_lowering
    p = mp.Program("rms")
    x = p.input("X", (8, 128), "float16")
    p.output(mp.rms_norm(x), name="Y")
    naive = naive_lowering(p)
    narrowed = replace(naive, ops=tuple(
        replace(op, output=replace(op.output, dtype="float16")) if op.op in ("square", "sum")
        else op for op in naive.ops))
    return p, naive, narrowed
