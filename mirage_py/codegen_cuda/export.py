"""``export_cuda(graph, directory)``: self-contained CUDA sources plus a PyTorch extension.

Files written (``<p>`` is the graph's C prefix)::

    <p>.cu            kernels + host launcher (needs only the CUDA runtime: no cuBLAS, no CuPy)
    <p>.h             C API: <p>_tensors, <p>_workspace_bytes(), <p>_launch(...)
    binding.cpp       PyTorch binding: checks shapes, dtypes, device, contiguity; returns a dict
    setup.py          builds the extension with torch.utils.cpp_extension.CUDAExtension
    load_example.py   JIT-builds it with torch.utils.cpp_extension.load and runs it once
    README.md         how to build and call it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ugraph.graph import KernelGraph
from .cexpr import ident
from .emit import CudaSource, emit_cuda
from .host import io_fields
from .launch import DIM_PARAM

TORCH_DTYPES = {"float16": "at::kHalf", "bfloat16": "at::kBFloat16", "float32": "at::kFloat",
                "int32": "at::kInt", "int64": "at::kLong"}
PY_DTYPES = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32",
             "int32": "torch.int32", "int64": "torch.int64"}


def _shape(shape: tuple[int, ...]) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}"


def binding_text(src: CudaSource) -> str:
    g, p = src.graph, src.prefix
    tensors = g.tensors()
    fields = io_fields(g)
    ins = [(n, f) for n, f, is_in in fields if is_in]
    outs = [(n, f) for n, f, is_in in fields if not is_in]
    dims = src.dims  # a padded graph's valid sizes: ints after the tensors
    args = ", ".join([f"const at::Tensor& {f}" for _, f in ins] +
                     [f"int64_t {DIM_PARAM}{d}" for d in dims])
    lines = [f"// PyTorch binding of the mirage_py μGraph {g.name!r}: forward({', '.join(f for _, f in ins)})",
             "// checks every input (CUDA, dtype, shape, contiguous, 16-byte aligned, one device),",
             "// allocates the outputs and the workspace, and launches on the current stream.",
             "// (ATen and torch's pybind11 casters only, not all of <torch/extension.h>: "
             "compiles in a",
             "// fraction of the time.)",
             "#include <ATen/core/Tensor.h>", "#include <ATen/ops/empty.h>",
             "#include <c10/cuda/CUDAGuard.h>", "#include <c10/cuda/CUDAStream.h>",
             "#include <pybind11/stl.h>", "#include <torch/csrc/utils/pybind.h>", "",
             "#include <cstdint>", "#include <map>",
             "#include <string>", "#include <vector>", "", f'#include "{p}.h"', "",
             "static void check_input(const at::Tensor& t, const char* name, "
             "c10::ScalarType dtype,",
             "                        const std::vector<int64_t>& shape, const c10::Device& device) {",
             '  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");',
             '  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), ", expected ", device);',
             '  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", '
             "t.scalar_type());",
             '  TORCH_CHECK(t.sizes() == c10::IntArrayRef(shape), name, " must have shape ", '
             'c10::IntArrayRef(shape), ", got ", t.sizes());',
             '  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");',
             "  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, name,",
             '              " must be 16-byte aligned");', "}", "",
             f"std::map<std::string, at::Tensor> forward({args}) {{",
             f"  const c10::Device device = {ins[0][1]}.device();"]
    for n, f in ins:
        t = tensors[n]
        lines.append(f'  check_input({f}, "{n}", {TORCH_DTYPES[t.dtype]}, {_shape(t.shape)}, '
                     "device);")
    lines += ["  const c10::cuda::CUDAGuard guard(device);",
              f"  const auto options = {ins[0][1]}.options();"]
    for n, f in outs:
        t = tensors[n]
        lines.append(f"  at::Tensor {f} = at::empty({_shape(t.shape)}, "
                     f"options.dtype({TORCH_DTYPES[t.dtype]}));")
    lines += [f"  at::Tensor workspace = at::empty("
              f"{{static_cast<int64_t>({p}_workspace_bytes())}}, options.dtype(at::kByte));",
              f"  {p}_tensors tensors;"]
    for _, f, _ in fields:
        lines.append(f"  tensors.{f} = {f}.data_ptr();")
    for d in dims:
        lines.append(f"  tensors.{DIM_PARAM}{d} = static_cast<int>({DIM_PARAM}{d});")
    lines += [f"  const cudaError_t err = {p}_launch(&tensors, workspace.data_ptr(), "
              "c10::cuda::getCurrentCUDAStream());",
              f'  TORCH_CHECK(err == cudaSuccess, "{p}_launch failed: ", cudaGetErrorString(err));',
              "  return {" + ", ".join(f'{{"{n}", {f}}}' for n, f in outs) + "};", "}", "",
              "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
              f'  m.def("forward", &forward, "Run the μGraph {g.name} (outputs by name)",',
              "        " + ", ".join([f'pybind11::arg("{f}")' for _, f in ins] +
                                   [f'pybind11::arg("{d}")' for d in dims]) + ");", "}", ""]
    return "\n".join(lines)


def _arch_flags(arch: str) -> list[str]:
    """sm_90 targets build for sm_90a: the warpgroup MMA path (the cubin runs on H100/H200)."""
    arch = "sm_90a" if arch == "sm_90" else arch
    return [f"-gencode=arch=compute_{arch[3:]},code={arch}"]


def setup_text(src: CudaSource, module: str) -> str:
    flags = ["-O3", *_arch_flags(src.plan.target.arch)]
    return f'''"""Build the PyTorch extension for the mirage_py μGraph {src.graph.name!r}:

    pip install --no-build-isolation .        (or: python setup.py build_ext --inplace)

