#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
using namespace cute;
// one 64x64x64 fp16 tile matmul on mma.sync m16n8k16 with ldmatrix, shared-memory operands
extern "C" __global__ void __launch_bounds__(128) tile(const half_t* A, const half_t* B, float* C) {
  __shared__ alignas(128) half_t sa[64 * 64];
  __shared__ alignas(128) half_t sb[64 * 64];
  for (int i = threadIdx.x; i < 64 * 64; i += 128) { sa[i] = A[i]; sb[i] = B[i]; }
  __syncthreads();
  auto tA = make_tensor(make_smem_ptr(sa), make_layout(make_shape(Int<64>{}, Int<64>{}), LayoutRight{}));
  auto tB = make_tensor(make_smem_ptr(sb), make_layout(make_shape(Int<64>{}, Int<64>{}), LayoutLeft{}));
  auto gC = make_tensor(make_gmem_ptr(C), make_layout(make_shape(Int<64>{}, Int<64>{}), LayoutRight{}));
  TiledMMA mma = make_tiled_mma(SM80_16x8x16_F32F16F16F32_TN{}, Layout<Shape<_2, _2, _1>>{});
  auto thr = mma.get_slice(threadIdx.x);
  auto rA = thr.partition_fragment_A(tA);
  auto rB = thr.partition_fragment_B(tB);
  auto rC = thr.partition_fragment_C(gC);
  clear(rC);
  auto cpA = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, half_t>{}, mma);
  auto sA = cpA.get_slice(threadIdx.x);
  copy(cpA, sA.partition_S(tA), sA.retile_D(rA));
  copy(thr.partition_B(tB), rB);
  gemm(mma, rA, rB, rC);
  copy(rC, thr.partition_C(gC));
}
