"""Emitted CUDA text: snapshots of three small μGraphs, the pieces it is made of, and that every
fixture and naive lowering emits. Set MIRAGE_UPDATE_SNAPSHOTS=1 to rewrite the snapshots after an
intended change (then read the diff)."""

import os
import re
from pathlib import Path

import numpy as np
import pytest

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_program
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.cexpr import Names, coords, flit, ident, linear, prune_unused
from mirage_py.codegen_cuda.emit import translation_unit
from mirage_py.ugraph import naive_lowering

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("MIRAGE_UPDATE_SNAPSHOTS") == "1"

SNAPSHOT_GRAPHS = {
    "rmsnorm_matmul": cc.small_rmsnorm_matmul,
    "mixed_block_ops": cc.mixed_block_ops,
    "kernel_ops": lambda: naive_lowering(cc.kernel_ops_program()),
}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_GRAPHS))
def test_snapshot(name):
    text = emit_cuda(SNAPSHOT_GRAPHS[name]()).cu()
    path = SNAPSHOTS / f"{name}.cu"
    if UPDATE or not path.exists():
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"snapshot {path.name} was missing; written now, check it in")
    expected = path.read_text()
    assert text == expected, (f"emitted CUDA for {name} changed; if intended, rerun with "
                              "MIRAGE_UPDATE_SNAPSHOTS=1 and review the diff")


CASES = [(n, bs, kind) for bs in (1, 8) for n in NAMES for kind in ("fused", "naive")]


def _graph(name, bs, kind):
    return hand_built(name, bs) if kind == "fused" else naive_lowering(get_program(name, bs))


@pytest.mark.parametrize("name,bs,kind", CASES)
def test_every_benchmark_graph_emits(name, bs, kind):
    g = _graph(name, bs, kind)
    src = emit_cuda(g, "h100")
    text = src.cu()
    # one __global__ per kernel node, in order, with the μGraph in the banner
    assert text.count("__global__ void") == len(g.ops) == len(src.launches)
    assert [s.op_index for s in src.launches] == list(range(len(g.ops)))
    for line in str(g).splitlines():
        assert "// " + line in text
    for spec in src.launches:
        assert 1 <= spec.threads <= 1024 and all(d >= 1 for d in spec.grid)
        assert spec.smem_bytes <= 227 * 1024
    assert "__CUDACC_RTC__" in text and src.prefix + "_launch" in text
    assert "__restrict__" in text and "\t" not in text
    # the device code NVRTC gets has no host part
    assert "<<<" not in src.device_code()


def test_kernel_names_follow_the_operators():
    src = emit_cuda(naive_lowering(get_program("gated_mlp", 1)))
    names = [s.kernel for s in src.launches]
    assert names == ["gated_mlp_k0_matmul_t3", "gated_mlp_k1_silu_t4", "gated_mlp_k2_matmul_t5",
                     "gated_mlp_k3_mul_Y"]
    fused = emit_cuda(hand_built("gqa", 1))
    assert [s.kernel for s in fused.launches] == ["gqa_k0_graph_O_part_L_part", "gqa_k1_graph_O"]


def test_translation_unit_shares_one_prelude():
    a = emit_cuda(hand_built("lora", 1), prefix="a")
    b = emit_cuda(hand_built("lora", 1), prefix="b")
    text = translation_unit([a, b])
    assert text.count("struct __align__(2) fp16_t") == 1
    assert "a_k0_graph_Y" in text and "b_k0_graph_Y" in text
    with pytest.raises(ValueError):
        translation_unit([a, a])


def test_identifiers():
    assert ident("O_part") == "O_part"
    assert ident("x.1") == "x_1" and ident("3d") == "_3d" and ident("int") == "int_"
    n = Names("s_")
    assert n("a-b") == "s_a_b" and n("a_b") == "s_a_b_2" and n("a-b") == "s_a_b"


def test_float_literals_are_float32_exact():
    for v in (1e-6, 0.125, 4096.0, -2.5, 0.1, 3.0e38):
        text = flit(v)
        assert text.endswith("f") or text.endswith("f)")
        assert np.float32(float(text.strip("()").rstrip("f"))) == np.float32(v)
    assert "0x7f800000" in flit(float("inf")) and "0x7fc00000" in flit(float("nan"))


def test_index_helpers():
    assert coords("i", (1, 64, 64)) == ["0", "i / 64", "i % 64"]
    assert coords("i", (4, 3, 5)) == ["i / 15", "(i / 5) % 3", "i % 5"]
    assert coords("i", (7,)) == ["i"]
    assert linear([("c0", 64), ("0", 5), ("c1", 1), ("x", 0)]) == "c0 * 64 + c1"
    assert linear([("i / 5", 2)]) == "(i / 5) * 2"
    assert linear([]) == "0"


