"""The fixed part of every emitted .cu file: storage types, conversions, element-wise functions
and the tile matmul. It needs no header, so NVRTC compiles it without include paths.

Device tensors of float16 / bfloat16 are stored as 16-bit structs (``fp16_t`` / ``bf16_t``);
``to_float`` widens a stored value to fp32, ``store`` rounds an fp32 value to nearest-even into
a stored one -- the same rounding as :func:`mirage_py.lax.ops.storage_round`. Under
``MIRAGE_EMULATE`` (the CPU emulator, see emulator.py) the conversions are done in software.
"""

PRELUDE = r"""// ---- mirage_py prelude: storage types, conversions, element-wise functions, tile matmul ----
struct __align__(2) fp16_t { unsigned short bits; };         // IEEE binary16 as stored
struct __align__(2) bf16_t { unsigned short bits; };         // bfloat16 as stored
struct __align__(16) vec16_t { unsigned int x, y, z, w; };  // one 16-byte copy

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
#ifndef MIRAGE_EMULATE
__device__ __forceinline__ float to_float(fp16_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t x) {
  return __uint_as_float(static_cast<unsigned int>(x.bits) << 16);
}
__device__ __forceinline__ void store(fp16_t* p, float v) {
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(p->bits) : "f"(v));
}
__device__ __forceinline__ void store(bf16_t* p, float v) {
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(p->bits) : "f"(v));
}
#else
__device__ __forceinline__ float to_float(fp16_t x) { return mp_emu::half_to_float(x.bits); }
__device__ __forceinline__ float to_float(bf16_t x) { return mp_emu::bf16_to_float(x.bits); }
__device__ __forceinline__ void store(fp16_t* p, float v) { p->bits = mp_emu::float_to_half(v); }
__device__ __forceinline__ void store(bf16_t* p, float v) { p->bits = mp_emu::float_to_bf16(v); }
#endif
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  *static_cast<vec16_t*>(dst) = *static_cast<const vec16_t*>(src);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x / 1.41421356f)); }
__device__ __forceinline__ float relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }

// C = A @ B for tiles in shared memory, row-major: A (M, K), B (K, N), C (M, N) fp32. Products
// and sums in fp32; with ACCUMULATE the result is added to C (a for-loop accumulator). Thread t
// computes elements t, t + THREADS, ... of C. A tensor-core version replaces this function.
template <int M, int N, int K, int THREADS, bool ACCUMULATE, class TA, class TB>
__device__ __forceinline__ void tile_matmul(float* __restrict__ C, const TA* __restrict__ A,
                                            const TB* __restrict__ B) {
  for (int i = threadIdx.x; i < M * N; i += THREADS) {
    const TA* a = A + (i / N) * K;
    const TB* b = B + i % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(to_float(a[k]), to_float(b[k * N]), acc);
    if (ACCUMULATE) C[i] += acc; else C[i] = acc;
  }
}

// The same over BATCH tiles: C is (BATCH, M, N); a_off(b) / b_off(b) give the element offset of
// the operands' b-th matrix (0 for an operand broadcast over the batch).
template <int BATCH, int M, int N, int K, int THREADS, bool ACCUMULATE, class TA, class TB,
          class AOff, class BOff>
__device__ __forceinline__ void tile_matmul_batched(float* __restrict__ C, const TA* __restrict__ A,
                                                    const TB* __restrict__ B, AOff a_off,
                                                    BOff b_off) {
  for (int i = threadIdx.x; i < BATCH * M * N; i += THREADS) {
    const int bt = i / (M * N), mn = i % (M * N);
    const TA* a = A + a_off(bt) + (mn / N) * K;
    const TB* b = B + b_off(bt) + mn % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(to_float(a[k]), to_float(b[k * N]), acc);
    if (ACCUMULATE) C[i] += acc; else C[i] = acc;
  }
}
// ---- end of prelude ----
"""
