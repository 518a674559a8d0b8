// ---- mirage_py prelude: storage types, conversions, element-wise functions, tile matmul ----
struct __align__(2) fp16_t { unsigned short bits; };         // IEEE binary16 as stored
struct __align__(2) bf16_t { unsigned short bits; };         // bfloat16 as stored
struct __align__(4) tf32_t { unsigned int bits; };           // a float32 rounded to TF32
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
__device__ __forceinline__ void store(tf32_t* p, float v) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(p->bits) : "f"(v));
}
#else
__device__ __forceinline__ float to_float(fp16_t x) { return mp_emu::half_to_float(x.bits); }
__device__ __forceinline__ float to_float(bf16_t x) { return mp_emu::bf16_to_float(x.bits); }
__device__ __forceinline__ void store(fp16_t* p, float v) { p->bits = mp_emu::float_to_half(v); }
__device__ __forceinline__ void store(bf16_t* p, float v) { p->bits = mp_emu::float_to_bf16(v); }
__device__ __forceinline__ void store(tf32_t* p, float v) { p->bits = mp_emu::float_to_tf32(v); }
#endif
__device__ __forceinline__ float to_float(tf32_t x) { return __uint_as_float(x.bits); }
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  *static_cast<vec16_t*>(dst) = *static_cast<const vec16_t*>(src);
}
// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80+);
// cp_async_wait_all() before the barrier that publishes the tile
#ifndef MIRAGE_EMULATE
// the 32-bit shared-memory address of a generic pointer into shared memory
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
  unsigned int a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
               :: "r"(smem_addr(smem_dst)), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// software pipelines: close a group of copies; wait until at most N of the newest groups are
// still in flight (all older ones have landed)
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#else
inline void cp_async16(void* smem_dst, const void* global_src) { mp_emu::cp_async(smem_dst, global_src); }
inline void cp_async_wait_all() { mp_emu::cp_wait(-1); }
inline void cp_async_commit() { mp_emu::cp_commit(); }
template <int N> inline void cp_async_wait_group() { mp_emu::cp_wait(N); }
#endif
// ---- TMA (sm_90+): a tile fetched whole by cp.async.bulk.tensor, counted on an mbarrier ----
// A tensor map is 128 opaque bytes the driver encodes (cuTensorMapEncodeTiled); kernels take
// it as a __grid_constant__ parameter. Compiled for anything older than sm_90 (or with
// MIRAGE_NO_TMA) kernels take the cp.async path instead and ignore their maps.
#ifndef MIRAGE_EMULATE
struct __align__(128) mp_tensor_map { unsigned long long opaque[16]; };
#endif
#if defined(MIRAGE_EMULATE)
#if !defined(MIRAGE_NO_TMA)
#define MIRAGE_TMA 1
#endif
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(MIRAGE_NO_TMA)
#define MIRAGE_TMA 1
#endif
#if !defined(__CUDACC_RTC__) && !defined(MIRAGE_EMULATE)
// host launchers: a tensor map from the driver's cuTensorMapEncodeTiled, found through the
// runtime (no link against libcuda). Dims innermost first, byte strides of dims 1.., the box.
// Zeros where the kernels take the cp.async path and ignore their maps: built with
// MIRAGE_NO_TMA, or running on a device older than sm_90.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <string.h>
inline cudaError_t mp_encode_tensor_map(mp_tensor_map* map, int dtype, cuuint32_t rank,
                                        const void* address, const cuuint64_t* dims,
                                        const cuuint64_t* strides, const cuuint32_t* box,
                                        int swizzle) {
  memset(map, 0, sizeof *map);
#ifdef MIRAGE_NO_TMA
  (void)dtype, (void)rank, (void)address, (void)dims, (void)strides, (void)box, (void)swizzle;
  return cudaSuccess;
#else
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major < 9) return cudaSuccess;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                           cudaEnableDefault, &found);
#else
    err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
      return cudaErrorNotSupported;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
  CUtensorMap m;
  static_assert(sizeof(m) == sizeof(*map), "a tensor map is 128 bytes");
  if (encode(&m, static_cast<CUtensorMapDataType>(dtype), rank, const_cast<void*>(address), dims,
             strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
             static_cast<CUtensorMapSwizzle>(swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  memcpy(map, &m, sizeof m);
  return cudaSuccess;
#endif
}
#endif
#if defined(MIRAGE_TMA) && !defined(MIRAGE_EMULATE)
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// the initialised barriers become visible to the async proxy (TMA completes on them)
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// arrive once and expect `bytes` more of transactions in the current phase
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// wait until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
  const unsigned int a = smem_addr(bar);
  unsigned int done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
// the box of `map` at coordinates c (innermost first) into dst; completes `bytes` on bar
template <int R>
__device__ __forceinline__ void tma_load(void* dst, const mp_tensor_map& map,
                                         unsigned long long* bar, int c0, int c1 = 0,
                                         int c2 = 0, int c3 = 0, int c4 = 0) {
  const unsigned int d = smem_addr(dst), b = smem_addr(bar);
  const unsigned long long m = reinterpret_cast<unsigned long long>(&map);
  if constexpr (R == 1)
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3}], [%2];" :: "r"(d), "l"(m), "r"(b), "r"(c0) : "memory");
  else if constexpr (R == 2)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3, %4}], [%2];" :: "r"(d), "l"(m), "r"(b), "r"(c0), "r"(c1)
                 : "memory");
  else if constexpr (R == 3)
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3, %4, %5}], [%2];" :: "r"(d), "l"(m), "r"(b), "r"(c0), "r"(c1),
                 "r"(c2) : "memory");
  else if constexpr (R == 4)
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3, %4, %5, %6}], [%2];" :: "r"(d), "l"(m), "r"(b), "r"(c0),
                 "r"(c1), "r"(c2), "r"(c3) : "memory");
  else
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3, %4, %5, %6, %7}], [%2];" :: "r"(d), "l"(m), "r"(b), "r"(c0),
                 "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
