"""Small μGraphs for code generation tests: every block operator, iterator mapping and pre-defined
kernel the emitter knows, at sizes the CPU emulator runs in a blink, plus small versions of the
nine benchmark programs (same operators, shapes scaled down)."""

from __future__ import annotations

import mirage_py as mp
from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                              KernelGraph, KernelOp, MaskIter, OutputSaver, ThreadGraph, ThreadOp,
                              attrs_of)

R = -1


def _thread(*ops: tuple, ninputs: int) -> ThreadGraph:
    """Thread ops from tuples (out, op, operands...), a trailing dict giving attributes."""
    return ThreadGraph(ninputs, tuple(
        ThreadOp(o[0], o[1], tuple(x for x in o[2:] if not isinstance(x, dict)),
                 attrs_of(*[x for x in o[2:] if isinstance(x, dict)])) for o in ops))


def small_rmsnorm_matmul() -> KernelGraph:
    """rms_norm(X) @ W fused: X@W and sum(X^2) accumulated over K, normalised in the epilogue."""
    m, k, n = 4, 64, 32
    g = BlockGraph((2, 1, 1), 64, 4, (
        InputIter("x", 0, (R, R, R), fmap=1),
        InputIter("w", 1, (1, R, R), fmap=0),
        BlockOp("xw", "matmul", ("x", "w")),
        Fused("x2", ("x",), _thread(("y", "square", "in0"), ninputs=1)),
        BlockOp("ss", "sum", ("x2",), attrs_of(axes=(1,), keepdims=True)),
        Accum("acc", "xw"),
        Accum("sacc", "ss"),
        Fused("y", ("acc", "sacc"), _thread(("m", "div", "in1", float(k)), ("v", "add", "m", 1e-6),
                                            ("r", "sqrt", "v"), ("y", "div", "in0", "r"),
                                            ninputs=2)),
        OutputSaver("y", 0, (1, R, R)),
    ))
    return KernelGraph("rmsnorm_matmul", (DTensor("X", (m, k)), DTensor("W", (k, n))),
                       (GraphKernel(("X", "W"), (DTensor("Y", (m, n)),), g),), ("Y",))


def small_attention(rows: int = 8) -> KernelGraph:
    """Flash-decoding style: the key dim split over grid.y *and* the loop, partial sums saved in
    fp32 by kernel 0, combined by kernel 1. With ``rows`` >= 32 each of the two warps gets 16
    rows: the probabilities stay in registers (FlashAttention-2)."""
    h, d, seq, split, loop = 2, 16, 64, 2, 2
    chunk = seq // (split * loop)
    k0 = GraphKernel(("Q", "K", "V"), (DTensor("Op", (h, rows, d * split), "float32"),
                                       DTensor("Lp", (h, rows, split), "float32")), BlockGraph(
        (h, split, 1), 64, loop, (
            InputIter("q", 0, (0, R, R)),
            InputIter("k", 1, (0, 2, R), fmap=2),
            InputIter("v", 2, (0, 1, R), fmap=1),
            BlockOp("s", "matmul", ("q", "k")),
            Fused("e", ("s",), _thread(("y", "exp", "in0"), ninputs=1)),
            BlockOp("l", "sum", ("e",), attrs_of(axes=(2,), keepdims=True)),
            BlockOp("o", "matmul", ("e", "v")),
            Accum("O", "o"),
            Accum("L", "l"),
            OutputSaver("O", 0, (0, 2, R)),
            OutputSaver("L", 1, (0, 2, R)),
        )))
    assert chunk * split * loop == seq
    k1 = GraphKernel(("Op", "Lp"), (DTensor("O", (h, rows, d)),), BlockGraph(
        (h, 2, 1), 32, split, (
            InputIter("po", 0, (0, 1, R), fmap=2),
            InputIter("pl", 1, (0, 1, R), fmap=2),
            Accum("so", "po"),
            Accum("sl", "pl"),
            Fused("out", ("so", "sl"), _thread(("y", "div", "in0", "in1"), ninputs=2)),
            OutputSaver("out", 0, (0, 1, R)),
        )))
    ins = (DTensor("Q", (h, rows, d)), DTensor("K", (h, d, seq)), DTensor("V", (h, seq, d)))
    return KernelGraph("attention" if rows == 8 else f"attention_r{rows}", ins, (k0, k1), ("O",))


