// A CPU emulation of the CUDA device code our seeds' .cu files use, for correctness tests
// on a machine without a GPU. Not a simulator of timing, caches or memory ordering: every
// CUDA thread is an OS thread, a block's threads run together, blocks one after another
// (the blocks of a thread-block cluster together, clusters one after another), warp
// collectives exchange values through per-warp slots and a barrier, and asynchronous
// work (copies, wgmma) completes as late as the program allows. What it checks is the
// arithmetic and the indexing: which element goes where, every shared-memory access made
// through a shared address (the helpers below) inside the block's dynamic allocation (a
// fault, not silent corruption), routing, permutations, split-K counts, the fixups' last
// arrivals, the cluster's barriers around reads of another CTA's shared memory.
//
// The kernel file keeps its inline PTX in helpers guarded by #ifndef EVOKERNEL_EMULATION;
// this header provides those helpers (memory: smem_u32, cp_async16/4, cp_async_commit/wait,
// lds128, lds_f32, ldsm_x4, ldsm_x4_trans, bulk_copy and the mbarrier helpers
// (mbar_init, mbar_arrive_expect or mbar_expect_tx, mbar_wait); tensor cores: mma_fp8 or
// mma_e4m3, mma_bf16, mma_f16, the warpgroup MMA wgmma_m64n32k32_e4m3 with wgmma_fence,
// wgmma_commit, wgmma_wait_all (and wgmma_hold); barriers: named_sync_128 (bar.sync
// id, 128), cluster_sync and its halves cluster_arrive, cluster_wait; distributed shared
// memory: dsmem_load, dsmem_red_add, dsmem_atom_add, dsmem_store, dsmem_store_u16;
// conversions: to_e4m3x2,
// to_bf16, to_bf16x2, bf16_to_f32, e4m3x2_to_f16x2; counters: arrive_last, add_acq_rel,
// load_acquire; fences; dynamic_smem_bytes) and the CUDA built-ins the kernels call. The
// tensor-core fragments follow the PTX ISA's layouts (as CUTLASS's SM80 and SM90 MMA
// traits spell them), g = lane / 4, t = lane % 4:
//   m16n8k32, 8-bit: A a0 (row g, k 4t..4t+3), a1 (row g+8, same k), a2 (row g, k 16+4t..),
//            a3 (row g+8, k 16+4t..); B b0 (k 4t.., column g), b1 (k 16+4t..);
//   m16n8k16, 16-bit (bf16 or f16): A a0 (row g, k 2t, 2t+1), a1 (row g+8), a2 (row g,
//            k 2t+8, 2t+9), a3 (row g+8, k 2t+8..); B b0 (k 2t, 2t+1, column g), b1 (k 2t+8, 2t+9);
//   C 16x8:  c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1);
//   ldmatrix x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of
//            lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (.trans: rows
//            2(l%4), 2(l%4)+1 of column l/4);
//   wgmma m64nNk32, 8-bit, A and B K-major in shared memory: warp w of the warpgroup owns D
//            rows 16w..16w+15 as one 16x8 C fragment per 8 columns, d[4j..4j+3] for
//            columns 8j..8j+7 (CUTLASS's CLayout_64xN);
//   cvt.rn.f16x2.e4m3x2: the low byte to the low half.
// wgmma operands are read through their shared-memory matrix descriptors (start address,
// leading and stride byte offsets, swizzle; PTX ISA "Matrix Descriptor Format"): K-major
// without swizzle is 8-row x 16-byte core matrices, row r%8 at 16 (r%8) bytes, the 8-row
// groups SBO apart and the second 16 bytes of a row's 32-byte K slice LBO further; with the
// 128-byte swizzle rows are 128 bytes apart within a group and the 16-byte chunk bits 4-6
// of each address are XORed with its bits 7-9 (CUTLASS's Swizzle<3,4,3>), which needs the
// swizzle atom on a 1 KiB boundary (a descriptor whose atom is not, or with a base offset,
// traps; 32- and 64-byte swizzles and M/N-major operands are not modelled). Every product
// is summed in fp32 (Hopper's narrower fp8 accumulator is not modelled), and scale-d 0
// (D = A B) and 1 (D += A B) are both modelled.
// Asynchronous work lands late, as late as the program allows: a thread's cp.async
// copies of a committed group land at the cp.async.wait_group that retires the group
// (uncommitted ones only at the thread's exit), bulk copies at the first wait that sees
// their mbarrier's phase complete, and a wgmma reads its operands and writes its
// accumulators at the wgmma.wait_group that retires its commit group (until then the
// accumulators hold NaN, and shared memory changed before then is what it multiplies; one
// never waited for writes nothing);
// until then a copy's destination keeps what it held (NaN at first), so a stage read before
// its wait reads junk. A bulk copy counts down its mbarrier's expected bytes when issued;
// a wait whose phase never completes (expect_tx and the copies disagree) traps after
// 10 s, a named barrier after 60 s. A wgmma.mma_async needs a wgmma.fence since the
// thread's last wgmma.wait_group (the PTX rule is about the registers; this one is
// stricter and simpler).
// Shared memory: the dynamic window starts at shared address 128 (as if after 128 bytes
// of static shared memory: an alignment beyond 128 bytes is the kernel's to make) and
// holds 0xff junk at launch (NaN as bf16, fp16, fp32); a static __shared__ variable is the
// block's own (tests/workloads/cuda_emulation rewrites its declaration) and starts as junk
// too. Clusters (__cluster_dims__ on a declaration of the kernel): the blocks of a cluster
// run at once, cluster_sync is a barrier of all their threads (an exited thread no longer
// counts), and dsmem_load reads another CTA's shared memory as it was at the last
// cluster barrier (what is written after it is not seen until the next), so a read not
// preceded by a barrier reads junk; a read of a CTA that has exited, or an exit that no
// cluster barrier separates from another CTA's read, traps. Remote stores and red.add
// (any rank, the CTA's own too) land at the writing thread's next cluster barrier arrival
// (so a CTA sees them only after a barrier), remote atom.add at once (it returns the old
// value); they follow the same exit rules as reads, and a thread that exits with writes
// not yet landed traps. cluster_arrive counts the thread's arrival (its writes land) and
// cluster_wait joins the barrier, so a split barrier completes at the last wait, not the
// last arrival (later than on hardware; the snapshot dsmem_load reads is taken then, so it
// may hold what a CTA wrote between its arrival and its wait: not modelled strictly).
// Blocks of different clusters run one cluster after another (without __cluster_dims__ a
// block is a cluster of one), unless the whole grid is asked to run at once
// (emu_set_grid_at_once, `emulate(..., grid_at_once=True)`): then every block of a launch
// is in flight together, as a grid that fits in one wave is on a GPU, and kernels whose
// blocks wait for blocks outside their cluster (a spread merge) run too. A thread that
// keeps polling (__nanosleep) for 20 s traps, so a wait that can never end, or a grid run
// a cluster at a time that needs to run at once, fails instead of hanging.

