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
                                       naive_lowering(cc.kernel_ops_program()),
                                       cc.causal_two_pass_attention(),
                                       naive_lowering(cc.new_ops_program()))]
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


def test_nvrtc_compute_90a_emits_warpgroup_mma():
    """What the runtime loads on an sm_90 device (runtime._hopper_module): PTX for compute_90a
    has wgmma instructions for the fixtures that qualify (gqa's score tile) and the matrix
    descriptors' fences; for compute_90 the same source has none (mma.sync)."""
    sources = [emit_cuda(hand_built(n, 1), prefix=f"{n}_wg") for n in ("gqa", "lora")]
    code = _device_code(sources)
    hopper, log = compile_with_nvrtc(code, "compute_90a")
    assert log.strip() == "", log
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in hopper
    assert "fence.proxy.async.shared::cta" in hopper and "wgmma.wait_group" in hopper
    plain, _ = compile_with_nvrtc(code, "compute_90")
    assert "wgmma" not in plain and "fence.proxy.async" not in plain and "mma.sync" in plain


def test_runtime_takes_the_sm90a_path_only_on_sm90_devices(monkeypatch):
    """The runtime's choice, with a stand-in CuPy: compute capability 9.0 -> the compute_90a PTX
    module (RawModule(path=...)); anything else, or a failing NVRTC, -> CuPy's own compile
    (RawModule(code=...))."""
    import types

    import fake_cupy
    from mirage_py.codegen_cuda import runtime
    cp = fake_cupy.install(monkeypatch)
    made = []
    cp.RawModule = lambda **kw: made.append(kw) or types.SimpleNamespace(compile=lambda: None)
    src = emit_cuda(hand_built("gqa", 1), prefix="rt_wg").device_code()
    for cc, kind in (((9, 0), "sm_90a"), ((8, 0), "cupy default"), ((10, 0), "cupy default")):
        monkeypatch.setattr(runtime, "_compute_capability", lambda _cp, cc=cc: cc)
        monkeypatch.setattr(runtime, "_MODULES", {})
        made.clear()
        runtime.load_module(src)
        assert list(runtime.COMPILED_FOR.values())[-1] == kind
        if kind == "sm_90a":
            assert made[0]["path"].endswith("_sm90a.ptx")
            assert "wgmma.mma_async" in open(made[0]["path"]).read()
        else:
            assert made[0]["code"] == src
    # NVRTC failing on the sm_90 path: CuPy's own compile, same results (mma.sync)
    monkeypatch.setattr(runtime, "_compute_capability", lambda _cp: (9, 0))
    monkeypatch.setattr(runtime, "_MODULES", {})
    monkeypatch.setattr("mirage_py.codegen_cuda.nvrtc.compile_with_nvrtc",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no NVRTC")))
    made.clear()
    runtime.load_module(src)
    assert made[0]["code"] == src and list(runtime.COMPILED_FOR.values())[-1] == "cupy default"
