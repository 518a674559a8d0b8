"""Run the emitted CUDA on the CPU: the kernels are compiled with the host C++ compiler against
``emulator.h`` (each CUDA thread a fiber, barriers and warp shuffles switch fibers) and launched
exactly as the GPU runtime launches them, from the same :class:`LaunchSpec` list.

This checks the emitted index arithmetic, barriers and launch plan without a GPU. It is slow
(every thread of every block is emulated), so tests use small graphs. Float arithmetic is the
host's IEEE fp32 (``expf`` and friends from libm, no FMA contraction), so results agree with the
GPU's to a few ulps, not bit for bit.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..lax.ops import storage_round
from ..ugraph.graph import KernelGraph
from .cexpr import ident
from .emit import CudaSource, emit_cuda, translation_unit
from .runtime import check_gather_indices, dim_values
from .errors import CompileError, ToolMissing
from .tensor_map import MAP_BYTES, emulated

HERE = Path(__file__).resolve().parent
ORDERS = {"forward": 0, "reverse": 1}  # any other int >= 2: shuffled with that seed


def cache_dir() -> Path:
    d = Path(os.environ.get("MIRAGE_PY_CACHE", Path.home() / ".cache" / "mirage_py"))
    d.mkdir(parents=True, exist_ok=True)
    return d


_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+(?:, \d+)?\)\s*(\w+)\((.*?)\)\s*\{',
                        re.DOTALL)
_PARAM = re.compile(r"(const )?((?:long )?\w+)\* __restrict__ \w+|"
                    r"const __grid_constant__ (mp_tensor_map) \w+|const (int) mp_dim_\w+")


def kernel_signatures(code: str) -> list[tuple[str, list[tuple[bool, str]]]]:
    """(name, [(is_const, type)...]) of every emitted __global__ function in ``code``: the
    storage type of a pointer parameter, ``mp_dim`` for a dim's size or ``mp_tensor_map`` for
    a TMA map (both passed by value)."""
    out = []
    for m in _SIGNATURE.finditer(code):
        params = [(True, p.group(3)) if p.group(3) else (True, "mp_dim") if p.group(4)
                  else (bool(p.group(1)), p.group(2)) for p in _PARAM.finditer(m.group(2))]
        out.append((m.group(1), params))
    return out


def _argument(i: int, const: bool, ctype: str) -> str:
    if ctype == "mp_tensor_map":  # passed by value: a[i] points at the value
        return f"*static_cast<const mp_tensor_map*>(a[{i}])"
    if ctype == "mp_dim":  # a dim's size, by value
        return f"*static_cast<const int*>(a[{i}])"
    return f"static_cast<{'const ' if const else ''}{ctype}*>(a[{i}])"


def _trampolines(code: str) -> str:
    """One entry point per kernel: ``emu_<kernel>(args, dims, smem_bytes, order)`` with
    dims = (grid.x, grid.y, grid.z, block.x, block.y, block.z)."""
    lines = ["", "// ---- emulator entry points: one per kernel ----"]
    for name, params in kernel_signatures(code):
        args = ", ".join(_argument(i, c, t) for i, (c, t) in enumerate(params))
        lines += [f'extern "C" int emu_{name}(void** a, const unsigned int* d, long smem, '
                  "int order) {",
                  "  return mp_emu::launch(dim3{d[0], d[1], d[2]}, dim3{d[3], d[4], d[5]}, "
                  "static_cast<size_t>(smem), order,",
                  f"                        [&] {{ {name}({args}); }});", "}"]
    return "\n".join(lines) + "\n"


def build_emulator_code(code: str, defines: Sequence[str] = ()) -> Path:
    """Compile emitted device code (prelude + kernels) for the CPU into a shared library with one
    ``emu_<kernel>`` entry point per kernel, cached by source hash; returns its path.
    ``defines``: macros set before the code (``MIRAGE_NO_WGMMA``: emulate the ``mma.sync``
    fallback of warpgroup MMAs, which is what the code does on GPUs other than sm_90a)."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise ToolMissing("the CPU emulator needs a C++17 compiler (g++); set CXX")
    text = '#include "emulator.h"\n' + "".join(f"#define {d}\n" for d in defines) + code + \
        _trampolines(code)
    key = hashlib.sha256((text + (HERE / "emulator.h").read_text()).encode()).hexdigest()[:24]
    lib = cache_dir() / f"emu_{key}.so"
    if lib.exists():
        return lib
    with tempfile.TemporaryDirectory() as tmp:
        cpp = Path(tmp) / "emulated.cpp"
        cpp.write_text(text)
        out = Path(tmp) / lib.name
        cmd = [cxx, "-std=c++17", "-O2", "-U_FORTIFY_SOURCE", "-fno-gnu-unique", "-shared",
               "-fPIC", "-w",
               "-I", str(HERE), str(cpp), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise CompileError(f"emulator build failed:\n{res.stderr[-4000:]}")
        shutil.move(str(out), lib)
    return lib


def build_emulator(sources: CudaSource | list[CudaSource], defines: Sequence[str] = ()) -> Path:
    """The emulator library of one or more emitted graphs (distinct prefixes), in one build."""
    sources = [sources] if isinstance(sources, CudaSource) else list(sources)
    return build_emulator_code(translation_unit(sources), defines)


def run_kernel(lib: ctypes.CDLL, kernel: str, pointers: list[int], grid: tuple[int, ...],
               block: tuple[int, ...], smem_bytes: int, order: int) -> None:
    """Launch one emulated kernel; raises RuntimeError on barrier divergence."""
    args = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
    dims = (ctypes.c_uint * 6)(*grid, *block)
    fn = getattr(lib, f"emu_{kernel}")
    fn.restype = ctypes.c_int
    rc = fn(args, dims, ctypes.c_long(smem_bytes), ctypes.c_int(order))
    if rc:
        what = {1: "barrier divergence", 2: "shared memory too large"}.get(
            rc, "TMA or mbarrier misuse, see stderr")
        raise RuntimeError(f"emulated kernel {kernel} failed ({rc}: {what})")


def _aligned(nbytes: int, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """A byte buffer starting on a 256-byte boundary (and the allocation that keeps it alive)."""
    raw = np.full(nbytes + 256, fill, dtype=np.uint8)
    start = (-raw.ctypes.data) % 256
    return raw[start:start + nbytes], raw


def to_storage(x: Any, dtype: str) -> np.ndarray:
    """Float values -> the bytes a device tensor of ``dtype`` holds (as a NumPy array)."""
    x = np.asarray(x)
    if dtype in ("int32", "int64"):  # an index tensor: its integers
        return np.ascontiguousarray(x, dtype=np.dtype(dtype))
    if dtype == "float16":
        return np.ascontiguousarray(x, dtype=np.float16)
    if dtype == "bfloat16":
        r = storage_round(x, "bfloat16")
        return np.ascontiguousarray((r.view(np.uint32) >> 16).astype(np.uint16))
    return np.ascontiguousarray(x, dtype=np.float32)


def from_storage(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored bytes of a dense tensor -> float32 values."""
    if dtype == "float16":
        return raw.view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.view(np.float32).copy()


class EmulatedGraph:
    """The emitted CUDA of ``graph`` compiled for the CPU; call with NumPy inputs by name,
    get float32 outputs by name (values rounded to each output's dtype, as the GPU stores them).

    ``order`` sets in which order threads run between barriers: "forward", "reverse" or an int
    seed >= 2 for a shuffle."""

    def __init__(self, graph: KernelGraph | CudaSource, target: Any = "h100",
                 order: str | int = "reverse", lib: Path | None = None):
        self.source = graph if isinstance(graph, CudaSource) else emit_cuda(graph, target)
        self.order = ORDERS[order] if isinstance(order, str) else int(order)
        self.lib = ctypes.CDLL(str(lib or build_emulator(self.source)))

    @classmethod
    def many(cls, graphs: list[KernelGraph], target: Any = "h100",
             order: str | int = "reverse") -> list["EmulatedGraph"]:
        """Emulators for several graphs built as one library (one compiler run)."""
        sources = [emit_cuda(g, target, prefix=f"{ident(g.name)}_{i}")
                   for i, g in enumerate(graphs)]
        lib = build_emulator(sources)
        return [cls(s, target, order, lib) for s in sources]

    @property
    def graph(self) -> KernelGraph:
        return self.source.graph

    def __call__(self, inputs: Mapping[str, Any],
                 sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Run on ``inputs``; ``sizes``: the sizes of the dims a padded graph's masks name."""
        g, dev = self.graph, self.source.plan.device
        dims = dim_values(self.source, sizes)
        check_gather_indices(g, lambda n: (int(np.min(inputs[n])), int(np.max(inputs[n]))))
        keep: list[np.ndarray] = []
        ptr: dict[str, int] = {}
        for t in g.inputs:
            data = to_storage(inputs[t.name], t.dtype)
            if data.shape != t.shape:
                raise ValueError(f"input {t.name!r}: shape {data.shape}, expected {t.shape}")
            buf, raw = _aligned(data.nbytes, 0)
            buf[:] = data.reshape(-1).view(np.uint8)
            keep.append(raw)
            ptr[t.name] = buf.ctypes.data
        outs: dict[str, np.ndarray] = {}
        for name in g.outputs:
            buf, raw = _aligned(dev.layouts[name].nbytes, 0xFF)  # poisoned: NaN
            keep.append(raw)
            outs[name] = buf
            ptr[name] = buf.ctypes.data
        ws, raw = _aligned(max(dev.workspace_bytes, 1), 0xFF)
        keep.append(raw)
        for name, off in dev.workspace.items():
            ptr[name] = ws.ctypes.data + off
        for spec in self.source.launches:
            maps = []
            for m in spec.tensor_maps:
                buf, raw = _aligned(MAP_BYTES, 0)
                buf[:] = np.frombuffer(emulated(m.copy, ptr[m.tensor]), np.uint8)
                keep.append(raw)
                maps.append(buf.ctypes.data)
            run_kernel(self.lib, spec.kernel, [ptr[p.tensor] for p in spec.params] +
                       [dims[d].ctypes.data for d in spec.dims] + maps,
                       spec.grid_at(sizes), spec.block, spec.smem_bytes, self.order)
        tensors = g.tensors()
        return {n: from_storage(outs[n], tensors[n].dtype).reshape(tensors[n].shape)
                for n in g.outputs}
