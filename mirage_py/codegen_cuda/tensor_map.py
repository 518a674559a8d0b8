"""Tensor maps of TMA copies (:class:`mirage_py.layout.tma.TmaCopy`), made at launch time
because they hold the tensor's device address.

* :func:`encode` asks the CUDA driver (``cuTensorMapEncodeTiled``, through ctypes; sm_90+
  devices, driver 12.0 or later) for the 128 opaque bytes a kernel's ``mp_tensor_map``
  parameter takes -- what the CuPy runtime passes.
* :func:`emulated` packs the geometry in the layout the CPU emulator's ``mp_tensor_map``
  reads (``emulator.h``).

The C++ launcher of an exported extension encodes its maps itself (``mp_encode_tensor_map`` in
prelude.cuh).
"""

from __future__ import annotations

import ctypes
import struct

from ..lax.ops import DTYPES
from ..layout.tma import TmaCopy
from .errors import ToolMissing

MAP_BYTES = 128
# CUtensorMapDataType of each storage dtype
DATA_TYPES = {"float16": 6, "float32": 7, "bfloat16": 9}
L2_PROMOTION_256B = 3
_ENCODE = None


def emulated(copy: TmaCopy, address: int) -> bytes:
    """The emulator's tensor map: base, rank, element size, swizzle, then dims, byte strides
    (the innermost one the element size) and box, five each."""
    r = copy.rank
    eb = DTYPES[copy.dtype]
    pad5 = lambda xs: list(xs) + [0] * (5 - len(xs))  # noqa: E731
    raw = struct.pack("<Q4I5Q5Q5I", address, r, eb, copy.swizzle, 0, *pad5(copy.dims),
                      *pad5((eb, *copy.strides)), *pad5(copy.box))
    return raw + bytes(MAP_BYTES - len(raw))


def _encoder():
    global _ENCODE
    if _ENCODE is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuTensorMapEncodeTiled
        except (OSError, AttributeError) as e:
            raise ToolMissing("TMA needs the CUDA driver's cuTensorMapEncodeTiled "
                              "(libcuda.so.1, driver 12.0 or later)") from e
        u32, u64p, u32p = ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), \
            ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, u64p, u64p, u32p,
                       u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _ENCODE = fn
    return _ENCODE


def encode(copy: TmaCopy, address: int) -> bytes:
    """The driver's tensor map of ``copy`` over the tensor at device ``address``."""
    fn = _encoder()
    r = copy.rank
    out = (ctypes.c_uint8 * (MAP_BYTES + 128))()
    start = (-ctypes.addressof(out)) % 128  # CUtensorMap is alignas(128) in CUDA 13's cuda.h
    dims = (ctypes.c_uint64 * r)(*copy.dims)
    strides = (ctypes.c_uint64 * max(r - 1, 1))(*copy.strides)
    box = (ctypes.c_uint32 * r)(*copy.box)
    ones = (ctypes.c_uint32 * r)(*([1] * r))
    rc = fn(ctypes.addressof(out) + start, DATA_TYPES[copy.dtype], r, ctypes.c_void_p(address),
            dims, strides, box, ones, 0, copy.swizzle, L2_PROMOTION_256B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({rc}) for tile {copy.tile!r} of "
                           f"{copy.tensor!r}: dims {copy.dims}, strides {copy.strides}, box "
                           f"{copy.box}, swizzle mode {copy.swizzle}")
    return bytes(out[start:start + MAP_BYTES])
