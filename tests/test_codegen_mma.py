"""Tensor-core tile matmuls (``tile_mma``: ldmatrix + mma.sync m16n8k16) compute the product.

The CPU emulator follows the PTX fragment layouts literally (lanes trade addresses and registers),
so these graphs check the emitted index arithmetic of every path: ldmatrix for A and B (tiles that
are whole fragments), element-wise fragment loads with zero padding (ragged M, N and K), fp16 and
bf16, several column tiles per warp (ng = 1, 2, 4), more units than warps, batched tiles inside a
block, accumulation over a for-loop, and the pre-defined (naive lowering) matmul kernel. A
prelude with two fragment registers swapped must fail, or the test could not tell."""

import re
from dataclasses import replace
import shutil

import numpy as np
import pytest

import codegen_cases as cc
import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import translation_unit
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator, build_emulator_code
from mirage_py.layout.mma import mma_config
from mirage_py.lax.precision import MatmulMath, operand_math

F16 = MatmulMath.FP16
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
    c = mma_config(1, 32, 32, 128, MatmulMath.FP16)
    assert (c.warps, c.ng, c.etype) == (4, 2, "fp16_t") and c.units(1, 32, 32) == 4
    assert mma_config(1, 16, 64, 64, MatmulMath.FP16).ng == 4
    assert mma_config(1, 8, 8, 128, operand_math("float16", "bfloat16")).etype == "bf16_t"
    assert mma_config(1, 8, 24, 128, operand_math("float32", "float16")).ng == 1  # 3 col tiles
    assert mma_config(1, 16, 16, 48, MatmulMath.FP16) is None  # not whole warps
    assert mma_config(1, 16, 16, 128, MatmulMath.FP32) is None  # float32 products: FMA
    tf = mma_config(1, 16, 16, 128, MatmulMath.TF32)
    assert tf.etype == "tf32_t" and tf.k_step == 8 and not tf.sixteen_bit


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
    lib = build_emulator(src, ("MIRAGE_NO_TMA",))  # the cp.async path (TMA: test_codegen_tma)
    out = EmulatedGraph(src, order="reverse", lib=lib)(x)["Y"]
    assert _rel(out, g.run(x, precision="gpu")["Y"]) <= 2e-3


def test_a_missing_pipeline_wait_is_caught():
    g = block_matmul("nowait", 1, 16, 128, 32, loop=8, threads=64)
    src = emit_cuda(g, prefix="nowait", stages=[3])
    kernels = (src.kernels[0].replace("cp_async_wait_group<2>();", "/* no wait */"),)
    from dataclasses import replace
    bad = replace(src, kernels=kernels, prefix="nowait_bad")
    x = _inputs(g, 9)
    out = EmulatedGraph(bad, lib=build_emulator(bad, ("MIRAGE_NO_TMA",)))(x)["Y"]
    ref = g.run(x, precision="gpu")["Y"]
    assert not np.all(np.isfinite(out)) or _rel(out, ref) > 0.1


def test_loop_accumulators_stay_in_registers(built):
    """A tile matmul accumulated over the for-loop keeps its fragments in registers and writes
    them to shared memory once, after the loop; the results above went through that path."""
    _, sources, _ = built
    k = sources["ldsm_ng4_loop"].kernels[0]
    assert "tile_mma_regs<" in k and "frags_to_smem<" in k and "tile_mma<" not in k
    assert k.index("frags_to_smem<") > k.index("for (int it = 0;")


# ---- warpgroup MMA (sm_90a) -------------------------------------------------------------------

