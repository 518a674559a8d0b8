"""What it takes to launch one emitted kernel: shared by the C++ host launcher, the CuPy runtime
and the CPU emulator, so all three launch exactly the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..layout.tma import TmaCopy

DIM_PARAM = "mp_dim_"  # the parameter carrying a dim's size (codegen_cuda.cexpr.size_expr)


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
class TensorMapParam:
    """A TMA tensor map the launcher encodes for ``tensor`` (its device pointer, the copy's
    geometry) and passes by value after the pointer parameters."""

    tensor: str
    cname: str
    copy: TmaCopy

    def decl(self) -> str:
        return f"const __grid_constant__ mp_tensor_map {self.cname}"


@dataclass(frozen=True)
class LaunchSpec:
    kernel: str  # extern "C" name of the __global__ function
    op_index: int  # position of the kernel node in graph.ops
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory per block
    params: tuple[KernelParam, ...]
    # blocks per SM promised to ptxas (__launch_bounds__'s second argument; 0: not declared).
    # Declared as 1 when threads or shared memory allow only one resident block anyway: told
    # the thread count alone, ptxas may budget registers for more blocks than can ever be
    # resident (it held a 512-thread attention kernel with 128 KB of shared memory to 64
    # registers, and it spilled). Otherwise ptxas chooses.
    min_blocks: int = 0
    tensor_maps: tuple[TensorMapParam, ...] = ()  # TMA copies' maps, after the pointers
    # the dims whose sizes the kernel reads when it runs (a padded graph's masks: ugraph.bind),
    # passed as ``const int mp_dim_<name>`` after the pointers, before the maps
    dims: tuple[str, ...] = ()
    # per grid axis, None (the bucket's count, ``grid``) or a count computed at launch from the
    # valid sizes (codegen_cuda/extents.py: blocks wholly past them are left out)
    grid_counts: tuple[Any, Any, Any] = (None, None, None)

    @property
    def grid_dims(self) -> tuple[str, ...]:
        """The dims the launch reads to size the grid (host side; not kernel arguments)."""
        return tuple(sorted({n for c in self.grid_counts if c is not None for n in c.dims}))

    def grid_at(self, sizes: Mapping[str, int] | None) -> tuple[int, int, int]:
        """The grid of a launch at ``sizes`` (the bucket's grid where nothing is computed)."""
        return tuple(g if c is None else c.at(sizes or {})  # type: ignore[return-value]
                     for g, c in zip(self.grid, self.grid_counts))

    def grid_c(self, dim_value: Callable[[str], str]) -> tuple[str, str, str]:
        """The grid as C expressions (``dim_value(name)``: a dim's value in the launcher)."""
        return tuple(str(g) if c is None else c.c(dim_value)  # type: ignore[return-value]
                     for g, c in zip(self.grid, self.grid_counts))

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def signature(self) -> str:
        args = ",\n    ".join([p.decl() for p in self.params] +
                                [f"const int {DIM_PARAM}{d}" for d in self.dims] +
                                [p.decl() for p in self.tensor_maps])
        bounds = f"{self.threads}, {self.min_blocks}" if self.min_blocks else f"{self.threads}"
        return (f'extern "C" __global__ void __launch_bounds__({bounds})\n'
                f"{self.kernel}(\n    {args})")
