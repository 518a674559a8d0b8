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
#include <map>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

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
  bool spinning = false;  // yielded in a wait loop (an mbarrier wait), not at a barrier
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

// A thread that waits for something another thread has still to do (an mbarrier phase) yields
// without counting a barrier; the scheduler resumes such threads until none waits, and fails
// the launch when a whole pass of them changes nothing (the GPU would hang).
int g_error = 0;
long g_progress = 0;  // changes of mbarrier state (initialised, armed, copies landed)
// Asynchronous copies (cp.async, TMA) land at the wait that covers them in the forward and
// reverse orders -- a missing wait reads a stale tile -- and at issue in shuffled orders -- a
// copy that overwrites a buffer still being read (a missing barrier before a prefetch) shows.
bool g_eager = false;
size_t g_smem_bytes = 0;  // the launch's dynamic shared memory
inline void spin() {
  g_current->spinning = true;
  if (_setjmp(g_current->jb) == 0) _longjmp(g_sched, 1);
}
inline void fail(const char* what) {
  if (!g_error) fprintf(stderr, "mirage emulator: %s\n", what);
  g_error = 3;
}

// cp.async emulation: copies land when a wait_group covers their group (or at wait_all), or at
// issue in shuffled orders (g_eager).
inline void cp_async(void* dst, const void* src) {
  if (g_eager) {
    memcpy(dst, src, 16);
    return;
  }
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
// a float32 rounded to TF32 as cvt.rna.tf32.f32 does: to nearest, ties away from zero (the 13
// low mantissa bits cleared); inf and NaN as they are
inline unsigned int float_to_tf32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & 0xffffe000u;
}

// Run `kernel` (a call of the __global__ function with its arguments) over the whole grid.
// order: 0 forward, 1 reverse, >= 2 a shuffle seeded with `order`. Returns 0, or 1 when the
// threads of a block disagreed about barriers (waited at different __syncthreads() or shuffles).
int launch(dim3 grid, dim3 block, size_t smem_bytes, int order,
           const std::function<void()>& kernel);

}  // namespace
}  // namespace mp_emu

alignas(1024) static unsigned char smem[mp_emu::kSmemBytes];  // like a block's window

// The emulator's tensor map: the geometry itself (the driver's encoding is opaque); emulator.py
// packs it. Dims innermost first; strides in bytes, stride[0] the element size.
struct alignas(128) mp_tensor_map {
  const unsigned char* base;
  unsigned int rank, esize, swizzle, pad;  // swizzle: 0 none, 1 32B, 2 64B, 3 128B
  unsigned long long dim[5];
  unsigned long long stride[5];
  unsigned int box[5];
};
static_assert(sizeof(mp_tensor_map) == 128, "emulated tensor map layout");

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
// mbarriers (by shared-memory offset) and TMA copies in flight, per block
struct MBar {
  unsigned int count = 0, pending = 0;  // arrivals per phase, still to come in this one
  long long tx = 0;                     // transaction bytes still expected in this phase
  long phase = 0;                       // phases completed
};
struct TmaCopy {
  unsigned int bar, dst;
  int swizzle;
  size_t size;                       // bytes the copy completes on its mbarrier
  std::vector<unsigned char> bytes;  // read from global memory at issue; empty once written
};
std::map<unsigned int, MBar> g_mbars;
std::vector<TmaCopy> g_tma;