#elif defined(MIRAGE_TMA)
// The emulator copies the box when a wait needs its phase, swizzling absolute addresses as the
// hardware does; a wait on a phase nobody armed fails the launch (it would hang on a GPU).
inline void mbar_init(unsigned long long* bar, unsigned int count) { mp_emu::mbar_init(bar, count); }
inline void mbar_fence_init() {}
inline void mbar_expect_tx(unsigned long long* bar, unsigned int bytes) {
  mp_emu::mbar_expect_tx(bar, bytes);
}
inline void mbar_wait(unsigned long long* bar, unsigned int parity) { mp_emu::mbar_wait(bar, parity); }
template <int R>
inline void tma_load(void* dst, const mp_tensor_map& map, unsigned long long* bar, int c0,
                     int c1 = 0, int c2 = 0, int c3 = 0, int c4 = 0) {
  const int c[5] = {c0, c1, c2, c3, c4};
  mp_emu::tma_load(dst, map, bar, R, c);
}
#endif
// One 16-byte global store, written as PTX: through a plain struct assignment NVVM may split
// the store into four 4-byte ones (it did in the combine kernels' savers).
#ifndef MIRAGE_EMULATE
__device__ __forceinline__ void st_global16(void* dst, const vec16_t& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
               :: "l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
#else
inline void st_global16(void* dst, const vec16_t& v) { *static_cast<vec16_t*>(dst) = v; }
#endif
// The j-th of the 16 / sizeof(T) values packed in a 16-byte vector (no union or local array:
// ptxas keeps everything in registers).
__device__ __forceinline__ unsigned int vec_word(const vec16_t& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}
__device__ __forceinline__ float vec_value(const vec16_t& v, int j, float) {
  return __uint_as_float(vec_word(v, j));
}
template <class T> __device__ __forceinline__ float vec_value(const vec16_t& v, int j, T) {
  T e;
  e.bits = static_cast<unsigned short>(vec_word(v, j / 2) >> (16 * (j % 2)));
  return to_float(e);
}
__device__ __forceinline__ unsigned int word_bits(float x) { return __float_as_uint(x); }
template <class T> __device__ __forceinline__ unsigned int word_bits(float lo, float hi, T) {
  T a, b;
  store(&a, lo);
  store(&b, hi);
  return a.bits | (static_cast<unsigned int>(b.bits) << 16);
}
// acc[0 .. 16 / sizeof(T)) += the values of one 16-byte global load (a tile folded into a sum).
template <class T>
__device__ __forceinline__ void add16(float* acc, const T* src) {
  const vec16_t v = *reinterpret_cast<const vec16_t*>(src);
#pragma unroll
  for (int j = 0; j < static_cast<int>(16 / sizeof(T)); ++j) acc[j] += vec_value(v, j, T{});
}
// Round 16 / sizeof(T) consecutive values to T and write them with one 16-byte store.
template <class T, class S>
__device__ __forceinline__ void store16(T* dst, const S* src) {
  vec16_t v;
  if constexpr (sizeof(T) == 4) {
    v.x = word_bits(to_float(src[0]));
    v.y = word_bits(to_float(src[1]));
    v.z = word_bits(to_float(src[2]));
    v.w = word_bits(to_float(src[3]));
  } else {
    v.x = word_bits(to_float(src[0]), to_float(src[1]), T{});
    v.y = word_bits(to_float(src[2]), to_float(src[3]), T{});
    v.z = word_bits(to_float(src[4]), to_float(src[5]), T{});
    v.w = word_bits(to_float(src[6]), to_float(src[7]), T{});
  }
  st_global16(dst, v);
}

// Division of tensor values: PTX div.full.f32 (full range, at most 2 ulp, no slow-path call;
// IEEE '/' calls a subroutine whose register saves go to local memory)
#ifndef MIRAGE_EMULATE
__device__ __forceinline__ float fdiv(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#else
inline float fdiv(float a, float b) { return a / b; }
#endif
__device__ __forceinline__ float silu(float x) { return fdiv(x, 1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }
__device__ __forceinline__ float relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }
// the operators of the op table as NumPy computes them (NaN propagates through maxf / minf,
// as through np.maximum / np.minimum; fmaxf would drop it)
__device__ __forceinline__ float maxf(float a, float b) { return a > b || a != a ? a : b; }
__device__ __forceinline__ float minf(float a, float b) { return a < b || a != a ? a : b; }
__device__ __forceinline__ float sigmoid(float x) { return fdiv(1.0f, 1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) {  // log(1 + e^x) without overflow
  return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
__device__ __forceinline__ float mish(float x) { return x * tanhf(softplus(x)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float leaky_relu(float x, float slope) {
  return x >= 0.0f ? x : slope * x;
}
__device__ __forceinline__ float powi(float x, int n) {  // x^n, n >= 0, square and multiply
  float r = 1.0f;
  for (; n; n >>= 1, x *= x)
    if (n & 1) r *= x;
  return r;
}
template <class T> __device__ __forceinline__ float round_to(float x) {  // storage rounding
  T t;
  store(&t, x);
  return to_float(t);
}

// C = A @ B for BATCH pairs of tiles in shared memory on CUDA cores (float32 products: a float32
// program's matmul, or a block that is not whole warps), row-major: A (M, K), B (K, N), C (BATCH,
// M, N) fp32; a_off(b) / b_off(b) give the element offset of the operands' b-th matrix (0 for an
// operand broadcast over the batch; NoOffset for one pair). With ACCUMULATE the result is added
// to C (a for-loop accumulator). Each thread owns micro-tiles of TM x TN outputs (TM | M,
// TN | N): rows r0..r0+TM-1 and the columns c, c + N/TN, ... -- consecutive threads take
// consecutive columns, so B's reads are conflict-free and A's are broadcast -- and per k loads
// TM + TN values from shared memory for TM * TN FMAs held in registers.
template <int BATCH, int M, int N, int K, int THREADS, bool ACCUMULATE, int TM, int TN, class TA,
          class TB, class AOff, class BOff>
__device__ __forceinline__ void tile_fma(float* __restrict__ C, const TA* __restrict__ A,
                                         const TB* __restrict__ B, AOff a_off, BOff b_off) {
  static_assert(M % TM == 0 && N % TN == 0, "micro-tiles divide the output");
  constexpr int NC = N / TN, UNITS = BATCH * (M / TM) * NC;
  for (int u = threadIdx.x; u < UNITS; u += THREADS) {
    const int bt = u / ((M / TM) * NC), q = u % ((M / TM) * NC);
    const int r0 = q / NC * TM, c = q % NC;
    const TA* __restrict__ a = A + a_off(bt) + r0 * K;
    const TB* __restrict__ b = B + b_off(bt) + c;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      float av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = to_float(a[i * K + k]);
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = to_float(b[k * N + j * NC]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    float* __restrict__ Cb = C + bt * (M * N) + r0 * N + c;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        if (ACCUMULATE) Cb[i * N + j * NC] += acc[i][j]; else Cb[i * N + j * NC] = acc[i][j];
      }
  }
}
// ---- tensor cores: mma.sync m16n8k16 (fp16 / bf16 in, fp32 accumulate), ldmatrix ----
// Fragments of one warp (PTX ISA, mma.m16n8k16; lane = 4 g + t, g = lane / 4, t = lane % 4), two
// 16-bit values per 32-bit register, the lower column / k index in the low half:
//   A (16 x 16, row-major) a[0]: row g, cols 2t, 2t+1   a[1]: row g+8   a[2]: cols 2t+8, 2t+9
//                          a[3]: row g+8, cols 2t+8, 2t+9
//   B (16 x 8, k x n)      b[0]: k 2t, 2t+1, col g       b[1]: k 2t+8, 2t+9, col g
//   C (16 x 8, fp32)       c[0], c[1]: row g, cols 2t, 2t+1    c[2], c[3]: row g+8, same cols
template <class X, class Y> struct same_type { static constexpr bool value = false; };
template <class X> struct same_type<X, X> { static constexpr bool value = true; };

// Shared-memory swizzles map a tile's logical element offset to where it is stored.
struct NoSwizzle {
  static __device__ __forceinline__ int at(int o) { return o; }
};
// XOR swizzle (layout/swizzle.py): bits [M, M+B) of an offset ^= bits [M+S, M+S+B); groups of
// 2^M elements (16 bytes) stay whole, so cp.async and ldmatrix rows stay contiguous
template <int B, int M, int S> struct Swizzle {
  static __device__ __forceinline__ int at(int o) { return o ^ ((o >> S) & (((1 << B) - 1) << M)); }
};

// The 16 bits an mma operand of type E holds for a stored or computed value (rounded to E).
template <class E, class T> struct MmaBits {
  static __device__ __forceinline__ unsigned int of(T x) {
    E e;
    store(&e, to_float(x));
    return e.bits;
  }
};
template <class E> struct MmaBits<E, E> {
  static __device__ __forceinline__ unsigned int of(E x) { return x.bits; }
};

#ifndef MIRAGE_EMULATE
// lanes 0-7 / 8-15 / 16-23 / 24-31 give the row addresses (16 bytes each) of matrices 0 / 1 / 2 / 3
__device__ __forceinline__ void ldsm_x4(unsigned int (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
}
// transposed: lanes 0-7 / 8-15 give rows k of two 8 x 8 matrices of a row-major (k x n) tile
__device__ __forceinline__ void ldsm_x2_trans(unsigned int (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(row)));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned int (&a)[4],
                                         const unsigned int (&b)[2], fp16_t) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned int (&a)[4],
                                         const unsigned int (&b)[2], bf16_t) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// TF32 (PTX ISA, mma.m16n8k8 .tf32), one 32-bit value per register: A (16 x 8) a[0]: row g,
// col t   a[1]: row g+8, col t   a[2]: row g, col t+4   a[3]: row g+8, col t+4;  B (8 x 8)
// b[0]: k t, col g   b[1]: k t+4, col g;  C as for m16n8k16
__device__ __forceinline__ void mma1688(float (&c)[4], const unsigned int (&a)[4],
                                        const unsigned int (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
// The emulator follows the fragment layouts above literally: lanes trade addresses and registers
// through exchange slots (emulator.h), so a wrong index in the caller shows as a wrong result.
inline unsigned int half_pair(const void* p) {
  const unsigned short* h = static_cast<const unsigned short*>(p);
  return h[0] | (static_cast<unsigned int>(h[1]) << 16);
}
inline void ldsm_x4(unsigned int (&r)[4], const void* row) {
  mp_emu::xput(&row, sizeof row, __LINE__);
  const unsigned int lane = mp_emu::lane_id();
  for (int i = 0; i < 4; ++i) {
    const unsigned char* p;
    memcpy(&p, mp_emu::xpeer(i * 8 + lane / 4), sizeof p);
    r[i] = half_pair(p + 4 * (lane % 4));
  }
  mp_emu::xdone(__LINE__);
}
inline void ldsm_x2_trans(unsigned int (&r)[2], const void* row) {
  mp_emu::xput(&row, sizeof row, __LINE__);
  const unsigned int lane = mp_emu::lane_id();
  for (int i = 0; i < 2; ++i) {
    unsigned short h[2];
    for (int e = 0; e < 2; ++e) {
      const unsigned char* p;
      memcpy(&p, mp_emu::xpeer(i * 8 + 2 * (lane % 4) + e), sizeof p);
      memcpy(&h[e], p + 2 * (lane / 4), 2);
    }
    r[i] = half_pair(h);
  }
  mp_emu::xdone(__LINE__);
}
inline float mma_value(unsigned int bits, fp16_t) { return mp_emu::half_to_float(bits); }
inline float mma_value(unsigned int bits, bf16_t) { return mp_emu::bf16_to_float(bits); }
template <class E>
inline void mma16816(float (&c)[4], const unsigned int (&a)[4], const unsigned int (&b)[2], E) {
  unsigned int mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  mp_emu::xput(mine, sizeof mine, __LINE__);
  const unsigned int lane = mp_emu::lane_id(), g = lane / 4, t = lane % 4;
  auto half_of = [](const unsigned char* slot, int reg, int hi) {
    unsigned int r;
    memcpy(&r, slot + 4 * reg, 4);
    return hi ? r >> 16 : r & 0xffffu;
  };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const unsigned int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (unsigned int k = 0; k < 16; ++k) {
      const unsigned char* pa = mp_emu::xpeer((row % 8) * 4 + (k % 8) / 2);
      const unsigned char* pb = mp_emu::xpeer(col * 4 + (k % 8) / 2);
      const float x = mma_value(half_of(pa, (row >= 8) + 2 * (k >= 8), k % 2), E{});
      const float y = mma_value(half_of(pb, 4 + (k >= 8), k % 2), E{});
      s += x * y;
    }
    d[i] = s;
  }
  for (int i = 0; i < 4; ++i) c[i] = d[i];
  mp_emu::xdone(__LINE__);
}
inline void mma1688(float (&c)[4], const unsigned int (&a)[4], const unsigned int (&b)[2]) {
  unsigned int mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  mp_emu::xput(mine, sizeof mine, __LINE__);
  const unsigned int lane = mp_emu::lane_id(), g = lane / 4, t = lane % 4;
  auto reg_of = [](const unsigned char* slot, int reg) {
    unsigned int r;
    memcpy(&r, slot + 4 * reg, 4);
    return __uint_as_float(r);
  };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const unsigned int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (unsigned int k = 0; k < 8; ++k) {
      const float x = reg_of(mp_emu::xpeer((row % 8) * 4 + k % 4), (row >= 8) + 2 * (k >= 4));
      const float y = reg_of(mp_emu::xpeer(col * 4 + k % 4), 4 + (k >= 4));
      s += x * y;
    }
    d[i] = s;
  }
  for (int i = 0; i < 4; ++i) c[i] = d[i];
  mp_emu::xdone(__LINE__);
}
#endif
// k of one MMA: 16 for 16-bit operands, 8 for TF32
template <class E> struct MmaK { static constexpr int value = 16; };
template <> struct MmaK<tf32_t> { static constexpr int value = 8; };

// Tensor-core tile matmuls, C = A @ B for BATCH pairs of tiles in shared memory: A (M, K) and
// B (K, N) row-major in any storage type, C (BATCH, M, N) fp32. Operands are rounded to E (fp16_t
// or bf16_t: m16n8k16; tf32_t: m16n8k8 on float32 tiles, rounded by cvt.rna) -- exact for tiles
// stored as E -- and products accumulate in fp32. a_off(b) /
// b_off(b): element offset of the b-th operand matrix (0: broadcast); SA / SB: the operands'
// swizzles. The warps share out units of 16 x (8 NG) outputs; a unit's A fragment serves its NG
// column tiles. ldmatrix reads 16-bit E tiles whose sizes are multiples of the fragment; other
// tiles are read element by element with zeros past the edges. Every warp runs the same number
// of ROUNDS (a warp without a unit in the last one repeats the last unit and stores nothing), so
// the warp-collective instructions stay uniform over the block.
template <int BATCH, int M, int N, int K, int WARPS, int NG> struct MmaTiling {
  static constexpr int MT = (M + 15) / 16, NT = (N + 7) / 8, NB = NT / NG, KT = (K + 15) / 16;
  static constexpr int UNITS = BATCH * MT * NB, ROUNDS = (UNITS + WARPS - 1) / WARPS;
  static_assert(NT % NG == 0, "NG must divide the column tiles");
  // the unit of this warp in round r (clamped), its batch index, first row and first column
  static __device__ __forceinline__ int unit(int r) {
    const int u = r * WARPS + static_cast<int>(threadIdx.x) / 32;
    return u < UNITS ? u : UNITS - 1;
  }
  static __device__ __forceinline__ bool owns(int r) {
    return r * WARPS + static_cast<int>(threadIdx.x) / 32 < UNITS;
  }
  static __device__ __forceinline__ int batch(int u) { return u / (MT * NB); }
  static __device__ __forceinline__ int row0(int u) { return (u / NB) % MT * 16; }
  static __device__ __forceinline__ int col0(int u) { return u % NB * NG * 8; }
};

// acc += the products of one k step (k0..k0+15) for the NG column tiles from c0: B fragments
// (ldmatrix.trans, or element by element) against this warp's A fragment a.
template <int N, int K, int NG, class E, class SB, class TB>
__device__ __forceinline__ void mma_k_step(float (&acc)[NG][4], const unsigned int (&a)[4],
                                           const TB* __restrict__ B, int k0, int c0, int lane) {
  constexpr bool LDSM_B = same_type<TB, E>::value && N % 8 == 0 && K % 16 == 0;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < NG; ++j) {
    const int n0 = c0 + j * 8;
    unsigned int b[2];
    if constexpr (same_type<E, tf32_t>::value) {  // one value per register: k t, t+4 of col g
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int k = k0 + t + 4 * r, col = n0 + g;
        b[r] = k < K && col < N ? MmaBits<E, TB>::of(B[SB::at(k * N + col)]) : 0u;
      }
      mma1688(acc[j], a, b);
    } else {
      if constexpr (LDSM_B) {
        ldsm_x2_trans(b, B + SB::at((k0 + lane % 16) * N + n0));
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int k = k0 + 2 * t + 8 * r, col = n0 + g;
          unsigned int lo = 0, hi = 0;
          if (k < K && col < N) lo = MmaBits<E, TB>::of(B[SB::at(k * N + col)]);
          if (k + 1 < K && col < N) hi = MmaBits<E, TB>::of(B[SB::at((k + 1) * N + col)]);
          b[r] = lo | (hi << 16);
        }
      }
      mma16816(acc[j], a, b, E{});
    }
  }
}

// acc += the products of one unit (rows m0.., columns c0..) over all of K.
template <int M, int N, int K, int NG, class E, class SA, class SB, class TA, class TB>
__device__ __forceinline__ void mma_unit(float (&acc)[NG][4], const TA* __restrict__ A,
                                         const TB* __restrict__ B, int m0, int c0) {
  constexpr int KS = MmaK<E>::value, KT = (K + KS - 1) / KS;
  constexpr bool LDSM_A = same_type<TA, E>::value && M % 16 == 0 && K % 16 == 0;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < KT * KS; k0 += KS) {
    unsigned int a[4];
    if constexpr (same_type<E, tf32_t>::value) {  // rows g, g+8; cols t, t+4
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + g + 8 * (r & 1), col = k0 + t + 4 * (r >> 1);
        a[r] = row < M && col < K ? MmaBits<E, TA>::of(A[SA::at(row * K + col)]) : 0u;
      }
    } else if constexpr (LDSM_A) {
      ldsm_x4(a, A + SA::at((m0 + lane % 16) * K + k0 + lane / 16 * 8));
    } else {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + g + 8 * (r & 1), col = k0 + 2 * t + 8 * (r >> 1);
        unsigned int lo = 0, hi = 0;
        if (row < M && col < K) lo = MmaBits<E, TA>::of(A[SA::at(row * K + col)]);
        if (row < M && col + 1 < K) hi = MmaBits<E, TA>::of(A[SA::at(row * K + col + 1)]);
        a[r] = lo | (hi << 16);
      }
    }
    mma_k_step<N, K, NG, E, SB>(acc, a, B, k0, c0, lane);
  }
}

