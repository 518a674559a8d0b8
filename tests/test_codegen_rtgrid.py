"""Grids and loop trip counts computed at launch for a shape family's bucket
(codegen_cuda/extents.py, docs/codegen.md "Sizes at run time"): a bucket's graph compiled once
runs at a valid size inside the bucket without the bucket's whole grid / loop, equal to the
interpreter and to float64 at sizes 1, a partial tile, a tile boundary and the full bucket, with
NaN-poisoned outputs (a block left out that was needed shows as NaN); a count that leaves out
one block too many is caught; the source compiles with nvcc for sm_90."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import CudaSource, translation_unit
from mirage_py.codegen_cuda.emulator import EmulatedGraph
from mirage_py.codegen_cuda.extents import PaddedExtents, RunCount, kernel_counts
from mirage_py.codegen_cuda.nvcc import compile_with_nvcc, find_nvcc
from mirage_py.lax.family import cut_outputs, pad_inputs


def _rel(y, r):
    return float(np.linalg.norm(np.asarray(y, np.float64) - r) / np.linalg.norm(r))


def _rmsnorm_matmul():
    T = mp.dim("T", 1, 128)
    p = mp.Program("rms_t")
    x = p.input("X", (T, 64))
    g = p.input("G", (64,))
    w = p.input("W", (64, 64))
    p.output(mp.rms_norm(x, g) @ w, name="Y")
    return p


@pytest.fixture(scope="module")
def rms_family():
    p = _rmsnorm_matmul()
    fam = mp.superopt(p, workers=1, database=False, representative={"T": 64})
    return p, fam


def _run(p, fam, src, em, bucket, s, seed=0):
    x = p.random_inputs(seed, sizes={"T": s})
    padded_x = pad_inputs(p, p.check_inputs(x), bucket)
    got = cut_outputs(p, em(padded_x, sizes={"T": s}), {"T": s})["Y"]
    return x, got


def test_a_token_count_inside_the_bucket_launches_only_the_blocks_it_needs(rms_family):
    p, fam = rms_family
    inst = fam.instance({"T": 64})
    graph = inst.annotated.graph
    ext = PaddedExtents.of_program(p)
    counts = kernel_counts(graph, ext)
    assert counts, "the kernel over the token rows should size its grid at launch"
    src = emit_cuda(inst.annotated, prefix="rms_t", extents=ext)
    static = emit_cuda(inst.annotated, prefix="rms_t")
    (k, kc), = counts.items()
    axis = next(a for a in range(3) if kc.grid[a] is not None)
    part = kc.grid[axis].part
    spec = src.launches[0]
    assert src.dims == ("T",) and static.dims == ()
    assert "int mp_dim_T;" in src.header and "tensors->mp_dim_T" in src.launcher
    em = EmulatedGraph(src)
    for s in sorted({1, part + 1 if part > 1 else 3, 2 * part, 40, 64}):
        grid = spec.grid_at({"T": s})
        assert grid[axis] == -(-s // part) < spec.grid[axis] or s == 64
        x, got = _run(p, fam, src, em, {"T": 64}, s, seed=s)
        assert not np.isnan(got).any(), s
        ref = p.evaluate(x)["Y"]
        assert _rel(got, ref) <= 2e-3, s
        assert _rel(got, fam.run_numpy(x)["Y"]) <= 2e-3, s


def test_a_grid_that_leaves_out_one_block_too_many_is_caught(rms_family):
    p, fam = rms_family
    inst = fam.instance({"T": 64})
    ext = PaddedExtents.of_program(p)
    src = emit_cuda(inst.annotated, prefix="rms_m", extents=ext)
    spec = src.launches[0]
    axis = next(a for a in range(3) if spec.grid_counts[a] is not None)
    c = spec.grid_counts[axis]
    short = RunCount(c.valid - c.part, c.part, c.whole)  # one block fewer
    counts = tuple(short if a == axis else spec.grid_counts[a] for a in range(3))
    mutant = replace(src, launches=(replace(spec, grid_counts=counts),) + src.launches[1:])
    em = EmulatedGraph(mutant)
    x, got = _run(p, fam, mutant, em, {"T": 64}, 2 * c.part + 1)
    assert np.isnan(got).any()  # the last valid rows were never written


def _contraction():
    """A contraction over a symbolic length (exp(X) @ W, X zero-filled past S: the padded
    contraction relies on W's zero padding) followed by a softmax over its columns."""
    S = mp.dim("S", 1, 1024)
    p = mp.Program("kred_s")
    x = p.input("X", (32, S))
    w = p.input("W", (S, 64))
    p.output(mp.softmax(mp.exp(x) @ w, -1), name="Y")
    return p


@pytest.fixture(scope="module")
def contraction_family():
    p = _contraction()
    return p, mp.superopt(p, workers=1, database=False, representative={"S": 512})


def _loop_kernel(src: CudaSource):
    return next(s for s in src.launches if "mp_trips" in src.kernels[src.launches.index(s)])


def test_a_loop_over_the_padded_length_runs_only_the_iterations_it_needs(contraction_family):
    p, fam = contraction_family
    inst = fam.instance({"S": 512})
    ext = PaddedExtents.of_program(p)
    counts = kernel_counts(inst.annotated.graph, ext)
    loops = [c.loop for c in counts.values() if c.loop is not None]
    assert len(loops) == 1
    tile, whole = loops[0].part, loops[0].whole
    assert whole >= 2
    src = emit_cuda(inst.annotated, prefix="kred_s", extents=ext)
    assert "for (int it = 0; it < mp_trips; ++it)" in "".join(src.kernels)
    spec = _loop_kernel(src)
    assert spec.dims == ("S",)
    em = EmulatedGraph(src)
    for s in sorted({1, tile // 2 + 1, tile, tile + 1, 512}):
        x = p.random_inputs(s, sizes={"S": s})
        got = cut_outputs(p, em(pad_inputs(p, p.check_inputs(x), {"S": 512}),
                                sizes={"S": s}), {"S": s})["Y"]
        assert loops[0].at({"S": s}) == min(whole, -(-s // tile))
        assert not np.isnan(got).any(), s
        assert _rel(got, p.evaluate(x)["Y"]) <= 2e-2, s
        assert _rel(got, fam.run_numpy(x)["Y"]) <= 2e-2, s


def test_a_trip_count_one_iteration_short_is_caught(contraction_family):
    """The kernel's trip count is part of its code: a mutant source that stops one iteration
    early (``mp_trips - 1``) is wrong at a size that needs the last iteration."""
    p, fam = contraction_family
    inst = fam.instance({"S": 512})
    src = emit_cuda(inst.annotated, prefix="kred_m", extents=PaddedExtents.of_program(p))
    i = next(k for k, t in enumerate(src.kernels) if "mp_trips" in t)
    text = src.kernels[i].replace("it < mp_trips;", "it < mp_trips - 1;")
    assert text != src.kernels[i]
    mutant = replace(src, kernels=src.kernels[:i] + (text,) + src.kernels[i + 1:])
    s = 512 - 7
    x = p.random_inputs(3, sizes={"S": s})
    got = cut_outputs(p, EmulatedGraph(mutant)(pad_inputs(p, p.check_inputs(x), {"S": 512}),
                                               sizes={"S": s}), {"S": s})["Y"]
    assert _rel(got, p.evaluate(x)["Y"]) > 0.05


def test_static_graphs_and_graphs_without_extents_emit_what_they_did(contraction_family):
    """Without extents (or for a static program) the kernels run the bucket's whole grid and
    loop: the same text as before; the extents change only the launch and the trip count."""
    p, fam = contraction_family
    inst = fam.instance({"S": 512})
    plain = emit_cuda(inst.annotated, prefix="kred_p")
    assert "mp_trips" not in plain.cu() and plain.dims == ()
    assert all(s.grid_counts == (None, None, None) for s in plain.launches)
    fixed = emit_cuda(inst.annotated, prefix="kred_p", extents=PaddedExtents({}))
    assert fixed.cu() == plain.cu()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_sources_with_counts_at_launch_compile_with_nvcc_for_sm90(rms_family,
                                                                   contraction_family):
    """Both families' buckets, kernels and host launcher (grids computed from the tensors
    struct's sizes), in one translation unit: nvcc for sm_90 without a warning."""
    srcs = []
    for (p, fam), bucket, prefix in ((rms_family, {"T": 64}, "rms_n"),
                                     (contraction_family, {"S": 512}, "kred_n")):
        srcs.append(emit_cuda(fam.instance(bucket).annotated, prefix=prefix,
                              extents=PaddedExtents.of_program(p)))
    assert all(s.dims for s in srcs)
    res = compile_with_nvcc(translation_unit(srcs), ("sm_90",), name="rtgrid")
    assert res.warnings == [], res.warnings
