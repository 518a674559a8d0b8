"""Read the SASS of compiled kernels (no GPU needed) and count what matters for speed.

ptxas's resource report (nvcc.py) says how many registers a kernel uses and whether it spills,
but not *what* the machine code does. The questions that decide whether an emitted kernel can run
near the hardware's limits are answered only by the SASS, the instructions the GPU executes:

* **tensor cores**: does a tile matmul become ``HMMA`` (``mma.sync``, sm_80+) or ``HGMMA``
  (``wgmma``, sm_90) instructions, or scalar ``FFMA``/``HFMA2`` loops?
* **ldmatrix**: are tensor-core operands loaded from shared memory with ``LDSM``?
* **local memory**: do ``LDL``/``STL`` appear (register spills, or a per-thread array indexed at
  run time that ptxas could not keep in registers)? Local memory is as slow as global memory;
  ptxas's spill counters miss arrays that were placed in local memory from the start.
* **vector width**: are global loads and stores 128 bits wide (``LDG.E.128``, ``STG.E.128``) or
  narrower; are asynchronous copies (``cp.async`` = ``LDGSTS``) 16-byte ones?
* shared loads and stores (``LDS``, ``STS``, ``STSM``), barriers (``BAR``), TMA copies.

``sass_stats(text)`` compiles a .cu text to a cubin for one architecture (``compile_cubin``, i.e.
``compile_with_nvcc`` with ``host=False``), disassembles it with ``cuobjdump -sass``
(``disassemble``) and counts per kernel (:class:`SassStats`). cuobjdump comes with the CUDA
toolkit or from the ``nvidia-cuda-cuobjdump`` wheel (``pip install mirage_py[test]``); neither
needs a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from .errors import DisassemblyError, ToolMissing
from .nvcc import NvccResult, compile_with_nvcc

__all__ = ["SassStats", "CubinBuild", "find_cuobjdump", "compile_cubin", "disassemble",
           "parse_sass", "count_sass", "sass_stats"]

_HINT = ("cuobjdump not found: install the CUDA toolkit, or the nvidia-cuda-cuobjdump wheel "
         "(pip install 'mirage_py[test]'), or set CUOBJDUMP to its path")


def _wheel_tools(tool: str) -> list[Path]:
    """``tool`` in the NVIDIA wheels' layout: site-packages/nvidia/cu13/bin/<tool> (and the
    older nvidia/cuda_<tool>/bin/<tool>)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    out: list[Path] = []
    for base in map(Path, spec.submodule_search_locations):
        out += sorted(base.glob(f"cu*/bin/{tool}"), reverse=True)  # newest CUDA major first
        out.append(base / f"cuda_{tool}" / "bin" / tool)
    return out


def find_cuobjdump() -> str | None:
    """Path of cuobjdump: ``$CUOBJDUMP``, else on PATH, else from the nvidia-cuda-cuobjdump wheel,
    else the CUDA toolkit's default location; None when there is none."""
    env = os.environ.get("CUOBJDUMP")
    if env:
        return env
    cand = shutil.which("cuobjdump")
    if cand:
        return cand
    for p in [*_wheel_tools("cuobjdump"), Path("/usr/local/cuda/bin/cuobjdump")]:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def _require_cuobjdump() -> str:
    path = find_cuobjdump()
    if path is None:
        raise ToolMissing(_HINT)
    return path


class CubinBuild(NamedTuple):
    nvcc: NvccResult  # ptxas's per-kernel resources and the compiler's warnings
    path: Path  # the cubin


_ARCH = re.compile(r"sm_\d+a?")


def compile_cubin(text: str, arch: str = "sm_90", *, include_dirs: tuple[str, ...] = (),
                  extra: tuple[str, ...] = (), name: str = "kernels",
                  out_dir: str | Path | None = None) -> CubinBuild:
    """Compile the device code of ``text`` (a whole .cu file) to a cubin for ``arch``.

    The cubin is written to ``out_dir`` (``<name>.cubin``); without one, to a fresh temporary
    directory that the caller owns (remove ``path.parent`` when done). Raises ToolMissing without
    nvcc, CompileError when nvcc rejects the code."""
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ValueError(f"compile_cubin: arch must look like 'sm_90', got {arch!r}")
    if out_dir is None:
        out_dir = tempfile.mkdtemp(prefix="mirage_sass_")
    res = compile_with_nvcc(text, (arch,), include_dirs=include_dirs, host=False, extra=extra,
                            name=name, out_dir=out_dir)
    if res.output is None or not res.output.is_file():
        raise DisassemblyError(f"compile_cubin: nvcc reported success but wrote no cubin "
                               f"({res.output})")
    return CubinBuild(res, res.output)