inline unsigned int smem_offset(const void* p) {
  return static_cast<unsigned int>(static_cast<const unsigned char*>(p) - smem);
}
// The hardware's swizzle modes (TMA's, wgmma's) on an absolute shared-memory byte address with
// `chunks` 16-byte chunks per row (1, 2, 4, 8): the chunk bits XOR the row bits 7..
// (Swizzle<B,4,3> on bytes)
inline unsigned int hw_swizzle(unsigned int addr, unsigned int chunks) {
  return addr ^ (((addr >> 7) & (chunks - 1u)) << 4);
}
inline MBar* mbar_at(const void* p) {
  auto it = g_mbars.find(smem_offset(p));
  if (it == g_mbars.end()) {
    fail("mbarrier used before mbarrier.init");
    return nullptr;
  }
  return &it->second;
}
inline void mbar_complete(MBar& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.phase++;
    b.pending = b.count;
  }
}
inline void mbar_init(void* bar, unsigned int count) {
  if (smem_offset(bar) % 8) fail("mbarrier not 8-byte aligned");
  MBar b;
  b.count = b.pending = count;
  g_mbars[smem_offset(bar)] = b;
  g_progress++;
}
inline void mbar_expect_tx(void* bar, unsigned int bytes) {
  MBar* b = mbar_at(bar);
  if (!b) return;
  if (b->pending == 0) return fail("mbarrier arrive with no arrival pending");
  b->tx += bytes;
  b->pending--;
  mbar_complete(*b);
  g_progress++;
}
// write a copy's box: dense in shared memory, swizzled by its absolute address (hw_swizzle)
inline void tma_write(TmaCopy& c) {
  if (c.dst + c.size > g_smem_bytes) return fail("TMA box beyond the launch's shared memory");
  for (const auto& kv : g_mbars)
    if (kv.first < c.dst + c.size && c.dst < kv.first + 8)
      return fail("TMA box overwrites an mbarrier");
  for (size_t o = 0; o < c.bytes.size(); ++o)
    smem[hw_swizzle(c.dst + static_cast<unsigned int>(o), 1u << c.swizzle)] = c.bytes[o];
  c.bytes.clear();
}
// complete the copies counted on `bar` (writing those not written at issue)
inline void tma_land(unsigned int bar) {
  std::vector<TmaCopy> keep;
  for (TmaCopy& c : g_tma) {
    if (c.bar != bar) {
      keep.push_back(std::move(c));
      continue;
    }
    tma_write(c);
    MBar& b = g_mbars[bar];
    b.tx -= static_cast<long long>(c.size);
    mbar_complete(b);
    g_progress++;
  }
  g_tma.swap(keep);
}
inline void tma_load(void* dst, const mp_tensor_map& m, void* bar, int rank, const int* c) {
  if (!mbar_at(bar)) return;
  if (static_cast<int>(m.rank) != rank || rank < 1 || rank > 5) return fail("TMA rank mismatch");
  if (smem_offset(dst) % 128) return fail("TMA destination not 128-byte aligned");
  if ((m.box[0] * m.esize) % 16) return fail("TMA box row not a multiple of 16 bytes");
  if (m.swizzle && m.box[0] * m.esize > (16u << m.swizzle)) return fail("TMA box wider than its swizzle");
  TmaCopy t;
  t.bar = smem_offset(bar);
  t.dst = smem_offset(dst);
  t.swizzle = static_cast<int>(m.swizzle);
  size_t n = m.esize;
  for (int d = 0; d < rank; ++d) n *= m.box[d];
  t.bytes.assign(n, 0);  // out-of-bounds elements read as zeros
  unsigned int j[5] = {0, 0, 0, 0, 0};
  for (size_t e = 0; e * m.esize < n; ++e) {
    bool inside = true;
    size_t src = 0;
    for (int d = 0; d < rank; ++d) {
      const long long g = static_cast<long long>(c[d]) + j[d];
      inside = inside && g >= 0 && g < static_cast<long long>(m.dim[d]);
      src += static_cast<size_t>(g) * m.stride[d];
    }
    if (inside) memcpy(&t.bytes[e * m.esize], m.base + src, m.esize);
    for (int d = 0; d < rank && ++j[d] == m.box[d]; ++d) j[d] = 0;
  }
  t.size = n;
  if (g_eager) tma_write(t);  // the bytes may land any time after issue: here at once
  g_tma.push_back(std::move(t));
}
inline void mbar_wait(void* bar, unsigned int parity) {
  for (;;) {
    MBar* b = mbar_at(bar);
    if (!b || g_error) return;
    if ((b->phase & 1) != static_cast<long>(parity & 1)) return;  // that phase has completed
    const size_t before = g_tma.size();
    tma_land(smem_offset(bar));
    if (g_tma.size() == before) spin();  // someone else has to arrive or issue first
  }
}

int launch(dim3 grid, dim3 block, size_t smem_bytes, int order,
                  const std::function<void()>& kernel) {
  if (smem_bytes > kSmemBytes) return 2;
  g_error = 0;
  g_eager = order >= 2;
  g_smem_bytes = smem_bytes;
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
          f.spinning = false;
        }
        g_mbars.clear();
        g_tma.clear();
        for (long round = 0;; ++round) {
          if (order >= 2) std::shuffle(seq.begin(), seq.end(), rng);
          bool alive = false;
          // every thread runs to its next barrier; threads that wait on an mbarrier phase are
          // resumed again until none waits (no change in a whole pass: they would hang)
          for (int pass = 0;; ++pass) {
            const long progress = g_progress;
            bool spun = false;
            for (unsigned int i : seq) {
              Fiber& f = g_fibers[i];
              if (f.done || (pass > 0 && !f.spinning)) continue;
              f.spinning = false;
              resume(f);
              spun = spun || f.spinning;
            }
            if (g_error) return g_error;
            if (!spun) break;
            if (pass > 0 && g_progress == progress) {
              fail("mbarrier wait that nothing will complete (the GPU would hang)");
              return g_error;
            }
          }
          for (unsigned int i = 0; i < n; ++i) alive = alive || !g_fibers[i].done;
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
