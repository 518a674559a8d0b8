"""Hand-built fused μGraphs for the nine benchmarks: the fusions an expert would write.

``hand_built(name, bs) -> KernelGraph`` returns, for benchmark ``name`` at batch size ``bs``:

* attention (gqa, qknorm_gqa, mha, mqa): a flash-decoding style split-K kernel -- grid over
  (heads, sequence splits, row splits), a for-loop over key chunks inside each split, exp fused
  in registers, the row sums and exp(S)@V accumulated in fp32 and saved as fp32 partials -- plus a
  small combine kernel that sums the partials and divides. qknorm_gqa normalises the Q and K tiles
  inside the same kernel.
* rmsnorm_linear: one kernel that accumulates X@W and the sum of squares of X in the same loop
  and divides by the norm in the epilogue ((X/r)@W == (X@W)/r for a per-row r).
* lora: one kernel accumulating X@W and X@A over K; the epilogue adds (X@A)@B.
* gated_mlp: one kernel accumulating X@W1 and X@W2 in one loop; silu(a)*b as a thread epilogue.
* ntrans: one row-wise kernel computing both norms and the blend.
* exp_matmul: two tiled matmul kernels, exp fused in the first one's epilogue.

Tile sizes and split counts come from the shapes (divisors, a target of roughly two blocks per
SM on an H100), not from benchmark names.
"""

from __future__ import annotations

from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                              KernelGraph, OutputSaver, ThreadGraph, ThreadOp, attrs_of)

from .programs import NAMES, get_program

SM_COUNT = 132
THREADS = 128
R = -1  # replicate / none


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _split_for(n: int, have_blocks: int, want_blocks: int = 2 * SM_COUNT, min_part: int = 1) -> int:
    """How many parts to split a dim of size n into so that have_blocks * parts approaches
    want_blocks, keeping each part >= min_part (a divisor of n)."""
    best = 1
    for d in range(1, n + 1):
        if n % d or n // d < min_part:
            continue
        if have_blocks * d <= want_blocks:
            best = d
    return best


def _thread(*ops: tuple, ninputs: int) -> ThreadGraph:
    return ThreadGraph(ninputs, tuple(ThreadOp(o[0], o[1], tuple(o[2:])) for o in ops))


# inv-norm thread graph: in0 / sqrt(in1 / n + eps) (* scale)
def _norm_thread(n: int, eps: float, scale: float | None = None) -> ThreadGraph:
    ops = [("m", "div", "in1", float(n)), ("v", "add", "m", eps), ("r", "sqrt", "v"),
           ("y", "div", "in0", "r")]
    if scale is not None:
        ops.append(("z", "mul", "y", scale))
    return _thread(*ops, ninputs=2)


