"""Compile device code with NVRTC directly (ctypes), as CuPy's RawModule does on a GPU machine.

NVRTC needs no GPU, so this checks on any machine that the device code the runtime hands to
NVRTC -- no include paths, no host code -- is accepted (the library comes with the CUDA
toolkit, or from the ``nvidia-cuda-nvrtc`` wheel).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

from .errors import CompileError, ToolMissing


def find_nvrtc() -> str | None:
    cands = [os.environ.get("MIRAGE_NVRTC")]
    try:
        import nvidia  # the nvidia-cuda-nvrtc wheel: nvidia/cu13/lib/libnvrtc.so.13
        for base in nvidia.__path__:
            cands += sorted(glob.glob(os.path.join(base, "cu*", "lib", "libnvrtc.so*")))
            cands += sorted(glob.glob(os.path.join(base, "cuda_nvrtc", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    for root in ("/usr/local/cuda/lib64", *sorted(glob.glob("/usr/local/cuda-*/lib64"))):
        cands += sorted(glob.glob(os.path.join(root, "libnvrtc.so*")))
    cands.append(ctypes.util.find_library("nvrtc"))
    for c in cands:
        if c and (os.path.exists(c) or not os.path.isabs(c)) and "builtins" not in c and \
                ".alt." not in c:
            try:
                ctypes.CDLL(c)
                return c
            except OSError:
                continue
    return None


def compile_with_nvrtc(code: str, arch: str = "compute_90",
                       options: tuple[str, ...] = ("--std=c++17",)) -> tuple[str, str]:
    """PTX and the compile log of ``code``; raises CompileError when NVRTC rejects it."""
    path = find_nvrtc()
    if path is None:
        raise ToolMissing("NVRTC not found (install the CUDA toolkit or the nvidia-cuda-nvrtc "
                          "wheel, or set MIRAGE_NVRTC)")
    # NVRTC dlopens libnvrtc-builtins by name: load the one beside it first
    for b in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
        if ".alt." not in b:
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()

    def check(rc: int, what: str) -> None:
        if rc:
            raise CompileError(f"NVRTC {what}: {lib.nvrtcGetErrorString(rc).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"mirage.cu", 0, None, None),
          "create")
    try:
        opts = [o.encode() for o in (*options, f"-arch={arch}")]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc:
            raise CompileError(f"NVRTC rejected the code ({arch}):\n{log[-6000:]}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, ptx), "get PTX")
        return ptx.value.decode(), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
