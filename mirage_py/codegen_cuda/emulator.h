// CPU emulation of the CUDA subset that mirage_py's generated kernels use, so that the emitted
// code runs (slowly, exactly) on a machine without a GPU. Every CUDA thread of a block is a fiber
// (a stack made with ucontext once, switched with _setjmp/_longjmp: no system calls);
// __syncthreads() and warp shuffles switch fibers; blocks run one after another.
// Between barriers the fibers run in a chosen order (forward, reverse or shuffled), so a missing
// barrier shows up as a wrong result in one of the orders. Shared memory is poisoned (all bits
// set: NaN) at the start of every block.
#ifndef MIRAGE_EMULATOR_H
#define MIRAGE_EMULATOR_H
#define MIRAGE_EMULATE 1

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

// Everything has internal linkage (anonymous namespace, static): several emulator libraries
// loaded into one process must not share fibers or shared memory.
namespace mp_emu {
namespace {

constexpr size_t kSmemBytes = 256 * 1024;
constexpr size_t kStackBytes = 64 * 1024;

struct Fiber {
  ucontext_t ctx;  // only to start the fiber on its own stack
  jmp_buf jb;      // where the fiber continues
  bool started = false;
  dim3 tid;
  unsigned int linear = 0;
  bool done = false;
  long syncs = 0;
  int at = 0;  // source line of the barrier it waits at
  std::vector<char> stack;
  // cp.async copies in flight: the source bytes are read at issue, the destination written at
  // the wait that completes their group (so a missing wait shows as a stale tile)
  struct Copy {
    void* dst;
    unsigned char data[16];
    long group;
  };
  std::vector<Copy> copies;
  long committed = 0;  // groups committed so far; uncommitted copies carry group `committed`
};

jmp_buf g_sched;  // where the scheduler continues
std::vector<Fiber> g_fibers;
Fiber* g_current = nullptr;
dim3 g_block_idx, g_block_dim, g_grid_dim;
const std::function<void()>* g_body = nullptr;
std::vector<float> g_slots;
// Per-thread exchange slots for warp-collective tensor-core operations (ldmatrix, mma): a
// thread puts its operands, all threads meet, each reads its warp-mates' slots, all meet again.
constexpr size_t kSlotBytes = 64;
struct Slot {
  alignas(16) unsigned char b[kSlotBytes];
};
std::vector<Slot> g_xslots;

// A fiber runs the kernel once per block, forever: after each run it parks, and the scheduler
// wakes it for the next block (or launch) with fresh thread and block indices.
inline void fiber_main() {
  for (;;) {
    (*g_body)();
    g_current->done = true;
    if (_setjmp(g_current->jb) == 0) _longjmp(g_sched, 1);
  }
}

inline void sync(int line) {
  g_current->syncs++;
  g_current->at = line;
  if (_setjmp(g_current->jb) == 0) _longjmp(g_sched, 1);
}

inline void resume(Fiber& f) {
  g_current = &f;
  if (_setjmp(g_sched) == 0) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.ctx);
    }
    _longjmp(f.jb, 1);
  }
}

inline float shfl_xor(float v, int mask, int line) {
  const unsigned int me = g_current->linear;
  g_slots[me] = v;
  sync(-line);
  const float r = g_slots[me ^ static_cast<unsigned int>(mask)];
  sync(-line);
  return r;
}

// cp.async emulation: copies land when a wait_group covers their group (or at wait_all).
inline void cp_async(void* dst, const void* src) {
  Fiber::Copy c;
  c.dst = dst;
  memcpy(c.data, src, 16);
  c.group = g_current->committed;
  g_current->copies.push_back(c);
}
inline void cp_commit() { g_current->committed++; }
inline void cp_wait(long pending) {  // at most `pending` of the newest committed groups stay
  Fiber& f = *g_current;
  std::vector<Fiber::Copy> keep;
  for (const Fiber::Copy& c : f.copies) {
    if (pending < 0 || c.group < f.committed - pending) memcpy(c.dst, c.data, 16);
    else keep.push_back(c);
  }
  f.copies.swap(keep);
}

