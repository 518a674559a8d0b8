"""GPU targets as data: the limits that validity checks use and the figures cost models use.

Bandwidth and tensor-core figures are given twice: the datasheet value and the value measured in
practice (a large device-to-device copy reached about 3.0 TB/s on an H100 and 4.3 TB/s on an H200;
a large bf16 matmul about 790 TFLOP/s on both), which is what a cost model should believe. The A100
figures are those of the 80 GB SXM part (datasheet 2.04 TB/s, 312 TFLOP/s dense fp16/bf16).
TF32 tensor cores run at half the 16-bit rate (datasheets: 156 TFLOP/s dense on an A100, 495 on an
H100 SXM); ``tf32_flops`` takes the same 80-90% of it that the 16-bit figures see in practice.

Per-SM limits (threads, blocks, registers, shared memory) are those of the CUDA occupancy
calculator for compute capability 8.0 and 9.0. ``smem_reserved_per_block`` is the shared memory
the driver keeps per resident block (1 KiB on sm_80 and later). ``mem_latency_us`` is the time of
one dependent global-memory round trip as a kernel sees it (DRAM latency plus issue and barrier,
about 800 cycles): a loop that loads, waits and computes cannot run faster than one of these per
iteration, whatever the bandwidth.
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
    regs_per_sm: int  # 32-bit registers per SM
    l2_bytes: int
    mem_bw_datasheet: float  # bytes/s
    mem_bw: float  # bytes/s, measured device-to-device copy
    tc_flops_datasheet: float  # dense fp16/bf16 tensor-core FLOP/s
    tc_flops: float  # measured large-matmul FLOP/s
    fp32_flops: float  # CUDA-core fp32 FLOP/s
    tf32_flops: float  # dense TF32 tensor-core FLOP/s, measured-practice value
    launch_us: float  # cost of one kernel launch on a stream, microseconds
    max_threads: int = 1024  # threads per block
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_blocks_per_sm: int = 32
    max_threads_per_sm: int = 2048
    regs_per_block: int = 65536
    regs_per_thread: int = 255
    smem_reserved_per_block: int = 1 * KB
    mem_latency_us: float = 0.5
    clock_ghz: float = 1.755  # boost clock, for converting cycle counts

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // 32

    @property
    def tma(self) -> bool:
        """Has the Tensor Memory Accelerator (cp.async.bulk.tensor): sm_90 and later."""
        return int(self.arch.split("_")[1].rstrip("a")) >= 90


TARGETS: dict[str, Target] = {
    "a100": Target(
        name="a100", arch="sm_80", sm_count=108, smem_per_block=163 * KB, smem_per_sm=164 * KB,
        regs_per_sm=65536, l2_bytes=40 * 1024 * KB,
        mem_bw_datasheet=2.039e12, mem_bw=1.75e12,
        tc_flops_datasheet=312e12, tc_flops=280e12, fp32_flops=19.5e12, tf32_flops=140e12,
        launch_us=3.0, mem_latency_us=0.6, clock_ghz=1.41),
    "h100": Target(
        name="h100", arch="sm_90", sm_count=132, smem_per_block=227 * KB, smem_per_sm=228 * KB,
        regs_per_sm=65536, l2_bytes=50 * 1024 * KB,
        mem_bw_datasheet=3.35e12, mem_bw=3.0e12,
        tc_flops_datasheet=989e12, tc_flops=790e12, fp32_flops=67e12, tf32_flops=395e12,
        launch_us=2.5, mem_latency_us=0.5, clock_ghz=1.98),
    "h200": Target(
        name="h200", arch="sm_90", sm_count=132, smem_per_block=227 * KB, smem_per_sm=228 * KB,
        regs_per_sm=65536, l2_bytes=50 * 1024 * KB,
        mem_bw_datasheet=4.8e12, mem_bw=4.3e12,
        tc_flops_datasheet=989e12, tc_flops=790e12, fp32_flops=67e12, tf32_flops=395e12,
        launch_us=2.5, mem_latency_us=0.5, clock_ghz=1.98),
}


def get_target(target: "str | Target") -> Target:
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[str(target).lower()]
    except KeyError:
        raise TargetError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}") from None
