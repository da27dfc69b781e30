// The gathers of dsa_sparse_attention and nothing else: how fast can the GPU read the
// rows that a call's sparse indices select (benchmarks/probe_gather.py)?
//
// A call reads, per token, up to 2048 rows of 1152 bytes at random slots: 1024 latent
// bytes (ckv [slots, 512] bf16) and 128 rotary bytes (kpe [slots, 64] bf16), as 72
// 16-byte pieces. Every kernel here runs a grid (tokens, spans): one CTA per token and
// span of `span` consecutive index slots, as the attention seeds do, and does only the
// part of their work named:
//
//   launch_only   nothing but start and end (with the dynamic shared memory asked for):
//                 the fixed cost of a CUPTI span of one such launch.
//   slots_only    the span's slot ids into shared memory (the first dependent load).
//   gather_ldg    slot ids, then every piece into registers by 16-byte read-only loads,
//                 BATCH at once a thread, folded by XOR.
//   gather_async  slot ids, then every piece into shared memory by cp.async (the span's
//                 rows all queued at once, as cuda_resident does), then one wait.
//   gather_bulk   slot ids, then two bulk copies a row (1024 + 128 bytes) issued by warp
//                 0 onto one mbarrier that every thread waits on.
//   wait_only     slot ids, then the spread merge's wait and nothing gathered: thread 0
//                 adds EPOCH / spans to its token's counter (acq_rel) and polls it
//                 (ld.acquire, nanosleep) until every span of the token has arrived, as
//                 cuda_resident and triton_split's spread do (the grid must be resident
//                 at once: the probe keeps it small; a wait past SPIN_LIMIT polls traps).
//
// Each CTA writes one word to sink[cta] (cta = token * spans + span index): gather_ldg
// its XOR fold of every 32-bit word it read; the others 0, or with CHECKSUM defined
// (the CPU tests' build) the same fold over the rows they landed in shared memory, so a
// test can tell that exactly the right bytes arrived. A slot id below 0 is padding: its
// row is not read. Dynamic shared memory: one 16-byte slot for the mbarrier, then the
// span's rows (gather_async, gather_bulk). Trusted probe code, not a seed.

typedef unsigned int u32;
typedef unsigned long long u64;

#define THREADS 256
#define PIECES 72        // 16-byte pieces a row: 64 latent, 8 rotary
#define MAX_SPAN 2048
#define BATCH 8          // gather_ldg: loads in flight a thread
#define EPOCH 1024u      // wait_only: what one call adds to each counter it uses
#define SPIN_LIMIT (1u << 25)

// ------------------------------------------------------------------------------------
// PTX helpers, named as tests/workloads/cuda_emulation provides them for the CPU tests.
#ifndef EVOKERNEL_EMULATION
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ u32 add_acq_rel(u32* counter, u32 add) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(add) : "memory");
    return old;
}
__device__ __forceinline__ u32 load_acquire(const u32* counter) {
    u32 seen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    return seen;
}
#endif  // EVOKERNEL_EMULATION

__device__ __forceinline__ const uint4* piece_at(const uint4* ckv, const uint4* kpe, int slot, int p) {
    return p < 64 ? ckv + (size_t)slot * 64 + p : kpe + (size_t)slot * 8 + (p - 64);
}

__device__ __forceinline__ u32 fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The CTA's span of slot ids into shared memory; returns how many there are.
__device__ __forceinline__ int stage_slots(int* slots, const int* idx, int topk, int span) {
    const int first = blockIdx.y * span;
    const int count = min(span, topk - first);
    const int* row = idx + (size_t)blockIdx.x * topk + first;
    for (int i = threadIdx.x; i < count; i += THREADS) slots[i] = row[i];
    __syncthreads();
    return count;
}

__device__ __forceinline__ u32 cta_index() { return blockIdx.x * gridDim.y + blockIdx.y; }

// XOR of every word of the landed rows (CHECKSUM builds), reduced over the CTA into
// sink[cta]; 0 otherwise.
__device__ __forceinline__ void write_sink(const int* slots, int count, u32 rows, u32* fold_slot, u32* sink) {
#if defined(CHECKSUM)
    if (threadIdx.x == 0) *fold_slot = 0u;
    __syncthreads();
    u32 acc = 0;
    const uint4* landed = reinterpret_cast<const uint4*>(fold_slot + 4);  // the rows after the slot
    for (int i = threadIdx.x; i < count * PIECES; i += THREADS)
        if (slots[i / PIECES] >= 0) acc ^= fold(landed[i]);
    atomicXor(fold_slot, acc);
    __syncthreads();
    if (threadIdx.x == 0) sink[cta_index()] = *fold_slot;
    (void)rows;
#else
    (void)slots; (void)count; (void)rows; (void)fold_slot;
    if (threadIdx.x == 0) sink[cta_index()] = 0u;
#endif
}