def _attention(name: str, bs: int) -> KernelGraph:
    p = get_program(name, bs)
    Q, K, V = (next(t for t in p.inputs if t.name == n) for n in "QKV")
    H, rows, d = Q.shape
    seq = K.shape[2]
    norm = name == "qknorm_gqa"
    chunk = _divisor_at_most(seq, 64)  # keys per loop iteration
    row_tile = _divisor_at_most(rows, 64)
    rsplit = rows // row_tile
    ssplit = _split_for(seq // chunk, H * rsplit)  # sequence splits (grid y)
    forloop = seq // (ssplit * chunk)
    grid = (H, ssplit, rsplit)
    ops = [
        InputIter("q", 0, (0, R, 1)),
        InputIter("k", 1, (0, 2, R), fmap=2),
        InputIter("v", 2, (0, 1, R), fmap=1),
    ]
    qn, kn = "q", "k"
    if norm:
        ops += [
            Fused("q2", ("q",), _thread(("y", "square", "in0"), ninputs=1)),
            BlockOp("qss", "sum", ("q2",), attrs_of(axes=(2,), keepdims=True)),
            Fused("qn", ("q", "qss"), _norm_thread(d, 1e-6, 0.125)),
            Fused("k2", ("k",), _thread(("y", "square", "in0"), ninputs=1)),
            BlockOp("kss", "sum", ("k2",), attrs_of(axes=(1,), keepdims=True)),
            Fused("kn", ("k", "kss"), _norm_thread(d, 1e-6)),
        ]
        qn, kn = "qn", "kn"
    ops += [
        BlockOp("s", "matmul", (qn, kn)),
        Fused("e", ("s",), _thread(("y", "exp", "in0"), ninputs=1)),
        BlockOp("l", "sum", ("e",), attrs_of(axes=(2,), keepdims=True)),
        BlockOp("o", "matmul", ("e", "v")),
        Accum("O", "o"),
        Accum("L", "l"),
        OutputSaver("O", 0, (0, 2, 1)),
        OutputSaver("L", 1, (0, 2, 1)),
    ]
    parts_o = DTensor("O_part", (H, rows, d * ssplit), "float32")
    parts_l = DTensor("L_part", (H, rows, ssplit), "float32")
    k1 = GraphKernel(("Q", "K", "V"), (parts_o, parts_l),
                     BlockGraph(grid, THREADS, forloop, tuple(ops)))
    # combine: sum the partial numerators and denominators over the splits, divide
    crow = _divisor_at_most(rows, 16)
    cgrid = (H, rows // crow, 1)
    k2 = GraphKernel(("O_part", "L_part"), (DTensor("O", (H, rows, d), Q.dtype),), BlockGraph(
        cgrid, THREADS, ssplit, (
            InputIter("po", 0, (0, 1, R), fmap=2),
            InputIter("pl", 1, (0, 1, R), fmap=2),
            Accum("so", "po"),
            Accum("sl", "pl"),
            Fused("out", ("so", "sl"), _thread(("y", "div", "in0", "in1"), ninputs=2)),
            OutputSaver("out", 0, (0, 1, R)),
        )))
    return KernelGraph(p.name, _inputs(p), (k1, k2), ("O",))


def _inputs(p) -> tuple[DTensor, ...]:
    return tuple(DTensor(t.name, t.shape, t.dtype) for t in p.inputs)


def _rmsnorm_linear(bs: int) -> KernelGraph:
    p = get_program("rmsnorm_linear", bs)
    (m, k), n = p.inputs[0].shape, p.inputs[1].shape[1]
    ntile = _divisor_at_most(n, 64)
    kchunk = _divisor_at_most(k, 64)
    g = BlockGraph((n // ntile, 1, 1), THREADS, k // kchunk, (
        InputIter("x", 0, (R, R, R), fmap=1),
        InputIter("w", 1, (1, R, R), fmap=0),
        BlockOp("xw", "matmul", ("x", "w")),
        Fused("x2", ("x",), _thread(("y", "square", "in0"), ninputs=1)),
        BlockOp("ss", "sum", ("x2",), attrs_of(axes=(1,), keepdims=True)),
        Accum("acc", "xw"),
        Accum("sacc", "ss"),
        Fused("y", ("acc", "sacc"), _norm_thread(k, 1e-6)),
        OutputSaver("y", 0, (1, R, R)),
    ))
    out = DTensor("Y", (m, n), p.inputs[0].dtype)
    return KernelGraph(p.name, _inputs(p), (GraphKernel(("X", "W"), (out,), g),), ("Y",))


def _lora(bs: int) -> KernelGraph:
    p = get_program("lora", bs)
    (m, k), n = p.inputs[0].shape, p.inputs[1].shape[1]
    ntile = _divisor_at_most(n, 64)
    kchunk = _divisor_at_most(k, 64)
    g = BlockGraph((n // ntile, 1, 1), THREADS, k // kchunk, (
        InputIter("x", 0, (R, R, R), fmap=1),
        InputIter("w", 1, (1, R, R), fmap=0),
        InputIter("a", 2, (R, R, R), fmap=0),
        InputIter("b", 3, (1, R, R)),
        BlockOp("xw", "matmul", ("x", "w")),
        BlockOp("xa", "matmul", ("x", "a")),
        Accum("sw", "xw"),
        Accum("sa", "xa"),
        BlockOp("ab", "matmul", ("sa", "b")),
        BlockOp("y", "add", ("sw", "ab")),
        OutputSaver("y", 0, (1, R, R)),
    ))
    out = DTensor("Y", (m, n), p.inputs[0].dtype)
    return KernelGraph(p.name, _inputs(p), (GraphKernel(("X", "W", "A", "B"), (out,), g),), ("Y",))


def _gated_mlp(bs: int) -> KernelGraph:
    p = get_program("gated_mlp", bs)
    (m, k), n = p.inputs[0].shape, p.inputs[1].shape[1]
    ntile = _divisor_at_most(n, 64)
    kchunk = _divisor_at_most(k, 64)
    g = BlockGraph((n // ntile, 1, 1), THREADS, k // kchunk, (
        InputIter("x", 0, (R, R, R), fmap=1),
        InputIter("w1", 1, (1, R, R), fmap=0),
        InputIter("w2", 2, (1, R, R), fmap=0),
        BlockOp("a", "matmul", ("x", "w1")),
        BlockOp("b", "matmul", ("x", "w2")),
        Accum("sa", "a"),
        Accum("sb", "b"),
        Fused("y", ("sa", "sb"), _thread(("s", "silu", "in0"), ("y", "mul", "s", "in1"),
                                         ninputs=2)),
        OutputSaver("y", 0, (1, R, R)),
    ))
    out = DTensor("Y", (m, n), p.inputs[0].dtype)
    return KernelGraph(p.name, _inputs(p), (GraphKernel(("X", "W1", "W2"), (out,), g),), ("Y",))


def _ntrans(bs: int) -> KernelGraph:
    p = get_program("ntrans", bs)
    m, n = p.inputs[0].shape
    rtile = _divisor_at_most(m, 1)
    sq = _thread(("y", "square", "in0"), ninputs=1)
    g = BlockGraph((m // rtile, 1, 1), THREADS, 1, (
        InputIter("h", 0, (0, R, R)),
        InputIter("x", 1, (0, R, R)),
        InputIter("al", 2, (0, R, R)),
        Fused("h2", ("h",), sq),
        BlockOp("hss", "sum", ("h2",), attrs_of(axes=(1,), keepdims=True)),
        Fused("z", ("h", "hss", "x", "al"), ThreadGraph(4, (
            ThreadOp("m", "div", ("in1", float(n))), ThreadOp("v", "add", ("m", 1e-6)),
            ThreadOp("r", "sqrt", ("v",)), ThreadOp("hn", "div", ("in0", "r")),
            ThreadOp("d", "sub", ("hn", "in2")), ThreadOp("ad", "mul", ("in3", "d")),
            ThreadOp("z", "add", ("in2", "ad"))))),
        Fused("z2", ("z",), sq),
        BlockOp("zss", "sum", ("z2",), attrs_of(axes=(1,), keepdims=True)),
        Fused("y", ("z", "zss"), _norm_thread(n, 1e-6)),
        OutputSaver("y", 0, (0, R, R)),
    ))
    out = DTensor("Y", (m, n), p.inputs[0].dtype)
    return KernelGraph(p.name, _inputs(p), (GraphKernel(("H", "X", "alpha"), (out,), g),), ("Y",))


def _tiled_matmul(a: DTensor, b: DTensor, out: DTensor, exp_epilogue: bool) -> GraphKernel:
    """Batched C = A @ B (optionally exp(A @ B)): grid over (batch, column tiles), loop over K."""
    batch, m, k = a.shape
    n = b.shape[2]
    ntile = _divisor_at_most(n, 64)
    kchunk = _divisor_at_most(k, 64)
    ops = [
        InputIter("a", 0, (0, R, R), fmap=2),
        InputIter("b", 1, (0, 2, R), fmap=1),
        BlockOp("c", "matmul", ("a", "b")),
        Accum("acc", "c"),
    ]
    res = "acc"
    if exp_epilogue:
        ops.append(Fused("e", ("acc",), _thread(("y", "exp", "in0"), ninputs=1)))
        res = "e"
    ops.append(OutputSaver(res, 0, (0, 2, R)))
    return GraphKernel((a.name, b.name), (out,),
                       BlockGraph((batch, n // ntile, 1), THREADS, k // kchunk, tuple(ops)))


def _exp_matmul(bs: int) -> KernelGraph:
    p = get_program("exp_matmul", bs)
    X, A, B = _inputs(p)
    E = DTensor("E", X.shape[:2] + (A.shape[2],), X.dtype)
    Y = DTensor("Y", X.shape[:2] + (B.shape[2],), X.dtype)
    return KernelGraph(p.name, (X, A, B), (_tiled_matmul(X, A, E, True),
                                           _tiled_matmul(E, B, Y, False)), ("Y",))


def hand_built(name: str, bs: int = 1) -> KernelGraph:
    """The expert fusion of benchmark ``name`` at batch size ``bs``."""
    if name not in NAMES:
        from mirage_py import ProgramError
        raise ProgramError(f"unknown benchmark {name!r}; choose one of {', '.join(NAMES)}")
    if name in ("gqa", "qknorm_gqa", "mha", "mqa"):
        return _attention(name, bs)
    return {"rmsnorm_linear": _rmsnorm_linear, "lora": _lora, "gated_mlp": _gated_mlp,
            "ntrans": _ntrans, "exp_matmul": _exp_matmul}[name](bs)