#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <math.h>

#define EVOKERNEL_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

using std::max;
using std::min;

namespace emu {

struct Trap : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void trap(const std::string& why) { throw Trap(why); }

struct Slot {
    u32 v[8];
};

// A copy into shared memory not yet landed: from `source` (or zeros) to `destination`.
struct Copy {
    u32 destination;
    const void* source;  // nullptr: zero-fill
    u32 bytes;
};

struct Mbarrier {
    unsigned count = 0;       // arrivals a phase needs
    unsigned pending = 0;     // arrivals still missing in the current phase
    long long tx = 0;         // bytes announced and not yet copied
    unsigned completed = 0;   // phases completed
    std::vector<Copy> landing;  // bulk copies counted but not yet written
};

inline constexpr u32 dynamic_base = 128;  // the shared address of dynamic shared memory

// A barrier of `count` threads that traps, rather than hanging, when it never completes or
// when another thread of the launch has faulted (`abort`).
class TimedBarrier {
  public:
    TimedBarrier(unsigned count, const std::atomic<bool>* abort) : count_(count), abort_(abort) {}
    unsigned count() const { return count_; }
    void arrive_and_wait(const char* what) {
        std::unique_lock<std::mutex> hold(lock_);
        const unsigned long long phase = phase_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++phase_;
            released_.notify_all();
            return;
        }
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (phase_ == phase) {
            released_.wait_for(hold, std::chrono::milliseconds(50));
            if (phase_ != phase) break;
            if (abort_->load()) trap(std::string(what) + ": abandoned (another thread faulted)");
            if (std::chrono::steady_clock::now() > give_up)
                trap(std::string(what) + " never completed: " + std::to_string(arrived_) + " of " +
                     std::to_string(count_) + " threads arrived");
        }
    }

  private:
    std::mutex lock_;
    std::condition_variable released_;
    unsigned count_, arrived_ = 0;
    unsigned long long phase_ = 0;
    const std::atomic<bool>* abort_;
};

struct Cluster;

// One block in flight: its barriers, shared memory (dynamic and static) and warp exchange
// slots; in a cluster, its rank, what its shared memory held at the last cluster barrier,
// and when it was read from and exited (cluster epochs: barriers passed).
struct Block {
    std::mutex barrier_lock;
    std::vector<std::pair<u32, Mbarrier>> mbarriers;  // by shared address
    std::unique_ptr<std::barrier<>> block_barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
    std::unique_ptr<TimedBarrier> named[16];  // bar.sync id, count (id 0 is __syncthreads')
    std::vector<u8> shared;   // dynamic shared memory, at shared address dynamic_base
    struct Static {
        const void* key;
        std::unique_ptr<u8[]> storage;
        void* object;  // in `storage`, aligned as declared
    };
    std::vector<Static> statics;  // static __shared__ variables
    std::vector<Slot> slots;  // [warps][2][32]
    unsigned threads = 0;
    Cluster* cluster = nullptr;
    unsigned rank = 0;              // %cluster_ctarank
    std::vector<u8> published;      // `shared` at the last cluster barrier
    long long last_read = -1;       // latest epoch at which another CTA read `published`
    long long exited = -1;          // epoch at which its first thread exited
};

struct Publish {
    Cluster* cluster;
    void operator()() noexcept;
};

struct Cluster {
    std::vector<Block*> blocks;  // by rank
    std::mutex lock;             // remote reads and exits
    std::unique_ptr<std::barrier<Publish>> barrier;
    std::atomic<bool> abort{false};
};

inline void Publish::operator()() noexcept {
    for (Block* b : cluster->blocks) b->published = b->shared;
}

inline dim3 grid_dim, block_dim;
inline thread_local Block* block = nullptr;
inline thread_local dim3 thread_idx, block_idx;
inline thread_local unsigned collectives = 0;  // this lane's warp collectives so far
inline thread_local long long cluster_epoch = 0;  // cluster barriers this thread has passed
inline thread_local long long cluster_arrived = 0;  // cluster barriers this thread has arrived at
inline thread_local bool cluster_arrival_open = false;  // arrived (cluster_arrive), not yet waited
inline bool grid_at_once = false;  // every block of a launch in flight together
inline std::atomic<bool> launch_failed{false};  // a thread of the running launch faulted
inline constexpr auto POLL_LIMIT = std::chrono::seconds(20);
inline thread_local std::optional<std::chrono::steady_clock::time_point> polling_since;  // first __nanosleep

inline thread_local std::vector<Copy> open_group;                  // cp.async since the last commit
inline thread_local std::vector<std::vector<Copy>> committed;      // committed groups, oldest first

inline int lane() { return static_cast<int>(thread_idx.x & 31); }
inline int warp() { return static_cast<int>(thread_idx.x >> 5); }

// Every lane of the warp publishes `mine`; returns the 32 slots (valid until this lane's
// next collective but one: two slot sets alternate, and a lane passes the next barrier
// only once every lane is done reading).
inline const Slot* exchange(const Slot& mine) {
    Slot* set = &block->slots[(warp() * 2 + (collectives++ & 1)) * 32];
    set[lane()] = mine;
    block->warp_barriers[warp()]->arrive_and_wait();
    return set;
}

template <class T>
Slot pack(T value) {
    static_assert(sizeof(T) <= sizeof(Slot));
    Slot s{};
    std::memcpy(s.v, &value, sizeof(T));
    return s;
}
template <class T>
T unpack(const Slot& s) {
    T value;
    std::memcpy(&value, s.v, sizeof(T));
    return value;
}