WGMMA_CASES = {
    # name: (b, m, k, n, dtype, loop, threads, grid_batch), k the whole K (k / loop per
    # iteration): per-iteration rows of A and rows of B of 32, 64 and 128 bytes (the 32B / 64B /
    # 128B swizzle modes), results in registers or in shared memory
    "wg_128B_loop_regs": (1, 64, 128, 64, "float16", 2, 128, True),
    "wg_64B_two_groups": (1, 128, 64, 32, "float16", 2, 256, True),
    "wg_32B_smem_result": (2, 64, 16, 16, "float16", 1, 128, True),
    "wg_bf16_mixed_rows": (1, 64, 96, 64, "bfloat16", 3, 128, True),
    "wg_batched_in_block": (2, 64, 64, 32, "float16", 1, 256, False),
    "wg_two_rounds": (1, 256, 16, 64, "float16", 1, 128, True),
}


@pytest.fixture(scope="module")
def wg_built():
    graphs = {c: block_matmul(c, *args) for c, args in WGMMA_CASES.items()}
    sources = {c: emit_cuda(g, prefix=f"wg_{c}") for c, g in graphs.items()}
    libs = {d: build_emulator(list(sources.values()), defines=d) for d in ((), ("MIRAGE_NO_WGMMA",))}
    return graphs, sources, libs


def test_wgmma_applies_where_it_pays():
    from mirage_py.layout.mma import wgmma_config
    c = wgmma_config(1, 64, 64, 64, 128, "float16", "float16", F16)
    assert c.wgmma and c.ng == 8 and c.warps == 4
    assert wgmma_config(1, 64, 64, 64, 256, "float16", "float16", F16) is None  # a warpgroup idle
    assert wgmma_config(2, 64, 64, 64, 256, "float16", "float16", F16).wgmma  # one block each
    assert wgmma_config(1, 48, 64, 64, 128, "float16", "float16", F16) is None  # not 64-row blocks
    assert wgmma_config(1, 64, 64, 128, 128, "float16", "float16", F16) is None  # 256-byte rows
    assert wgmma_config(1, 64, 8, 64, 128, "float16", "float16", F16) is None  # 16-byte rows
    assert wgmma_config(1, 64, 64, 64, 128, "float32", "float16", F16) is None  # computed fp32 A
    assert wgmma_config(1, 64, 64, 64, 128, "float32", "float32", MatmulMath.TF32) is None
    assert wgmma_config(1, 64, 64, 64, 96, "float16", "float16", F16) is None  # not warpgroups


def test_float32_tiles_of_warpgroup_shape_multiply_by_fma():
    """A float32 matmul (FMA math) whose tiles have warpgroup-MMA sizes (64 rows, 64- and
    128-byte rows at 2 bytes an element) gets no warpgroup plan: KernelBench level2/37 emitted
    ``tile_wgmma<..., None, ...>`` (the FMA math has no operand type, nor have float32 tiles, and
    the two Nones compared equal), which NVRTC and nvcc reject. It runs tile_fma and equals the
    interpreter."""
    from mirage_py.layout.mma import wgmma_config
    assert wgmma_config(1, 64, 64, 32, 128, "float32", "float32", MatmulMath.FP32) is None
    g = block_matmul("fp32_wg_shape", 1, 64, 32, 64, "float32", 1, 128)
    (k,) = g.ops
    ops = tuple(replace(o, attrs=(("math", "fp32"),)) if isinstance(o, BlockOp) else o
                for o in k.block.ops)
    g = replace(g, ops=(replace(k, block=replace(k.block, ops=ops)),))
    src = emit_cuda(g, prefix="fp32_wg")
    code = "".join(src.kernels)
    assert "tile_fma<" in code and "tile_wgmma" not in code and "None" not in code
    x = _inputs(g, 5)
    ref = g.run(x, precision="gpu")["Y"]
    assert _rel(EmulatedGraph(src)(x)["Y"], ref) <= 1e-5