then ``import torch, {module}; {module}.forward(...)`` (see README.md)."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="{module}",
    ext_modules=[
        CUDAExtension(
            name="{module}",
            sources=["binding.cpp", "{src.prefix}.cu"],
            extra_compile_args={{"cxx": ["-O3"], "nvcc": {flags!r}}},
        )
    ],
    cmdclass={{"build_ext": BuildExtension}},
)
'''


def example_text(src: CudaSource, module: str) -> str:
    g = src.graph
    tensors = g.tensors()
    fields = io_fields(g)
    ins = [(n, f) for n, f, is_in in fields if is_in]
    make = "\n".join(f'    "{f}": torch.randn({tensors[n].shape}, device="cuda").to('
                     f"{PY_DTYPES[tensors[n].dtype]}),"
                     for n, f in ins)
    flags = ["-O3", *_arch_flags(src.plan.target.arch)]
    return f'''"""JIT-build the extension with torch.utils.cpp_extension.load and run the μGraph
{g.name!r} once on random inputs (needs a CUDA GPU and nvcc)."""

from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
ext = load(
    name="{module}",
    sources=[str(HERE / "binding.cpp"), str(HERE / "{src.prefix}.cu")],
    extra_cuda_cflags={flags!r},
    verbose=False,
)

inputs = {{
{make}
}}
outputs = ext.forward(**inputs)
torch.cuda.synchronize()
for name, value in outputs.items():
    print(name, tuple(value.shape), value.dtype, "finite:", bool(torch.isfinite(value).all()))
'''


def readme_text(src: CudaSource, module: str) -> str:
    g = src.graph
    tensors = g.tensors()
    fields = io_fields(g)
    rows = "\n".join(f"| `{f}` | {'input' if is_in else 'output'} | {tensors[n].shape} | "
                     f"{tensors[n].dtype} |" for n, f, is_in in fields)
    ins = ", ".join(f for _, f, is_in in fields if is_in)
    return f"""# `{g.name}`: CUDA generated by mirage_py

Target {src.plan.target.name} ({src.plan.target.arch}); {len(src.launches)} kernel launch(es);
workspace {src.plan.device.workspace_bytes} bytes. Only the CUDA runtime is needed: no cuBLAS,
no CuPy.

| tensor | role | shape | dtype |
| --- | --- | --- | --- |
{rows}

Tensors are dense row-major (contiguous) and 16-byte aligned.

## Files

- `{src.prefix}.cu`, `{src.prefix}.h` -- the kernels and a C API:
  `{src.prefix}_launch(&tensors, workspace, stream)` runs the whole graph on `stream`;
  `{src.prefix}_workspace_bytes()` says how much device workspace to pass.
- `binding.cpp` -- the PyTorch binding: `forward({ins})` checks every input (CUDA, dtype, shape,
  contiguous, 16-byte aligned, one device) and returns the outputs in a dict by name.
- `setup.py`, `load_example.py` -- two ways to build it.

## Build and call

Ahead of time (needs PyTorch with CUDA and nvcc):

    pip install --no-build-isolation .
    python -c "import torch, {module}; print({module}.forward.__doc__)"

Or just in time:

    python load_example.py

From Python:

```python
import torch, {module}
outputs = {module}.forward({ins})   # dict: output name -> torch.Tensor
```

From C/C++: include `{src.prefix}.h`, compile `{src.prefix}.cu` with
`nvcc -std=c++17 -O3 {_arch_flags(src.plan.target.arch)[0]} -c {src.prefix}.cu`, fill a
`{src.prefix}_tensors` struct with device pointers and call `{src.prefix}_launch`.
"""


def export_cuda(graph: KernelGraph | CudaSource, directory: str | Path, target: Any = "h100",
                module: str | None = None) -> Path:
    """Write the sources of ``graph`` and its PyTorch extension into ``directory``; returns it."""
    src = graph if isinstance(graph, CudaSource) else emit_cuda(graph, target)
    module = ident(module or f"{src.prefix}_mirage")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        f"{src.prefix}.cu": src.cu(header_file=f"{src.prefix}.h"),
        f"{src.prefix}.h": src.header,
        "binding.cpp": binding_text(src),
        "setup.py": setup_text(src, module),
        "load_example.py": example_text(src, module),
        "README.md": readme_text(src, module),
    }
    for name, text in files.items():
        (d / name).write_text(text)
    return d