// Fragment element i (0..3) of column tile j of the unit at (m0, c0) is C[row][col]:
template <int N> struct FragCoord {
  static __device__ __forceinline__ int row(int m0, int i) {
    return m0 + static_cast<int>(threadIdx.x) % 32 / 4 + 8 * (i / 2);
  }
  static __device__ __forceinline__ int col(int c0, int j, int i) {
    return c0 + j * 8 + 2 * (static_cast<int>(threadIdx.x) % 4) + i % 2;
  }
};

// C (+)= A @ B with C in shared memory (fp32).
template <int BATCH, int M, int N, int K, int WARPS, int NG, bool ACCUMULATE, class E,
          class SA = NoSwizzle, class SB = NoSwizzle, class TA, class TB, class AOff, class BOff>
__device__ __forceinline__ void tile_mma(float* __restrict__ C, const TA* __restrict__ A,
                                         const TB* __restrict__ B, AOff a_off, BOff b_off) {
  using T = MmaTiling<BATCH, M, N, K, WARPS, NG>;
  for (int r = 0; r < T::ROUNDS; ++r) {
    const int u = T::unit(r), bt = T::batch(u), m0 = T::row0(u), c0 = T::col0(u);
    float acc[NG][4];
#pragma unroll
    for (int j = 0; j < NG; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    mma_unit<M, N, K, NG, E, SA, SB>(acc, A + a_off(bt), B + b_off(bt), m0, c0);
    if (T::owns(r)) {
      float* __restrict__ Cb = C + bt * (M * N);
#pragma unroll
      for (int j = 0; j < NG; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = FragCoord<N>::row(m0, i), col = FragCoord<N>::col(c0, j, i);
          if (row < M && col < N) {
            if (ACCUMULATE) Cb[row * N + col] += acc[j][i]; else Cb[row * N + col] = acc[j][i];
          }
        }
    }
  }
}

// A for-loop accumulator kept in registers: acc[r] holds this warp's unit of round r.
// tile_mma_regs adds A @ B into it each iteration; frags_to_smem writes it out once, after the
// loop, for the epilogue.
template <int BATCH, int M, int N, int K, int WARPS, int NG, class E, class SA = NoSwizzle,
          class SB = NoSwizzle, class TA, class TB, class AOff, class BOff>
__device__ __forceinline__ void tile_mma_regs(
    float (&acc)[MmaTiling<BATCH, M, N, K, WARPS, NG>::ROUNDS][NG][4], const TA* __restrict__ A,
    const TB* __restrict__ B, AOff a_off, BOff b_off) {
  using T = MmaTiling<BATCH, M, N, K, WARPS, NG>;
#pragma unroll
  for (int r = 0; r < T::ROUNDS; ++r) {
    const int u = T::unit(r), bt = T::batch(u);
    mma_unit<M, N, K, NG, E, SA, SB>(acc[r], A + a_off(bt), B + b_off(bt), T::row0(u),
                                     T::col0(u));
  }
}
// acc (+)= A @ B where A is this warp's fp32 fragments `a` of a row tiling (units of 16 x K:
// the C fragments of a previous tile matmul, or values computed on them), rounded to E. The C
// fragment of columns 8j.. (rows g, g+8; columns 2t, 2t+1) is exactly the half of the A
// fragment for k = 8j.. of the same rows, so no fragment leaves its thread (FlashAttention-2's
// probabilities in registers). acc has the row tiling of the output (units of 16 x N), unit
// for unit the same warps and rows as `a`'s.
template <int BATCH, int M, int N, int K, int WARPS, class E, class SB = NoSwizzle, class TB,
          class BOff>
__device__ __forceinline__ void tile_mma_rega(
    float (&acc)[MmaTiling<BATCH, M, N, K, WARPS, N / 8>::ROUNDS][N / 8][4],
    const float (&a)[MmaTiling<BATCH, M, K, 16, WARPS, K / 8>::ROUNDS][K / 8][4],
    const TB* __restrict__ B, BOff b_off) {
  using T = MmaTiling<BATCH, M, N, K, WARPS, N / 8>;
  static_assert(K % 16 == 0, "whole k steps of A fragments");
  static_assert(!same_type<E, tf32_t>::value, "TF32 A fragments are not C fragments");
  auto pack = [](float lo, float hi) {
    return MmaBits<E, float>::of(lo) | (MmaBits<E, float>::of(hi) << 16);
  };
#pragma unroll
  for (int r = 0; r < T::ROUNDS; ++r) {
    const TB* Bb = B + b_off(T::batch(T::unit(r)));
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      const unsigned int f[4] = {pack(a[r][2 * kk][0], a[r][2 * kk][1]),
                                 pack(a[r][2 * kk][2], a[r][2 * kk][3]),
                                 pack(a[r][2 * kk + 1][0], a[r][2 * kk + 1][1]),
                                 pack(a[r][2 * kk + 1][2], a[r][2 * kk + 1][3])};
      mma_k_step<N, K, N / 8, E, SB>(acc[r], f, Bb, 16 * kk, 0, threadIdx.x % 32);
    }
  }
}
// Row sums of this warp's fp32 fragments `a` of a row tiling (units of 16 x K) into (or added
// into, ADD) out[batch * M + row]: each thread sums its columns of rows g and g+8, the four
// threads of a row meet by shuffles, and the first writes. Every warp runs every round (the
// shuffles need all lanes); only owners write.
template <int BATCH, int M, int K, int WARPS, bool ADD>
__device__ __forceinline__ void frag_row_sums(
    float* __restrict__ out, const float (&a)[MmaTiling<BATCH, M, K, 16, WARPS, K / 8>::ROUNDS][K / 8][4]) {
  using T = MmaTiling<BATCH, M, K, 16, WARPS, K / 8>;
#pragma unroll
  for (int r = 0; r < T::ROUNDS; ++r) {
    const int u = T::unit(r);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < K / 8; ++j) sum += a[r][j][2 * h] + a[r][j][2 * h + 1];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = FragCoord<K>::row(T::row0(u), 2 * h);
      if (T::owns(r) && threadIdx.x % 4 == 0 && row < M) {
        if (ADD) out[T::batch(u) * M + row] += sum;
        else out[T::batch(u) * M + row] = sum;
      }
    }
  }
}
template <int BATCH, int M, int N, int K, int WARPS, int NG, bool ADD = false>
__device__ __forceinline__ void frags_to_smem(
    float* __restrict__ C, const float (&acc)[MmaTiling<BATCH, M, N, K, WARPS, NG>::ROUNDS][NG][4]) {
  using T = MmaTiling<BATCH, M, N, K, WARPS, NG>;
#pragma unroll
  for (int r = 0; r < T::ROUNDS; ++r) {
    const int u = T::unit(r), m0 = T::row0(u), c0 = T::col0(u);
    if (!T::owns(r)) continue;
    float* __restrict__ Cb = C + T::batch(u) * (M * N);
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = FragCoord<N>::row(m0, i), col = FragCoord<N>::col(c0, j, i);
        if (row < M && col < N) {
          if (ADD) Cb[row * N + col] += acc[r][j][i];
          else Cb[row * N + col] = acc[r][j][i];
        }
      }
  }
}
struct NoOffset {
  __device__ __forceinline__ int operator()(int) const { return 0; }
};
// ---- warpgroup MMA (sm_90a): wgmma.mma_async m64nNk16, operands in shared memory ----
// A (M x K, K contiguous: "K-major") and B (K x N, N contiguous: "MN-major", transposed) are
// dense row-major tiles whose rows are one swizzle atom wide (32, 64 or 128 bytes) and stored
// with its canonical swizzle (Swizzle<B,3,3> on 16-bit element offsets = Swizzle<B,4,3> on
// bytes), at offsets aligned to 8 rows (the hardware swizzles absolute addresses). A matrix
// descriptor: start address, leading / stride byte offsets (>> 4) and the swizzle mode.
// Each warpgroup takes whole 64-row blocks; warp w of it holds rows 16 w .. 16 w + 15 of the
// block in the mma.sync C-fragment layout, so the accumulator is MmaTiling<.., NG = N / 8>'s.
// Compiled for anything but sm_90a the same template runs tile_mma_regs with that tiling.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(MIRAGE_EMULATE) && !defined(MIRAGE_NO_WGMMA))
#define MIRAGE_WGMMA 1
#endif
// swizzle mode of the descriptor for rows of `row_bytes` (32B: 3, 64B: 2, 128B: 1)
__device__ __forceinline__ constexpr unsigned long long wgmma_mode(int row_bytes) {
  return row_bytes == 128 ? 1ull : row_bytes == 64 ? 2ull : 3ull;
}
#if defined(MIRAGE_WGMMA) && !defined(MIRAGE_EMULATE)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// shared-memory writes by ordinary stores and cp.async become visible to the async proxy that
// wgmma reads through (each writer fences before the barrier that publishes the tile)
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// d (+)= A @ B for one 64 x N block: scale-d 1 (accumulate), A K-major, B MN-major
// @WGMMA_WRAPPERS@ (generated by prelude.py: one wgmma_m64k16 per N and operand type)
#elif defined(MIRAGE_WGMMA)
// The emulator decodes the descriptors as the hardware does -- canonical layouts of the swizzle
// modes, the XOR on (1024-byte aligned) addresses -- and each thread computes its own
// accumulator elements, so a wrong descriptor, layout or swizzle shows as a wrong result.
inline unsigned int smem_addr(const void* p) { return mp_emu::smem_offset(p); }
inline void wgmma_fence() {}
inline void wgmma_commit() {}
inline void wgmma_wait_all() {}
inline void fence_view_async_shared() {}
template <class E> inline float wgmma_read(unsigned int addr, int chunks) {
  addr = mp_emu::hw_swizzle(addr, chunks);
  E e;
  memcpy(&e, smem + addr, sizeof e);
  return to_float(e);
}
template <int NG, class E>
inline void wgmma_m64k16(float (&d)[NG][4], unsigned long long da, unsigned long long db, E) {
  constexpr int chunks_of[4] = {1, 8, 4, 2};  // 16-byte chunks per row by swizzle mode
  const unsigned int a0 = (da & 0x3FFF) << 4, a_sbo = ((da >> 32) & 0x3FFF) << 4;
  const unsigned int b0 = (db & 0x3FFF) << 4, b_lbo = ((db >> 16) & 0x3FFF) << 4,
                     b_sbo = ((db >> 32) & 0x3FFF) << 4;
  const int wa = chunks_of[da >> 62], wb = chunks_of[db >> 62];
  if (wa == 1 || wb == 1) abort();  // only the swizzled canonical layouts are generated
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = mp_emu::lane_id();
  for (int j = 0; j < NG; ++j)
    for (int q = 0; q < 4; ++q) {
      const int row = 16 * warp + lane / 4 + 8 * (q / 2), col = 8 * j + 2 * (lane % 4) + q % 2;
      float acc = 0.0f;
      for (int k = 0; k < 16; ++k) {
        // A, K-major: ((8, m), (16 B chunks)) : ((row bytes, SBO), 16 B)
        const unsigned int ea = a0 + (row % 8) * 16 * wa + (row / 8) * a_sbo + 2 * k;
        // B, MN-major: ((chunks, n), (8, k)) : ((16 B, LBO), (row bytes, SBO))
        const int c16 = col / 8;
        const unsigned int eb = b0 + (c16 % wb) * 16 + (c16 / wb) * b_lbo + (k % 8) * 16 * wb +
                                (k / 8) * b_sbo + 2 * (col % 8);
        acc += wgmma_read<E>(ea, wa) * wgmma_read<E>(eb, wb);
      }
      d[j][q] += acc;
    }
}
#else
__device__ __forceinline__ void fence_view_async_shared() {}  // no async proxy to feed
#endif
#ifdef MIRAGE_WGMMA
// a matrix descriptor: start address, leading / stride byte offsets (all >> 4), swizzle mode
__device__ __forceinline__ unsigned long long wgmma_desc(const void* p, unsigned int lbo,
                                                         unsigned int sbo, int row_bytes) {
  return static_cast<unsigned long long>((smem_addr(p) & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>(lbo >> 4) << 16) |
         (static_cast<unsigned long long>(sbo >> 4) << 32) | (wgmma_mode(row_bytes) << 62);
}
#endif
// Pin the accumulator registers at the wgmma fence and after the wait: without it NVVM may
// move their zeroing between fence and MMA, and ptxas then inserts waits that serialise the
// MMAs (notes C7517 / C7519)
template <int R, int NG>
__device__ __forceinline__ void wgmma_fence_operands(float (&acc)[R][NG][4]) {
#ifndef MIRAGE_EMULATE
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NG; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(acc[r][j][q])::"memory");
#endif
}
// acc (registers, MmaTiling<BATCH, M, N, K, WARPS, N / 8>) += A @ B by warpgroups
template <int BATCH, int M, int N, int K, int WARPS, class E, class SA, class SB,
          class AOff, class BOff>
