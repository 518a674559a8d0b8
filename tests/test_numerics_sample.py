"""Numerics checks on sampled rows (verifier/sample.py): the sampled candidate computes exactly
the rows it keeps, the sample keeps the rows that hold outlier features, and what cannot be
sampled is checked at full size."""

from __future__ import annotations

import numpy as np

import mirage_py as mp
import pytest

from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                              KernelGraph, OutputSaver, ThreadGraph, ThreadOp, naive_lowering)
from mirage_py.ugraph.interp import run
from mirage_py.verifier.numerics import PROBES, numerics_verdict
from mirage_py.verifier.sample import (SAMPLE_BLOCKS, sample_rows, sampled_labels,
                                       sampled_like)

R, N, TILE = 4, 1024, 16  # rows, columns (the sampled label), columns a block


def _elementwise(name, src, out, dtype, ops, grid=N // TILE):
    """One graph kernel over ``src`` -> ``out`` (both R x N), a block a ``TILE``-column slice."""
    return GraphKernel((src,), (DTensor(out, (R, N), dtype),), BlockGraph((grid, 1, 1), 128, 1, (
        InputIter("x", 0, (1, -1, -1)),
        Fused(name, ("x",), ThreadGraph(1, ops)),
        OutputSaver(name, 0, (1, -1, -1)))))


def _scaled_square():
    """``Y = float16(float32(X)^2 / 4096)``: the square kept in float32, as the program says."""
    p = mp.Program("sq")
    x = p.input("X", (R, N), "float16")
    t = mp.cast(x, "float32")
    p.output(mp.cast(t * t * (1.0 / 4096), "float16"), name="Y")
    return p


def _one_kernel():
    """The program as one kernel (the square in float32 registers): a good candidate."""
    return KernelGraph("one", (DTensor("X", (R, N), "float16"),), (_elementwise(
        "y", "X", "Y", "float16", (ThreadOp("s", "mul", ("in0", "in0")),
                                   ThreadOp("y", "mul", ("s", 1.0 / 4096)))),), ("Y",))


def _square_stored_in_float16():
    """A mutant that stores the square in float16 before scaling it: right to float16's rounding
    on unit inputs, but it overflows where a value is over 256 -- only in the columns (tiles)
    that hold the outlier features, 4 of 1024."""
    return KernelGraph("mutant", (DTensor("X", (R, N), "float16"),), (
        _elementwise("s", "X", "S", "float16", (ThreadOp("s", "mul", ("in0", "in0")),)),
        _elementwise("y", "S", "Y", "float16", (ThreadOp("y", "mul", ("in0", 1.0 / 4096)),)),
    ), ("Y",))


def test_columns_are_the_sampled_label_and_the_good_candidate_passes_on_a_sample():
    p, g = _scaled_square(), _one_kernel()
    assert mp.verify(p, g)
    assert sorted(sampled_labels(p).values()) == [R, N]  # the graph does not cut the rows
    s = sample_rows(p, g)
    assert s, s.why
    (n,) = s.sizes.values()
    assert N // n > 1 and n // TILE >= SAMPLE_BLOCKS
    v = numerics_verdict(p, g, naive_lowering(p))
    assert v.ok and v.sampled == s.sizes and v.elements == R * n


def test_the_sampled_graph_computes_the_rows_it_keeps_bit_for_bit():
    """Every block runs the same code: the sampled graph, fed the first, the last and random
    tiles of full-size inputs, writes exactly what the full graph writes for them."""
    p, g = _scaled_square(), _one_kernel()
    s = sample_rows(p, g)
    (n,) = s.sizes.values()
    x = np.random.default_rng(3).standard_normal((R, N)).astype(np.float16) * np.float16(8)
    full = np.asarray(run(g, {"X": x}, target="h100", backend=_gpu())["Y"])
    blocks = n // TILE
    rng = np.random.default_rng(0)
    picked = [0, N // TILE - 1] + sorted(rng.choice(np.arange(1, N // TILE - 1), blocks - 2,
                                                    replace=False).tolist())
    cols = np.concatenate([np.arange(b * TILE, (b + 1) * TILE) for b in picked])
    small = np.asarray(run(s.graph, {"X": x[:, cols]}, target="h100", backend=_gpu())["Y"])
    assert small.shape == (R, n)
    assert small.dtype == full.dtype and np.array_equal(small, full[:, cols])
    assert not np.array_equal(small, full[:, :n])  # not just the first blocks' values