# ---- parsing cuobjdump -sass ------------------------------------------------------------------

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_CODE_FOR = re.compile(r"^\s*code for (sm_\d+a?)\b")
# "/*0070*/   @!P0 LDG.E.128.CONSTANT R4, desc[UR6][R4.64] ;   /* 0x... */"
_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+([^;]*?)\s*;")


def _split_instruction(body: str) -> tuple[str, str]:
    """(mnemonic with modifiers, operands) of an instruction's text, predicate dropped."""
    body = body.strip().lstrip("{").rstrip("}").strip()  # dual-issue braces (old archs)
    toks = body.split(None, 1)
    if toks and toks[0].startswith("@"):  # @P0, @!P1, @UP0, @!PT
        toks = toks[1].split(None, 1) if len(toks) > 1 else []
    if not toks:
        return "", ""
    return toks[0], (toks[1] if len(toks) > 1 else "")


def _drop_padding(instrs: list[tuple[int, str, str]]) -> list[str]:
    """Mnemonics without the padding ptxas appends after the last instruction: a branch to
    itself (``BRA 0x110``) followed by NOPs."""
    while instrs and instrs[-1][1] == "NOP":
        instrs.pop()
    if instrs:
        addr, mnem, ops = instrs[-1]
        target = re.fullmatch(r"`?\(?(0x[0-9a-fA-F]+)\)?", ops.strip())
        if mnem == "BRA" and target and int(target.group(1), 16) == addr:
            instrs.pop()
    return [m for _, m, _ in instrs]


def parse_sass(text: str) -> dict[str, list[str]]:
    """Per-function instruction mnemonics (with modifiers: ``LDG.E.128.CONSTANT``) of
    ``cuobjdump -sass`` output, in address order, alignment padding dropped.

    Raises DisassemblyError when a function appears twice (a fatbin with several architectures:
    disassemble one cubin per architecture)."""
    funcs: dict[str, list[tuple[int, str, str]]] = {}
    cur: list[tuple[int, str, str]] | None = None
    arch = None
    for line in text.splitlines():
        m = _CODE_FOR.match(line)
        if m:
            arch, cur = m.group(1), None
            continue
        m = _FUNCTION.match(line)
        if m:
            name = m.group(1)
            if name in funcs:
                raise DisassemblyError(f"function {name!r} appears twice in the SASS (again for "
                                       f"{arch}): disassemble one cubin per architecture")
            cur = funcs[name] = []
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if m:
            mnem, ops = _split_instruction(m.group(2))
            if mnem:
                cur.append((int(m.group(1), 16), mnem, ops))
    return {name: _drop_padding(instrs) for name, instrs in funcs.items()}


def disassemble(cubin: str | Path | bytes) -> dict[str, list[str]]:
    """``cuobjdump -sass`` of a cubin (a path, or its bytes): per kernel, the instruction
    mnemonics with their modifiers (see :func:`parse_sass`)."""
    tool = _require_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cubin, (bytes, bytearray)):
            path = Path(tmp) / "code.cubin"
            path.write_bytes(bytes(cubin))
        else:
            path = Path(cubin)
            if not path.is_file():
                raise DisassemblyError(f"disassemble: no such file {str(path)!r}")
        try:
            res = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
        except OSError as e:
            raise ToolMissing(f"cannot run cuobjdump at {tool!r}: {e}. {_HINT}") from e
    if res.returncode:
        raise DisassemblyError(f"cuobjdump -sass {path.name} failed ({res.returncode}):\n"
                               f"{(res.stdout + res.stderr)[-4000:]}")
    return parse_sass(res.stdout)


# ---- counting ---------------------------------------------------------------------------------

_WIDTH_MODS = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}


def access_bits(mnemonic: str) -> int:
    """Bits one thread moves with a load or store: ``LDG.E.128.CONSTANT`` -> 128,
    ``STG.E.U16`` -> 16, ``LDG.E`` -> 32 (no width modifier means 32 bits)."""
    for mod in mnemonic.split(".")[1:]:
        if mod in _WIDTH_MODS:
            return _WIDTH_MODS[mod]
    return 32


