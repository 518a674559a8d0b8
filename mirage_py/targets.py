"""GPU targets as data: the limits that validity checks use and the figures cost models use.

Bandwidth and tensor-core figures are given twice: the datasheet value and the value measured in
practice (a large device-to-device copy; a large bf16 matmul), which is what a cost model should
believe.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import TargetError

KB = 1024


@dataclass(frozen=True)
class Target:
    name: str
    arch: str  # nvcc arch, e.g. "sm_90"
    sm_count: int
    smem_per_block: int  # bytes of shared memory one block may use (opt-in maximum)
    smem_per_sm: int
    regs_per_sm: int
    l2_bytes: int
    mem_bw_datasheet: float  # bytes/s
    mem_bw: float  # bytes/s, measured device-to-device copy
    tc_flops_datasheet: float  # dense fp16/bf16 tensor-core FLOP/s
    tc_flops: float  # measured large-matmul FLOP/s
    fp32_flops: float  # CUDA-core fp32 FLOP/s
    launch_us: float  # cost of one kernel launch on a stream, microseconds
    max_threads: int = 1024
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_blocks_per_sm: int = 32


TARGETS: dict[str, Target] = {
    "a100": Target("a100", "sm_80", 108, 164 * KB, 164 * KB, 65536, 40 * 1024 * KB,
                   2.039e12, 1.75e12, 312e12, 280e12, 19.5e12, 3.0),
    "h100": Target("h100", "sm_90", 132, 227 * KB, 228 * KB, 65536, 50 * 1024 * KB,
                   3.35e12, 3.0e12, 989e12, 790e12, 67e12, 2.5),
    "h200": Target("h200", "sm_90", 132, 227 * KB, 228 * KB, 65536, 50 * 1024 * KB,
                   4.8e12, 4.3e12, 989e12, 790e12, 67e12, 2.5),
}


def get_target(target: "str | Target") -> Target:
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[str(target).lower()]
    except KeyError:
        raise TargetError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}") from None
