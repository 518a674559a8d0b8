"""Tensor-core tile matmuls (``tile_mma``: ldmatrix + mma.sync m16n8k16) compute the product.

The CPU emulator follows the PTX fragment layouts literally (lanes trade addresses and registers),
so these graphs check the emitted index arithmetic of every path: ldmatrix for A and B (tiles that
are whole fragments), element-wise fragment loads with zero padding (ragged M, N and K), fp16 and
bf16, several column tiles per warp (ng = 1, 2, 4), more units than warps, batched tiles inside a
block, accumulation over a for-loop, and the pre-defined (naive lowering) matmul kernel. A
prelude with two fragment registers swapped must fail, or the test could not tell."""

import re
import shutil

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import translation_unit
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator, build_emulator_code
from mirage_py.layout.mma import mma_config
from mirage_py.codegen_cuda.prelude import PRELUDE
from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, GraphKernel, InputIter,
                              KernelGraph, OutputSaver, naive_lowering)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
R = -1


def block_matmul(name, b, m, k, n, dtype="float16", loop=1, threads=128, grid_batch=True):
    """Y (b, m, n) = A (b, m, k) @ B (b, k, n) in one graph-defined kernel: the batch over grid.x
    (one matrix per block) or inside the block (batched tiles); K split over a for-loop of
    ``loop`` iterations accumulated in shared memory."""
    imap = (0, R, R) if grid_batch else (R, R, R)
    ops = [InputIter("a", 0, imap, fmap=2 if loop > 1 else -1),
           InputIter("b", 1, imap, fmap=1 if loop > 1 else -1),
           BlockOp("c", "matmul", ("a", "b"))]
    if loop > 1:
        ops += [Accum("acc", "c"), OutputSaver("acc", 0, imap)]
    else:
        ops += [OutputSaver("c", 0, imap)]
    bg = BlockGraph((b if grid_batch else 1, 1, 1), threads, loop, tuple(ops))
    ins = (DTensor("A", (b, m, k), dtype), DTensor("B", (b, k, n), dtype))
    return KernelGraph(name, ins, (GraphKernel(("A", "B"), (DTensor("Y", (b, m, n)),), bg),),
                       ("Y",))


CASES = {
    # name: (b, m, k, n, dtype, loop, threads, grid_batch)
    "ldsm_both_ng2": (2, 32, 32, 32, "float16", 1, 128, True),
    "ldsm_ng4_loop": (1, 16, 64, 64, "float16", 2, 64, True),
    "ragged_mkn": (2, 5, 24, 12, "float16", 1, 128, True),
    "more_units_than_warps": (1, 48, 16, 8, "float16", 1, 64, True),
    "bf16": (1, 16, 32, 16, "bfloat16", 1, 128, True),
    "bf16_ragged_loop": (1, 7, 40, 20, "bfloat16", 2, 128, True),
    "batched_in_block": (3, 16, 16, 8, "float16", 1, 128, False),
}


def _graphs():
    return {c: block_matmul(c, *args) for c, args in CASES.items()}


def _inputs(g, seed):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in g.inputs}


def _rel(a, ref):
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def built():
    graphs = _graphs()
    p = mp.Program("naive_mm")
    x, w = p.input("X", (3, 20, 72)), p.input("W", (72, 40))
    p.output(x @ w, name="Y")
    graphs["naive_matmul"] = naive_lowering(p)
    sources = {c: emit_cuda(g, prefix=f"mma_{c}") for c, g in graphs.items()}
    return graphs, sources, build_emulator(list(sources.values()))


@pytest.mark.parametrize("case", [*CASES, "naive_matmul"])
def test_tile_mma_matches_interpreter(case, built):
    graphs, sources, lib = built
    g, src = graphs[case], sources[case]
    assert re.search(r"tile_mma(_regs)?<", src.device_code().split("// ---- end of prelude ----")[1])
    x = _inputs(g, 3)
    ref = g.run(x, precision="gpu")["Y"]
    for order in ("forward", 5):
        out = EmulatedGraph(src, order=order, lib=lib)(x)["Y"]
        assert np.all(np.isfinite(out)), (case, order)
        # operands are exact in fp16/bf16; products exact in fp32; only summation order differs
        assert _rel(out, ref) <= 2e-3, (case, order, _rel(out, ref))