@dataclass
class SassStats:
    """Instruction counts of one kernel's SASS (static counts: instructions in the code, not
    executions). Width dicts map bits per thread (128, 64, 32, 16, 8) to counts."""

    kernel: str
    instructions: int = 0  # all of them, alignment padding excluded
    hmma: int = 0  # warp-level tensor-core MMA (mma.sync)
    hgmma: int = 0  # warpgroup tensor-core MMA (wgmma, sm_90)
    ldsm: int = 0  # ldmatrix
    stsm: int = 0  # stmatrix (sm_90)
    ldl: int = 0  # local memory loads: spills or run-time indexed per-thread arrays
    stl: int = 0  # local memory stores
    lds: int = 0  # shared memory loads (ldmatrix excluded)
    sts: int = 0  # shared memory stores
    bar: int = 0  # barriers (__syncthreads and named barriers)
    tma: int = 0  # TMA bulk copies (UTMALDG, UTMASTG, UBLKCP)
    ldg: dict[int, int] = field(default_factory=dict)  # global loads by width
    ldgsts: dict[int, int] = field(default_factory=dict)  # cp.async global -> shared, by width
    stg: dict[int, int] = field(default_factory=dict)  # global stores by width
    opcodes: Counter = field(default_factory=Counter)  # every base opcode (before the first '.')

    @property
    def tensor_core(self) -> int:
        return self.hmma + self.hgmma

    @property
    def local_memory(self) -> int:
        return self.ldl + self.stl

    @property
    def global_loads_128(self) -> int:
        """128-bit global reads: LDG.128 and 16-byte cp.async (LDGSTS.128)."""
        return self.ldg.get(128, 0) + self.ldgsts.get(128, 0)

    @property
    def global_loads_narrow(self) -> int:
        return sum(self.ldg.values()) + sum(self.ldgsts.values()) - self.global_loads_128

    @property
    def global_stores_128(self) -> int:
        return self.stg.get(128, 0)

    @property
    def global_stores_narrow(self) -> int:
        return sum(self.stg.values()) - self.global_stores_128

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "instructions": self.instructions, "hmma": self.hmma,
                "hgmma": self.hgmma, "ldsm": self.ldsm, "stsm": self.stsm, "ldl": self.ldl,
                "stl": self.stl, "lds": self.lds, "sts": self.sts, "bar": self.bar,
                "tma": self.tma,
                "ldg": {str(k): v for k, v in sorted(self.ldg.items(), reverse=True)},
                "ldgsts": {str(k): v for k, v in sorted(self.ldgsts.items(), reverse=True)},
                "stg": {str(k): v for k, v in sorted(self.stg.items(), reverse=True)},
                "global_loads_128": self.global_loads_128,
                "global_loads_narrow": self.global_loads_narrow,
                "global_stores_128": self.global_stores_128,
                "global_stores_narrow": self.global_stores_narrow,
                "opcodes": dict(sorted(self.opcodes.items()))}


_SCALAR = {"HMMA": "hmma", "HGMMA": "hgmma", "LDSM": "ldsm", "STSM": "stsm", "LDL": "ldl",
           "STL": "stl", "LDS": "lds", "STS": "sts", "BAR": "bar", "UTMALDG": "tma",
           "UTMASTG": "tma", "UBLKCP": "tma"}
_BY_WIDTH = {"LDG": "ldg", "LDGSTS": "ldgsts", "STG": "stg"}


def count_sass(kernel: str, mnemonics: Iterable[str]) -> SassStats:
    """Count one kernel's instructions (mnemonics as :func:`parse_sass` returns them)."""
    st = SassStats(kernel)
    for m in mnemonics:
        base = m.split(".", 1)[0]
        st.instructions += 1
        st.opcodes[base] += 1
        if base in _SCALAR:
            attr = _SCALAR[base]
            setattr(st, attr, getattr(st, attr) + 1)
        elif base in _BY_WIDTH:
            d = getattr(st, _BY_WIDTH[base])
            bits = access_bits(m)
            d[bits] = d.get(bits, 0) + 1
    return st


def sass_stats(text: str, arch: str = "sm_90", *, include_dirs: tuple[str, ...] = (),
               extra: tuple[str, ...] = (), name: str = "kernels") -> dict[str, SassStats]:
    """Compile ``text`` (a whole .cu file) for ``arch``, disassemble it and count per kernel.
    Raises ToolMissing without nvcc or cuobjdump, CompileError when nvcc rejects the code."""
    _require_cuobjdump()  # fail before the seconds nvcc takes
    with tempfile.TemporaryDirectory() as tmp:
        build = compile_cubin(text, arch, include_dirs=include_dirs, extra=extra, name=name,
                              out_dir=tmp)
        funcs = disassemble(build.path)
    return {k: count_sass(k, v) for k, v in funcs.items()}