__device__ __forceinline__ void tile_wgmma(
    float (&acc)[MmaTiling<BATCH, M, N, K, WARPS, N / 8>::ROUNDS][N / 8][4],
    const E* __restrict__ A, const E* __restrict__ B, AOff a_off, BOff b_off) {
#ifdef MIRAGE_WGMMA
  using T = MmaTiling<BATCH, M, N, K, WARPS, N / 8>;
  static_assert(M % 64 == 0 && WARPS % 4 == 0, "whole warpgroups, whole 64-row blocks");
  constexpr int RA = K * static_cast<int>(sizeof(E)), RB = N * static_cast<int>(sizeof(E));
  wgmma_fence_operands(acc);
  wgmma_fence();
#pragma unroll
  for (int r = 0; r < T::ROUNDS; ++r) {
    // whole warpgroups own a round or not; no branch at all when every warp owns every round
    // (a branch around wgmma makes ptxas serialise the MMAs)
    if (T::UNITS % WARPS != 0 && !T::owns(r)) continue;
    const int u = T::unit(r), bt = T::batch(u), m0 = T::row0(u) / 64 * 64;
    const E* a = A + a_off(bt) + m0 * K;
    const E* b = B + b_off(bt);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16)
      wgmma_m64k16(acc[r], wgmma_desc(a + k0, 16, 8 * RA, RA),
                   wgmma_desc(b + k0 * N, 16, 8 * RB, RB), E{});
  }
  wgmma_commit();
  wgmma_wait_all();
  wgmma_fence_operands(acc);
#else
  tile_mma_regs<BATCH, M, N, K, WARPS, N / 8, E, SA, SB>(acc, A, B, a_off, b_off);
#endif
}
// ---- end of prelude ----