def test_unused_coordinates_are_pruned():
    lines = ["for (...) {", "  const int c0 = i / 4, c1 = i % 4;", "  x[c1] = 1;", "}",
             "const int k0 = 3;", "y = k0;"]
    assert prune_unused(lines)[1] == "  const int c1 = i % 4;"
    assert prune_unused(["{", "const int a = 1;", "}", "b = a;"]) == ["{", "}", "b = a;"]


def test_division_by_a_power_of_two_is_a_multiplication():
    text = emit_cuda(cc.small_rmsnorm_matmul()).cu()
    assert "in1 * 0.015625f" in text  # in1 / 64
    assert "fdiv(in0, v_r)" in text   # a real division stays one (div.full.f32, no slow path)


def test_vector_loads_need_aligned_rows():
    text = emit_cuda(hand_built("gqa", 1)).cu()
    assert "cp_async16(s_q + Swizzle<3, 3, 3>::at(i)" in text and "cp_async_wait_all();" in text
    assert "store16(g_O + " in text  # the combine kernel's output rows are 16-byte aligned
    # a (4, 3, 10) bf16 tensor has 20-byte rows: element loads only
    from mirage_py.ugraph import (BlockGraph, DTensor, GraphKernel, InputIter, KernelGraph,
                                  OutputSaver)
    g = KernelGraph("odd", (DTensor("A", (4, 3, 10), "bfloat16"),), (GraphKernel(
        ("A",), (DTensor("B", (4, 3, 10), "bfloat16"),), BlockGraph((4, 1, 1), 32, 1, (
            InputIter("a", 0, (0, -1, -1)), OutputSaver("a", 0, (0, -1, -1))))),), ("B",))
    text = emit_cuda(g).cu()
    assert "cp_async16(s_a" not in text and "s_a[i] = g_A[" in text
    assert "store16(" not in text.split("end of prelude")[1]


def test_scalar_shapes_and_edge_cases_emit():
    import mirage_py as mp
    p = mp.Program("edge")
    x = p.input("x", (5,), "float32")
    p.output(mp.sum(x * x, axis=0), name="s")          # shape ()
    p.output(mp.rms_norm(x) + 1.0, name="r")
    src = emit_cuda(naive_lowering(p))
    assert "__global__" in src.cu()


def test_snapshot_files_are_plain_cuda():
    for path in SNAPSHOTS.glob("*.cu"):
        text = path.read_text()
        assert re.search(r'extern "C" __global__', text)
        assert "Generated by mirage_py" in text.splitlines()[0]


def test_launch_bounds_promise_one_block_only_when_only_one_fits():
    """``__launch_bounds__(T, 1)`` where threads or shared memory leave room for one resident
    block per SM anyway (ptxas may otherwise cap registers for blocks that can never be
    resident); just ``(T)`` elsewhere, leaving ptxas its choice."""
    from dataclasses import replace
    from mirage_py.codegen_cuda.block_kernel import BlockKernelEmitter
    from mirage_py.codegen_cuda.emulator import kernel_signatures
    from mirage_py.layout import plan_graph
    g = cc.small_rmsnorm_matmul()
    plan = plan_graph(g, "h100")
    src = emit_cuda(plan)
    assert "__launch_bounds__(64)\n" in src.kernels[0] and src.launches[0].min_blocks == 0
    em = BlockKernelEmitter(g.ops[0], plan.kernels[0], plan.device, "k", True, plan.target)
    assert not em.one_block_per_sm(0) and not em.one_block_per_sm(100 * 1024)  # two fit
    assert em.one_block_per_sm(120 * 1024)  # 228 KB per SM, 1 KB reserved per block
    # register tiles in a block of 512 threads: sized for one block's share of registers
    wide = cc.attention_row_sums_after_loop()
    k = wide.ops[0]
    wide = replace(wide, ops=(replace(k, block=replace(k.block, threads=512)),))
    wplan = plan_graph(wide, "h100")
    assert wplan.kernels[0].schedule.registers
    assert emit_cuda(wplan).launches[0].min_blocks == 1
    one = replace(src.launches[0], min_blocks=1)
    assert "__launch_bounds__(64, 1)" in one.signature()
    (name, params), = kernel_signatures(one.signature() + " {}")
    assert name == one.kernel and len(params) == len(one.params) + len(one.tensor_maps)
    assert one.tensor_maps and params[-1] == (True, "mp_tensor_map")  # TMA maps by value