// Warp-collective exchange: every thread of the block calls xput / xpeer ... / xdone in the same
// order (the generated code keeps tensor-core calls block-uniform), like a barrier.
inline void xput(const void* data, size_t n, int line) {
  memcpy(g_xslots[g_current->linear].b, data, n);
  sync(-line);
}
inline const unsigned char* xpeer(unsigned int lane) {
  return g_xslots[(g_current->linear & ~31u) | (lane & 31u)].b;
}
inline void xdone(int line) { sync(-line); }
inline unsigned int lane_id() { return g_current->linear & 31u; }

struct HalfTable {  // every binary16 value as a float: widening is one load
  float v[65536];
  HalfTable() {
    for (unsigned int i = 0; i < 65536; ++i) {
      const unsigned short h = static_cast<unsigned short>(i);
      _Float16 x;
      memcpy(&x, &h, 2);
      v[i] = static_cast<float>(x);
    }
  }
};
const HalfTable g_half_table;
inline float half_to_float(unsigned short h) { return g_half_table.v[h]; }
inline unsigned short float_to_half(float f) {
  _Float16 x = static_cast<_Float16>(f);  // round to nearest even
  unsigned short h;
  memcpy(&h, &x, 2);
  return h;
}
inline float bf16_to_float(unsigned short b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned short float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

// Run `kernel` (a call of the __global__ function with its arguments) over the whole grid.
// order: 0 forward, 1 reverse, >= 2 a shuffle seeded with `order`. Returns 0, or 1 when the
// threads of a block disagreed about barriers (waited at different __syncthreads() or shuffles).
int launch(dim3 grid, dim3 block, size_t smem_bytes, int order,
           const std::function<void()>& kernel);

}  // namespace
}  // namespace mp_emu

alignas(1024) static unsigned char smem[mp_emu::kSmemBytes];  // like a block's window

#define threadIdx (mp_emu::g_current->tid)
#define blockIdx (mp_emu::g_block_idx)
#define blockDim (mp_emu::g_block_dim)
#define gridDim (mp_emu::g_grid_dim)
#define __syncthreads() mp_emu::sync(__LINE__)
#define __shfl_xor_sync(mask, v, lane_mask) mp_emu::shfl_xor((v), (lane_mask), __LINE__)
// libm's fmaf is a slow software routine without -mfma; multiply-add with two roundings is what
// the interpreter does too (the GPU fuses: results differ by an ulp here and there)
#define fmaf(a, b, c) ((a) * (b) + (c))

inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int i;
  memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}

namespace mp_emu {
namespace {
int launch(dim3 grid, dim3 block, size_t smem_bytes, int order,
                  const std::function<void()>& kernel) {
  if (smem_bytes > kSmemBytes) return 2;
  const unsigned int n = block.x * block.y * block.z;
  if (g_fibers.size() < n) g_fibers.resize(n);
  g_slots.assign(n, 0.0f);
  g_xslots.assign(n, Slot{});
  g_grid_dim = grid;
  g_block_dim = block;
  g_body = &kernel;
  std::vector<unsigned int> seq(n);
  for (unsigned int i = 0; i < n; ++i) seq[i] = i;
  if (order == 1) std::reverse(seq.begin(), seq.end());
  std::mt19937 rng(order);
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        g_block_idx = dim3{bx, by, bz};
        memset(smem, 0xff, smem_bytes);
        for (unsigned int i = 0; i < n; ++i) {
          Fiber& f = g_fibers[i];
          if (f.stack.empty()) {
            f.stack.resize(kStackBytes);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = nullptr;  // fiber_main never returns
            makecontext(&f.ctx, fiber_main, 0);
          }
          f.linear = i;
          f.tid = dim3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
          f.done = false;
          f.syncs = 0;
          f.copies.clear();
          f.committed = 0;
        }
        for (long round = 0;; ++round) {
          if (order >= 2) std::shuffle(seq.begin(), seq.end(), rng);
          bool alive = false;
          for (unsigned int i : seq) {
            Fiber& f = g_fibers[i];
            if (f.done) continue;
            resume(f);
            alive = alive || !f.done;
          }
          if (!alive) break;
          int at = 0;  // every waiting thread is at the same barrier
          for (unsigned int i = 0; i < n; ++i) {
            const Fiber& f = g_fibers[i];
            if (f.done) continue;
            if (f.syncs != round + 1 || (at != 0 && f.at != at)) return 1;
            at = f.at;
          }
        }
      }
  g_current = nullptr;
  return 0;
}
}  // namespace
}  // namespace mp_emu

#endif  // MIRAGE_EMULATOR_H
