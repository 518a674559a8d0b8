"""The emitted CUDA, compiled for the CPU emulator (every CUDA thread a fiber), computes what the
interpreter computes in GPU precision: small graphs covering every operator (in three thread
orders, so that a missing barrier shows), small versions of the nine benchmarks lowered naively,
and the hand-built fixtures at batch size 1. No GPU needed."""

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_inputs
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator
from mirage_py.ugraph import naive_lowering
from marks import sample

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

SMALL = {g.name: g for g in [cc.small_rmsnorm_matmul(), cc.small_attention(),
                             cc.attention_row_sums_after_loop(), cc.causal_two_pass_attention(),
                             cc.mixed_block_ops(), naive_lowering(cc.kernel_ops_program()),
                             naive_lowering(cc.new_ops_program())] +
         [naive_lowering(cc.small_benchmark(n)) for n in NAMES]}
ORDERS = ("forward", "reverse", 11)


def _rel(a, ref):
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(a - ref) / den) if den else float(np.abs(a).max())


@pytest.fixture(scope="module")
def emulators():
    """Two emulator libraries (small graphs; fixtures at bs=1), built side by side."""
    fixtures = {n: hand_built(n, 1) for n in NAMES}
    groups = {"small": SMALL, "fixtures": fixtures}
    sources = {k: [emit_cuda(g, prefix=f"{k}_{name}") for name, g in v.items()]
               for k, v in groups.items()}
    with ThreadPoolExecutor(2) as pool:
        libs = dict(zip(sources, pool.map(build_emulator, sources.values())))
    return {k: {name: src for name, src in zip(groups[k], sources[k])} for k in groups}, libs


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_graph_matches_interpreter(name, emulators):
    srcs, libs = emulators
    g = SMALL[name]
    x = cc.random_inputs(g, seed=5)
    ref = g.run(x, precision="gpu")
    for order in ORDERS:
        out = EmulatedGraph(srcs["small"][name], order=order, lib=libs["small"])(x)
        for k in ref:
            assert np.all(np.isfinite(out[k])), (name, order, k)
            assert _rel(out[k], ref[k]) <= 1e-3, (name, order, k, _rel(out[k], ref[k]))


@pytest.mark.parametrize("name", sample(NAMES))
def test_fixture_matches_interpreter(name, emulators):
    srcs, libs = emulators
    g = hand_built(name, 1)
    x = get_inputs(name, 1, seed=7)
    ref = g.run(x, precision="gpu")
    out = EmulatedGraph(srcs["fixtures"][name], order=2 + len(name),
                        lib=libs["fixtures"])(x)
    for k in ref:
        assert np.all(np.isfinite(out[k])), (name, k)
        assert _rel(out[k], ref[k]) <= 2e-3, (name, k, _rel(out[k], ref[k]))


def _without_barrier(src, kernel_index, nth):
    text = src.kernels[kernel_index]
    parts = text.split("__syncthreads();")
    assert len(parts) > nth + 1
    text = "__syncthreads();".join(parts[:nth + 1]) + "/* removed */" + \
        "__syncthreads();".join(parts[nth + 1:])
    kernels = list(src.kernels)
    kernels[kernel_index] = text
    return replace(src, kernels=tuple(kernels), prefix=src.prefix + f"_nobar{nth}")


def test_emulator_catches_a_missing_barrier():
    g = cc.small_attention()
    src = emit_cuda(g, prefix="nobarrier")
    x = cc.random_inputs(g, seed=1)
    ref = g.run(x, precision="gpu")["O"]
    text = src.kernels[0]  # the barrier between s = q @ k and e = exp(s):
    nth = text[:text.index("// s = matmul(q, k)")].count("__syncthreads();")
    broken = _without_barrier(src, 0, nth)
    outs = [EmulatedGraph(broken, order=o)(x)["O"] for o in ORDERS]
    assert any(not np.all(np.isfinite(o)) or _rel(o, ref) > 1e-2 for o in outs)


def test_emulator_reports_barrier_divergence():
    src = emit_cuda(cc.small_rmsnorm_matmul(), prefix="diverge")
    text = src.kernels[0].replace("__syncthreads();", "if (threadIdx.x == 0) __syncthreads();", 1)
    bad = replace(src, kernels=(text,))
    with pytest.raises(RuntimeError, match="barrier divergence"):
        EmulatedGraph(bad)(cc.random_inputs(src.graph))


@pytest.fixture(scope="module")
def shipped():
    """What superopt ships for small versions of the nine benchmarks (search, tuning, stages),
    emitted from the annotated graph and built as one emulator library."""
    import mirage_py as mp
    opts = {n: mp.superopt(cc.small_benchmark(n), target="h100", database=False) for n in NAMES}
    sources = {n: emit_cuda(o.annotated, prefix=f"shipped_{n}") for n, o in opts.items()}
    return opts, sources, build_emulator(list(sources.values()))


@pytest.mark.parametrize("name", NAMES)
def test_superopt_result_runs_as_emitted(name, shipped):
    """End to end on the CPU: the search's answer, through layout planning and code generation
    (tensor cores, swizzles, pipeline, register epilogues as they apply), computes what the
    interpreter computes for that answer, and what the program means."""
    opts, sources, lib = shipped
    o = opts[name]
    x = cc.random_inputs(o.graph, seed=13)
    ref = o.graph.run(x, precision="gpu")
    exact = o.program.evaluate(x)
    out = EmulatedGraph(sources[name], order=3, lib=lib)(x)
    for k in ref:
        assert np.all(np.isfinite(out[k])), (name, k)
        assert _rel(out[k], ref[k]) <= 2e-3, (name, k, _rel(out[k], ref[k]))
        assert _rel(out[k], np.asarray(exact[k], np.float64)) <= 2e-2, (name, k)
