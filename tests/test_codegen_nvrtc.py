"""NVRTC -- what CuPy compiles with on a GPU machine -- accepts the device code of every fixture
and naive lowering (bs 1 and 8) and of the small test graphs, for compute_80 and compute_90,
without a warning. NVRTC needs no GPU; the test skips where the library is missing."""

import pytest

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_program
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.nvrtc import compile_with_nvrtc, find_nvrtc
from mirage_py.codegen_cuda.prelude import PRELUDE
from mirage_py.ugraph import naive_lowering

pytestmark = pytest.mark.skipif(find_nvrtc() is None, reason="needs NVRTC (nvidia-cuda-nvrtc)")


def _device_code(sources):
    return PRELUDE + "\n".join(k for s in sources for k in s.kernels)


def _group(group):
    if group == "small":
        return [emit_cuda(g) for g in (cc.small_rmsnorm_matmul(), cc.small_attention(),
                                       cc.mixed_block_ops(),
                                       naive_lowering(cc.kernel_ops_program()))]
    kind, bs = group.split("_bs")
    make = (lambda n: hand_built(n, int(bs))) if kind == "fused" else \
        (lambda n: naive_lowering(get_program(n, int(bs))))
    return [emit_cuda(make(n), prefix=f"{n}_{group}") for n in NAMES]


@pytest.mark.parametrize("group", ["fused_bs1", "fused_bs8", "naive_bs1", "naive_bs8", "small"])
def test_nvrtc_accepts_the_device_code(group):
    sources = _group(group)
    code = _device_code(sources)
    for arch in ("compute_80", "compute_90"):
        ptx, log = compile_with_nvrtc(code, arch)
        assert log.strip() == "", log
        for s in sources:
            for spec in s.launches:
                assert f".entry {spec.kernel}(" in ptx


def test_runtime_device_code_is_what_nvrtc_checks():
    src = emit_cuda(hand_built("gqa", 1))
    ptx, _ = compile_with_nvrtc(src.device_code(), "compute_90")
    assert ".entry gqa_k0_graph_O_part_L_part(" in ptx
    assert "<<<" not in src.device_code()