inline float e4m3_to_float(u8 byte) {
    const int sign = byte >> 7, exponent = (byte >> 3) & 15, mantissa = byte & 7;
    if (exponent == 15 && mantissa == 7) return NAN;
    const float magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0f, -6)
                                          : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    return sign ? -magnitude : magnitude;
}

// Round to nearest even, saturating at +-448 (satfinite); NaN stays NaN.
inline u8 float_to_e4m3(float x) {
    if (std::isnan(x)) return 0x7f;
    const u8 sign = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7e;
    u8 best = 0;
    float best_error = INFINITY;
    for (int code = 0; code < 0x7f; ++code) {  // every finite magnitude, ascending
        const float v = e4m3_to_float(static_cast<u8>(code));
        const float error = std::fabs(v - a);
        if (error < best_error || (error == best_error && (code & 1) == 0)) {
            best = static_cast<u8>(code);
            best_error = error;
        }
    }
    return sign | best;
}

inline u16 float_to_bf16(float x) {
    u32 bits = std::bit_cast<u32>(x);
    if (std::isnan(x)) return static_cast<u16>((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return static_cast<u16>(bits >> 16);
}

inline float f16_to_float(u16 h) {
    const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
    float magnitude;
    if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    else magnitude = std::ldexp(1.0f + mantissa / 1024.0f, exponent - 15);
    return sign ? -magnitude : magnitude;
}

// Round to nearest even (overflow to infinity); NaN to the canonical 0x7fff.
inline u16 float_to_f16(float x) {
    if (std::isnan(x)) return 0x7fff;
    const u16 sign = std::signbit(x) ? 0x8000 : 0;
    const float a = std::fabs(x);
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < 0x1p-14f) return sign | static_cast<u16>(std::nearbyint(a * 0x1p24f));  // 0x400 if it rounds up
    int e;
    const float f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
    u32 mantissa = static_cast<u32>(std::nearbyint((2.0f * f - 1.0f) * 1024.0f));
    u32 exponent = static_cast<u32>(e + 14);
    if (mantissa == 1024) mantissa = 0, ++exponent;
    return sign | static_cast<u16>(exponent << 10 | mantissa);
}

inline u8* shared_at(u32 address, u32 bytes) {
    if (address < dynamic_base ||
        static_cast<size_t>(address - dynamic_base) + bytes > block->shared.size()) {
        trap("shared memory access at " + std::to_string(address) + " (+" + std::to_string(bytes) +
             ") outside the " + std::to_string(block->shared.size()) + " bytes the launch gave (from " +
             std::to_string(dynamic_base) + ")");
    }
    return block->shared.data() + (address - dynamic_base);
}

inline void* dynamic_shared() { return block->shared.data(); }

// The block's own instance of a static __shared__ variable (one per declaration and
// instantiation: `Key`), made on first use, holding junk.
template <class T, int Key, size_t Align>
T& block_static() {
    static_assert(std::is_trivially_default_constructible_v<T>, "static __shared__ of a trivial type");
    constexpr size_t align = max(max(Align, alignof(T)), size_t{16});
    static const char key = 0;
    std::lock_guard<std::mutex> hold(block->barrier_lock);
    for (const Block::Static& s : block->statics)
        if (s.key == &key) return *static_cast<T*>(s.object);
    std::unique_ptr<u8[]> storage(new u8[sizeof(T) + align]);
    void* object = storage.get() + (align - reinterpret_cast<uintptr_t>(storage.get()) % align) % align;
    std::memset(object, 0xff, sizeof(T));
    block->statics.push_back({&key, std::move(storage), object});
    return *static_cast<T*>(object);
}

// d (this lane's C fragment of a 16x8 tile: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t),
// c3 (g+8, 2t+1)) += sum over k < K of a_at(row, k) * b_at(k, col).
template <int K, class A, class B>
void accumulate_16x8(float (&d)[4], A a_at, B b_at) {
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float sum = 0.f;
        for (int k = 0; k < K; ++k) sum += a_at(row, k) * b_at(k, col);
        d[i] += sum;
    }
}

inline Mbarrier& mbarrier_at(u32 address) {  // under barrier_lock
    for (auto& [at, state] : block->mbarriers)
        if (at == address) return state;
    trap("mbarrier at " + std::to_string(address) + " used before mbarrier.init");
}

inline void land(const Copy& c) {
    u8* to = shared_at(c.destination, c.bytes);
    if (c.source) std::memcpy(to, c.source, c.bytes);
    else std::memset(to, 0, c.bytes);
}

// cp.async.wait_group n: every committed group but the n most recent lands.
inline void retire_groups(size_t keep) {
    while (committed.size() > keep) {
        for (const Copy& c : committed.front()) land(c);
        committed.erase(committed.begin());
    }
}

inline void settle(Mbarrier& m) {
    if (m.pending == 0 && m.tx == 0) {
        ++m.completed;
        m.pending = m.count;
    }
}

// -- warpgroup MMA ----------------------------------------------------------------------

// One wgmma.mma_async of this thread, not yet retired: its accumulator fragment (n/2
// registers at `d`), operand descriptors, scale-d, the immediate scales, and the
// fragment's value at issue (what scale-d 1 adds to).
struct Wgmma {
    float* d;
    int n;
    unsigned long long a, b;
    bool accumulate;
    float scale;  // imm-scale-a * imm-scale-b
    std::array<float, 128> c;
};
inline thread_local std::vector<Wgmma> wgmma_open;                    // since the last commit
inline thread_local std::vector<std::vector<Wgmma>> wgmma_committed;  // oldest first
inline thread_local bool wgmma_fenced = false;