def attention_row_sums_after_loop() -> KernelGraph:
    """Attention in one kernel as the search often finds it: the exp of each score tile is
    summed element-wise over the loop (``accum.sum(e)``) and reduced along rows only once after
    it. With tensor cores, the scores, their exp and that running sum all stay in registers."""
    h, rows, d, seq, loop = 2, 16, 16, 64, 4
    g = BlockGraph((h, 1, 1), 64, loop, (
        InputIter("q", 0, (0, R, R)),
        InputIter("k", 1, (0, R, R), fmap=2),
        InputIter("v", 2, (0, R, R), fmap=1),
        BlockOp("s", "matmul", ("q", "k")),
        Fused("e", ("s",), _thread(("y", "exp", "in0"), ninputs=1)),
        BlockOp("o", "matmul", ("e", "v")),
        Accum("esum", "e"),
        Accum("O", "o"),
        BlockOp("l", "sum", ("esum",), attrs_of(axes=(2,), keepdims=True)),
        Fused("out", ("O", "l"), _thread(("y", "div", "in0", "in1"), ninputs=2)),
        OutputSaver("out", 0, (0, R, R)),
    ))
    ins = (DTensor("Q", (h, rows, d)), DTensor("K", (h, d, seq)), DTensor("V", (h, seq, d)))
    return KernelGraph("attention_rowsum_after", ins,
                       (GraphKernel(("Q", "K", "V"), (DTensor("O", (h, rows, d)),), g),), ("O",))


