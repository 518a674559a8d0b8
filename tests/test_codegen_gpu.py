"""On a GPU: the CUDA of every fixture and naive lowering of the nine benchmarks (bs 1 and 8), and
of the small test graphs, equals the interpreter in GPU precision (norm-wise relative error
<= 2e-2) on fresh random inputs, with NaN-poisoned outputs and workspace; the exported PyTorch
extension builds and runs. Skipped cleanly without CuPy or a GPU.

    pytest -m gpu tests/test_codegen_gpu.py
"""

import numpy as np
import pytest

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_inputs, get_program
from mirage_py.ugraph import naive_lowering

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
from mirage_py.codegen_cuda.runtime import (CompiledGraph, bf16_bits_to_float32,  # noqa: E402
                                            gpu_available)

if not gpu_available():
    pytest.skip("no CUDA GPU visible to CuPy", allow_module_level=True)

TOL = 2e-2
CASES = [(n, bs, kind) for bs in (1, 8) for n in NAMES for kind in ("fused", "naive")]
STORAGE = {"float16": np.float16, "float32": np.float32}


def _device_inputs(graph, x):
    from mirage_py.codegen_cuda.emulator import to_storage
    return {t.name: cp.asarray(to_storage(x[t.name], t.dtype)) for t in graph.inputs}


def _poisoned_outputs(graph):
    out = {}
    for n in graph.outputs:
        t = graph.tensors()[n]
        if t.dtype == "bfloat16":
            out[n] = cp.full(t.shape, 0x7FC0, cp.uint16)  # NaN
        else:
            out[n] = cp.full(t.shape, np.nan, STORAGE[t.dtype])
    return out


def _to_float(a, dtype):
    if dtype == "bfloat16":
        return cp.asnumpy(bf16_bits_to_float32(a))
    return cp.asnumpy(a).astype(np.float32)


def _check(graph, x, tol=TOL):
    ref = graph.run(x, precision="gpu")
    out = CompiledGraph(graph, "h100")(_device_inputs(graph, x), outputs=_poisoned_outputs(graph),
                                       poison=True)
    cp.cuda.Device().synchronize()
    tensors = graph.tensors()
    for k in ref:
        got = _to_float(out[k], tensors[k].dtype)
        assert np.all(np.isfinite(got)), (graph.name, k, "unwritten or non-finite elements")
        err = np.linalg.norm(got - ref[k]) / np.linalg.norm(ref[k])
        assert err <= tol, (graph.name, k, err)


@pytest.mark.parametrize("name,bs,kind", CASES)
def test_benchmark_graph_on_gpu(name, bs, kind):
    g = hand_built(name, bs) if kind == "fused" else naive_lowering(get_program(name, bs))
    _check(g, get_inputs(name, bs, seed=1000 + bs))


SMALL = [cc.small_rmsnorm_matmul(), cc.small_attention(), cc.mixed_block_ops(),
         naive_lowering(cc.kernel_ops_program())]


@pytest.mark.parametrize("g", SMALL, ids=lambda g: g.name)
def test_small_graph_on_gpu(g):
    _check(g, cc.random_inputs(g, seed=3))


def test_dlpack_inputs_from_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    g = hand_built("lora", 1)
    x = get_inputs("lora", 1, seed=4)
    ref = g.run(x, precision="gpu")
    tin = {k: torch.tensor(v, dtype=torch.float16, device="cuda") for k, v in x.items()}
    out = CompiledGraph(g)(tin)
    got = cp.asnumpy(out["Y"]).astype(np.float32)
    assert np.linalg.norm(got - ref["Y"]) / np.linalg.norm(ref["Y"]) <= TOL