def test_fp32_fma_path_is_still_available(built):
    graphs, _, _ = built
    src = emit_cuda(graphs["ragged_mkn"], prefix="fma_ragged", tensor_cores=False)
    assert "tile_mma<" not in src.device_code().split("// ---- end of prelude ----")[1]
    x = _inputs(src.graph, 4)
    out = EmulatedGraph(src)(x)["Y"]
    assert _rel(out, src.graph.run(x, precision="gpu")["Y"]) <= 1e-5


@pytest.mark.parametrize("swap", [("a[1]", "a[2]"), ("b[0]", "b[1]")])
def test_a_wrong_fragment_layout_is_caught(swap, built):
    """Swap two fragment registers inside the emulated mma: results must go wrong."""
    graphs, sources, _ = built
    src = sources["ldsm_both_ng2"]
    marker = "unsigned int mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};"
    assert marker in PRELUDE
    x, y = swap
    bad_marker = marker.replace(x, "@").replace(y, x).replace("@", y)
    code = translation_unit([src]).replace(marker, bad_marker)
    lib = build_emulator_code(code)
    g = graphs["ldsm_both_ng2"]
    inp = _inputs(g, 6)
    out = EmulatedGraph(src, lib=lib)(inp)["Y"]
    assert _rel(out, g.run(inp, precision="gpu")["Y"]) > 0.1


def test_mma_config_tiles_the_output():
    c = mma_config(1, 32, 32, 128, "float16", "float16")
    assert (c.warps, c.ng, c.etype) == (4, 2, "fp16_t") and c.units(1, 32, 32) == 4
    assert mma_config(1, 16, 64, 64, "float16", "float16").ng == 4
    assert mma_config(1, 8, 8, 128, "float16", "bfloat16").etype == "bf16_t"
    assert mma_config(1, 8, 24, 128, "float32", "float16").ng == 1  # 3 column tiles
    assert mma_config(1, 16, 16, 48, "float16", "float16") is None  # not whole warps


def test_swizzled_operands_are_exercised(built):
    """The layout planner swizzles the ldmatrix operands of these cases, and the emulated
    results above were computed through the swizzled offsets."""
    _, sources, _ = built
    for case in ("ldsm_both_ng2", "ldsm_ng4_loop"):
        kernel = sources[case].kernels[0]
        assert "stored with Swizzle<" in kernel and ", Swizzle<" in kernel, case


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_cp_async_pipeline_depths(depth):
    """K over an 8-iteration loop with 1..4 cp.async stages in flight: the emulator lands each
    copy only at the wait that covers its group, so a wrong buffer index or group count shows."""
    g = block_matmul(f"pipe{depth}", 1, 16, 128, 32, loop=8, threads=64)
    src = emit_cuda(g, prefix=f"pipe{depth}", stages=[depth])
    assert src.plan.kernels[0].pipeline == depth
    if depth > 1:
        assert f"cp_async_wait_group<{depth - 1}>()" in src.kernels[0]
    x = _inputs(g, depth)
    out = EmulatedGraph(src, order="reverse")(x)["Y"]
    assert _rel(out, g.run(x, precision="gpu")["Y"]) <= 2e-3


def test_a_missing_pipeline_wait_is_caught():
    g = block_matmul("nowait", 1, 16, 128, 32, loop=8, threads=64)
    src = emit_cuda(g, prefix="nowait", stages=[3])
    kernels = (src.kernels[0].replace("cp_async_wait_group<2>();", "/* no wait */"),)
    from dataclasses import replace
    bad = replace(src, kernels=kernels, prefix="nowait_bad")
    x = _inputs(g, 9)
    out = EmulatedGraph(bad)(x)["Y"]
    ref = g.run(x, precision="gpu")["Y"]
    assert not np.all(np.isfinite(out)) or _rel(out, ref) > 0.1


def test_loop_accumulators_stay_in_registers(built):
    """A tile matmul accumulated over the for-loop keeps its fragments in registers and writes
    them to shared memory once, after the loop; the results above went through that path."""
    _, sources, _ = built
    k = sources["ldsm_ng4_loop"].kernels[0]
    assert "tile_mma_regs<" in k and "frags_to_smem<" in k and "tile_mma<" not in k
    assert k.index("frags_to_smem<") > k.index("for (int it = 0;")
