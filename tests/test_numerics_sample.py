"""Numerics checks on sampled rows (verifier/sample.py): the sampled candidate computes exactly
the rows it keeps, the sample keeps the rows that hold outlier features, and what cannot be
sampled is checked at full size."""

from __future__ import annotations

import numpy as np

import mirage_py as mp
from mirage_py.ugraph import (BlockGraph, DTensor, Fused, GraphKernel, InputIter, KernelGraph,
                              OutputSaver, ThreadGraph, ThreadOp, naive_lowering)
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
    assert N // s.sizes[N] > 1 and s.sizes[N] // TILE >= SAMPLE_BLOCKS
    v = numerics_verdict(p, g, naive_lowering(p))
    assert v.ok and v.sampled == s.sizes and v.elements == R * s.sizes[N]


def test_the_sampled_graph_computes_the_rows_it_keeps_bit_for_bit():
    """Every block runs the same code: the sampled graph, fed the first, the last and random
    tiles of full-size inputs, writes exactly what the full graph writes for them."""
    p, g = _scaled_square(), _one_kernel()
    s = sample_rows(p, g)
    x = np.random.default_rng(3).standard_normal((R, N)).astype(np.float16) * np.float16(8)
    full = np.asarray(run(g, {"X": x}, target="h100", backend=_gpu())["Y"])
    blocks = s.sizes[N] // TILE
    rng = np.random.default_rng(0)
    picked = [0, N // TILE - 1] + sorted(rng.choice(np.arange(1, N // TILE - 1), blocks - 2,
                                                    replace=False).tolist())
    cols = np.concatenate([np.arange(b * TILE, (b + 1) * TILE) for b in picked])
    small = np.asarray(run(s.graph, {"X": x[:, cols]}, target="h100", backend=_gpu())["Y"])
    assert small.shape == (R, s.sizes[N])
    assert small.dtype == full.dtype and np.array_equal(small, full[:, cols])
    assert not np.array_equal(small, full[:, :s.sizes[N]])  # not just the first blocks' values


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
    assert s and s.sizes[N] < N
    small_naive = sampled_like(naive, s.sizes)
    from mirage_py.verifier.numerics import _verdict
    on_sample = _verdict(s.program, s.graph, small_naive, 0, "h100", (unit, outliers))
    assert not on_sample.ok and on_sample.probe == outliers.name
    assert on_sample.candidate.events and on_sample.candidate.events[0].kind == "overflow"
    assert not on_sample.naive.events  # the program's own lowering keeps the square in float32
    v = numerics_verdict(p, bad, naive, probes=(unit, outliers))
    assert not v.ok and not v.sampled and v.elements == R * N + R * s.sizes[N]  # decided at
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


def test_labels_of_one_extent_are_sampled_only_when_none_is_reduced():
    from mirage_py.verifier.sample import checked_elements, sample_extents
    # gate and up projections: two column labels of 2048, neither reduced
    p = mp.Program("gate_up")
    x, a, b = p.input("X", (1, 512), "float16"), p.input("A", (512, 2048), "float16"), \
        p.input("B", (512, 2048), "float16")
    p.output(x @ a, name="G")
    p.output(x @ b, name="U")
    assert sorted(sampled_labels(p).values()) == [2048, 2048]
    assert sample_extents(p) == {2048: 512}  # 2 x 512 output elements
    assert checked_elements(p) == 512 + 2 * 512 * 512
    # a square projection: its 512 columns share the extent of the reduced 512 rows
    q = mp.Program("square")
    x, w = q.input("X", (1, 512), "float16"), q.input("W", (512, 512), "float16")
    q.output(x @ w, name="Y")
    assert sampled_labels(q) == {} and checked_elements(q) == 512 + 512 * 512