def _gpu():
    from mirage_py.lax.backend import NumpyBackend
    return NumpyBackend("gpu")


def test_a_mutant_wrong_only_in_the_tiles_of_the_outlier_features_is_rejected_on_its_sample():
    p, bad = _scaled_square(), _square_stored_in_float16()
    assert mp.verify(p, bad)  # exactly the same function: only its rounding differs
    naive = naive_lowering(p)
    unit, outliers = PROBES[0], PROBES[-1]
    assert numerics_verdict(p, bad, naive, probes=(unit,)).ok  # fine on unit normals
    s = sample_rows(p, bad)
    (n,) = s.sizes.values()
    assert s and n < N
    small_naive = sampled_like(p, naive, s.sizes)
    from mirage_py.verifier.numerics import _verdict
    on_sample = _verdict(s.program, s.graph, small_naive, 0, "h100", (unit, outliers))
    assert not on_sample.ok and on_sample.probe == outliers.name
    assert on_sample.candidate.events and on_sample.candidate.events[0].kind == "overflow"
    assert not on_sample.naive.events  # the program's own lowering keeps the square in float32
    v = numerics_verdict(p, bad, naive, probes=(unit, outliers))
    assert not v.ok and not v.sampled and v.elements == R * N + R * n  # decided at
    # full size, after the sample failed


def test_positional_operators_and_whole_dims_are_checked_at_full_size():
    # a slice reads positions: no sample, the full-size check
    p = mp.Program("sl")
    x = p.input("X", (R, 2 * N), "float16")
    p.output(mp.slice(x, 1, 0, N) * 2.0, name="Y")
    g = naive_lowering(p)
    assert not sample_rows(p, g) and "positions" in sample_rows(p, g).why
    v = numerics_verdict(p, g, g)
    assert v.ok and not v.sampled and v.elements == R * 2 * N
    # one block takes all the columns: its tile cannot be kept at fewer columns
    one_block = KernelGraph("whole", (DTensor("X", (R, N), "float16"),), (_elementwise(
        "y", "X", "Y", "float16", (ThreadOp("s", "mul", ("in0", "in0")),
                                   ThreadOp("y", "mul", ("s", 1.0 / 4096))), grid=1),), ("Y",))
    assert not sample_rows(_scaled_square(), one_block)


def test_labels_are_sampled_by_identity_not_by_extent():
    from mirage_py.verifier.sample import checked_elements, sample_sizes
    # gate and up projections: two column labels of 2048, neither reduced
    p = mp.Program("gate_up")
    x, a, b = p.input("X", (1, 512), "float16"), p.input("A", (512, 2048), "float16"), \
        p.input("B", (512, 2048), "float16")
    p.output(x @ a, name="G")
    p.output(x @ b, name="U")
    assert sorted(sampled_labels(p).values()) == [2048, 2048]
    assert sorted(sample_sizes(p).values()) == [1024, 1024]  # 1024 elements of each output
    assert checked_elements(p) == 512 + 2 * 512 * 1024
    # a square projection: its 512 columns share the extent of the reduced 512 rows, and are
    # sampled all the same (the rows, 64, are too few to halve at 1024 output elements)
    q = mp.Program("square")
    x, w = q.input("X", (64, 512), "float16"), q.input("W", (512, 512), "float16")
    q.output(x @ w, name="Y")
    assert sorted(sampled_labels(q).values()) == [64, 512]
    assert list(sample_sizes(q).values()) == [16]  # 64 x 16 output elements
    assert checked_elements(q) == 64 * 512 + 512 * 16


# a GEMM whose reduced K equals its output columns N (KernelBench level2/76, Llama's square
# projections): M x K @ K x N, blocks of TM x TN, a loop over K in TK steps
M, K, TM, TN, TK = 64, 256, 4, 16, 32
_R = -1


def _gemm_relu():
    """``Y = float16(relu(X @ W / 1024 + b))``, the product and epilogue in float32."""
    p = mp.Program("gemm_relu")
    x, w = p.input("X", (M, K), "float16"), p.input("W", (K, K), "float16")
    b = p.input("b", (1, K), "float16")
    h = mp.cast(x, "float32") @ mp.cast(w, "float32")
    p.output(mp.cast(mp.relu(h * (1.0 / 1024) + mp.cast(b, "float32")), "float16"), name="Y")
    return p


