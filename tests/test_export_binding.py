"""The exported PyTorch extension's ``binding.cpp`` compiles against the installed PyTorch's
headers (``torch.utils.cpp_extension.include_paths()``) and the CUDA toolkit's (the directory of
``cuda_runtime.h`` beside nvcc), with ``g++ -fsyntax-only -Wall -Wextra``: no error, no warning.

It needs no GPU and no nvcc run, only g++, torch and the CUDA headers, so CI (torch is in the
test extra, the CUDA toolkit is on its machines) checks every change to the binding generator.
A CPU build of PyTorch lacks one generated CUDA header (``c10/cuda/impl/cuda_cmake_macros.h``);
an empty stub stands in for it. Graphs of several shapes are exported: one output or several,
float16, bfloat16 and float32 tensors."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import mirage_py as mp
from mirage_py.codegen_cuda.export import export_cuda
from mirage_py.codegen_cuda.nvcc import cuda_include_dir
from mirage_py.examples.fixtures import hand_built
from mirage_py.ugraph import naive_lowering

torch_ext = pytest.importorskip("torch.utils.cpp_extension",
                                reason="PyTorch is not installed (pip install -e '.[test]')")

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
    pytest.mark.skipif(cuda_include_dir() is None,
                       reason="needs the CUDA toolkit's headers (cuda_runtime.h)"),
]


def _two_outputs(dtype: str) -> mp.Program:
    p = mp.Program(f"two_outputs_{dtype}")
    X = p.input("X", (16, 64), dtype)
    W = p.input("W", (64, 32), dtype)
    Y = X @ W
    p.output(mp.silu(Y), name="Y")
    p.output(mp.sum(Y * Y, axis=-1, keepdims=True), name="S")
    return p


CASES = {
    "gqa_fused": lambda: hand_built("gqa", 1),
    "two_outputs_bf16": lambda: naive_lowering(_two_outputs("bfloat16")),
    "two_outputs_fp32": lambda: naive_lowering(_two_outputs("float32")),
}


def _syntax_check(directory: Path, module: str) -> subprocess.CompletedProcess:
    stub = directory / "_stub"
    (stub / "c10" / "cuda" / "impl").mkdir(parents=True, exist_ok=True)
    (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    inc = ["-isystem", str(stub)]
    for path in [*torch_ext.include_paths(), sysconfig.get_paths()["include"],
                 cuda_include_dir()]:
        inc += ["-isystem", path]
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", *inc,
           f"-DTORCH_EXTENSION_NAME={module}", "-I", str(directory),
           str(directory / "binding.cpp")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    dirs = {name: export_cuda(make(), tmp_path_factory.mktemp(name), module=f"{name}_ext")
            for name, make in CASES.items()}
    with ThreadPoolExecutor(2) as pool:  # the suite runs on two cores
        futures = {name: pool.submit(_syntax_check, d, f"{name}_ext") for name, d in dirs.items()}
        return {name: (dirs[name], f.result()) for name, f in futures.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_binding_compiles_against_the_installed_torch_headers(case, checks):
    directory, res = checks[case]
    text = (directory / "binding.cpp").read_text()
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME" in text
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr, res.stderr[-4000:]


def test_binding_checks_every_input_and_returns_every_output(checks):
    directory, _ = checks["two_outputs_fp32"]
    text = (directory / "binding.cpp").read_text()
    assert text.count("check_input(") == 3  # the definition and the two inputs
    assert '"X"' in text and '"W"' in text and "at::kFloat" in text
    assert '{"Y", ' in text and '{"S", ' in text
    directory, _ = checks["two_outputs_bf16"]
    assert "at::kBFloat16" in (directory / "binding.cpp").read_text()
