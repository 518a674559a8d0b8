"""Compile emitted CUDA with nvcc (no GPU needed) and read ptxas's resource report.

``compile_with_nvcc(text)`` builds one translation unit for several architectures in one nvcc
call (``-c``: device code for each arch plus the host launcher) with ``-Xptxas -v`` and returns
the per-kernel, per-arch resources ptxas reports: registers per thread, static shared memory,
stack frame, spill stores and loads, barriers. ``check_resources`` compares them with a target's
limits. With ``out_dir`` the compiled file (object, cubin or fatbin) is kept there and its path
is ``NvccResult.output`` (sass.py disassembles it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..targets import Target
from .errors import CompileError, ToolMissing
from .launch import LaunchSpec

ARCHS = ("sm_80", "sm_90")
MAX_REGISTERS = 255


@dataclass(frozen=True)
class KernelResources:
    kernel: str
    arch: str
    registers: int
    smem_static: int  # bytes; dynamic shared memory is the launch's smem_bytes
    stack_frame: int
    spill_stores: int
    spill_loads: int
    barriers: int


@dataclass
class NvccResult:
    resources: list[KernelResources]
    warnings: list[str]  # compiler diagnostics (nvcc, cudafe, host compiler, ptxas)
    seconds: float
    command: list[str] = field(default_factory=list)
    output: Path | None = None  # the compiled file, when compile_with_nvcc was given out_dir
    # ptxas's performance notes: "Potential Performance Loss" (such as serialised wgmma
    # instructions) and the C75xx notes on waits / arrives it injected around wgmma
    performance_notes: list[str] = field(default_factory=list)

    def for_kernel(self, kernel: str, arch: str) -> KernelResources:
        for r in self.resources:
            if r.kernel == kernel and r.arch == arch:
                return r
        raise KeyError((kernel, arch))


def find_nvcc() -> str | None:
    cand = os.environ.get("NVCC") or shutil.which("nvcc")
    if cand:
        return cand
    for p in ("/usr/local/cuda/bin/nvcc",):
        if os.path.exists(p):
            return p
    return None


def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include directory (for compiling host code that includes
    cuda_runtime.h with a plain C++ compiler)."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = find_nvcc()
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
    cands += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")), reverse=True)]
    for c in cands:
        if not c:
            continue
        for inc in (Path(c) / "include", Path(c) / "targets" / "x86_64-linux" / "include"):
            if (inc / "cuda_runtime.h").exists():
                return str(inc)
    return None


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BAR = re.compile(r"used (\d+) barriers")


def parse_ptxas(text: str) -> list[KernelResources]:
    """Per-kernel resources from ``ptxas -v`` output (as nvcc prints it)."""
    out: list[KernelResources] = []
    cur: dict | None = None

    def flush() -> None:
        if cur and "registers" in cur:
            out.append(KernelResources(cur["kernel"], cur["arch"], cur["registers"],
                                       cur.get("smem", 0), cur.get("frame", 0),
                                       cur.get("stores", 0), cur.get("loads", 0),
                                       cur.get("barriers", 0)))

    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            flush()
            cur = {"kernel": m.group(1), "arch": m.group(2)}
            continue
        if cur is None:
            continue
        m = _FRAME.search(line)
        if m:
            cur["frame"], cur["stores"], cur["loads"] = map(int, m.groups())
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            cur["smem"] = int(s.group(1)) if s else 0
            b = _BAR.search(line)
            cur["barriers"] = int(b.group(1)) if b else 0
    flush()
    return out


def _diagnostics(text: str) -> list[str]:
    return [ln for ln in text.splitlines()
            if re.search(r"\bwarning\b", ln, re.IGNORECASE) and "ptxas info" not in ln]


def compile_with_nvcc(text: str, archs: tuple[str, ...] = ARCHS, *,
                      include_dirs: tuple[str, ...] = (), host: bool = True,
                      extra: tuple[str, ...] = (), name: str = "kernels",
                      out_dir: str | Path | None = None) -> NvccResult:
    """Compile ``text`` (a whole .cu file) for ``archs``; raises CompileError on failure.

    ``host=False`` compiles device code only: a cubin for one arch, else a fatbin. The compiled
    file lives in a temporary directory and is deleted, unless ``out_dir`` names a directory to
    keep it in (created if needed; ``<name>.o`` / ``<name>.cubin`` / ``<name>.fatbin``), in which
    case ``NvccResult.output`` is its path."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise ToolMissing("nvcc not found (install the CUDA toolkit or set NVCC)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.cu"
        src.write_text(text)
        if out_dir is None:
            dest = Path(tmp) / (f"{name}.o" if host else f"{name}.bin")
        else:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            dest = Path(out_dir) / (f"{name}.o" if host else
                                    f"{name}.cubin" if len(archs) == 1 else f"{name}.fatbin")
        cmd = [nvcc, "-std=c++17", "-O3", "-Xptxas", "-v", "-Xcompiler", "-Wall,-Wextra"]
        for a in archs:
            cmd += ["-gencode", f"arch=compute_{a[3:]},code={a}"]
        for d in include_dirs:
            cmd += ["-I", d]
        cmd += list(extra)
        cmd += ["-c", str(src), "-o", str(dest)] if host else \
            ["--cubin" if len(archs) == 1 else "--fatbin", str(src), "-o", str(dest)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    log = res.stdout + res.stderr
    if res.returncode:
        raise CompileError(f"nvcc failed ({res.returncode}):\n{log[-6000:]}")
    return NvccResult(parse_ptxas(log), _diagnostics(log), seconds, cmd,
                      None if out_dir is None else dest,
                      [ln for ln in log.splitlines()
                       if "Potential Performance Loss" in ln or re.search(r"\(C75\d\d\)", ln)])


# the limits each arch is checked against
ARCH_TARGET = {"sm_80": "a100", "sm_90": "h100", "sm_90a": "h100"}


def check_resources(res: KernelResources, spec: LaunchSpec, target: Target,
                    max_spill_bytes: int = 0) -> list[str]:
    """Problems of one compiled kernel against ``target``'s limits (empty when it fits)."""
    bad = []
    if res.registers > MAX_REGISTERS:
        bad.append(f"{res.kernel} ({res.arch}): {res.registers} registers > {MAX_REGISTERS}")
    if res.registers * spec.threads > target.regs_per_sm:
        bad.append(f"{res.kernel} ({res.arch}): {res.registers} registers x {spec.threads} "
                   f"threads > {target.regs_per_sm} per SM")
    smem = res.smem_static + spec.smem_bytes
    if smem > target.smem_per_block:
        bad.append(f"{res.kernel} ({res.arch}): {smem} bytes shared memory > "
                   f"{target.smem_per_block}")
    if max(res.spill_stores, res.spill_loads) > max_spill_bytes:
        bad.append(f"{res.kernel} ({res.arch}): spills {res.spill_stores} bytes stored / "
                   f"{res.spill_loads} loaded (allowed {max_spill_bytes})")
    return bad