@pytest.mark.parametrize("fallback", [False, True], ids=["wgmma", "mma_sync_fallback"])
@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_wgmma_matches_interpreter(case, fallback, wg_built):
    """The emulator decodes the matrix descriptors as the hardware does (canonical layouts of the
    swizzle modes, XOR on absolute addresses); without wgmma (other GPUs) the same code runs
    mma.sync with the 16 x N tiling. Both must compute the interpreter's product."""
    graphs, sources, libs = wg_built
    g, src = graphs[case], sources[case]
    assert "tile_wgmma<" in "".join(src.kernels)
    x = _inputs(g, 3)
    ref = g.run(x, precision="gpu")["Y"]
    lib = libs[("MIRAGE_NO_WGMMA",) if fallback else ()]
    for order in ("forward", 5):
        out = EmulatedGraph(src, order=order, lib=lib)(x)["Y"]
        assert _rel(out, ref) <= 1e-3, (case, order, _rel(out, ref))


def test_a_wrong_wgmma_descriptor_is_caught(wg_built):
    """Mutants of the descriptor (stride byte offset doubled, swizzle mode of the 128-byte rows
    taken for the 64-byte mode) give wrong products in the emulator."""
    graphs, sources, _ = wg_built
    g, src = graphs["wg_128B_loop_regs"], sources["wg_128B_loop_regs"]
    x = _inputs(g, 4)
    ref = g.run(x, precision="gpu")["Y"]
    tu = translation_unit([src])
    for old, new in (("(static_cast<unsigned long long>(sbo >> 4) << 32)",
                      "(static_cast<unsigned long long>((2 * sbo) >> 4) << 32)"),
                     ("row_bytes == 128 ? 1ull", "row_bytes == 128 ? 2ull")):
        assert tu.count(old) >= 1, old
        lib = build_emulator_code(tu.replace(old, new))
        out = EmulatedGraph(src, lib=lib)(x)["Y"]
        assert not np.all(np.isfinite(out)) or _rel(out, ref) > 1e-2, old  # NaN: poisoned bytes


def test_wgmma_operands_get_canonical_swizzles_and_aligned_buffers():
    from mirage_py.layout import plan_graph
    g = block_matmul("wg", *WGMMA_CASES["wg_bf16_mixed_rows"])
    kp = plan_graph(g).kernels[0]
    sw = {t: (s.bits, s.base, s.shift) for t, s in kp.swizzles.items()}
    assert sw == {"a": (2, 3, 3), "b": (3, 3, 3)}  # 64-byte rows of A, 128-byte rows of B
    for t, atom in (("a", 512), ("b", 1024)):
        assert kp.smem.offsets[t] % atom == 0


def test_fma_matmuls_get_unswizzled_operands():
    """``tensor_cores=False``: the FMA tile matmul reads its operands row-major, so the planner
    gives them no swizzle (it once chose the ldmatrix swizzles anyway, and the results were
    garbage)."""
    g = block_matmul("fma_plain", 1, 16, 128, 32, loop=8, threads=64)
    src = emit_cuda(g, prefix="fma_plain", stages=[2], tensor_cores=False)
    assert src.plan.kernels[0].swizzles == {} and "tile_fma<1," in src.kernels[0]
    x = _inputs(g, 4)
    assert _rel(EmulatedGraph(src)(x)["Y"], g.run(x, precision="gpu")["Y"]) <= 1e-5


@pytest.mark.parametrize("rows", [24, 32, 48])
def test_probabilities_in_registers_match_the_interpreter(rows, monkeypatch):
    """Attention with the probabilities kept in registers (two warps; 24 rows: the second
    unit ragged; 48 rows: three units, the second round clamped): e @ v takes its A fragments from exp's registers and the row
    sums use quad shuffles. Both equal the interpreter in every thread order; packing the A
    fragment's halves in the wrong order (rows g + 8 for k + 8) is caught."""
    from mirage_py.codegen_cuda import emit as emit_mod
    g = cc.small_attention(rows)
    src = emit_cuda(g, prefix=f"regp{rows}")
    code = src.kernels[0]
    assert "tile_mma_rega<" in code and "frag_row_sums<" in code and "s_e" not in code
    x = cc.random_inputs(g, seed=rows)
    ref = g.run(x, precision="gpu")["O"]
    for order in ("forward", "reverse", 4):
        assert _rel(EmulatedGraph(src, order=order)(x)["O"], ref) <= 2e-3, order
    good = "pack(a[r][2 * kk][2], a[r][2 * kk][3]),\n                                 pack(a[r][2 * kk + 1][0], a[r][2 * kk + 1][1])"
    bad = "pack(a[r][2 * kk + 1][0], a[r][2 * kk + 1][1]),\n                                 pack(a[r][2 * kk][2], a[r][2 * kk][3])"
    assert good in emit_mod.PRELUDE
    monkeypatch.setattr(emit_mod, "PRELUDE", emit_mod.PRELUDE.replace(good, bad))
    wrong = EmulatedGraph(replace(src, prefix=f"regp{rows}_bad"))(x)["O"]
    assert not np.all(np.isfinite(wrong)) or _rel(wrong, ref) > 0.05


