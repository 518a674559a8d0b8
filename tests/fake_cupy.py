"""A stand-in for CuPy on the CPU, so the GPU runtime's Python side (argument order, workspace
slices, output buffers, dtype and shape checks, dynamic shared memory) runs without a GPU:
arrays are NumPy arrays with a ``.data.ptr``, "NVRTC" builds the CPU emulator from the same
device code, and a kernel call runs it with the grid, block and shared memory the runtime
passes. Install with ``install(monkeypatch)``."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np

from mirage_py.codegen_cuda.emulator import build_emulator_code, run_kernel


class _Mem:
    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray(np.ndarray):
    @property
    def data(self):  # CuPy's MemoryPointer
        return _Mem(self.ctypes.data)


def _wrap(a) -> ndarray:
    return np.asarray(a).view(ndarray)


def empty(shape, dtype):
    return _wrap(np.empty(shape, dtype))


def zeros(shape, dtype):
    return _wrap(np.zeros(shape, dtype))


def full(shape, value, dtype):
    return _wrap(np.full(shape, value, dtype))


def asarray(a, dtype=None):
    return _wrap(np.asarray(a, dtype))


def ascontiguousarray(a):
    return _wrap(np.ascontiguousarray(a))


def from_dlpack(x):
    return _wrap(np.from_dlpack(x))


def asnumpy(a):
    return np.asarray(a).view(np.ndarray)


class RawKernel:
    def __init__(self, lib, name):
        self.lib, self.name = lib, name
        self.max_dynamic_shared_size_bytes = 48 * 1024
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        assert shared_mem <= self.max_dynamic_shared_size_bytes, "attribute not raised"
        self.calls.append((tuple(grid), tuple(block), shared_mem))
        # CuPy arrays by pointer; by-value structs (TMA maps) as NumPy arrays and ints (sizes)
        # as NumPy scalars, by address
        keep = [a if isinstance(a, (ndarray, np.ndarray)) else np.array(a) for a in args]
        ptrs = [a.data.ptr if isinstance(a, ndarray) else a.ctypes.data for a in keep]
        run_kernel(self.lib, self.name, ptrs, tuple(grid), tuple(block), shared_mem, order=1)


class RawModule:
    compiled = 0

    def __init__(self, code, options=()):
        self.code, self.options, self.lib = code, options, None

    def compile(self):
        RawModule.compiled += 1
        defines = [o[2:] for o in self.options if o.startswith("-D")]
        self.lib = ctypes.CDLL(str(build_emulator_code(self.code, defines)))

    def get_function(self, name):
        return RawKernel(self.lib, name)


class CUDARuntimeError(RuntimeError):
    pass


class CompileException(Exception):
    pass


def install(monkeypatch) -> types.ModuleType:
    mod = types.ModuleType("cupy")
    for name, val in dict(ndarray=ndarray, empty=empty, zeros=zeros, full=full, asarray=asarray,
                          ascontiguousarray=ascontiguousarray, from_dlpack=from_dlpack,
                          asnumpy=asnumpy, RawModule=RawModule, uint8=np.uint8,
                          uint16=np.uint16, int16=np.int16, uint32=np.uint32,
                          float16=np.float16, float32=np.float32).items():
        setattr(mod, name, val)
    mod.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, CUDARuntimeError=CUDARuntimeError),
        compiler=types.SimpleNamespace(CompileException=CompileException))
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod
