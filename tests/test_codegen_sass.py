"""The SASS reader (codegen_cuda/sass.py): nvcc compiles hand-written kernels with known machine
code -- inline-PTX mma.sync and ldmatrix, 16-byte vector loads, a 16-byte cp.async, a run-time
indexed per-thread array -- and the counts of ``cuobjdump -sass`` see HMMA, LDSM, LDG.E.128,
LDGSTS.128 and LDL/STL where they are, and none of them in a plain kernel. One nvcc call for all
kernels (nvcc costs seconds per file). The parser is also checked on canned SASS text."""

import pytest

from mirage_py.codegen_cuda.errors import DisassemblyError, ToolMissing
from mirage_py.codegen_cuda.nvcc import find_nvcc
from mirage_py.codegen_cuda.sass import (access_bits, compile_cubin, count_sass, disassemble,
                                         find_cuobjdump, parse_sass, sass_stats)

needs_tools = pytest.mark.skipif(find_nvcc() is None or find_cuobjdump() is None,
                                 reason="needs nvcc and cuobjdump")

KERNELS = r"""
#include <cstdint>

// (a) one tensor-core MMA fed by ldmatrix from shared memory
extern "C" __global__ void __launch_bounds__(32)
k_mma(const uint4* __restrict__ a, float* __restrict__ out) {
  __shared__ __align__(16) uint16_t tile[16 * 16 * 4];
  for (int i = threadIdx.x; i < 16 * 16 * 4 / 8; i += blockDim.x)
    reinterpret_cast<uint4*>(tile)[i] = a[i];
  __syncthreads();
  uint32_t r[4];
  const uint32_t addr =
      static_cast<uint32_t>(__cvta_generic_to_shared(tile + (threadIdx.x % 32) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[0]), "r"(r[1]));
  for (int j = 0; j < 4; ++j) out[threadIdx.x * 4 + j] = d[j];
}

// (b) 16-byte vector loads and stores
extern "C" __global__ void k_vec(const uint4* __restrict__ a, uint4* __restrict__ b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = a[i];
}

// 16-byte cp.async (global -> shared, bypassing L1)
extern "C" __global__ void __launch_bounds__(128)
k_cp_async(const uint4* __restrict__ a, uint4* __restrict__ b) {
  __shared__ __align__(16) uint4 buf[128];
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(buf + threadIdx.x));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(a + threadIdx.x));
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  b[threadIdx.x] = buf[127 - threadIdx.x];
}

// (c) a per-thread array indexed at run time: ptxas puts it in local memory
extern "C" __global__ void k_local(const float* __restrict__ a, const int* __restrict__ idx,
                                   float* __restrict__ out) {
  float buf[256];
  for (int i = 0; i < 256; ++i) buf[i] = 0.f;
  for (int i = 0; i < 64; ++i) buf[idx[i] & 255] += a[threadIdx.x * 64 + i];
  out[threadIdx.x] = buf[idx[threadIdx.x] & 255];
}

// none of the above
extern "C" __global__ void k_plain(const float* __restrict__ a, float* __restrict__ b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = a[i] * 2.0f;
}
"""


@pytest.fixture(scope="module")
def stats():
    return sass_stats(KERNELS, "sm_90", name="sass_probe")


@needs_tools
def test_all_kernels_are_found(stats):
    assert set(stats) == {"k_mma", "k_vec", "k_cp_async", "k_local", "k_plain"}
    assert all(s.instructions > 0 for s in stats.values())


@needs_tools
def test_mma_sync_and_ldmatrix_become_hmma_and_ldsm(stats):
    s = stats["k_mma"]
    assert s.hmma >= 1 and s.tensor_core == s.hmma + s.hgmma
    assert s.ldsm >= 1
    assert s.bar >= 1 and s.sts >= 1
    assert s.local_memory == 0


@needs_tools
def test_uint4_accesses_are_128_bit(stats):
    s = stats["k_vec"]
    assert s.ldg.get(128, 0) >= 1 and s.global_loads_128 >= 1 and s.global_loads_narrow == 0
    assert s.global_stores_128 >= 1 and s.global_stores_narrow == 0


@needs_tools
def test_cp_async_16_bytes_is_ldgsts_128(stats):
    s = stats["k_cp_async"]
    assert s.ldgsts.get(128, 0) >= 1 and s.global_loads_128 >= 1
    assert s.ldg == {}


@needs_tools
def test_dynamically_indexed_array_uses_local_memory(stats):
    s = stats["k_local"]
    assert s.ldl >= 1 and s.stl >= 1


@needs_tools
def test_plain_kernel_has_none_of_them(stats):
    s = stats["k_plain"]
    assert (s.hmma, s.hgmma, s.ldsm, s.ldl, s.stl, s.global_loads_128,
            s.global_stores_128, s.bar) == (0, 0, 0, 0, 0, 0, 0, 0)
    assert s.ldg == {32: 1} and s.stg == {32: 1}


@needs_tools
def test_compile_cubin_keeps_the_cubin(tmp_path):
    build = compile_cubin(KERNELS.split("// (b)")[0], "sm_80", out_dir=tmp_path, name="mma80")
    assert build.path == tmp_path / "mma80.cubin" and build.path.is_file()
    assert [r.kernel for r in build.nvcc.resources] == ["k_mma"]
    assert build.nvcc.resources[0].arch == "sm_80"
    funcs = disassemble(build.path.read_bytes())  # bytes work as well as a path
    assert count_sass("k_mma", funcs["k_mma"]).hmma >= 1


