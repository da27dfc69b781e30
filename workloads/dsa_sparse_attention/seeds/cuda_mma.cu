// DSA sparse attention (DeepSeek-V3.2 MLA, absorbed form), two kernels:
//
//   sparse_mla_split    grid (T, 16 / HEADS_PER_CTA, splits): one CTA per query token,
//                       head group and split of the 2048-slot index row. It gathers its
//                       slots' rows (512 latent + 64 rotary bf16 values) BLOCK_N at a
//                       time into shared memory with cp.async (STAGES buffers in
//                       flight; -1 slots are zero-filled), computes the logits with
//                       bf16 mma.sync (m16n8k16, heads as the 16 rows), keeps a base-2
//                       online softmax, and accumulates P @ latents with mma.sync.
//                       With one split it writes the final bf16 output and lse;
//                       otherwise the split's normalised output and lse (float32).
//                       With COMBINE fused it then counts itself in: the last CTA of a
//                       (token, head group) to arrive merges every split (see below),
//                       so a call is one launch. With COMBINE spread every CTA waits
//                       for all splits of its (token, head group) and merges a slice
//                       of the 512 output dims (see below): one launch too.
//   sparse_mla_combine  grid (T * 16): weighs the splits of one (token, head) by their
//                       lse into the bf16 output and the final lse (COMBINE separate:
//                       the second launch of a call).
//
// Fused combine, and why it is race-free. Each CTA stores its partials with plain
// stores, then __syncthreads() (every thread's stores precede thread 0's next step in
// the CTA), then thread 0 does a gpu-scope fence and an acq_rel atomic add on the
// (token, head group) counter: a release that covers the whole CTA's stores. The CTA
// that reads back splits - 1 is the last; its acquire (the same atomic, then a fence)
// followed by __syncthreads() orders every thread's later loads after all the other
// CTAs' releases. It reads the partials with ld.global.cg (L2, never a stale L1 line),
// writes the output and lse, and sets the counter back to 0: counters are zero between
// calls (the host zeroes them once), so no call needs a memset, and graph replays work.
// Calls must not run concurrently on two streams with the same workspace.
//
// Spread combine (COMBINE spread). After the same barrier, thread 0 adds EPOCH / splits
// to the (token, head group) counter (fence, acq_rel atomic: the release of the CTA's
// partials), then polls it with ld.acquire.gpu until it has grown by a whole EPOCH
// past old - old % EPOCH (old: the value its add returned; unsigned differences, so
// wrap-around is harmless, EPOCH dividing 2^32): every split of its token and group
// has arrived. A fence and __syncthreads() order the CTA's later loads after that
// acquire. The CTA then merges output dims [split * 512/splits, +512/splits) of its
// heads from every split's partials (.cg loads), and split 0 writes the lse. Each call
// adds exactly EPOCH to each counter it uses, whatever the split count (a power of two
// <= 128), so counters stay multiples of EPOCH and need no reset. The wait is safe
// only if every CTA of the grid is resident at once: the host caps the grid at one
// wave (SM count x 1 CTA per SM, see cuda_mma_host.py); nothing here checks it.
//
// Layouts (all contiguous): q_nope [T,16,512], q_pe [T,16,64], ckv [pages*64, 512],
// kpe [pages*64, 64] (bf16); sparse_indices [T, topk] int32 (-1, or any negative
// value, is an unused slot); sm_scale: one float32 on the device; part_out
// [T,16,splits,512] and part_lse [T,16,splits] float32; counters [T * 16/HEADS_PER_CTA]
// int32.
//
// Parameters (each arrives as a #define from the harness; defaults below):
//   HEADS_PER_CTA  16: every gathered row is read by one CTA; 8: two CTAs per token and
//                  split, rows 8-15 of the mma are zero queries.
//   BLOCK_N        slots gathered per pipeline step (multiple of 16).
//   STAGES         gather buffers in flight (2-4); reduced when they do not fit in
//                  shared memory (the host mirrors the rule in shared_bytes()).
//   THREADS        threads per CTA (128 or 256).
//   COMBINE_FUSED  defined (COMBINE: fused): the split kernel merges the splits itself.
//   COMBINE_SPREAD defined (COMBINE: spread): every CTA merges a slice after a wait.
//   GATHER_BULK    defined (GATHER: bulk): the gathered rows come by the bulk-copy
//                  engine (cp.async.bulk, Hopper's TMA unit without a tensor map: two
//                  copies a row, 1024 latent and 128 rotary bytes, issued by warp 0 and
//                  counted on one mbarrier per buffer), instead of 72 16-byte cp.async
//                  copies a row spread over the CTA's threads. A -1 slot's row is
//                  zeroed by plain stores (its probability is 0, but 0 x NaN is not).
//                  Unmeasured.
// No #include: NVRTC has no host headers.