// The shared address of byte `k` (< 32) of row `row` of a K-major 8-bit operand.
inline u32 kmajor_address(unsigned long long desc, int row, int k) {
    const u32 start = static_cast<u32>(desc & 0x3fff) << 4;
    const u32 lbo = static_cast<u32>((desc >> 16) & 0x3fff) << 4;
    const u32 sbo = static_cast<u32>((desc >> 32) & 0x3fff) << 4;
    const u32 base_offset = static_cast<u32>((desc >> 49) & 7);
    const u32 mode = static_cast<u32>(desc >> 62);
    const u32 group = static_cast<u32>(row / 8) * sbo;
    if (mode == 0) return start + group + 16u * (row % 8) + (k / 16) * lbo + k % 16;
    if (mode != 1) trap("wgmma: only no swizzle and the 128-byte swizzle are modelled");
    if (base_offset != 0 || ((start >> 7) & 7) != 0)
        trap("wgmma: a 128-byte-swizzled operand whose swizzle atom does not start on a 1 KiB "
             "boundary (base offset " + std::to_string(base_offset) + ", start " + std::to_string(start) + ")");
    const u32 address = start + group + 128u * (row % 8) + static_cast<u32>(k);
    return address ^ (((address >> 7) & 7) << 4);
}

// The retired wgmma's fragment: warp w of the warpgroup, lane 4g + t holds D rows 16w + g
// (+8) at columns 8j + 2t (+1): d[4j + 2h + c] = D[16w + g + 8h][8j + 2t + c].
inline void wgmma_land(const Wgmma& op) {
    const int wtid = static_cast<int>(thread_idx.x & 127);
    const int w = wtid / 32, g = (wtid % 32) / 4, t = wtid % 4;
    float a[2][32], b[64][32];
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 32; ++k)
            a[h][k] = e4m3_to_float(*shared_at(kmajor_address(op.a, 16 * w + g + 8 * h, k), 1));
    for (int j = 0; j < op.n / 8; ++j)
        for (int c = 0; c < 2; ++c)
            for (int k = 0; k < 32; ++k)
                b[2 * j + c][k] = e4m3_to_float(*shared_at(kmajor_address(op.b, 8 * j + 2 * t + c, k), 1));
    for (int i = 0; i < op.n / 2; ++i) {
        const int h = (i >> 1) & 1, col = 2 * (i >> 2) + (i & 1);
        float sum = 0.f;
        for (int k = 0; k < 32; ++k) sum += a[h][k] * b[col][k];
        op.d[i] = (op.accumulate ? op.c[i] : 0.f) + op.scale * sum;
    }
}

// wgmma.wait_group n: every committed group but the n most recent is computed now.
inline void wgmma_retire(size_t keep) {
    while (wgmma_committed.size() > keep) {
        for (const Wgmma& op : wgmma_committed.front()) wgmma_land(op);
        wgmma_committed.erase(wgmma_committed.begin());
    }
    wgmma_fenced = false;
}

// wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3 d, a-desc, b-desc, scale-d, sa, sb.
template <int N>
void wgmma_e4m3(float (&d)[N / 2], unsigned long long a, unsigned long long b, bool accumulate,
                int scale_a, int scale_b) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N a multiple of 8 up to 256");
    if ((thread_idx.x / 128 + 1) * 128 > block->threads) trap("wgmma outside a whole warpgroup");
    if (!wgmma_fenced) trap("wgmma.mma_async without a wgmma.fence since the last wgmma.wait_group");
    Wgmma op{d, N, a, b, accumulate, static_cast<float>(scale_a * scale_b), {}};
    for (int i = 0; i < N / 2; ++i) {
        op.c[i] = d[i];
        d[i] = NAN;  // undefined until the wait that retires it
    }
    wgmma_open.push_back(op);
}

// -- clusters ---------------------------------------------------------------------------

// `bytes` at shared address `address` of the cluster's CTA `rank`, as they were at the last
// cluster barrier (this CTA's own: as they are).
inline void remote_read(u32 address, u32 rank, void* out, u32 bytes) {
    Cluster& cluster = *block->cluster;
    if (rank >= cluster.blocks.size())
        trap("mapa to cluster rank " + std::to_string(rank) + " of a cluster of " +
             std::to_string(cluster.blocks.size()));
    Block& owner = *cluster.blocks[rank];
    if (&owner == block) {
        std::memcpy(out, shared_at(address, bytes), bytes);
        return;
    }
    std::lock_guard<std::mutex> hold(cluster.lock);
    if (owner.exited >= 0 && cluster_arrived >= owner.exited)
        trap("a read of the shared memory of cluster rank " + std::to_string(rank) +
             ", which has exited (no cluster barrier between the read and its exit)");
    owner.last_read = max(owner.last_read, cluster_arrived);
    if (address < dynamic_base || static_cast<size_t>(address - dynamic_base) + bytes > owner.shared.size())
        trap("distributed shared memory read at " + std::to_string(address) + " outside rank " +
             std::to_string(rank) + "'s allocation");
    if (owner.published.empty()) {  // no cluster barrier yet: what the launch left there
        std::memset(out, 0xff, bytes);
        return;
    }
    std::memcpy(out, owner.published.data() + (address - dynamic_base), bytes);
}

// Remote writes (st.shared::cluster, red.shared::cluster) of this thread not yet released
// by a cluster barrier arrival: they land in their CTA's shared memory at this thread's
// next arrival (as late as the program allows).
struct RemoteWrite {
    Block* owner;
    u32 address;
    u32 bytes;  // 2 or 4
    u32 value;
    bool add;   // red.add (u32) rather than a store
};
inline thread_local std::vector<RemoteWrite> remote_writes;

// The CTA of cluster rank `rank`, checked for an access of `bytes` at shared address
// `address` now (the epoch rules of remote_read); a CTA's own rank is itself.
inline Block& remote_owner(u32 address, u32 rank, u32 bytes, const char* what) {
    Cluster& cluster = *block->cluster;
    if (rank >= cluster.blocks.size())
        trap(std::string(what) + ": mapa to cluster rank " + std::to_string(rank) + " of a cluster of " +
             std::to_string(cluster.blocks.size()));
    Block& owner = *cluster.blocks[rank];
    if (address % bytes) trap(std::string(what) + " at an unaligned shared address");
    if (address < dynamic_base || static_cast<size_t>(address - dynamic_base) + bytes > owner.shared.size())
        trap(std::string(what) + " at " + std::to_string(address) + " outside rank " + std::to_string(rank) +
             "'s allocation");
    if (&owner != block) {
        std::lock_guard<std::mutex> hold(cluster.lock);
        if (owner.exited >= 0 && cluster_arrived >= owner.exited)
            trap(std::string(what) + " to the shared memory of cluster rank " + std::to_string(rank) +
                 ", which has exited (no cluster barrier between the access and its exit)");
        owner.last_read = max(owner.last_read, cluster_arrived);
    }
    return owner;
}

