"""The fixed part of every emitted .cu file: storage types, conversions, element-wise functions,
tensor maps and the tile matmuls. The CUDA lives in ``prelude.cuh`` (one marker line stands for
the wgmma wrappers this module generates); ``PRELUDE`` is that text, pasted into every emitted
file, so NVRTC compiles it without include paths.

Device tensors of float16 / bfloat16 are stored as 16-bit structs (``fp16_t`` / ``bf16_t``);
``to_float`` widens a stored value to fp32, ``store`` rounds an fp32 value to nearest-even into
a stored one -- the same rounding as :func:`mirage_py.lax.ops.storage_round`. Under
``MIRAGE_EMULATE`` (the CPU emulator, see emulator.py) the conversions are done in software.
"""

from __future__ import annotations

from pathlib import Path


def _wgmma_wrappers() -> str:
    """``wgmma_m64k16`` for N = 16, 32, 64 (accumulators ``float[N / 8][4]``) and fp16 / bf16
    operands: one ``wgmma.mma_async.m64nNk16`` each, scale-d 1 (accumulate), A K-major, B
    MN-major (trans-b 1). Written out by this loop rather than by hand: the six differ only in
    N, the type and the operand numbers."""
    out = []
    for ng in (2, 4, 8):
        for ctype, ptx in (("fp16_t", "f16"), ("bf16_t", "bf16")):
            n = 4 * ng
            regs = ", ".join(f"%{i}" for i in range(n))
            outs = ", ".join(f'"+f"(d[{j}][{q}])' for j in range(ng) for q in range(4))
            out.append(
                f"__device__ __forceinline__ void wgmma_m64k16(float (&d)[{ng}][4], "
                "unsigned long long da,\n"
                f"                                             unsigned long long db, {ctype}) {{\n"
                f'  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{n + 2}, 0; "\n'
                f'               "wgmma.mma_async.sync.aligned.m64n{8 * ng}k16.f32.{ptx}.{ptx} "\n'
                f'               "{{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 1; }}"\n'
                f"               : {outs}\n"
                f'               : "l"(da), "l"(db), "r"(1));\n'
                "}\n")
    return "".join(out)


_CUH = Path(__file__).with_name("prelude.cuh")
_MARKER = "// @WGMMA_WRAPPERS@"


def _load() -> str:
    """``prelude.cuh`` with the marker line replaced by the generated wgmma wrappers."""
    lines = _CUH.read_text().splitlines(keepends=True)
    out = [_wgmma_wrappers() if line.startswith(_MARKER) else line for line in lines]
    if sum(line.startswith(_MARKER) for line in lines) != 1:
        raise RuntimeError(f"{_CUH}: expected one {_MARKER} line")
    return "".join(out)


PRELUDE = _load()