def test_exported_extension_builds_and_runs(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    from torch.utils.cpp_extension import load

    from mirage_py.codegen_cuda.export import export_cuda
    g = hand_built("lora", 1)
    d = export_cuda(g, tmp_path / "lora", module="lora_mirage_test")
    ext = load(name="lora_mirage_test", sources=[str(d / "binding.cpp"), str(d / "lora.cu")],
               extra_cuda_cflags=["-O3"], build_directory=str(tmp_path), verbose=False)
    x = get_inputs("lora", 1, seed=5)
    ref = g.run(x, precision="gpu")
    tin = {k: torch.tensor(v, dtype=torch.float16, device="cuda") for k, v in x.items()}
    out = ext.forward(**tin)
    got = out["Y"].float().cpu().numpy()
    assert np.linalg.norm(got - ref["Y"]) / np.linalg.norm(ref["Y"]) <= TOL
    with pytest.raises(RuntimeError, match="must have shape"):
        ext.forward(**{**tin, "X": tin["X"][:8]})
    with pytest.raises(RuntimeError, match="must be"):
        ext.forward(**{**tin, "W": tin["W"].float()})


def _wgmma_graphs():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_codegen_mma import WGMMA_CASES, block_matmul
    return {c: block_matmul(c, *a) for c, a in WGMMA_CASES.items()}


@pytest.mark.parametrize("wgmma", [True, False], ids=["sm_90a", "mma_sync"])
@pytest.mark.parametrize("case", ["wg_128B_loop_regs", "wg_64B_two_groups", "wg_32B_smem_result",
                                  "wg_bf16_mixed_rows", "wg_batched_in_block", "wg_two_rounds"])
def test_warpgroup_mma_cases_on_gpu(case, wgmma, monkeypatch):
    """The warpgroup-MMA test graphs on the device, with the sm_90a build (on an sm_90 GPU) and
    with the mma.sync build (MIRAGE_PY_NO_WGMMA): both must equal the interpreter. A failure of
    the first only points at the descriptors, swizzles or fences of tile_wgmma."""
    from mirage_py.codegen_cuda import runtime
    if wgmma:
        monkeypatch.delenv("MIRAGE_PY_NO_WGMMA", raising=False)
    else:
        monkeypatch.setenv("MIRAGE_PY_NO_WGMMA", "1")
    g = _wgmma_graphs()[case]
    _check(g, cc.random_inputs(g, seed=7))
    path = list(runtime.COMPILED_FOR.values())[-1]
    cc_major = cp.cuda.Device().compute_capability
    assert path.startswith("sm_90a") if wgmma and cc_major == "90" else path == "cupy default"


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp_async"])
@pytest.mark.parametrize("name", ["gqa", "rmsnorm_linear", "lora", "gated_mlp", "exp_matmul"])
def test_tma_and_cp_async_builds_on_gpu(name, tma, monkeypatch):
    """The fixtures whose pipelined tiles arrive by TMA (sm_90 GPUs), built with TMA and with
    the cp.async fallback (MIRAGE_PY_NO_TMA): both must equal the interpreter. A failure of
    the first only points at the tensor maps, the mbarrier protocol or the TMA swizzles."""
    if tma:
        monkeypatch.delenv("MIRAGE_PY_NO_TMA", raising=False)
    else:
        monkeypatch.setenv("MIRAGE_PY_NO_TMA", "1")
    g = hand_built(name, 1)
    assert any(s.tensor_maps for s in CompiledGraph(g, "h100").source.launches)
    _check(g, get_inputs(name, 1, seed=11))
    major = int(cp.cuda.Device().compute_capability[:-1])
    assert CompiledGraph(g, "h100").tma == (tma and major >= 9)


@pytest.mark.parametrize("precision,tol", [("highest", 1e-5), ("high", 1e-5), ("medium", 1e-4)])
def test_float32_maths_on_gpu(precision, tol):
    """A float32 matmul with an epilogue, fused and naive, at each float32_matmul precision:
    tile_fma, mma.m16n8k8 TF32 (cvt.rna-rounded operands) and bf16 tensor cores equal the
    interpreter, which rounds operands as the math says (tests/test_float32.py reads the same
    kernels' SASS on the CPU)."""
    import mirage_py as mp
    p = mp.Program(f"f32_{precision}")
    a = p.input("A", (64, 256), "float32")
    b = p.input("B", (256, 128), "float32")
    p.output(mp.silu(mp.matmul(a, b, precision=precision)) * 2.0, name="C")
    opt = mp.superopt(p, workers=1, database=False)
    x = {"A": np.random.default_rng(9).standard_normal((64, 256)),
         "B": np.random.default_rng(10).standard_normal((256, 128)) / 16}
    for g in (opt.graph, naive_lowering(p)):
        _check(g, x, tol=tol)


def test_captured_call_replays_the_launches():
    """CompiledGraph.capture: one CUDA graph for the call's launches (gqa's fixture: two
    kernels, TMA on sm_90). A replay writes the outputs (poisoned again before it), and new
    inputs written into the captured buffers give the new results."""
    from mirage_py.codegen_cuda.emulator import to_storage
    g = hand_built("gqa", 1)
    cg = CompiledGraph(g, "h100")
    x = get_inputs("gqa", 1, seed=21)
    ins = _device_inputs(g, x)
    outs = _poisoned_outputs(g)
    call = cg.capture(ins, outs)
    for seed in (21, 22):
        x = get_inputs("gqa", 1, seed=seed)
        for t in g.inputs:
            ins[t.name][...] = cp.asarray(to_storage(x[t.name], t.dtype))
        for a in outs.values():
            a.fill(np.nan)
        got = call()
        cp.cuda.Device().synchronize()
        ref = g.run(x, precision="gpu")
        for k in ref:
            v = _to_float(got[k], g.tensors()[k].dtype)
            assert np.all(np.isfinite(v))
            assert np.linalg.norm(v - ref[k]) / np.linalg.norm(ref[k]) <= TOL, (seed, k)