typedef unsigned short u16;
typedef unsigned int u32;

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 16
#endif
#ifndef BLOCK_N
#define BLOCK_N 32
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef THREADS
#define THREADS 128
#endif

#if HEADS_PER_CTA != 16 && HEADS_PER_CTA != 8
#error "HEADS_PER_CTA must be 16 or 8"
#endif
#if (BLOCK_N % 16) != 0 || BLOCK_N < 16 || BLOCK_N > 64
#error "BLOCK_N must be a multiple of 16 in [16, 64]"
#endif
#if THREADS != 128 && THREADS != 256
#error "THREADS must be 128 or 256"
#endif
#if STAGES < 2 || STAGES > 4
#error "STAGES must lie in [2, 4]"
#endif

#define HEADS 16
#define CKV 512
#define KPE 64
#define DIM 576                     // CKV + KPE
#define ROW_ELEMS 584               // DIM + 8: rows 16 B apart in the bank space
#define ROW_BYTES (ROW_ELEMS * 2)   // 1168
#define ROW_CHUNKS 72               // 16-byte pieces per gathered row (64 latent + 8 rotary)
#define NWARPS (THREADS / 32)
#define COLS_PER_WARP (CKV / NWARPS)        // output columns of each warp in P @ V
#define S_STRIDE (BLOCK_N + 4)              // floats per row of the logit tile
#define P_STRIDE (BLOCK_N + 8)              // bf16 per row of the probability tile
#define ROW_THREADS (THREADS / HEADS)       // softmax threads per head row

// Shared memory: one mbarrier per gather buffer (64 bytes reserved, used with
// GATHER_BULK), queries, PIPE gather buffers, their slot ids, logits, probabilities,
// per-row rescale factors and the final (m, l) of each row.
#define BAR_BYTES 64
#define FIXED_BYTES (BAR_BYTES + HEADS * ROW_BYTES + HEADS * S_STRIDE * 4 + HEADS * P_STRIDE * 2 + 3 * HEADS * 4)
#define STAGE_BYTES (BLOCK_N * ROW_BYTES + BLOCK_N * 4)
#define SMEM_LIMIT 232448                   // 227 KiB per block on sm_90
#if FIXED_BYTES + STAGES * STAGE_BYTES <= SMEM_LIMIT
#define PIPE STAGES
#elif FIXED_BYTES + 3 * STAGE_BYTES <= SMEM_LIMIT
#define PIPE 3
#else
#define PIPE 2
#endif
#define SMEM_BYTES (FIXED_BYTES + PIPE * STAGE_BYTES)

#define LOG2E 1.4426950408889634f
#define EPOCH 1024u                         // what one call adds to a spread counter
#define NEG_INF __int_as_float(0xff800000)

// ------------------------------------------------------------------------------------
// PTX helpers (sm_80+; the bulk copies and mbarriers sm_90). Every inline PTX of this
// file is here: a CPU emulation for the tests (tests/workloads/cuda_emulation) defines
// EVOKERNEL_EMULATION and brings its own versions of these functions.

#ifndef EVOKERNEL_EMULATION
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// The bulk-copy engine and its mbarriers (sm_90). A CTA launched without a cluster is a
// cluster of one, so its own shared memory is a valid shared::cluster destination.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of copies still to complete on the barrier.
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