def causal_two_pass_attention() -> KernelGraph:
    """Safe causal attention in two kernels, the form the search finds for a prefill: kernel 0
    walks the keys and keeps the running row maximum of the masked scores (a block max per
    chunk, a max accumulator over the loop; the mask tile computed from indices, split over the
    grid and the loop); kernel 1 subtracts it before the exp. Also a min accumulator, a slice
    and attributes in a thread graph (clamp, leaky_relu)."""
    h, rows, d, seq, loop = 2, 16, 16, 32, 4
    q = InputIter("q", 0, (0, 1, R))
    k = InputIter("k", 1, (0, R, R), fmap=2)
    mask = MaskIter("m", (seq, seq), 0, 0, (R, 0, R), fmap=1)
    scores = [q, k, mask, BlockOp("s", "matmul", ("q", "k")),
              Fused("sm", ("m", "s"), _thread(("y", "where", "in0", "in1", -1e4), ninputs=2))]
    k0 = GraphKernel(("Q", "K"), (DTensor("Mx", (h, seq, 1), "float32"),
                                  DTensor("Mn", (h, seq, 1), "float32")), BlockGraph(
        (h, seq // rows, 1), 64, loop, (
            *scores,
            BlockOp("cm", "max", ("sm",), attrs_of(axes=(2,), keepdims=True)),
            BlockOp("cn", "min", ("s",), attrs_of(axes=(2,), keepdims=True)),
            Accum("mx", "cm", "max"),
            Accum("mn", "cn", "min"),
            OutputSaver("mx", 0, (0, 1, R)),
            OutputSaver("mn", 1, (0, 1, R)),
        )))
    k1 = GraphKernel(("Q", "K", "V", "Mx", "Mn"), (DTensor("O", (h, seq, d)),), BlockGraph(
        (h, seq // rows, 1), 64, loop, (
            *scores,
            InputIter("v", 2, (0, R, R), fmap=1),
            InputIter("mx", 3, (0, 1, R)),
            InputIter("mn", 4, (0, 1, R)),
            Fused("e", ("sm", "mx"), _thread(("t", "sub", "in0", "in1"), ("y", "exp", "t"),
                                             ninputs=2)),
            BlockOp("o", "matmul", ("e", "v")),
            BlockOp("l", "sum", ("e",), attrs_of(axes=(2,), keepdims=True)),
            Accum("O", "o"),
            Accum("L", "l"),
            BlockOp("half", "slice", ("O",), attrs_of(axis=2, start=0, stop=d // 2)),
            BlockOp("rest", "slice", ("O",), attrs_of(axis=2, start=d // 2, stop=d)),
            BlockOp("cat", "concat", ("rest", "half"), attrs_of(axis=2)),
            Fused("out", ("cat", "L", "mn"), _thread(
                ("y", "div", "in0", "in1"), ("c", "clamp", "y", {"lo": -0.5, "hi": 0.5}),
                ("z", "leaky_relu", "in2", {"negative_slope": 0.1}), ("w", "add", "c", "z"),
                ninputs=3)),
            OutputSaver("out", 0, (0, 1, R)),
        )))
    ins = (DTensor("Q", (h, seq, d)), DTensor("K", (h, d, seq)), DTensor("V", (h, seq, d)))
    return KernelGraph("causal_two_pass", ins, (k0, k1), ("O",))


def mixed_block_ops() -> KernelGraph:
    """Every other block operator and mapping: bf16 and fp32 tensors, concat, a batched matmul
    with a broadcast operand, sums without keepdims and over two axes, a scalar operand, a saved
    loop-invariant tile, an accumulated loop-invariant tile, a tile broadcast to a higher rank,
    and pre-defined kernels around the graph kernel."""
    A = DTensor("A", (4, 6, 8), "bfloat16")
    B = DTensor("B", (8, 4), "bfloat16")
    C = DTensor("C", (4, 6, 4), "float32")
    At = DTensor("At", (4, 6, 8), "bfloat16")
    pre = KernelOp("mul", ("A", 0.5), At)
    g = BlockGraph((2, 1, 1), 64, 2, (
        InputIter("a", 0, (0, R, R)),            # (2, 6, 8) invariant
        InputIter("b", 1, (R, R, R), fmap=1),    # (8, 2) per iteration
        InputIter("c", 2, (0, R, R)),            # (2, 6, 4) invariant
        BlockOp("ab", "matmul", ("a", "b")),     # (2, 6, 2): batch of 2, b broadcast
        BlockOp("cat", "concat", ("ab", "ab"), attrs_of(axis=2)),  # (2, 6, 4)
        BlockOp("sc", "mul", ("cat", 0.25)),
        Accum("acc", "sc"),
        Accum("cacc", "c"),                      # c added each iteration: 2 * c
        BlockOp("tot", "sum", ("acc",), attrs_of(axes=(0,), keepdims=False)),  # (6, 4)
        BlockOp("s2", "sum", ("acc",), attrs_of(axes=(0, 2), keepdims=True)),  # (1, 6, 1)
        Fused("y", ("cacc", "tot", "s2"), _thread(("t", "add", "in0", "in1"),
                                                  ("u", "mul", "in2", 0.1), ("w", "sub", "t", "u"),
                                                  ("y", "relu", "w"), ninputs=3)),  # (2, 6, 4)
        OutputSaver("y", 0, (0, R, R)),
        OutputSaver("c", 1, (0, R, R)),          # a loaded tile saved as it is
    ))
    gk = GraphKernel(("At", "B", "C"), (DTensor("Y", (4, 6, 4), "float32"),
                                        DTensor("Ccopy", (4, 6, 4), "bfloat16")), g)
    post = KernelOp("rms_norm", ("Y",), DTensor("Z", (4, 6, 4), "float32"), attrs_of(eps=1e-5))
    return KernelGraph("mixed", (A, B, C), (pre, gk, post), ("Z", "Ccopy"))


def kernel_ops_program() -> mp.Program:
    """One of each pre-defined kernel: matmul with batch broadcasting, sum with and without
    keepdims, rms_norm, reshape, transpose, element-wise ops with broadcasting and constants."""
    p = mp.Program("kernel_ops")
    X = p.input("X", (2, 3, 24), "float16")
    W = p.input("W", (24, 10), "float16")
    b = p.input("b", (10,), "float32")
    H = mp.rms_norm(X) @ W                                   # (2, 3, 10)
    G = mp.gelu(H + b) - mp.relu(H) * 0.5
    T = mp.transpose(G, (0, 2, 1))                           # (2, 10, 3)
    S = mp.sum(mp.exp(T * 0.1), axis=1, keepdims=True)       # (2, 1, 3)
    U = mp.reshape(T / S, (4, 15))
    p.output(mp.sqrt(mp.square(U) + 1.0), name="U")
    p.output(mp.sum(mp.silu(G), axis=(0, 2)), name="V")
    p.output(-mp.sum(X, axis=-1), name="N")
    return p


def new_ops_program() -> mp.Program:
    """One of each operator of issue #16 as a pre-defined kernel (naive lowering): the new
    element-wise functions with their attributes, maximum / minimum / where with a mask, max /
    min reductions with and without keepdims, slices, concat and a cast."""
    p = mp.Program("new_ops")
    X = p.input("X", (4, 8), "float16")
    Y = p.input("Y", (8,), "float32")
    a = mp.sigmoid(X) + mp.tanh(X) * mp.abs(X) - mp.softplus(X) + mp.mish(X)
    b = mp.gelu(X, approximate="tanh") + mp.leaky_relu(X, 0.2) + mp.clamp(X, -0.5, 0.5)
    c = mp.log(X * X + 1.0) + X ** 3 + mp.pow(X * X + 1.0, -0.5) + mp.maximum(X, Y)
    d = mp.where(mp.sliding_window_mask(4, 8, 3), mp.minimum(a, b), c)
    e = mp.concat([d[:, 4:], mp.max(d, 1, keepdims=True), d[:, :3]], axis=1)
    p.output(mp.cast(e, "float32") + mp.min(e, 0), name="Z")
    p.output(mp.logsumexp(X, -1), name="L")
    return p


def small_benchmark(name: str) -> mp.Program:
    """Benchmark ``name`` with the same operators and tiny shapes."""
    p = mp.Program(f"small_{name}")
    if name in ("gqa", "qknorm_gqa", "mha", "mqa"):
        heads, rows, d, seq = {"gqa": (2, 8, 16, 32), "qknorm_gqa": (2, 8, 16, 32),
                               "mha": (4, 4, 16, 32), "mqa": (1, 16, 16, 32)}[name]
        Q = p.input("Q", (heads, rows, d))
        K = p.input("K", (heads, d, seq))
        V = p.input("V", (heads, seq, d))
        if name == "qknorm_gqa":
            Q = mp.rms_norm(Q) * 0.25
            K = mp.transpose(mp.rms_norm(mp.transpose(K, (0, 2, 1))), (0, 2, 1))
        E = mp.exp(Q @ K)
        p.output(E / mp.sum(E, axis=-1, keepdims=True) @ V, name="O")
    elif name == "rmsnorm_linear":
        X, W = p.input("X", (2, 48)), p.input("W", (48, 40))
        p.output(mp.rms_norm(X) @ W, name="Y")
    elif name == "lora":
        X, W = p.input("X", (8, 32)), p.input("W", (32, 24))
        A, B = p.input("A", (32, 4)), p.input("B", (4, 24))
        p.output(X @ W + (X @ A) @ B, name="Y")
    elif name == "gated_mlp":
        X, W1, W2 = p.input("X", (4, 32)), p.input("W1", (32, 24)), p.input("W2", (32, 24))
        p.output(mp.silu(X @ W1) * (X @ W2), name="Y")
    elif name == "ntrans":
        H, X, a = p.input("H", (4, 40)), p.input("X", (4, 40)), p.input("alpha", (4, 40))
        p.output(mp.rms_norm(X + a * (mp.rms_norm(H) - X)), name="Y")
    elif name == "exp_matmul":
        X, A, B = p.input("X", (2, 4, 32)), p.input("A", (2, 32, 24)), p.input("B", (2, 24, 20))
        p.output(mp.exp(X @ A) @ B, name="Y")
    return p


def random_inputs(graph: KernelGraph, seed: int = 0, scale: float = 1.0) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {}
    for t in graph.inputs:
        fan = t.shape[-2] if len(t.shape) >= 2 else 1
        out[t.name] = rng.standard_normal(t.shape) * scale / max(1.0, fan ** 0.5)
    return out