inline void remote_write(u32 address, u32 rank, u32 bytes, u32 value, bool add, const char* what) {
    Block& owner = remote_owner(address, rank, bytes, what);
    remote_writes.push_back({&owner, address, bytes, value, add});
}

// atom.shared::cluster.add.u32: at once (its old value is returned).
inline u32 remote_atomic_add(u32 address, u32 rank, u32 value) {
    Block& owner = remote_owner(address, rank, 4, "atom.shared::cluster");
    u32* at = reinterpret_cast<u32*>(owner.shared.data() + (address - dynamic_base));
    return std::atomic_ref<u32>(*at).fetch_add(value, std::memory_order_relaxed);
}

// At a cluster barrier arrival: this thread's remote writes land.
inline void release_remote_writes() {
    for (const RemoteWrite& w : remote_writes) {
        u8* at = w.owner->shared.data() + (w.address - dynamic_base);
        if (w.add) {
            std::atomic_ref<u32>(*reinterpret_cast<u32*>(at)).fetch_add(w.value, std::memory_order_relaxed);
        } else if (w.bytes == 4) {
            std::atomic_ref<u32>(*reinterpret_cast<u32*>(at)).store(w.value, std::memory_order_relaxed);
        } else {
            std::atomic_ref<u16>(*reinterpret_cast<u16*>(at)).store(static_cast<u16>(w.value),
                                                                     std::memory_order_relaxed);
        }
    }
    remote_writes.clear();
}

// A thread of this block exits at its epoch: no other CTA may still read this one.
inline void cluster_exit() {
    if (!remote_writes.empty())
        trap("a thread exited with distributed shared memory writes no cluster barrier released");
    if (cluster_arrival_open) trap("a thread exited between barrier.cluster.arrive and its wait");
    Cluster& cluster = *block->cluster;
    std::lock_guard<std::mutex> hold(cluster.lock);
    if (block->last_read >= cluster_epoch)
        trap("cluster rank " + std::to_string(block->rank) +
             " exited while another CTA could still read its shared memory (no cluster barrier "
             "between that read and the exit)");
    if (block->exited < 0 || cluster_epoch < block->exited) block->exited = cluster_epoch;
}

}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

// -- built-ins ---------------------------------------------------------------------------

[[noreturn]] inline void __trap() { emu::trap("__trap()"); }
inline void __syncthreads() { emu::block->block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::block->warp_barriers[emu::warp()]->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T>
T __shfl_sync(unsigned, T value, int source) {
    return emu::unpack<T>(emu::exchange(emu::pack(value))[source & 31]);
}
template <class T>
T __shfl_xor_sync(unsigned, T value, int mask) {
    return emu::unpack<T>(emu::exchange(emu::pack(value))[(emu::lane() ^ mask) & 31]);
}
template <class T>
T __shfl_up_sync(unsigned, T value, unsigned delta) {
    const emu::Slot* all = emu::exchange(emu::pack(value));
    return emu::lane() >= static_cast<int>(delta) ? emu::unpack<T>(all[emu::lane() - delta]) : value;
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    const emu::Slot* all = emu::exchange(emu::pack(predicate != 0));
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= emu::unpack<bool>(all[l]) ? 1u << l : 0u;
    return bits;
}
template <class T>
unsigned __match_any_sync(unsigned, T value) {
    const emu::Slot* all = emu::exchange(emu::pack(value));
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= emu::unpack<T>(all[l]) == value ? 1u << l : 0u;
    return bits;
}

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(unsigned x) { return x ? std::countr_zero(x) + 1 : 0; }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }

template <class T>
T atomicAdd(T* address, T value) {
    return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}

template <class T>
T atomicXor(T* address, T value) {
    return std::atomic_ref<T>(*address).fetch_xor(value, std::memory_order_relaxed);
}

template <class T>
T atomicExch(T* address, T value) {
    return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}

template <class T>
T __ldg(const T* p) { return *p; }
template <class T>
T __ldcg(const T* p) { return *p; }
template <class T>
void __stcg(T* p, T value) { *p = value; }

// -- the kernel files' PTX helpers ---------------------------------------------------------

inline u32 smem_u32(const void* p) {
    const u8* base = emu::block->shared.data();
    const u8* at = static_cast<const u8*>(p);
    if (at < base || at > base + emu::block->shared.size()) emu::trap("smem_u32 of a pointer outside dynamic shared memory");
    return emu::dynamic_base + static_cast<u32>(at - base);
}
inline void cp_async16(u32 dst, const void* src, bool valid = true) {
    emu::shared_at(dst, 16);
    if (dst % 16) emu::trap("cp.async 16 to an unaligned shared address");
    if (valid && reinterpret_cast<uintptr_t>(src) % 16) emu::trap("cp.async 16 from an unaligned global address");
    emu::open_group.push_back({dst, valid ? src : nullptr, 16});
}
inline void cp_async4(u32 dst, const void* src, bool valid) {
    emu::shared_at(dst, 4);
    if (dst % 4 || (valid && reinterpret_cast<uintptr_t>(src) % 4)) emu::trap("cp.async 4 at an unaligned address");
    emu::open_group.push_back({dst, valid ? src : nullptr, 4});
}
inline void cp_async_commit() {
    emu::committed.push_back(std::move(emu::open_group));
    emu::open_group.clear();
}
template <int N>
inline void cp_async_wait() {  // copies not committed yet belong to no group: not waited for
    emu::retire_groups(N);
}

inline uint4 lds128(u32 address) {
    if (address % 16) emu::trap("ld.shared.v4 at an unaligned address");
    uint4 v;
    std::memcpy(&v, emu::shared_at(address, 16), 16);
    return v;
}
inline float lds_f32(u32 address) {
    float v;
    std::memcpy(&v, emu::shared_at(address, 4), 4);
    return v;
}

