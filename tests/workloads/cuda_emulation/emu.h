// A CPU emulation of the CUDA device code our seeds' .cu files use, for correctness tests
// on a machine without a GPU. Not a simulator of timing, caches or memory ordering: every
// CUDA thread is an OS thread, a block's threads run together (blocks one after
// another), warp collectives exchange values through per-warp slots and a barrier, and
// asynchronous copies complete at once. What it checks is the arithmetic and the
// indexing: which element goes where, every shared-memory access inside the block's
// dynamic allocation (a fault, not silent corruption), routing, permutations, split-K
// counts, the fixups' last arrivals.
//
// The kernel file keeps its inline PTX in helpers guarded by #ifndef EVOKERNEL_EMULATION;
// this header provides those helpers (memory: smem_u32, cp_async16/4, cp_async_commit/wait,
// lds128, lds_f32, ldsm_x4, ldsm_x4_trans, bulk_copy and the mbarrier helpers; tensor
// cores: mma_fp8, mma_bf16; conversions: to_e4m3x2, to_bf16, to_bf16x2, bf16_to_f32;
// counters: arrive_last, add_acq_rel, load_acquire; fences; dynamic_smem_bytes)
// and the CUDA built-ins the kernels call. The tensor-core fragments follow the PTX ISA's
// layouts (as CUTLASS's SM80 MMA traits spell them), g = lane / 4, t = lane % 4:
//   m16n8k32, 8-bit: A a0 (row g, k 4t..4t+3), a1 (row g+8, same k), a2 (row g, k 16+4t..),
//            a3 (row g+8, k 16+4t..); B b0 (k 4t.., column g), b1 (k 16+4t..);
//   m16n8k16, 16-bit: A a0 (row g, k 2t, 2t+1), a1 (row g+8), a2 (row g, k 2t+8, 2t+9),
//            a3 (row g+8, k 2t+8..); B b0 (k 2t, 2t+1, column g), b1 (k 2t+8, 2t+9);
//   C 16x8:  c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1);
//   ldmatrix x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of
//            lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (.trans: rows
//            2(l%4), 2(l%4)+1 of column l/4).
// Asynchronous copies land late, as late as the program allows: a thread's cp.async
// copies of a committed group land at the cp.async.wait_group that retires the group
// (uncommitted ones only at the thread's exit), and bulk copies at the
// first wait that sees their mbarrier's phase complete; until then the destination keeps
// what it held (NaN at first), so a stage read before its wait reads junk. A bulk copy
// counts down its mbarrier's expected bytes when issued; a wait whose phase never
// completes (expect_tx and the copies disagree) traps after 10 s.
// Blocks run one at a time, so a kernel whose blocks wait for each other cannot run here.

#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
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
struct alignas(8) uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

using std::max;
using std::min;

namespace emu {

struct Trap : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Slot {
    u32 v[8];
};

// One block in flight: its barriers, dynamic shared memory and warp exchange slots.
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

struct Block {
    std::mutex barrier_lock;
    std::vector<std::pair<u32, Mbarrier>> mbarriers;  // by shared address
    std::unique_ptr<std::barrier<>> block_barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
    std::vector<u8> shared;   // dynamic shared memory
    std::vector<Slot> slots;  // [warps][2][32]
};

inline dim3 grid_dim, block_dim;
inline Block* block = nullptr;
inline thread_local dim3 thread_idx, block_idx;
inline thread_local unsigned collectives = 0;  // this lane's warp collectives so far

inline thread_local std::vector<Copy> open_group;                  // cp.async since the last commit
inline thread_local std::vector<std::vector<Copy>> committed;      // committed groups, oldest first

inline int lane() { return static_cast<int>(thread_idx.x & 31); }
inline int warp() { return static_cast<int>(thread_idx.x >> 5); }

[[noreturn]] inline void trap(const std::string& why) { throw Trap(why); }

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

inline u8* shared_at(u32 address, u32 bytes) {
    if (static_cast<size_t>(address) + bytes > block->shared.size()) {
        trap("shared memory access at " + std::to_string(address) + " (+" + std::to_string(bytes) +
             ") beyond the " + std::to_string(block->shared.size()) + " bytes the launch gave");
    }
    return block->shared.data() + address;
}

inline void* dynamic_shared() { return block->shared.data(); }

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

template <class T>
T atomicAdd(T* address, T value) {
    return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
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
    return static_cast<u32>(at - base);
}
inline void cp_async16(u32 dst, const void* src, bool valid) {
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

inline u32 to_e4m3x2(float lo, float hi) {
    return static_cast<u32>(emu::float_to_e4m3(lo)) | (static_cast<u32>(emu::float_to_e4m3(hi)) << 8);
}
inline u16 to_bf16(float x) { return emu::float_to_bf16(x); }
inline float bf16_to_f32(u32 bits16) { return std::bit_cast<float>(bits16 << 16); }

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
inline void __nanosleep(unsigned) { std::this_thread::yield(); }
inline void fence_proxy_async() {}
inline void fence_mbarrier_init() {}

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

// d += A(16x16 bf16, row) * B(16x8 bf16, col).
inline void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    emu::Slot mine{};
    mine.v[0] = a[0], mine.v[1] = a[1], mine.v[2] = a[2], mine.v[3] = a[3], mine.v[4] = b0, mine.v[5] = b1;
    const emu::Slot* all = emu::exchange(mine);
    auto half = [](u32 reg, int which) { return bf16_to_f32((reg >> (16 * which)) & 0xffffu); };
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

// Run `kernel` over the grid, blocks one at a time; returns "" or the first fault.
template <class... P>
std::string launch(void (*kernel)(P...), dim3 grid, dim3 threads, unsigned shared_bytes, void** args) {
    const unsigned count = threads.x * threads.y * threads.z;
    if (threads.y != 1 || threads.z != 1 || count % 32 != 0) return "blocks must be 1-D and whole warps";
    grid_dim = grid;
    block_dim = threads;
    std::string fault;
    std::mutex fault_lock;
    for (unsigned bz = 0; bz < grid.z && fault.empty(); ++bz)
        for (unsigned by = 0; by < grid.y && fault.empty(); ++by)
            for (unsigned bx = 0; bx < grid.x && fault.empty(); ++bx) {
                Block b;
                b.block_barrier = std::make_unique<std::barrier<>>(count);
                for (unsigned w = 0; w < count / 32; ++w) b.warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
                b.shared.assign(shared_bytes, 0xff);  // junk, as a real launch leaves it: NaN as bf16, fp32, fp16
                b.slots.resize(count / 32 * 2 * 32);
                block = &b;
                std::vector<std::thread> pool;
                for (unsigned tid = 0; tid < count; ++tid) {
                    pool.emplace_back([&, tid] {
                        thread_idx = dim3{tid, 0, 0};
                        block_idx = dim3{bx, by, bz};
                        collectives = 0;
                        open_group.clear();
                        committed.clear();
                        try {
                            call(kernel, args, std::index_sequence_for<P...>{});
                            cp_async_commit();
                            retire_groups(0);  // copies still in flight land before the block ends
                        } catch (const std::exception& e) {
                            std::lock_guard<std::mutex> hold(fault_lock);
                            if (fault.empty()) fault = e.what();
                        }
                        b.warp_barriers[tid / 32]->arrive_and_drop();
                        b.block_barrier->arrive_and_drop();
                    });
                }
                for (auto& t : pool) t.join();
                block = nullptr;
            }
    return fault;
}

}  // namespace emu
