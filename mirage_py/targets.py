"""GPU targets as data: the limits that validity checks use and the figures cost models use.

Bandwidth and tensor-core figures are given twice: the datasheet value and the value measured in
practice (a large device-to-device copy reached about 3.0 TB/s on an H100 and 4.3 TB/s on an H200;
a large bf16 matmul about 790 TFLOP/s on both), which is what a cost model should believe. The A100
figures are those of the 80 GB SXM part (datasheet 2.04 TB/s, 312 TFLOP/s dense fp16/bf16).
TF32 tensor cores run at half the 16-bit rate (datasheets: 156 TFLOP/s dense on an A100, 495 on an
H100 SXM); ``tf32_flops`` takes the same 80-90% of it that the 16-bit figures see in practice. It
is what a float32 matmul or convolution gets where TF32 is allowed (cuDNN convolutions by
PyTorch's default); on a part without TF32 (Turing) it is the CUDA-core rate.

The parts of KernelBench's published timings (``h100_pcie``, ``a100_40gb``, ``l40s``, ``l4``,
``a10g``, ``a10``, ``t4``) come from their datasheets; their "measured" bandwidth and tensor rates
are scaled from the datasheet by what the measured parts reach, not measured.

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
    # ---- the GPUs of KernelBench's published timings (docs/learned.md), from datasheets;
    # "measured" bandwidth and tensor rates (16-bit and TF32) are the datasheet times the
    # fraction the a100 / h100 parts above reach (0.86-0.9 of bandwidth, 0.8 of tensor rate):
    # no one here has measured these parts.
    "h100_pcie": Target(  # H100 PCIe 80 GB (HBM2e), 350 W
        name="h100_pcie", arch="sm_90", sm_count=114, smem_per_block=227 * KB,
        smem_per_sm=228 * KB, regs_per_sm=65536, l2_bytes=50 * 1024 * KB,
        mem_bw_datasheet=2.0e12, mem_bw=1.8e12,
        tc_flops_datasheet=756e12, tc_flops=605e12, fp32_flops=51.2e12, tf32_flops=302e12,
        launch_us=2.5, mem_latency_us=0.5, clock_ghz=1.755),
    "a100_40gb": Target(  # A100 SXM4 40 GB (HBM2)
        name="a100_40gb", arch="sm_80", sm_count=108, smem_per_block=163 * KB,
        smem_per_sm=164 * KB, regs_per_sm=65536, l2_bytes=40 * 1024 * KB,
        mem_bw_datasheet=1.555e12, mem_bw=1.34e12,
        tc_flops_datasheet=312e12, tc_flops=280e12, fp32_flops=19.5e12, tf32_flops=140e12,
        launch_us=3.0, mem_latency_us=0.6, clock_ghz=1.41),
    "l40s": Target(  # L40S 48 GB (GDDR6), Ada
        name="l40s", arch="sm_89", sm_count=142, smem_per_block=99 * KB, smem_per_sm=100 * KB,
        regs_per_sm=65536, l2_bytes=96 * 1024 * KB,
        mem_bw_datasheet=864e9, mem_bw=778e9,
        tc_flops_datasheet=362e12, tc_flops=290e12, fp32_flops=91.6e12, tf32_flops=146e12,
        launch_us=2.5, max_threads_per_sm=1536, max_blocks_per_sm=24, mem_latency_us=0.6,
        clock_ghz=2.52),
    "l4": Target(  # L4 24 GB (GDDR6), Ada, 72 W
        name="l4", arch="sm_89", sm_count=58, smem_per_block=99 * KB, smem_per_sm=100 * KB,
        regs_per_sm=65536, l2_bytes=48 * 1024 * KB,
        mem_bw_datasheet=300e9, mem_bw=270e9,
        tc_flops_datasheet=121e12, tc_flops=97e12, fp32_flops=30.3e12, tf32_flops=48e12,
        launch_us=2.5, max_threads_per_sm=1536, max_blocks_per_sm=24, mem_latency_us=0.6,
        clock_ghz=2.04),
    # A10G 24 GB (GDDR6), Ampere GA102, the AWS part: more SMs, fewer tensor cores (35 TFLOP/s
    # dense TF32 by its sheet, no faster in practice than its CUDA cores: tf32_flops = fp32)
    "a10g": Target(
        name="a10g", arch="sm_86", sm_count=80, smem_per_block=99 * KB, smem_per_sm=100 * KB,
        regs_per_sm=65536, l2_bytes=6 * 1024 * KB,
        mem_bw_datasheet=600e9, mem_bw=540e9,
        tc_flops_datasheet=70e12, tc_flops=56e12, fp32_flops=35e12, tf32_flops=35e12,
        launch_us=3.0, max_threads_per_sm=1536, max_blocks_per_sm=16, mem_latency_us=0.6,
        clock_ghz=1.71),
    "a10": Target(  # A10 24 GB (GDDR6), Ampere GA102
        name="a10", arch="sm_86", sm_count=72, smem_per_block=99 * KB, smem_per_sm=100 * KB,
        regs_per_sm=65536, l2_bytes=6 * 1024 * KB,
        mem_bw_datasheet=600e9, mem_bw=540e9,
        tc_flops_datasheet=125e12, tc_flops=100e12, fp32_flops=31.2e12, tf32_flops=50e12,
        launch_us=3.0, max_threads_per_sm=1536, max_blocks_per_sm=16, mem_latency_us=0.6,
        clock_ghz=1.695),
    "t4": Target(  # T4 16 GB (GDDR6), Turing: no TF32 (float32 matmuls on CUDA cores), 70 W
        name="t4", arch="sm_75", sm_count=40, smem_per_block=64 * KB, smem_per_sm=64 * KB,
        regs_per_sm=65536, l2_bytes=4 * 1024 * KB,
        mem_bw_datasheet=320e9, mem_bw=288e9,
        tc_flops_datasheet=65e12, tc_flops=52e12, fp32_flops=8.1e12, tf32_flops=8.1e12,
        launch_us=3.0, max_threads_per_sm=1024, max_blocks_per_sm=16, mem_latency_us=0.6,
        clock_ghz=1.59),
}


def get_target(target: "str | Target") -> Target:
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[str(target).lower()]
    except KeyError:
        raise TargetError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}") from None