def test_bad_arguments():
    with pytest.raises(ValueError):
        compile_cubin("", "compute_90")
    if find_cuobjdump() is not None:
        with pytest.raises(DisassemblyError):
            disassemble("/nonexistent/kernels.cubin")


def test_missing_cuobjdump_is_reported(monkeypatch):
    import mirage_py.codegen_cuda.sass as sass
    monkeypatch.setattr(sass, "find_cuobjdump", lambda: None)
    with pytest.raises(ToolMissing, match="nvidia-cuda-cuobjdump"):
        sass.disassemble(b"\x7fELF")


CANNED = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

\tcode for sm_90

Fatbin elf code:
================
\tcode for sm_90
\t\tFunction : k_demo
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe20000000800 */
        /*0010*/               @P0 LDG.E.128.CONSTANT R4, desc[UR6][R4.64] ;  /* 0x0 */
        /*0020*/              @!P1 LDG.E.64 R8, desc[UR6][R2.64+0x8] ;    /* 0x0 */
        /*0030*/                   LDG.E.U16.CONSTANT R10, desc[UR6][R2.64] ;  /* 0x0 */
        /*0040*/                   LDG.E R11, desc[UR6][R2.64] ;           /* 0x0 */
        /*0050*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;  /* 0x0 */
        /*0060*/                   LDGSTS.E.64 [R3+0x10], desc[UR4][R4.64+0x10] ;  /* 0x0 */
        /*0070*/                   LDGDEPBAR ;                             /* 0x0 */
        /*0080*/                   DEPBAR.LE SB0, 0x0 ;                    /* 0x0 */
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;           /* 0x0 */
        /*00a0*/                   LDSM.16.M88.4 R12, [R0+UR4] ;           /* 0x0 */
        /*00b0*/                   LDSM.16.MT88.2 R16, [R0+UR4+0x200] ;    /* 0x0 */
        /*00c0*/                   HMMA.16816.F32 R20, R12, R16, R20 ;     /* 0x0 */
        /*00d0*/                   HMMA.16816.F32.BF16 R24, R12, R18, R24 ;  /* 0x0 */
        /*00e0*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;  /* 0x0 */
        /*00f0*/                   STL.64 [R1+0x8], R20 ;                  /* 0x0 */
        /*0100*/                   LDL R21, [R1+0xc] ;                     /* 0x0 */
        /*0110*/                   LDS.U.128 R4, [R0] ;                    /* 0x0 */
        /*0120*/                   STS [R0+0x4], R5 ;                      /* 0x0 */
        /*0130*/                   STG.E.128 desc[UR6][R2.64], R4 ;        /* 0x0 */
        /*0140*/                   STG.E.U16 desc[UR6][R2.64+0x10], R9 ;   /* 0x0 */
        /*0150*/                   NOP ;                                   /* 0x0 */
        /*0160*/                   EXIT ;                                  /* 0x0 */
        /*0170*/                   BRA 0x170;                              /* 0x0 */
        /*0180*/                   NOP;                                    /* 0x0 */
        /*0190*/                   NOP;                                    /* 0x0 */
\t\t..........


\t\tFunction : k_empty
        /*0000*/                   EXIT ;                                  /* 0x0 */
        /*0010*/                   BRA 0x10;                               /* 0x0 */
\t\t..........
"""


def test_parse_canned_sass():
    funcs = parse_sass(CANNED)
    assert list(funcs) == ["k_demo", "k_empty"]
    demo = funcs["k_demo"]
    assert demo[1] == "LDG.E.128.CONSTANT" and demo[2] == "LDG.E.64"  # predicates dropped
    assert demo[-2:] == ["NOP", "EXIT"]  # a NOP in the code stays, the padding goes
    assert funcs["k_empty"] == ["EXIT"]
    s = count_sass("k_demo", demo)
    assert s.instructions == 23
    assert (s.hmma, s.hgmma, s.tensor_core, s.ldsm) == (2, 1, 3, 2)
    assert (s.ldl, s.stl, s.local_memory) == (1, 1, 2)
    assert s.ldg == {128: 1, 64: 1, 16: 1, 32: 1}
    assert s.ldgsts == {128: 1, 64: 1}
    assert s.stg == {128: 1, 16: 1}
    assert (s.global_loads_128, s.global_loads_narrow) == (2, 4)
    assert (s.global_stores_128, s.global_stores_narrow) == (1, 1)
    assert (s.lds, s.sts, s.bar) == (1, 1, 1)
    assert s.opcodes["LDG"] == 4 and s.opcodes["LDGDEPBAR"] == 1
    doc = s.to_json()
    assert doc["ldg"] == {"128": 1, "64": 1, "32": 1, "16": 1} and doc["hmma"] == 2


def test_parse_rejects_a_function_twice():
    twice = CANNED + "\n\tcode for sm_80\n\t\tFunction : k_empty\n        /*0000*/  EXIT ;\n"
    with pytest.raises(DisassemblyError, match="k_empty"):
        parse_sass(twice)


def test_access_bits():
    assert access_bits("LDG.E.128.CONSTANT") == 128
    assert access_bits("LDG.E.CONSTANT") == 32
    assert access_bits("STG.E.64") == 64
    assert access_bits("LDG.E.S8") == 8
    assert access_bits("LDGSTS.E.BYPASS.LTC128B.128") == 128