__device__ __forceinline__ void ldsm_x4(u32 addr, u32 (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 addr, u32 (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += A(16x16 bf16, row) * B(16x8 bf16, col), float32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u16 to_bf16(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
    return r;
}
// Two floats as packed bf16 (lo in the low half, as memory order wants).
__device__ __forceinline__ u32 to_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// acq_rel add of `add` to a counter; returns the value before.
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
// Orders this thread's earlier generic-proxy shared memory accesses (and those its
// barriers ordered before it) before its later async-proxy ones (bulk copies).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Makes mbarrier inits visible to the async proxy.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 have;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
    return have;
}
#endif  // EVOKERNEL_EMULATION

// Thread 0's arrival at a (token, head group) counter: release of the CTA's stores
// (after the caller's __syncthreads), acquire of every earlier arrival's. Returns the
// count before this arrival.
__device__ __forceinline__ u32 arrive(u32* counter) {
    __threadfence();
    const u32 before = add_acq_rel(counter, 1u);
    __threadfence();
    return before;
}

// Max / sum over the ROW_THREADS consecutive lanes that share a head row.
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
    for (int o = ROW_THREADS / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = ROW_THREADS / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One head's row w[0, splits) of split log-sum-exps (base 2; -inf for an empty split)
// becomes the splits' normalised merge weights; returns the merged lse, -inf when every
// split is empty (then every weight is 0).
__device__ __forceinline__ float merge_weights(float* w, int splits) {
    float peak = NEG_INF;
    for (int s = 0; s < splits; ++s) peak = fmaxf(peak, w[s]);
    const float base = peak == NEG_INF ? 0.f : peak;
    float total = 0.f;
    for (int s = 0; s < splits; ++s) {
        w[s] = exp2f(w[s] - base);
        total += w[s];
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int s = 0; s < splits; ++s) w[s] *= inv;
    return total > 0.f ? base + log2f(total) : NEG_INF;
}

// ------------------------------------------------------------------------------------
// the split kernel

struct Smem {
    unsigned long long* bar;  // [PIPE] mbarriers (GATHER_BULK)
    u16* q;        // [16][ROW_ELEMS]
    u16* kv;       // [PIPE][BLOCK_N][ROW_ELEMS]
    int* slot;     // [PIPE][BLOCK_N]  global row id, or -1
    float* s;      // [16][S_STRIDE]
    u16* p;        // [16][P_STRIDE]
    float* alpha;  // [16]
    float* m;      // [16]
    float* l;      // [16]
};

#if defined(GATHER_BULK)
// Queue the gathers of tile `tile` of this split into buffer `buf`: warp 0 reads the
// slot ids, announces the valid rows' bytes on the buffer's mbarrier (one arrival, by
// lane 0), then each lane bulk-copies its rows; other warps return at once. The caller's
// __syncthreads() since the buffer was last read orders those reads before the fence.
__device__ __forceinline__ void issue_tile(const Smem& sm, int buf, int tile, const int* __restrict__ idx,
                                           int span, const u16* __restrict__ ckv,
                                           const u16* __restrict__ kpe) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    constexpr int PER_LANE = (BLOCK_N + 31) / 32;
    u16* dst_rows = sm.kv + (size_t)buf * BLOCK_N * ROW_ELEMS;
    const u32 bar = smem_u32(sm.bar + buf);
    int id_of[PER_LANE];
    u32 valid_rows = 0;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int r = lane + 32 * i;
        const int pos = tile * BLOCK_N + r;
        const int id = (r < BLOCK_N && pos < span) ? __ldg(idx + pos) : -1;
        id_of[i] = id;
        valid_rows += __popc(__ballot_sync(0xffffffffu, id >= 0));
        if (r < BLOCK_N) sm.slot[buf * BLOCK_N + r] = id >= 0 ? id : -1;
    }
    fence_proxy_async();  // earlier reads, then async writes
    if (lane == 0) mbar_arrive_expect(bar, valid_rows * (u32)(DIM * 2));
    __syncwarp();
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int r = lane + 32 * i;
        if (r >= BLOCK_N) continue;
        u16* row = dst_rows + r * ROW_ELEMS;
        const int id = id_of[i];
        if (id >= 0) {
            bulk_copy(smem_u32(row), ckv + (size_t)id * CKV, CKV * 2, bar);
            bulk_copy(smem_u32(row + CKV), kpe + (size_t)id * KPE, KPE * 2, bar);
        } else {
            uint4* zero = reinterpret_cast<uint4*>(row);
            for (int c = 0; c < ROW_CHUNKS; ++c) zero[c] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}
#else
// Queue the gathers of tile `tile` of this split into buffer `buf`.
__device__ __forceinline__ void issue_tile(const Smem& sm, int buf, int tile, const int* __restrict__ idx,
                                           int span, const u16* __restrict__ ckv,
                                           const u16* __restrict__ kpe) {
    u16* dst_rows = sm.kv + (size_t)buf * BLOCK_N * ROW_ELEMS;
    for (int c = threadIdx.x; c < BLOCK_N * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS;
        const int piece = c - r * ROW_CHUNKS;
        const int pos = tile * BLOCK_N + r;
        const int id = pos < span ? __ldg(idx + pos) : -1;
        const bool valid = id >= 0;
        const long long row = valid ? id : 0;
        const u16* src = piece < 64 ? ckv + row * CKV + piece * 8 : kpe + row * KPE + (piece - 64) * 8;
        cp_async16(smem_u32(dst_rows + r * ROW_ELEMS + piece * 8), src, valid);
        if (piece == 0) sm.slot[buf * BLOCK_N + r] = valid ? id : -1;
    }
}
#endif

extern "C" __global__ __launch_bounds__(THREADS) void sparse_mla_split(
    const u16* __restrict__ q_nope, const u16* __restrict__ q_pe, const u16* __restrict__ ckv,
    const u16* __restrict__ kpe, const int* __restrict__ sparse_indices,
    const float* __restrict__ sm_scale, u16* __restrict__ out, float* __restrict__ lse,
    float* __restrict__ part_out, float* __restrict__ part_lse, u32* __restrict__ counters, int topk,
    int splits, int chunk) {
    extern __shared__ __align__(16) unsigned char smem[];
    if (dynamic_smem_bytes() < SMEM_BYTES) __trap();  // the host's shared_bytes() disagrees with this file
    Smem sm;
    sm.bar = reinterpret_cast<unsigned long long*>(smem);
    sm.q = reinterpret_cast<u16*>(smem + BAR_BYTES);
    sm.kv = sm.q + HEADS * ROW_ELEMS;
    sm.s = reinterpret_cast<float*>(sm.kv + PIPE * BLOCK_N * ROW_ELEMS);
    sm.p = reinterpret_cast<u16*>(sm.s + HEADS * S_STRIDE);
    sm.alpha = reinterpret_cast<float*>(sm.p + HEADS * P_STRIDE);
    sm.m = sm.alpha + HEADS;
    sm.l = sm.m + HEADS;
    sm.slot = reinterpret_cast<int*>(sm.l + HEADS);

    const int token = blockIdx.x;
    const int head0 = blockIdx.y * HEADS_PER_CTA;
    const int split = blockIdx.z;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;

    const int first = split * chunk;
    const int span = max(0, min(chunk, topk - first));
    const int ntiles = (span + BLOCK_N - 1) / BLOCK_N;
    const int* idx = sparse_indices + (size_t)token * topk + first;
#if defined(GATHER_BULK)
    if (tid == 0) {
        for (int b = 0; b < PIPE; ++b) mbar_init(smem_u32(sm.bar + b), 1);
        fence_mbarrier_init();
    }
    __syncthreads();
#endif

    // queries: rows past HEADS_PER_CTA are zero
    for (int c = tid; c < HEADS * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS;
        const int piece = c - r * ROW_CHUNKS;
        const bool valid = r < HEADS_PER_CTA;
        const int head = head0 + (valid ? r : 0);
        const u16* src = piece < 64 ? q_nope + ((size_t)token * HEADS + head) * CKV + piece * 8
                                    : q_pe + ((size_t)token * HEADS + head) * KPE + (piece - 64) * 8;
        cp_async16(smem_u32(sm.q + r * ROW_ELEMS + piece * 8), src, valid);
    }
#pragma unroll
    for (int s = 0; s < PIPE - 1; ++s) {
        if (s < ntiles) issue_tile(sm, s, s, idx, span, ckv, kpe);
        cp_async_commit();  // the queries ride in the first group
    }

    const float scale = __ldg(sm_scale) * LOG2E;  // logits in base 2
    const int row = tid / ROW_THREADS;             // the head row this thread's softmax serves
    const int sub = tid - row * ROW_THREADS;
    float m_run = NEG_INF, l_run = 0.f;
    float acc[COLS_PER_WARP / 8][4];
#pragma unroll
    for (int i = 0; i < COLS_PER_WARP / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    const u32 q_base = smem_u32(sm.q);
    for (int tile = 0; tile < ntiles; ++tile) {
        const int ahead = tile + PIPE - 1;
        if (ahead < ntiles) issue_tile(sm, ahead % PIPE, ahead, idx, span, ckv, kpe);
        cp_async_commit();
#if defined(GATHER_BULK)
        cp_async_wait<0>();  // the queries (the only cp.async copies)
        mbar_wait(smem_u32(sm.bar + tile % PIPE), (tile / PIPE) & 1);
#else
        cp_async_wait<PIPE - 1>();
#endif
        __syncthreads();

        const int buf = tile % PIPE;
        const u32 kv_base = smem_u32(sm.kv + (size_t)buf * BLOCK_N * ROW_ELEMS);
        const int* slot = sm.slot + buf * BLOCK_N;

        // logits: 8-slot column tiles dealt round-robin to the warps
        for (int nt = warp; nt < BLOCK_N / 8; nt += NWARPS) {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            const u32 a_row = q_base + (lane & 15) * ROW_BYTES + (lane >> 4) * 16;
            const u32 b_row = kv_base + (nt * 8 + (lane & 7)) * ROW_BYTES + (lane >> 3) * 16;
#pragma unroll 6
            for (int k0 = 0; k0 < DIM; k0 += 32) {
                u32 a0[4], a1[4], b[4];
                ldsm_x4(a_row + k0 * 2, a0);
                ldsm_x4(a_row + (k0 + 16) * 2, a1);
                ldsm_x4(b_row + k0 * 2, b);
                mma_bf16(c, a0, b[0], b[1]);
                mma_bf16(c, a1, b[2], b[3]);
            }
            float* s0 = sm.s + g * S_STRIDE + nt * 8 + 2 * t;
            float* s1 = s0 + 8 * S_STRIDE;
            s0[0] = c[0]; s0[1] = c[1];
            s1[0] = c[2]; s1[1] = c[3];
        }
        __syncthreads();

        // online softmax, base 2: ROW_THREADS threads per head row
        {
            float* srow = sm.s + row * S_STRIDE;
            float peak = NEG_INF;
            for (int n = sub; n < BLOCK_N; n += ROW_THREADS) {
                const float v = slot[n] >= 0 ? srow[n] * scale : NEG_INF;
                srow[n] = v;
                peak = fmaxf(peak, v);
            }
            const float m_new = fmaxf(m_run, row_max(peak));
            const float base = m_new == NEG_INF ? 0.f : m_new;
            float total = 0.f;
            u16* prow = sm.p + row * P_STRIDE;
            for (int n = sub; n < BLOCK_N; n += ROW_THREADS) {
                const float p = exp2f(srow[n] - base);
                prow[n] = to_bf16(p);
                total += p;
            }
            const float alpha = exp2f(m_run - base);
            l_run = l_run * alpha + row_sum(total);
            m_run = m_new;
            if (sub == 0) sm.alpha[row] = alpha;
        }
        __syncthreads();

        // acc = acc * alpha + P @ V over this warp's output columns
        {
            const float alpha_lo = sm.alpha[g];
            const float alpha_hi = sm.alpha[g + 8];
#pragma unroll
            for (int i = 0; i < COLS_PER_WARP / 8; ++i) {
                acc[i][0] *= alpha_lo; acc[i][1] *= alpha_lo;
                acc[i][2] *= alpha_hi; acc[i][3] *= alpha_hi;
            }
            const u32 p_row = smem_u32(sm.p) + (lane & 15) * (P_STRIDE * 2) + (lane >> 4) * 16;
            const int col0 = warp * COLS_PER_WARP;
#pragma unroll
            for (int kk = 0; kk < BLOCK_N; kk += 16) {
                u32 a[4];
                ldsm_x4(p_row + kk * 2, a);
                const u32 v_row = kv_base + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * ROW_BYTES +
                                  (col0 + (lane >> 4) * 8) * 2;
#pragma unroll
                for (int np = 0; np < COLS_PER_WARP / 16; ++np) {
                    u32 b[4];
                    ldsm_x4_trans(v_row + np * 32, b);
                    mma_bf16(acc[2 * np], a, b[0], b[1]);
                    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // the buffer, logits and probabilities are free again
    }
    cp_async_wait<0>();

    if (sub == 0) {
        sm.m[row] = m_run;
        sm.l[row] = l_run;
    }
    __syncthreads();

    const int col0 = warp * COLS_PER_WARP + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
        if (r >= HEADS_PER_CTA) continue;
        const float l = sm.l[r];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const size_t pair = (size_t)token * HEADS + head0 + r;
#pragma unroll
        for (int i = 0; i < COLS_PER_WARP / 8; ++i) {
            const float x = acc[i][2 * half] * inv;
            const float y = acc[i][2 * half + 1] * inv;
            const int col = col0 + i * 8;
            if (splits == 1) {
                *reinterpret_cast<u32*>(out + pair * CKV + col) = to_bf16x2(x, y);
            } else {
                *reinterpret_cast<float2*>(part_out + (pair * splits + split) * CKV + col) =
                    make_float2(x, y);
            }
        }
    }
    if (tid < HEADS_PER_CTA) {
        const float l = sm.l[tid];
        const float value = l > 0.f ? sm.m[tid] + log2f(l) : NEG_INF;
        const size_t pair = (size_t)token * HEADS + head0 + tid;
        if (splits == 1) lse[pair] = value;
        else part_lse[pair * splits + split] = value;
    }
#if defined(COMBINE_FUSED)
    if (splits == 1) return;
    // Count this CTA in; the last of its (token, head group) merges the splits.
    int* last = reinterpret_cast<int*>(sm.alpha);  // free since the final tile
    __syncthreads();                               // the CTA's partial stores come first
    if (tid == 0) {
        u32* counter = counters + (size_t)token * gridDim.y + blockIdx.y;
        const bool is_last = arrive(counter) == (u32)(splits - 1);
        if (is_last) atomicExch(counter, 0u);      // zero again for the next call
        *last = is_last;
    }
    __syncthreads();
    if (!*last) return;
    if ((HEADS_PER_CTA * splits + splits + 1) * 4 > PIPE * BLOCK_N * ROW_BYTES) __trap();  // scratch too small

    // Scratch in the gather buffers (free: every cp.async has landed): per head its
    // weight of each split, and the splits that saw at least one valid slot.
    float* weight = reinterpret_cast<float*>(sm.kv);  // [HEADS_PER_CTA][splits]
    int* live = reinterpret_cast<int*>(weight + HEADS_PER_CTA * splits);  // [splits]
    int* n_live = live + splits;
    const size_t pair0 = (size_t)token * HEADS + head0;
    for (int i = tid; i < HEADS_PER_CTA * splits; i += THREADS) weight[i] = __ldcg(part_lse + pair0 * splits + i);
    __syncthreads();
    if (tid < HEADS_PER_CTA) {
        float* w = weight + tid * splits;
        if (tid == 0) {
            // an empty split has lse -inf for every head, a non-empty one for none
            int n = 0;
            for (int s = 0; s < splits; ++s)
                if (w[s] != NEG_INF) live[n++] = s;
            *n_live = n;
        }
        lse[pair0 + tid] = merge_weights(w, splits);
    }
    __syncthreads();

    // Thread: one float4 of columns (tid % 128) for every (THREADS / 128)-th head.
    constexpr int STEP = THREADS / 128;
    constexpr int MINE = HEADS_PER_CTA / STEP;
    const int c4 = tid & 127;
    const int h0 = tid >> 7;
    float4 sum[MINE];
#pragma unroll
    for (int k = 0; k < MINE; ++k) sum[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    const int n = *n_live;
#pragma unroll 2
    for (int j = 0; j < n; ++j) {
        const int s = live[j];
#pragma unroll
        for (int k = 0; k < MINE; ++k) {
            const int h = h0 + k * STEP;
            const float w = weight[h * splits + s];
            const float4 v = __ldcg(reinterpret_cast<const float4*>(part_out + ((pair0 + h) * splits + s) * CKV) + c4);
            sum[k].x += w * v.x; sum[k].y += w * v.y; sum[k].z += w * v.z; sum[k].w += w * v.w;
        }
    }
#pragma unroll
    for (int k = 0; k < MINE; ++k) {
        const int h = h0 + k * STEP;
        uint2 packed;
        packed.x = to_bf16x2(sum[k].x, sum[k].y);
        packed.y = to_bf16x2(sum[k].z, sum[k].w);
        *reinterpret_cast<uint2*>(out + (pair0 + h) * CKV + c4 * 4) = packed;
    }
#endif
#if defined(COMBINE_SPREAD)
    if (splits == 1) return;
    if ((CKV % (4 * splits)) != 0 || (splits & (splits - 1)) != 0) __trap();  // host: a power of two <= 128
    __syncthreads();  // the CTA's partial stores come first
    if (tid == 0) {
        u32* counter = counters + (size_t)token * gridDim.y + blockIdx.y;
        const u32 add = EPOCH / (u32)splits;
        u32 old;
        __threadfence();
        old = add_acq_rel(counter, add);
        const u32 start = old - (old & (EPOCH - 1u));  // the counter before this call's arrivals
        u32 seen = old + add;
        while (seen - start < EPOCH) {  // unsigned difference: wrap-around is harmless
            __nanosleep(32);
            seen = load_acquire(counter);
        }
        __threadfence();
    }
    __syncthreads();  // every thread's loads below follow thread 0's acquire

    // Scratch in the gather buffers (every cp.async has landed): per head its weight of
    // each split, normalised.
    if (HEADS_PER_CTA * splits * 4 > PIPE * BLOCK_N * ROW_BYTES) __trap();  // scratch too small
    float* weight = reinterpret_cast<float*>(sm.kv);  // [HEADS_PER_CTA][splits]
    const size_t pair0 = (size_t)token * HEADS + head0;
    for (int i = tid; i < HEADS_PER_CTA * splits; i += THREADS) weight[i] = __ldcg(part_lse + pair0 * splits + i);
    __syncthreads();
    if (tid < HEADS_PER_CTA) {
        const float merged = merge_weights(weight + tid * splits, splits);
        if (split == 0) lse[pair0 + tid] = merged;
    }
    __syncthreads();

    // float4 columns of this CTA's slice for every head: `lanes` consecutive threads
    // share one (head, float4) and take every lanes-th split, then add up by shuffles.
    const int slice4 = CKV / 4 / splits;
    const int vecs = HEADS_PER_CTA * slice4;  // a power of two, at least 8
    const int lanes = vecs >= THREADS ? 1 : THREADS / vecs;  // at most 32: one warp
    for (int it = tid; it < vecs * lanes; it += THREADS) {  // the same trip count in a warp
        const int v = it / lanes;
        const int r = it - v * lanes;
        const int h = v / slice4;
        const int c4 = split * slice4 + (v - h * slice4);
        const float* w = weight + h * splits;
        const float4* src = reinterpret_cast<const float4*>(part_out + (pair0 + h) * splits * CKV) + c4;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = r; s < splits; s += lanes) {
            const float ws = w[s];
            if (ws > 0.f) {  // an empty split (weight 0) is not read
                const float4 x = __ldcg(src + (size_t)s * (CKV / 4));
                sum.x += ws * x.x; sum.y += ws * x.y; sum.z += ws * x.z; sum.w += ws * x.w;
            }
        }
        for (int o = lanes / 2; o > 0; o >>= 1) {
            sum.x += __shfl_xor_sync(0xffffffffu, sum.x, o);
            sum.y += __shfl_xor_sync(0xffffffffu, sum.y, o);
            sum.z += __shfl_xor_sync(0xffffffffu, sum.z, o);
            sum.w += __shfl_xor_sync(0xffffffffu, sum.w, o);
        }
        if (r == 0) {
            uint2 packed;
            packed.x = to_bf16x2(sum.x, sum.y);
            packed.y = to_bf16x2(sum.z, sum.w);
            *reinterpret_cast<uint2*>(out + (pair0 + h) * CKV + c4 * 4) = packed;
        }
    }
#endif
}

// ------------------------------------------------------------------------------------
// the combine kernel: 128 threads, 4 output columns each

extern "C" __global__ __launch_bounds__(128) void sparse_mla_combine(
    const float* __restrict__ part_out, const float* __restrict__ part_lse, u16* __restrict__ out,
    float* __restrict__ lse, int splits) {
    const size_t pair = blockIdx.x;  // token * 16 + head
    const float* lses = part_lse + pair * splits;
    float peak = NEG_INF;
    for (int s = 0; s < splits; ++s) peak = fmaxf(peak, __ldg(lses + s));
    const float base = peak == NEG_INF ? 0.f : peak;
    const int col = threadIdx.x * 4;
    float total = 0.f;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
        const float w = exp2f(__ldg(lses + s) - base);
        total += w;
        if (w > 0.f) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(part_out + (pair * splits + s) * CKV + col));
            sum.x += w * v.x; sum.y += w * v.y; sum.z += w * v.z; sum.w += w * v.w;
        }
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    uint2 packed;
    packed.x = to_bf16x2(sum.x * inv, sum.y * inv);
    packed.y = to_bf16x2(sum.z * inv, sum.w * inv);
    *reinterpret_cast<uint2*>(out + pair * CKV + col) = packed;
    if (threadIdx.x == 0) lse[pair] = total > 0.f ? base + log2f(total) : NEG_INF;
}