// d += A(16x32 e4m3, row) * B(32x8 e4m3, col): the warp's fragments exchanged, each lane
// computing its own four outputs.
inline void mma_fp8(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    emu::Slot mine{};
    mine.v[0] = a0, mine.v[1] = a1, mine.v[2] = a2, mine.v[3] = a3, mine.v[4] = b0, mine.v[5] = b1;
    const emu::Slot* all = emu::exchange(mine);
    auto a_at = [&](int row, int k) {
        const emu::Slot& owner = all[4 * (row % 8) + (k % 16) / 4];
        const u32 reg = owner.v[(row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0)];
        return emu::e4m3_to_float(static_cast<u8>(reg >> (8 * (k % 4))));
    };
    auto b_at = [&](int k, int col) {
        const emu::Slot& owner = all[4 * col + (k % 16) / 4];
        const u32 reg = owner.v[4 + (k >= 16 ? 1 : 0)];
        return emu::e4m3_to_float(static_cast<u8>(reg >> (8 * (k % 4))));
    };
    emu::accumulate_16x8<32>(d, a_at, b_at);
}
inline void mma_e4m3(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    mma_fp8(d, a0, a1, a2, a3, b0, b1);
}

inline u32 to_e4m3x2(float lo, float hi) {
    return static_cast<u32>(emu::float_to_e4m3(lo)) | (static_cast<u32>(emu::float_to_e4m3(hi)) << 8);
}
inline u16 to_bf16(float x) { return emu::float_to_bf16(x); }
inline float bf16_to_f32(u32 bits16) { return std::bit_cast<float>(bits16 << 16); }

// cvt.rn.f16x2.e4m3x2 of the low 16 bits of w: byte 0 to the low half, byte 1 to the high
// (as cuda_fp8.hpp's host fallback of __nv_cvt_fp8x2_to_halfraw2 spells it); exact.
inline u32 e4m3x2_to_f16x2(u32 w) {
    return static_cast<u32>(emu::float_to_f16(emu::e4m3_to_float(static_cast<u8>(w)))) |
           (static_cast<u32>(emu::float_to_f16(emu::e4m3_to_float(static_cast<u8>(w >> 8)))) << 16);
}

inline bool arrive_last(u32* counter, u32 expected) {
    __syncwarp();
    u32 before = 0;
    if (emu::lane() == 0) {
        __threadfence();
        before = std::atomic_ref<u32>(*counter).fetch_add(1, std::memory_order_acq_rel);
    }
    before = __shfl_sync(0xffffffffu, before, 0);
    const bool last = before == expected - 1u;
    if (last) __threadfence();
    return last;
}

inline u32 dynamic_smem_bytes() { return static_cast<u32>(emu::block->shared.size()); }

inline u32 add_acq_rel(u32* counter, u32 add) {
    return std::atomic_ref<u32>(*counter).fetch_add(add, std::memory_order_acq_rel);
}
inline u32 load_acquire(const u32* counter) {
    return std::atomic_ref<u32>(*const_cast<u32*>(counter)).load(std::memory_order_acquire);
}
// Polling: yields; a thread polling for longer than emu::POLL_LIMIT since its first
// __nanosleep of the launch traps (a wait that never ends, here rather than a hang).
inline void __nanosleep(unsigned) {
    const auto now = std::chrono::steady_clock::now();
    if (!emu::polling_since) emu::polling_since = now;
    else if (emu::launch_failed)
        emu::trap("another block of the launch faulted while this one waited");
    else if (now - *emu::polling_since > emu::POLL_LIMIT)
        emu::trap("polled for more than 20 s: a wait that never ends (or blocks that must "
                  "run at once, launched without grid_at_once)");
    std::this_thread::yield();
}
inline void fence_proxy_async() {}
inline void fence_mbarrier_init() {}
inline void mbar_init_fence() {}

inline u32 to_bf16x2(float lo, float hi) {
    return static_cast<u32>(emu::float_to_bf16(lo)) | (static_cast<u32>(emu::float_to_bf16(hi)) << 16);
}

inline void mbar_init(u32 bar, u32 count) {
    std::lock_guard<std::mutex> hold(emu::block->barrier_lock);
    emu::shared_at(bar, 8);
    for (auto& [at, state] : emu::block->mbarriers)
        if (at == bar) {
            state = emu::Mbarrier{count, count, 0, 0};
            return;
        }
    emu::block->mbarriers.push_back({bar, emu::Mbarrier{count, count, 0, 0}});
}
inline void mbar_arrive_expect(u32 bar, u32 bytes) {
    std::lock_guard<std::mutex> hold(emu::block->barrier_lock);
    emu::Mbarrier& m = emu::mbarrier_at(bar);
    if (m.pending == 0) emu::trap("an mbarrier arrival beyond its count");
    m.tx += bytes;
    --m.pending;
    emu::settle(m);
}
inline void mbar_expect_tx(u32 bar, u32 bytes) { mbar_arrive_expect(bar, bytes); }
inline void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    if (dst % 16 || bytes % 16 || reinterpret_cast<uintptr_t>(src) % 16)
        emu::trap("cp.async.bulk needs 16-byte aligned addresses and sizes");
    emu::shared_at(dst, bytes);
    std::lock_guard<std::mutex> hold(emu::block->barrier_lock);
    emu::Mbarrier& m = emu::mbarrier_at(bar);
    m.landing.push_back({dst, src, bytes});
    m.tx -= bytes;
    emu::settle(m);
}
// Returns once the phase of parity `parity` has completed (the current phase's parity
// differs from it).
inline void mbar_wait(u32 bar, u32 parity) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        {
            std::lock_guard<std::mutex> hold(emu::block->barrier_lock);
            emu::Mbarrier& m = emu::mbarrier_at(bar);
            if ((m.completed & 1u) != (parity & 1u)) {
                for (const emu::Copy& c : m.landing) emu::land(c);  // the phase's copies, written now
                m.landing.clear();
                return;
            }
            if (std::chrono::steady_clock::now() > give_up)
                emu::trap("an mbarrier phase never completed: " + std::to_string(m.pending) +
                          " arrivals and " + std::to_string(m.tx) + " bytes missing");
        }
        if (emu::block->cluster->abort.load()) emu::trap("mbarrier wait abandoned (another thread faulted)");
        std::this_thread::yield();
    }
}

