"""The GPU runtime (CompiledGraph) end to end on the CPU: CuPy replaced by a test double whose
kernels run in the emulator. Checks what the runtime itself does -- launch order and arguments,
workspace slices, output buffers, input conversion and checks, the module cache -- without a GPU
(the GPU tests in test_codegen_gpu.py run the same with real CuPy)."""

import shutil

import numpy as np
import pytest

import codegen_cases as cc
import fake_cupy
from benchmarks.fixtures import hand_built
from benchmarks.programs import get_inputs
from mirage_py.errors import DTypeError, ProgramError, ShapeError
from mirage_py.codegen_cuda import runtime
from mirage_py.codegen_cuda.emulator import to_storage

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture
def cp(monkeypatch):
    monkeypatch.setattr(runtime, "_MODULES", {})
    return fake_cupy.install(monkeypatch)


def _inputs(cp, g, x):
    return {t.name: cp.asarray(to_storage(x[t.name], t.dtype)) for t in g.inputs}


def test_compiled_graph_runs_a_fixture(cp):
    g = hand_built("qknorm_gqa", 1)  # its attention kernel needs more than 48 KB
    x = get_inputs("qknorm_gqa", 1, seed=2)
    cg = runtime.CompiledGraph(g)
    big = [s for s in cg.source.launches if s.smem_bytes > 48 * 1024]
    assert big and all(cg.kernels[s.kernel].max_dynamic_shared_size_bytes == s.smem_bytes
                       for s in big)
    poisoned = {"O": cp.full((2, 256, 64), np.nan, np.float16)}
    out = cg(_inputs(cp, g, x), outputs=poisoned, poison=True)
    assert out["O"] is poisoned["O"]
    ref = g.run(x, precision="gpu")["O"]
    got = np.asarray(out["O"], dtype=np.float32)
    assert np.all(np.isfinite(got))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 2e-3
    for spec in cg.source.launches:  # launched exactly as planned
        assert cg.kernels[spec.kernel].calls == [(spec.grid, spec.block, spec.smem_bytes)]


def test_bf16_and_fp32_tensors_and_allocated_outputs(cp):
    g = cc.mixed_block_ops()
    x = cc.random_inputs(g, seed=4)
    out = runtime.CompiledGraph(g)(_inputs(cp, g, x))
    ref = g.run(x, precision="gpu")
    assert out["Ccopy"].dtype == np.uint16  # bfloat16 bits
    got = np.asarray(runtime.bf16_bits_to_float32(np.asarray(out["Ccopy"]).view(np.ndarray)))
    assert np.array_equal(got, ref["Ccopy"])
    z = np.asarray(out["Z"]).view(np.ndarray)
    assert np.linalg.norm(z - ref["Z"]) / np.linalg.norm(ref["Z"]) <= 1e-4


def test_inputs_are_checked_and_converted(cp):
    g = cc.small_rmsnorm_matmul()
    x = cc.random_inputs(g)
    good = _inputs(cp, g, x)
    cg = runtime.CompiledGraph(g)
    with pytest.raises(ProgramError, match="missing input"):
        cg({"X": good["X"]})
    with pytest.raises(ShapeError, match="'X' has shape"):
        cg({**good, "X": good["X"][:2]})
    with pytest.raises(DTypeError, match="'W' is float32, expected float16"):
        cg({**good, "W": cp.asarray(np.asarray(x["W"], np.float32))})
    # a strided view and a NumPy array are made contiguous device arrays
    wide = cp.asarray(np.zeros((4, 128), np.float16))
    wide[:, ::2] = good["X"]
    out = cg({"X": wide[:, ::2], "W": np.asarray(good["W"]).view(np.ndarray)})
    ref = g.run(x, precision="gpu")["Y"]
    assert np.allclose(np.asarray(out["Y"], np.float32), ref, rtol=1e-2, atol=1e-3)


def test_module_cache_is_keyed_by_source(cp):
    before = cp.RawModule.compiled
    g = cc.small_attention()
    runtime.CompiledGraph(g)
    runtime.CompiledGraph(g)
    assert cp.RawModule.compiled == before + 1
    runtime.CompiledGraph(cc.small_rmsnorm_matmul())
    assert cp.RawModule.compiled == before + 2


def test_missing_cupy_is_a_clear_error(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert not runtime.gpu_available()
    with pytest.raises(runtime.ToolMissing, match="CuPy"):
        runtime.CompiledGraph(cc.small_attention())