def _chained_attention(sum_chain: bool):
    """Probabilities in registers whose products feed another tensor-core matmul as its fp32
    A operand: o = e @ v then o @ w (sum_chain False), or the row sums l (no keepdims) then
    l @ w. o and l are written from fragments (frags_to_smem, frag_row_sums), unswizzled."""
    from codegen_cases import R, _thread
    from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                                  InputIter, KernelGraph, OutputSaver, attrs_of)
    b, m, d, seq, loop = (16, 16, 16, 32, 2) if sum_chain else (1, 32, 16, 64, 2)
    ins = [DTensor("Q", (b, m, d)), DTensor("K", (b, d, seq)), DTensor("V", (b, seq, d)),
           DTensor("W", (m if sum_chain else d, 16))]
    ops = [InputIter("q", 0, (R, R, R)), InputIter("k", 1, (R, R, R), fmap=2),
           InputIter("v", 2, (R, R, R), fmap=1), InputIter("w", 3, (R, R, R)),
           BlockOp("s", "matmul", ("q", "k")),
           Fused("e", ("s",), _thread(("y", "exp", "in0"), ninputs=1)),
           BlockOp("o", "matmul", ("e", "v"))]
    if sum_chain:
        ops += [BlockOp("l", "sum", ("e",), attrs_of(axes=(2,), keepdims=False)),
                BlockOp("z", "matmul", ("l", "w")), Accum("O", "o"), Accum("Z", "z")]
        outs = (DTensor("O", (b, m, d), "float32"), DTensor("Z", (b, 16), "float32"))
    else:
        ops += [BlockOp("z", "matmul", ("o", "w")), Accum("Z", "z")]
        outs = (DTensor("Z", (b, m, 16), "float32"),)
    ops += [OutputSaver(t.name, i, (R, R, R)) for i, t in enumerate(outs)]
    bg = BlockGraph((1, 1, 1), 64, loop, tuple(ops))
    return KernelGraph("chained_sum" if sum_chain else "chained_pv", tuple(ins),
                       (GraphKernel(tuple(t.name for t in ins), outs, bg),),
                       tuple(t.name for t in outs))


@pytest.mark.parametrize("sum_chain", [False, True], ids=["pv_then_matmul", "rowsum_then_matmul"])
def test_tiles_written_from_fragments_keep_the_identity_layout(sum_chain):
    """A tile computed from register fragments by a matmul or row sum is stored without a
    swizzle (its writers do not apply one), so the planner gives it none even where it is the
    fp32 A operand of a later matmul (a review found it swizzled, and the results wrong)."""
    g = _chained_attention(sum_chain)
    src = emit_cuda(g, prefix=g.name)
    kp = src.plan.kernels[0]
    tile = "l" if sum_chain else "o"
    assert "e" in kp.schedule.registers and tile in kp.smem.offsets
    assert tile not in kp.swizzles
    x = cc.random_inputs(g, seed=8)
    ref = g.run(x, precision="gpu")
    out = EmulatedGraph(src)(x)
    for name in ref:
        assert _rel(out[name], ref[name]) <= 2e-3, name
