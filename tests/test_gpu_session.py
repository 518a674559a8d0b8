"""The GPU session's preparation, checked on the CPU: cubins built ahead of time with nvcc are
what the runtime loads on an sm_90 device, and the measuring script's code path (bundle ->
compile-or-interpret -> check against PyTorch eager and float64 -> time -> report) gives the
right answers (benchmarks/gpu_prepare.py, benchmarks/gpu_measure.py, docs/gpu.md)."""

import json
import shutil
import subprocess
import types

import pytest

from benchmarks.fixtures import hand_built
from mirage_py.codegen_cuda.emit import emit_cuda
from mirage_py.codegen_cuda.nvcc import find_nvcc


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")
def test_prebuilt_cubin_is_what_an_sm90_device_loads(tmp_path, monkeypatch):
    """prebuild_cubin writes an sm_90a cubin under the cache directory, named by the same key
    load_module computes on an sm_90 device (TMA options included), and load_module loads that
    file instead of calling NVRTC; a second prebuild finds it."""
    import fake_cupy
    from mirage_py.codegen_cuda import runtime
    monkeypatch.setenv("MIRAGE_PY_CACHE", str(tmp_path))
    src = emit_cuda(hand_built("lora", 1), prefix="pre_lora")
    key, built = runtime.prebuild_cubin(src)
    assert built and runtime.cubin_path(key).exists()
    assert runtime.prebuild_cubin(src) == (key, False)
    dump = shutil.which("cuobjdump")
    if dump:
        listing = subprocess.run([dump, "--list-elf", str(runtime.cubin_path(key))],
                                 capture_output=True, text=True).stdout
        assert "sm_90a" in listing
    cp = fake_cupy.install(monkeypatch)
    made = []
    cp.RawModule = lambda **kw: made.append(kw) or types.SimpleNamespace(compile=lambda: None)
    monkeypatch.setattr(runtime, "_compute_capability", lambda _cp: (9, 0))
    monkeypatch.setattr(runtime, "_MODULES", {})
    monkeypatch.setattr("mirage_py.codegen_cuda.nvrtc.compile_with_nvrtc",
                        lambda *a, **k: pytest.fail("NVRTC called although a cubin exists"))
    tma = any(s.tensor_maps for s in src.launches)
    runtime.load_module(src.device_code(), runtime.module_options(src, tma))
    assert made == [{"path": str(runtime.cubin_path(key))}]
    assert list(runtime.COMPILED_FOR.values())[-1] == "sm_90a (prebuilt cubin)"
    # the cp.async build (MIRAGE_PY_NO_TMA) is another module with its own cubin
    key2, built2 = runtime.prebuild_cubin(src, tma=False)
    assert built2 and key2 != key


@pytest.mark.slow  # 12 s: PyTorch's and the interpreter's CPU runs, timed
def test_measuring_path_on_the_cpu(tmp_path, monkeypatch):
    """gpu_measure's bench step in its dry run, on a bundle made by gpu_prepare: our answer
    (interpreted) equals PyTorch eager and the float64 evaluation, every variant is timed, and
    the report's row says so."""
    torch = pytest.importorskip("torch")
    import benchmarks.gpu_measure as gm
    import benchmarks.gpu_prepare as gp
    monkeypatch.setattr(gp, "BUNDLE", tmp_path / "bundle")
    monkeypatch.setattr(gm, "BUNDLE", tmp_path / "bundle")
    monkeypatch.setattr(gp, "PREPARE_DB", tmp_path / "db.sqlite")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # the CPU's compile takes 10 s
    gp.prepare_bench(["lora"], (1,), workers=1, log=lambda *a: None)
    doc = json.loads((tmp_path / "bundle" / "bench" / "lora-bs1.json").read_text())
    assert doc["kernels"] == 1 and doc["kernels_naive"] == 4
    gm.measure_bench(gm.Device(dry=True, budget_s=0.01), None)
    (row,) = gm.read_jsonl(tmp_path / "out" / "bench.jsonl")
    assert "error" not in row, row.get("traceback")
    assert row["ours_allclose_eager"] and row["ours_finite"]
    assert row["ours_rel_err_vs_float64"] < 2e-3
    assert row["ours_naive_rel_err_vs_float64"] < 2e-3
    assert set(row["times"]) == {"ours", "ours_naive", "eager", "torch_compile"}
    md = gm.report(tmp_path / "out")
    assert "| lora | 1 | 4 -> 1 |" in md and "Geometric mean" in md


def test_report_counts_fast_1_and_kendall_tau(tmp_path):
    """The report from measured rows: fast_1 counts correct answers faster than both
    baselines; Kendall tau orders predicted against measured per benchmark."""
    import benchmarks.gpu_measure as gm
    kb = [{"problem": "level2/1_a", "kernels_naive": 3, "kernels": 1, "predicted_us": 5.0,
           "correct": True, "times": {"ours": {"us": 1.0}, "eager": {"us": 2.0},
                                      "torch_compile": {"us": 1.5}}},
          {"problem": "level2/2_b", "kernels_naive": 3, "kernels": 1, "predicted_us": 5.0,
           "correct": False, "times": {"ours": {"us": 1.0}, "eager": {"us": 2.0}}},
          {"problem": "level2/3_c", "kernels_naive": 3, "kernels": 3, "predicted_us": 5.0,
           "correct": True, "times": {"ours": {"us": 3.0}, "eager": {"us": 2.0}}}]
    tuning = [{"name": "x", "bs": 1, "label": str(i), "predicted_us": p, "us": m}
              for i, (p, m) in enumerate([(1, 10), (2, 20), (3, 15), (4, 40)])]
    for name, rows in (("kernelbench", kb), ("tuning", tuning)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = gm.report(tmp_path)
    assert "fast_1 (correct and faster than min(eager, torch.compile)): 1 of 3" in md
    assert "| x | 1 | 4/4 | 0.67 | 10.00 |" in md  # ratios 10, 10, 5, 10
