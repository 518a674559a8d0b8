"""nvcc compiles the emitted CUDA of every fixture and naive lowering of the nine benchmarks
(bs 1 and 8), plus the small test graphs, for sm_80 and sm_90 without a warning, and ptxas's
resource report fits the targets. The exported extension's sources compile too, and binding.cpp
passes a syntax check against PyTorch's headers where PyTorch is installed.

nvcc costs seconds per file whatever its size, so the graphs go into five translation units,
compiled two at a time (the suite runs on two cores)."""

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_program
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import translation_unit
from mirage_py.codegen_cuda.export import export_cuda
from mirage_py.codegen_cuda.nvcc import (ARCH_TARGET, check_resources, compile_with_nvcc,
                                         cuda_include_dir, find_nvcc, parse_ptxas)
from mirage_py.targets import get_target
from mirage_py.ugraph import naive_lowering

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")

def _groups():
    g = {}
    for bs in (1, 8):
        g[f"fused_bs{bs}"] = [emit_cuda(hand_built(n, bs), prefix=f"{n}_fused_bs{bs}")
                              for n in NAMES]
        g[f"naive_bs{bs}"] = [emit_cuda(naive_lowering(get_program(n, bs)),
                                        prefix=f"{n}_naive_bs{bs}") for n in NAMES]
    g["small"] = [emit_cuda(cc.small_rmsnorm_matmul()), emit_cuda(cc.small_attention()),
                  emit_cuda(cc.attention_row_sums_after_loop()), emit_cuda(cc.mixed_block_ops()),
                  emit_cuda(naive_lowering(cc.kernel_ops_program())),
                  emit_cuda(cc.causal_two_pass_attention()),
                  emit_cuda(naive_lowering(cc.new_ops_program()))]
    return g


GROUPS = ("fused_bs1", "fused_bs8", "naive_bs1", "naive_bs8", "small")


def _torch_include():
    try:
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return None
    return include_paths()


def _binding_check(directory: Path) -> subprocess.CompletedProcess:
    """g++ -fsyntax-only of binding.cpp against the installed PyTorch's headers. A CPU build
    of PyTorch lacks one generated CUDA header (cuda_cmake_macros.h); a stub stands in."""
    stub = directory / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    inc = ["-isystem", str(directory / "stub")]
    for p in _torch_include() + [sysconfig.get_paths()["include"], cuda_include_dir()]:
        inc += ["-isystem", p]
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", *inc,
           "-DTORCH_EXTENSION_NAME=gqa_mirage", "-I", str(directory),
           str(directory / "binding.cpp")]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    groups = _groups()
    export_dir = tmp_path_factory.mktemp("export")
    src = export_cuda(hand_built("gqa", 1), export_dir)
    jobs = {name: (lambda s=groups[name], n=name: compile_with_nvcc(translation_unit(s), name=n))
            for name in GROUPS}
    jobs["export"] = lambda: compile_with_nvcc((src / "gqa.cu").read_text(), ("sm_90",),
                                               include_dirs=(str(src),), name="gqa")
    if _torch_include() and shutil.which("g++") and cuda_include_dir():
        jobs["binding"] = lambda: _binding_check(src)
    with ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(f) for k, f in jobs.items()}
        results = {k: f.result() for k, f in futures.items()}
    return groups, results


@pytest.mark.parametrize("group", GROUPS)
def test_compiles_without_warnings(group, builds):
    _, results = builds
    res = results[group]
    assert res.warnings == [], "\n".join(res.warnings)
    print(f"{group}: nvcc {res.seconds:.1f} s")


@pytest.mark.parametrize("group", GROUPS)
def test_ptxas_resources_fit_the_targets(group, builds):
    groups, results = builds
    res = results[group]
    problems = []
    for src in groups[group]:
        for spec in src.launches:  # no kernel may spill (divisions avoid IEEE's slow-path call)
            for arch in ("sm_80", "sm_90"):
                r = res.for_kernel(spec.kernel, arch)
                problems += check_resources(r, spec, get_target(ARCH_TARGET[arch]))
    assert problems == [], "\n".join(problems)
    assert len(res.resources) == 2 * sum(len(s.launches) for s in groups[group])


def test_exported_sources_compile(builds):
    _, results = builds
    res = results["export"]
    assert res.warnings == []
    assert {r.kernel for r in res.resources} == {"gqa_k0_graph_O_part_L_part", "gqa_k1_graph_O"}


def test_exported_binding_passes_a_syntax_check(builds):
    _, results = builds
    if "binding" not in results:
        pytest.skip("PyTorch is not installed: binding.cpp cannot be checked")
    res = results["binding"]
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr, res.stderr[-4000:]


def test_parse_ptxas_report():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_80'
ptxas info    : Function properties for k_a
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 2176 bytes smem, 392 bytes cmem[0]
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""
    a, b = parse_ptxas(text)
    assert (a.kernel, a.arch, a.registers, a.smem_static, a.spill_stores, a.spill_loads,
            a.barriers) == ("k_a", "sm_80", 48, 2176, 8, 12, 1)
    assert (b.kernel, b.arch, b.registers, b.smem_static, b.spill_stores) == \
        ("k_b", "sm_90", 32, 0, 0)


def test_check_resources_flags_what_does_not_fit():
    from mirage_py.codegen_cuda.launch import LaunchSpec
    from mirage_py.codegen_cuda.nvcc import KernelResources
    spec = LaunchSpec("k", 0, (1, 1, 1), (1024, 1, 1), 200 * 1024, ())
    r = KernelResources("k", "sm_80", 96, 0, 0, 4, 4, 1)
    bad = check_resources(r, spec, get_target("a100"))
    assert len(bad) == 3  # registers x threads, shared memory, spills