// ldmatrix .x4 (.trans): lanes 8i..8i+7 address the rows of 8x8 b16 matrix i.
inline void ldmatrix_x4(u32 addr, u32 (&r)[4], bool transposed) {
    const emu::Slot* all = emu::exchange(emu::pack(addr));
    const int l = emu::lane();
    auto element = [&](int matrix, int row, int col) {
        const u32 row_address = emu::unpack<u32>(all[8 * matrix + row]);
        if (row_address % 16) emu::trap("ldmatrix row address not 16-byte aligned");
        u16 v;
        std::memcpy(&v, emu::shared_at(row_address + 2 * col, 2), 2);
        return static_cast<u32>(v);
    };
    for (int i = 0; i < 4; ++i) {
        if (transposed) r[i] = element(i, 2 * (l % 4), l / 4) | (element(i, 2 * (l % 4) + 1, l / 4) << 16);
        else r[i] = element(i, l / 4, 2 * (l % 4)) | (element(i, l / 4, 2 * (l % 4) + 1) << 16);
    }
}
inline void ldsm_x4(u32 addr, u32 (&r)[4]) { ldmatrix_x4(addr, r, false); }
inline void ldsm_x4_trans(u32 addr, u32 (&r)[4]) { ldmatrix_x4(addr, r, true); }

// d += A(16x16, row) * B(16x8, col), 16-bit inputs read by `half`, fp32 accumulation.
template <class Half>
void mma_16bit(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, Half half) {
    emu::Slot mine{};
    mine.v[0] = a[0], mine.v[1] = a[1], mine.v[2] = a[2], mine.v[3] = a[3], mine.v[4] = b0, mine.v[5] = b1;
    const emu::Slot* all = emu::exchange(mine);
    auto a_at = [&](int row, int k) {
        const emu::Slot& owner = all[4 * (row % 8) + (k % 8) / 2];
        return half(owner.v[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
    };
    auto b_at = [&](int k, int col) {
        const emu::Slot& owner = all[4 * col + (k % 8) / 2];
        return half(owner.v[4 + (k >= 8 ? 1 : 0)], k % 2);
    };
    emu::accumulate_16x8<16>(d, a_at, b_at);
}
inline void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    mma_16bit(d, a, b0, b1, [](u32 reg, int which) { return bf16_to_f32((reg >> (16 * which)) & 0xffffu); });
}
inline void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    const u32 a[4] = {a0, a1, a2, a3};
    mma_16bit(d, a, b0, b1, [](u32 reg, int which) {
        return emu::f16_to_float(static_cast<u16>(reg >> (16 * which)));
    });
}

// -- warpgroup MMA, named barriers, clusters ------------------------------------------------

inline void wgmma_fence() { emu::wgmma_fenced = true; }
inline void wgmma_commit() {
    emu::wgmma_committed.push_back(std::move(emu::wgmma_open));
    emu::wgmma_open.clear();
}
inline void wgmma_wait_all() { emu::wgmma_retire(0); }
template <int N>
inline void wgmma_hold(float (&)[N]) {}
// D (64 x 32 f32) = A (64 x 32 e4m3, K-major) * B (32 x 32 e4m3, K-major): scale-d 0.
inline void wgmma_m64n32k32_e4m3(float (&d)[16], unsigned long long a, unsigned long long b) {
    emu::wgmma_e4m3<32>(d, a, b, false, 1, 1);
}

// bar.sync id, count: a barrier of `count` threads of the block (whole warps), its own per id.
inline void bar_sync(unsigned id, unsigned count) {
    emu::Block& b = *emu::block;
    if (id > 15 || count % 32 != 0 || count == 0 || count > b.threads)
        emu::trap("bar.sync " + std::to_string(id) + ", " + std::to_string(count) + ": bad barrier");
    if (id == 0 && count == b.threads) {
        __syncthreads();
        return;
    }
    emu::TimedBarrier* barrier;
    {
        std::lock_guard<std::mutex> hold(b.barrier_lock);
        if (!b.named[id]) b.named[id] = std::make_unique<emu::TimedBarrier>(count, &b.cluster->abort);
        if (b.named[id]->count() != count)
            emu::trap("bar.sync " + std::to_string(id) + " used with " + std::to_string(count) + " and " +
                      std::to_string(b.named[id]->count()) + " threads");
        barrier = b.named[id].get();
    }
    barrier->arrive_and_wait(("bar.sync " + std::to_string(id)).c_str());
}
template <int ID>
inline void named_sync_128() { bar_sync(ID, 128); }

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread of the cluster.
inline void cluster_sync() {
    if (emu::cluster_arrival_open) emu::trap("cluster_sync between barrier.cluster.arrive and its wait");
    emu::release_remote_writes();
    emu::block->cluster->barrier->arrive_and_wait();
    ++emu::cluster_arrived;
    ++emu::cluster_epoch;
}
// barrier.cluster.arrive.release alone: this thread's remote writes land now; its arrival is
// counted (for the rules on reads and exits) but joins the barrier only at cluster_wait (so
// the barrier completes no earlier than the last thread's wait: later than on hardware).
inline void cluster_arrive() {
    if (emu::cluster_arrival_open) emu::trap("barrier.cluster.arrive twice without a wait");
    emu::release_remote_writes();
    emu::cluster_arrival_open = true;
    ++emu::cluster_arrived;
}
// barrier.cluster.wait.acquire after this thread's cluster_arrive.
inline void cluster_wait() {
    if (!emu::cluster_arrival_open) emu::trap("barrier.cluster.wait without an arrive");
    emu::block->cluster->barrier->arrive_and_wait();
    emu::cluster_arrival_open = false;
    ++emu::cluster_epoch;
}
// mapa + ld.shared::cluster.u32: the word at `local`'s shared address in CTA `rank`.
inline u32 dsmem_load(const u32* local, u32 rank) {
    u32 v;
    emu::remote_read(smem_u32(local), rank, &v, 4);
    return v;
}
// mapa + red / atom / st .shared::cluster at `local`'s shared address in CTA `rank`.
inline void dsmem_red_add(const u32* local, u32 rank, u32 v) {
    emu::remote_write(smem_u32(local), rank, 4, v, true, "red.shared::cluster");
}
inline u32 dsmem_atom_add(const u32* local, u32 rank, u32 v) {
    return emu::remote_atomic_add(smem_u32(local), rank, v);
}
inline void dsmem_store(const u32* local, u32 rank, u32 v) {
    emu::remote_write(smem_u32(local), rank, 4, v, false, "st.shared::cluster.u32");
}
inline void dsmem_store_u16(const u16* local, u32 rank, u16 v) {
    emu::remote_write(smem_u32(local), rank, 2, v, false, "st.shared::cluster.u16");
}