def _gemm_kernel(ins, out, epilogue=(), bias=False):
    """One graph kernel ``out = epilogue(ins[0] @ ins[1] [, ins[2]])``: a block a TM x TN
    tile, the loop over K; the epilogue's thread ops read the accumulated tile as ``in0`` (and
    the bias tile as ``in1``)."""
    ops = [InputIter("x", 0, (0, _R, _R), fmap=1), InputIter("w", 1, (_R, 1, _R), fmap=0),
           BlockOp("c", "matmul", ("x", "w")), Accum("acc", "c")]
    last = "acc"
    if bias:
        ops.append(InputIter("bb", 2, (_R, 1, _R)))
    if epilogue:
        ops.append(Fused("y", ("acc", "bb") if bias else ("acc",),
                         ThreadGraph(2 if bias else 1, epilogue)))
        last = "y"
    ops.append(OutputSaver(last, 0, (0, 1, _R)))
    return GraphKernel(tuple(t.name for t in ins), (out,),
                       BlockGraph((out.shape[0] // TM, out.shape[1] // TN, 1), 128,
                                  ins[0].shape[1] // TK, tuple(ops)))


_GEMM_INPUTS = (DTensor("X", (M, K), "float16"), DTensor("W", (K, K), "float16"),
                DTensor("b", (1, K), "float16"))
_EPILOGUE = (ThreadOp("s", "mul", ("in0", 1.0 / 1024)), ThreadOp("t", "add", ("s", "in1")),
             ThreadOp("y", "relu", ("t",)))


def _gemm_one_kernel():
    """The whole program in one kernel, the product and epilogue in float32 registers."""
    return KernelGraph("gemm_one", _GEMM_INPUTS, (_gemm_kernel(
        _GEMM_INPUTS, DTensor("Y", (M, K), "float16"), _EPILOGUE, bias=True),), ("Y",))


def _gemm_product_stored_in_float16():
    """The product stored in float16 before its 1/1024 scale: fine on unit normals, overflowing
    where an outlier feature of X meets an outlier column of W."""
    s = DTensor("S", (M, K), "float16")
    scale = GraphKernel(("S", "b"), (DTensor("Y", (M, K), "float16"),), BlockGraph(
        (M // TM, K // TN, 1), 128, 1, (
            InputIter("s", 0, (0, 1, _R)), InputIter("bb", 1, (_R, 1, _R)),
            Fused("y", ("s", "bb"), ThreadGraph(2, _EPILOGUE)), OutputSaver("y", 0, (0, 1, _R)))))
    return KernelGraph("gemm_f16", _GEMM_INPUTS, (_gemm_kernel(_GEMM_INPUTS[:2], s), scale),
                       ("Y",))


def _square_mlp():
    """``Y = relu(X @ W1) @ W2``, every extent but the rows 256: the hidden dim is reduced by
    the second product, the output columns are not."""
    p = mp.Program("square_mlp")
    x, w1, w2 = p.input("X", (M, K), "float16"), p.input("W1", (K, K), "float16"), \
        p.input("W2", (K, K), "float16")
    p.output(mp.relu(x @ w1) @ w2, name="Y")
    ins = (DTensor("X", (M, K), "float16"), DTensor("W1", (K, K), "float16"),
           DTensor("W2", (K, K), "float16"))
    h = DTensor("H", (M, K), "float16")
    g = KernelGraph("mlp", ins, (
        _gemm_kernel(ins[:2], h, (ThreadOp("y", "relu", ("in0",)),)),
        _gemm_kernel((h, ins[2]), DTensor("Y", (M, K), "float16"))), ("Y",))
    return p, g


def _sizes_by_dim(program, s):
    """The sampled sizes of ``s`` by (input name, dim)."""
    from mirage_py.generator.labels import infer_labels
    dims = infer_labels(program).node_dims
    return {(t.name, d): s.sizes[lab] for t in program.inputs
            for d, lab in enumerate(dims[t.digest]) if lab in s.sizes}


def test_a_gemm_whose_k_equals_n_is_sampled_along_n_and_m_with_k_whole():
    p, g = _gemm_relu(), _gemm_one_kernel()
    assert mp.verify(p, g)
    s = sample_rows(p, g)
    assert s, s.why
    # N (W's columns, b's) and M (X's rows) are sampled; K, of N's extent, stays whole
    assert _sizes_by_dim(p, s) == {("X", 0): M // 2, ("W", 1): K // 2, ("b", 1): K // 2}
    assert [t.shape for t in s.program.inputs] == [(M // 2, K), (K, K // 2), (1, K // 2)]
    assert s.graph.ops[0].block.grid == (M // TM // 2, K // TN // 2, 1)
    assert s.graph.ops[0].block.forloop == K // TK  # every block runs the whole K loop
    naive = naive_lowering(p)
    v = numerics_verdict(p, g, naive)
    full = numerics_verdict(p, g, naive, sample=False)
    assert v.ok and full.ok and v.sampled == s.sizes
    assert v.elements == (M // 2) * K + K * (K // 2) + K // 2 < full.elements


def test_a_gemm_rejected_at_full_size_is_rejected_on_its_sample_and_at_full_size():
    p, bad = _gemm_relu(), _gemm_product_stored_in_float16()
    assert mp.verify(p, bad)  # the same function: only its rounding differs
    naive = naive_lowering(p)
    full = numerics_verdict(p, bad, naive, sample=False)
    assert not full.ok and full.candidate.events[0].kind == "overflow"
    s = sample_rows(p, bad)
    assert s and _sizes_by_dim(p, s)[("W", 1)] == K // 2
    from mirage_py.verifier.numerics import _verdict
    small_naive = sampled_like(p, naive, s.sizes)
    assert [t.shape for t in small_naive.inputs] == [t.shape for t in s.program.inputs]
    on_sample = _verdict(s.program, s.graph, small_naive, 0, "h100", PROBES)
    assert not on_sample.ok and on_sample.probe == full.probe
    v = numerics_verdict(p, bad, naive)
    assert not v.ok and not v.sampled and v.probe == full.probe
    assert v.elements == full.elements + sum(int(np.prod(t.shape)) for t in s.program.inputs)


def test_a_square_mlp_samples_its_output_columns_and_keeps_the_hidden_dim_whole():
    p, g = _square_mlp()
    assert mp.verify(p, g)
    s = sample_rows(p, g)
    assert s, s.why
    assert _sizes_by_dim(p, s) == {("X", 0): M // 2, ("W2", 1): K // 2}
    assert [t.shape for t in s.program.inputs] == [(M // 2, K), (K, K), (K, K // 2)]
    assert s.graph.tensors()["H"].shape == (M // 2, K)  # the hidden dim whole
    naive = naive_lowering(p)
    v = numerics_verdict(p, g, naive)
    assert v.ok == numerics_verdict(p, g, naive, sample=False).ok and v.sampled == s.sizes


@pytest.mark.parametrize("case", ["gemm", "mlp"])
def test_the_sampled_program_is_the_full_one_on_the_sampled_rows_and_columns(case):
    """Float64: the sampled program, fed random rows of X and random columns of the sampled
    weights (the reduced dims of the same extent whole), computes exactly those rows and columns
    of the full program's output; resizing every dim of the extent, as the extent-keyed sample
    did, would compute something else."""
    from mirage_py.verifier.shrink import small_program
    p, g = (_gemm_relu(), _gemm_one_kernel()) if case == "gemm" else _square_mlp()
    s = sample_rows(p, g)
    rng = np.random.default_rng(1)
    x = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    want = p.evaluate(x)["Y"]
    picks = {M: np.sort(rng.choice(M, M // 2, replace=False)),
             K: np.sort(rng.choice(K, K // 2, replace=False))}

    def pick(a, dims):
        for d in dims:
            a = np.take(a, picks[a.shape[d]], axis=d)
        return a
    sampled = _sizes_by_dim(p, s)
    got = s.program.evaluate({n: pick(a, [d for m, d in sampled if m == n])
                              for n, a in x.items()})["Y"]
    expected = want[np.ix_(picks[M], picks[K])]
    assert got.shape == expected.shape == (M // 2, K // 2)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12)
    every = small_program(p, {M: M // 2, K: K // 2})  # every dim of the two extents
    alt = every.evaluate({n: pick(a, [d for d, e in enumerate(a.shape) if e in picks])
                          for n, a in x.items()})["Y"]
    assert alt.shape == expected.shape and not np.allclose(alt, expected, rtol=1e-3)


def _batch_norm(n: int, c: int, h: int, w: int) -> mp.Program:
    """Eval-mode BatchNorm as the torch frontend captures it: per-channel vectors reshaped to
    (1, C, 1, 1) -- views that move no data."""
    p = mp.Program("bn")
    x = p.input("x", (n, c, h, w), "float32")
    vec = {k: mp.reshape(p.input(k, (c,), "float32"), (1, c, 1, 1)) for k in "mswb"}
    p.output((x - vec["m"]) / vec["s"] * vec["w"] + vec["b"], name="y")
    return p


def test_a_reshape_that_only_adds_size_one_dims_does_not_refuse_a_sample():
    """BatchNorm's per-channel reshapes move no data: its labels are sampled (before, any
    reshape refused the sample, and KernelBench's 64 x 64 x 512 x 512 BatchNorm was guessed
    at 1 G elements and never searched), and the naive lowering at the sampled sizes -- its
    reshapes' targets resized too -- computes, in float64, the full program's values at the
    sampled positions."""
    from mirage_py.ugraph import naive_lowering
    from mirage_py.verifier.sample import sample_sizes

    p = _batch_norm(8, 4, 64, 64)
    assert set(sampled_labels(p).values()) == {8, 4, 64}
    sizes = sample_sizes(p)
    assert sizes
    small = sampled_like(p, naive_lowering(p), sizes)
    assert small is not None
    rng = np.random.default_rng(0)
    full = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    x = full["x"]
    keep = [slice(0, s) for s in small.tensors()["x"].shape]
    got = small.run({"x": x[tuple(keep)],
                     **{k: full[k][keep[1]] for k in "mswb"}}, precision="float64")["y"]
    want = p.evaluate(full)["y"][tuple(keep)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_sample_of_long_rows_keeps_two_blocks_where_eight_would_not_fit(monkeypatch):
    """Rows are sampled in whole blocks, at least SAMPLE_BLOCKS of them -- unless such a sample
    would hold a tensor over SAMPLE_TENSOR_ELEMENTS (KernelBench's softmax: 8 blocks of 64
    rows of 393,216, 1.5 GiB a float64 array, ran its checks out of memory): then two."""
    from mirage_py.verifier import sample

    p = mp.Program("rowsum")
    x = p.input("x", (4096, 2048), "float32")
    p.output(x / mp.sum(x, axis=-1, keepdims=True), name="y")
    (row,) = [lab for lab, e in sampled_labels(p).items() if e == 4096]
    assert sample.sample_sizes(p, {row: 64}) == {row: 4096 // 64 * SAMPLE_BLOCKS}
    monkeypatch.setattr(sample, "SAMPLE_TENSOR_ELEMENTS", 4096 // 64 * SAMPLE_BLOCKS * 2048 - 1)
    assert sample.sample_sizes(p, {row: 64}) == {row: 4096 // 64 * 2}


def test_a_row_reductions_sample_keeps_fewer_outputs_where_1024_rows_would_not_fit(monkeypatch):
    """A row reduction has one output element a row: 1024 of them kept 1024 whole rows
    (KernelBench's softmax statistics: 402 M input elements, a check guessed at 56 s, never
    searched). Where even two blocks' sample is over SAMPLE_TENSOR_ELEMENTS, each output keeps
    SAMPLE_LEAST_OUTPUT_ELEMENTS."""
    from mirage_py.verifier import sample

    p = mp.Program("rowstats")
    x = p.input("x", (4096, 2048), "float32")
    p.output(mp.sum(mp.exp(x - mp.max(x, axis=-1, keepdims=True)), axis=-1, keepdims=True),
             name="s")
    (row,) = sampled_labels(p)
    assert sample.sample_sizes(p) == {row: 1024}  # 1024 output elements
    monkeypatch.setattr(sample, "SAMPLE_TENSOR_ELEMENTS", 1024 * 2048 - 1)
    assert sample.sample_sizes(p) == {row: sample.SAMPLE_LEAST_OUTPUT_ELEMENTS}