extern "C" __global__ __launch_bounds__(THREADS) void launch_only(u32* sink) {
    if (threadIdx.x == 0) sink[cta_index()] = 0u;
}

extern "C" __global__ __launch_bounds__(THREADS) void slots_only(const int* idx, int topk, int span, u32* sink) {
    __shared__ int slots[MAX_SPAN];
    const int count = stage_slots(slots, idx, topk, span);
    if (threadIdx.x == 0) sink[cta_index()] = count > 0 ? (u32)slots[count - 1] : 0u;
}

extern "C" __global__ __launch_bounds__(THREADS) void gather_ldg(
        const uint4* ckv, const uint4* kpe, const int* idx, int topk, int span, u32* sink) {
    __shared__ int slots[MAX_SPAN];
    __shared__ u32 total_fold;
    const int count = stage_slots(slots, idx, topk, span);
    const int total = count * PIECES;
    if (threadIdx.x == 0) total_fold = 0u;
    u32 acc = 0;
    for (int base = threadIdx.x; base < total; base += BATCH * THREADS) {
        uint4 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {  // BATCH independent loads before any is used
            const int i = base + b * THREADS;
            const int r = i / PIECES;
            const int slot = i < total ? slots[r] : -1;
            v[b] = slot >= 0 ? __ldg(piece_at(ckv, kpe, slot, i - r * PIECES)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) acc ^= fold(v[b]);
    }
    __syncthreads();
    atomicXor(&total_fold, acc);
    __syncthreads();
    if (threadIdx.x == 0) sink[cta_index()] = total_fold;
}

extern "C" __global__ __launch_bounds__(THREADS) void gather_async(
        const uint4* ckv, const uint4* kpe, const int* idx, int topk, int span, u32* sink) {
    __shared__ int slots[MAX_SPAN];
    extern __shared__ __align__(16) uint4 dynamic[];  // [0]: fold slot; then span x PIECES
    uint4* rows = dynamic + 1;
    const int count = stage_slots(slots, idx, topk, span);
    for (int i = threadIdx.x; i < count * PIECES; i += THREADS) {
        const int r = i / PIECES;
        const int slot = slots[r];
        if (slot >= 0) cp_async16(smem_u32(rows + i), piece_at(ckv, kpe, slot, i - r * PIECES), true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    write_sink(slots, count, smem_u32(rows), reinterpret_cast<u32*>(dynamic), sink);
}

extern "C" __global__ __launch_bounds__(THREADS) void gather_bulk(
        const uint4* ckv, const uint4* kpe, const int* idx, int topk, int span, u32* sink) {
    __shared__ int slots[MAX_SPAN];
    extern __shared__ __align__(16) uint4 dynamic[];  // [0]: the mbarrier; then span x PIECES
    uint4* rows = dynamic + 1;
    const u32 bar = smem_u32(dynamic);
    const int count = stage_slots(slots, idx, topk, span);
    if (threadIdx.x == 0) {
        u32 valid = 0;
        for (int r = 0; r < count; ++r) valid += slots[r] >= 0;
        mbar_init(bar, 1);
        fence_mbarrier_init();
        mbar_arrive_expect(bar, valid * (u32)(PIECES * 16));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        for (int r = threadIdx.x; r < count; r += 32) {
            const int slot = slots[r];
            if (slot < 0) continue;
            bulk_copy(smem_u32(rows + r * PIECES), ckv + (size_t)slot * 64, 1024, bar);
            bulk_copy(smem_u32(rows + r * PIECES + 64), kpe + (size_t)slot * 8, 128, bar);
        }
    }
    mbar_wait(bar, 0);
    __syncthreads();  // every thread past the wait before the slot is reused as the fold
    write_sink(slots, count, smem_u32(rows), reinterpret_cast<u32*>(dynamic), sink);
}

extern "C" __global__ __launch_bounds__(THREADS) void wait_only(const int* idx, int topk, int span, u32* counters,
                                                             u32* sink) {
    __shared__ int slots[MAX_SPAN];
    const int count = stage_slots(slots, idx, topk, span);
    if (threadIdx.x == 0) {
        const u32 add = EPOCH / gridDim.y;  // the host keeps gridDim.y a power of two dividing EPOCH
        __threadfence();
        const u32 old = add_acq_rel(counters + blockIdx.x, add);
        const u32 start = old - (old & (EPOCH - 1u));
        u32 seen = old + add, polls = 0;
        while (seen - start < EPOCH) {
            if (++polls > SPIN_LIMIT) __trap();
            __nanosleep(32);
            seen = load_acquire(counters + blockIdx.x);
        }
        sink[cta_index()] = count > 0 ? (u32)slots[0] : 0u;
    }
}