// -- launching -----------------------------------------------------------------------------

namespace emu {

template <class T>
T argument(void* slot) {
    if constexpr (std::is_pointer_v<T>) {
        return reinterpret_cast<T>(*static_cast<uintptr_t*>(slot));
    } else {
        T value;
        std::memcpy(&value, slot, sizeof(T));
        return value;
    }
}

template <class... P, size_t... I>
void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(argument<P>(args[I])...);
}

// Cluster shapes of the kernels that declare one (__cluster_dims__, registered by the
// translation unit tests/workloads/cuda_emulation makes).
inline std::vector<std::pair<const void*, dim3>>& cluster_shapes() {
    static std::vector<std::pair<const void*, dim3>> shapes;
    return shapes;
}
inline dim3 cluster_dims(unsigned x, unsigned y = 1, unsigned z = 1) { return dim3{x, y, z}; }
inline bool declare_cluster(const void* kernel, dim3 shape) {
    cluster_shapes().push_back({kernel, shape});
    return true;
}
inline dim3 cluster_shape(const void* kernel) {
    for (auto& [at, shape] : cluster_shapes())
        if (at == kernel) return shape;
    return dim3{1, 1, 1};
}

// Run `kernel` over the grid, one cluster at a time (a block at a time where the kernel
// declares no cluster); returns "" or the first fault.
template <class... P>
std::string launch(void (*kernel)(P...), dim3 grid, dim3 threads, unsigned shared_bytes, void** args) {
    const unsigned count = threads.x * threads.y * threads.z;
    if (threads.y != 1 || threads.z != 1 || count % 32 != 0) return "blocks must be 1-D and whole warps";
    const dim3 shape = cluster_shape(reinterpret_cast<const void*>(kernel));
    if (grid.x % shape.x || grid.y % shape.y || grid.z % shape.z)
        return "the grid is not a whole number of clusters";
    const unsigned size = shape.x * shape.y * shape.z;
    grid_dim = grid;
    block_dim = threads;
    std::string fault;
    std::mutex fault_lock;
    launch_failed = false;
    // In flight: the clusters started and not yet joined (one at a time, or the whole
    // grid with grid_at_once), their blocks and their threads.
    std::vector<std::unique_ptr<Cluster>> clusters;
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<std::thread> pool;
    auto join = [&] {
        for (auto& t : pool) t.join();
        pool.clear();
        blocks.clear();
        clusters.clear();
    };
    for (unsigned cz = 0; cz < grid.z / shape.z && !launch_failed; ++cz)
        for (unsigned cy = 0; cy < grid.y / shape.y && !launch_failed; ++cy)
            for (unsigned cx = 0; cx < grid.x / shape.x && !launch_failed; ++cx) {
                clusters.push_back(std::make_unique<Cluster>());
                Cluster& cluster = *clusters.back();
                cluster.barrier = std::make_unique<std::barrier<Publish>>(size * count, Publish{&cluster});
                const size_t first = blocks.size();
                for (unsigned rank = 0; rank < size; ++rank) {
                    auto b = std::make_unique<Block>();
                    b->block_barrier = std::make_unique<std::barrier<>>(count);
                    for (unsigned w = 0; w < count / 32; ++w) b->warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
                    b->shared.assign(shared_bytes, 0xff);  // junk, as a real launch leaves it: NaN as bf16, fp32, fp16
                    b->slots.resize(count / 32 * 2 * 32);
                    b->threads = count;
                    b->cluster = &cluster;
                    b->rank = rank;
                    cluster.blocks.push_back(b.get());
                    blocks.push_back(std::move(b));
                }
                for (unsigned rank = 0; rank < size; ++rank) {
                    const dim3 at{cx * shape.x + rank % shape.x, cy * shape.y + (rank / shape.x) % shape.y,
                                  cz * shape.z + rank / (shape.x * shape.y)};
                    Block* b = blocks[first + rank].get();
                    for (unsigned tid = 0; tid < count; ++tid) {
                        pool.emplace_back([&, b, at, tid, &cluster = cluster] {
                            block = b;
                            thread_idx = dim3{tid, 0, 0};
                            block_idx = at;
                            collectives = 0;
                            cluster_epoch = 0;
                            cluster_arrived = 0;
                            cluster_arrival_open = false;
                            remote_writes.clear();
                            polling_since.reset();
                            open_group.clear();
                            committed.clear();
                            wgmma_open.clear();
                            wgmma_committed.clear();
                            wgmma_fenced = false;
                            try {
                                call(kernel, args, std::index_sequence_for<P...>{});
                                cp_async_commit();
                                retire_groups(0);  // copies still in flight land before the block ends
                                cluster_exit();
                            } catch (const std::exception& e) {
                                {
                                    std::lock_guard<std::mutex> hold(fault_lock);
                                    if (fault.empty()) fault = e.what();
                                }
                                launch_failed = true;
                                cluster.abort = true;  // after: the first fault is the one reported
                            }
                            b->warp_barriers[tid / 32]->arrive_and_drop();
                            b->block_barrier->arrive_and_drop();
                            cluster.barrier->arrive_and_drop();
                        });
                    }
                }
                if (!grid_at_once) join();
            }
    join();
    return fault;
}

}  // namespace emu

// Whether every block of the next launches runs at once (nonzero) or a cluster at a time
// (0). Not inline: the library exports it (emu.h is included by one translation unit).
extern "C" void emu_set_grid_at_once(int on) { emu::grid_at_once = on != 0; }

namespace emu {

}  // namespace emu
