"""What it takes to launch one emitted kernel: shared by the C++ host launcher, the CuPy runtime
and the CPU emulator, so all three launch exactly the same way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelParam:
    tensor: str  # device tensor name in the kernel graph
    ctype: str  # storage type: fp16_t, bf16_t or float
    const: bool  # read-only (an input of the kernel)
    cname: str  # the parameter's name in the kernel's signature

    def decl(self) -> str:
        q = "const " if self.const else ""
        return f"{q}{self.ctype}* __restrict__ {self.cname}"


@dataclass(frozen=True)
class LaunchSpec:
    kernel: str  # extern "C" name of the __global__ function
    op_index: int  # position of the kernel node in graph.ops
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory per block
    params: tuple[KernelParam, ...]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def signature(self) -> str:
        args = ",\n    ".join(p.decl() for p in self.params)
        return (f'extern "C" __global__ void __launch_bounds__({self.threads})\n'
                f"{self.kernel}(\n    {args})")
