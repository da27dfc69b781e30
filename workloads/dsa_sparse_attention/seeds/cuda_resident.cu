// DSA sparse attention (DeepSeek-V3.2 MLA, absorbed form) in one launch per call, with
// every gathered row of a CTA's span resident in shared memory at once.
//
//   sparse_mla_resident  grid (T, splits): one CTA per query token and span of its
//                        2048-slot index row, all 16 heads. The span is walked in rounds
//                        of up to MAX_ROWS slots (one round for every contest shape: the
//                        host picks spans of at most 128 slots). A round reads its slot
//                        ids in one coalesced pass, then queues the gathers of *all* its
//                        rows at once (BLOCK_N rows per copy group), so the round's bytes
//                        are in flight together rather than a few stages at a time:
//                        the gathers are what the H200's time is made of, and one deep
//                        queue per SM is what keeps its memory busy. The logits of each
//                        group of rows are computed (bf16 mma.sync, heads as the 16 rows)
//                        as soon as it lands; the softmax then sees the whole round at
//                        once (no rescaling within a round), and P @ latents runs over
//                        the round's rows from shared memory. Rounds after the first (a
//                        span longer than MAX_ROWS) rescale the accumulators as an
//                        online softmax does.
//
// With one span the CTA writes the final bf16 output and base-2 lse. With several, each
// CTA writes its span's normalised output and lse (float32 partials), and the spans are
// merged in the same launch ("spread"): after __syncthreads(), thread 0 adds EPOCH /
// splits to its token's counter (fence, then an acq_rel atomic: the release of the CTA's
// partials), then polls it with ld.acquire.gpu until it has grown by a whole EPOCH past
// old - old % EPOCH (old: what its add returned; unsigned differences, so wrap-around is
// harmless, EPOCH dividing 2^32). Every span of the token has then arrived; a fence and
// __syncthreads() order the CTA's later loads after that acquire, and the CTA merges
// output dims [split * 512/splits, +512/splits) of all heads from every span's partials
// (ld.global.cg: L2, never a stale L1 line); span 0 also writes the lse. A call adds
// exactly EPOCH to each counter it uses, so counters stay multiples of EPOCH whatever the
// split count (a power of two <= 128) and never need a reset: no memset launch, graph
// replays work. The wait is safe only if every CTA of the grid is resident at once: the
// host caps the grid at one wave (SMs x CTAS_PER_SM; see cuda_resident_host.py). A wait
// that lasts beyond SPIN_LIMIT polls (about a second) traps instead of hanging.
//
// Layouts (all contiguous): q_nope [T,16,512], q_pe [T,16,64], ckv [pages*64, 512],
// kpe [pages*64, 64] (bf16); sparse_indices [T, topk] int32 (a negative value is an
// unused slot); sm_scale: one float32 on the device; part_out [T,16,splits,512] float32
// (bf16 with PARTIALS_BFLOAT16) and part_lse [T,16,splits] float32; counters [T] u32.
//
// Parameters (each arrives as a #define from the harness; defaults below):
//   THREADS      threads per CTA (128 or 256).
//   BLOCK_N      slots per copy group: the grain at which the logits start (16, 32, 64).
//   MAX_ROWS     slots resident per round (32, 64 or 128; a multiple of BLOCK_N, at most
//                8 groups). 128 needs about 186 KB of shared memory, 64 about 101 KB.
//   CTAS_PER_SM  CTAs the host counts on per SM for the wave (1 or 2; 2 only with
//                MAX_ROWS <= 64, so that two CTAs' shared memory fits in an SM).
//   GATHER_BULK  defined (GATHER: bulk): rows arrive by Hopper's bulk-copy engine (two
//                cp.async.bulk copies a row, 1024 latent and 128 rotary bytes, issued by
//                warp 0 and counted on one mbarrier per group) instead of 72 16-byte
//                cp.async copies a row spread over the CTA's threads. A -1 slot's row is
//                zeroed by plain stores (its probability is 0, but 0 x NaN is not).
//   PARTIALS_BFLOAT16  defined (PARTIALS: bfloat16): the spans' partial outputs are stored
//                as bf16 (rounded once, 8-byte stores and loads) in the first half of the
//                float32 workspace, halving the partials' traffic; the lse partials stay
//                float32. Float32 by default.
// No #include: NVRTC has no host headers.

typedef unsigned short u16;
typedef unsigned int u32;

#ifndef THREADS
#define THREADS 256
#endif
#ifndef BLOCK_N
#define BLOCK_N 32
#endif
#ifndef MAX_ROWS
#define MAX_ROWS 128
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 1
#endif

#if THREADS != 128 && THREADS != 256
#error "THREADS must be 128 or 256"
#endif
#if BLOCK_N != 16 && BLOCK_N != 32 && BLOCK_N != 64
#error "BLOCK_N must be 16, 32 or 64"
#endif
#if (MAX_ROWS % BLOCK_N) != 0 || MAX_ROWS / BLOCK_N > 8 || MAX_ROWS > 128
#error "MAX_ROWS must be a multiple of BLOCK_N, at most 8 groups and 128 rows"
#endif
#if CTAS_PER_SM != 1 && CTAS_PER_SM != 2
#error "CTAS_PER_SM must be 1 or 2"
#endif
#ifndef CLUSTER
#define CLUSTER 0
#endif
#if CLUSTER == 8 || CLUSTER == 16
#define CLUSTER_SIZE CLUSTER
#elif CLUSTER == 0
#define CLUSTER_SIZE 8                      // the cluster kernel is built, never launched
#else
#error "CLUSTER must be 0, 8 or 16"
#endif
#if MAX_ROWS < 32
#error "MAX_ROWS must be at least 32: the staged outputs and merge weights live in the row buffer"
#endif

#define HEADS 16
#define CKV 512
#define KPE 64
#define DIM 576                     // CKV + KPE
#define ROW_ELEMS 584               // DIM + 8: rows 16 B apart in the bank space
#define ROW_BYTES (ROW_ELEMS * 2)   // 1168
#define ROW_CHUNKS 72               // 16-byte pieces per gathered row (64 latent + 8 rotary)
#define NWARPS (THREADS / 32)
#define GROUPS (MAX_ROWS / BLOCK_N)         // copy groups per round
#define COL_TILES (BLOCK_N / 8)             // 8-slot mma column tiles per group
// The logits of a group are COL_TILES x KSPLIT warp jobs: with more warps than column
// tiles, two warps share a tile, each over half of the 576 dims (summed in the softmax).
#define KSPLIT ((NWARPS / COL_TILES) >= 2 ? 2 : 1)
#define K_PER_JOB (DIM / KSPLIT)            // 576 or 288: a multiple of 32
#define COLS_PER_WARP (CKV / NWARPS)        // output columns of each warp in P @ V
#define S_STRIDE (MAX_ROWS + 4)             // floats per row of a logit tile
#define P_STRIDE (MAX_ROWS + 8)             // bf16 per row of the probability tile
#define ROW_THREADS (THREADS / HEADS)       // softmax threads per head row
#define STAGE_STRIDE (CKV + 8)              // floats per head row of the staged outputs

// Shared memory, in bytes: one mbarrier per copy group (GATHER_BULK), the queries, the
// round's rows, their slot ids, KSPLIT logit tiles, the probabilities, and per head row
// the rescale factor and the final (m, l).
#define BAR_BYTES 64
#define Q_OFF BAR_BYTES
#define KV_OFF (Q_OFF + HEADS * ROW_BYTES)
#define SLOT_OFF (KV_OFF + MAX_ROWS * ROW_BYTES)
#define S_OFF (SLOT_OFF + MAX_ROWS * 4)
#define P_OFF (S_OFF + KSPLIT * HEADS * S_STRIDE * 4)
#define STAT_OFF (P_OFF + HEADS * P_STRIDE * 2)
#define SMEM_BYTES (STAT_OFF + 3 * HEADS * 4)

#define LOG2E 1.4426950408889634f
#define EPOCH 1024u                         // what one call adds to a counter
#define SPIN_LIMIT (1u << 25)               // polls before a wait is taken for a hang
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
// A CTA launched without a cluster is a cluster of one: its own shared memory is a valid
// shared::cluster destination.
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
// Every thread of the cluster: its earlier writes released, every other thread's acquired.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The word at `local`'s shared-memory offset in the CTA of cluster rank `rank`.
__device__ __forceinline__ u32 dsmem_load(const u32* local, u32 rank) {
    u32 remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(local)), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(remote) : "memory");
    return v;
}
#endif  // EVOKERNEL_EMULATION

// The two bf16 of a packed pair as floats (lo: the lower address).
__device__ __forceinline__ float bf16_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }

// cp.async.wait_group with a run-time count (an immediate in PTX): at most `n` of this
// thread's newest groups still in flight.
__device__ __forceinline__ void cp_async_wait_pending(int n) {
    switch (n) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        case 6: cp_async_wait<6>(); break;
        default: cp_async_wait<7>(); break;
    }
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

struct Smem {
    unsigned long long* bar;  // [GROUPS] mbarriers (GATHER_BULK)
    u16* q;                   // [16][ROW_ELEMS]
    u16* kv;                  // [MAX_ROWS][ROW_ELEMS]
    int* slot;                // [MAX_ROWS] global row id, or -1
    float* s;                 // [KSPLIT][16][S_STRIDE]
    u16* p;                   // [16][P_STRIDE]
    float* alpha;             // [16]
    float* m;                 // [16]
    float* l;                 // [16]
};

// Queue the copies of group `group` of the round (slot ids already in sm.slot).
#if defined(GATHER_BULK)
// Warp 0 only: announces the group's valid bytes on its mbarrier (one arrival, lane 0),
// then copies each valid row in two bulk copies; a -1 slot's row is zeroed. The caller's
// __syncthreads() since the rows were last read orders those reads before the fence.
__device__ __forceinline__ void issue_group(const Smem& sm, int group, const u16* __restrict__ ckv,
                                            const u16* __restrict__ kpe) {
    const int lane = threadIdx.x & 31;
    constexpr int PER_LANE = (BLOCK_N + 31) / 32;
    const u32 bar = smem_u32(sm.bar + group);
    u32 valid_rows = 0;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int r = lane + 32 * i;
        const bool valid = r < BLOCK_N && sm.slot[group * BLOCK_N + r] >= 0;
        valid_rows += __popc(__ballot_sync(0xffffffffu, valid));
    }
    fence_proxy_async();  // earlier reads, then async writes
    if (lane == 0) mbar_arrive_expect(bar, valid_rows * (u32)(DIM * 2));
    __syncwarp();
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int r = lane + 32 * i;
        if (r >= BLOCK_N) continue;
        const int at = group * BLOCK_N + r;
        u16* row = sm.kv + (size_t)at * ROW_ELEMS;
        const int id = sm.slot[at];
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
// Every warp: whole rows of the group, its lanes taking the row's 72 16-byte pieces in
// turn (no division per piece), zero-filled for a -1 slot; one commit group per copy
// group.
__device__ __forceinline__ void issue_group(const Smem& sm, int group, const u16* __restrict__ ckv,
                                            const u16* __restrict__ kpe) {
    const int lane = threadIdx.x & 31;
    for (int r = group * BLOCK_N + (threadIdx.x >> 5); r < (group + 1) * BLOCK_N; r += NWARPS) {
        const int id = sm.slot[r];
        const bool valid = id >= 0;
        const long long row = valid ? id : 0;
        const u32 dst = smem_u32(sm.kv + (size_t)r * ROW_ELEMS);
#pragma unroll
        for (int piece = lane; piece < ROW_CHUNKS; piece += 32) {
            const u16* src = piece < 64 ? ckv + row * CKV + piece * 8 : kpe + row * KPE + (piece - 64) * 8;
            cp_async16(dst + piece * 16, src, valid);
        }
    }
    cp_async_commit();
}
#endif

// CLUSTER: the merge inside a token's cluster of CLUSTER_SIZE spans. Every CTA's
// normalised outputs (`stage`) and per-head lse (sm.alpha) stay in its shared memory;
// after a cluster barrier (release, then acquire: every CTA's writes visible to the
// cluster) each CTA reads the 16 x CLUSTER_SIZE lse through distributed shared memory,
// weighs the spans, and merges its slice of the output dims (CKV / CLUSTER_SIZE of them)
// from every CTA's stage; span 0 writes the lse. A last barrier keeps every CTA's shared
// memory alive until no CTA of the cluster reads it any more. No global partials, no
// counters, and no wait on CTAs outside the cluster, which the hardware schedules at once.
__device__ __forceinline__ void cluster_merge(const Smem& sm, const float* stage, u16* __restrict__ out,
                                              float* __restrict__ lse, const int token, const int split) {
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    cluster_sync();
    // [HEADS][CLUSTER_SIZE] weights, in this CTA's row buffer after the stage (never read
    // by another CTA)
    float* weight = const_cast<float*>(stage) + HEADS * STAGE_STRIDE;
    for (int i = tid; i < HEADS * CLUSTER_SIZE; i += THREADS) {
        const int h = i / CLUSTER_SIZE;
        weight[i] = __uint_as_float(dsmem_load(reinterpret_cast<const u32*>(sm.alpha + h), (u32)(i - h * CLUSTER_SIZE)));
    }
    __syncthreads();
    for (int h = warp; h < HEADS; h += NWARPS) {  // a warp per head, a lane per span
        const float x = lane < CLUSTER_SIZE ? weight[h * CLUSTER_SIZE + lane] : NEG_INF;
        float peak = x;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, o));
        const float shift = peak == NEG_INF ? 0.f : peak;  // every span empty: weights 0
        const float e = lane < CLUSTER_SIZE ? exp2f(x - shift) : 0.f;
        float total = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
        if (lane < CLUSTER_SIZE) weight[h * CLUSTER_SIZE + lane] = total > 0.f ? e / total : 0.f;
        if (split == 0 && lane == 0)
            lse[(size_t)token * HEADS + h] = total > 0.f ? shift + log2f(total) : NEG_INF;
    }
    __syncthreads();
    constexpr int SLICE = CKV / CLUSTER_SIZE;  // 64 or 32 output dims
    for (int i = tid; i < HEADS * SLICE / 2; i += THREADS) {
        const int h = i / (SLICE / 2);
        const int d = split * SLICE + 2 * (i - h * (SLICE / 2));
        const float* w = weight + h * CLUSTER_SIZE;
        const u32* at = reinterpret_cast<const u32*>(stage + h * STAGE_STRIDE + d);
        float x = 0.f, y = 0.f;
#pragma unroll
        for (int r = 0; r < CLUSTER_SIZE; ++r) {
            x += w[r] * __uint_as_float(dsmem_load(at, (u32)r));
            y += w[r] * __uint_as_float(dsmem_load(at + 1, (u32)r));
        }
        *reinterpret_cast<u32*>(out + ((size_t)token * HEADS + h) * CKV + d) = to_bf16x2(x, y);
    }
    cluster_sync();  // no CTA leaves while another may still read its shared memory
}

#define MLA_PARAMS                                                                          \
    const u16* __restrict__ q_nope, const u16* __restrict__ q_pe, const u16* __restrict__ ckv,  \
        const u16* __restrict__ kpe, const int* __restrict__ sparse_indices,                    \
        const float* __restrict__ sm_scale, u16* __restrict__ out, float* __restrict__ lse,     \
        float* __restrict__ part_out, float* __restrict__ part_lse, u32* __restrict__ counters, \
        int topk, int splits, int chunk
#define MLA_ARGS \
    q_nope, q_pe, ckv, kpe, sparse_indices, sm_scale, out, lse, part_out, part_lse, counters, topk, splits, chunk

// One CTA's span of one token: gathers, attention, and the merge of the token's spans,
// through global memory and a wait (CLUSTER_MERGE false) or inside the CTA's cluster
// (true: the cluster is the token's spans, splits == CLUSTER_SIZE).
template <bool CLUSTER_MERGE>
__device__ __forceinline__ void attend(MLA_PARAMS, const int token, const int split) {
    extern __shared__ __align__(16) unsigned char smem[];
    if (dynamic_smem_bytes() < SMEM_BYTES) __trap();  // the host's shared_bytes() disagrees with this file
    Smem sm;
    sm.bar = reinterpret_cast<unsigned long long*>(smem);
    sm.q = reinterpret_cast<u16*>(smem + Q_OFF);
    sm.kv = reinterpret_cast<u16*>(smem + KV_OFF);
    sm.slot = reinterpret_cast<int*>(smem + SLOT_OFF);
    sm.s = reinterpret_cast<float*>(smem + S_OFF);
    sm.p = reinterpret_cast<u16*>(smem + P_OFF);
    sm.alpha = reinterpret_cast<float*>(smem + STAT_OFF);
    sm.m = sm.alpha + HEADS;
    sm.l = sm.m + HEADS;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;

    const int first = split * chunk;
    const int span = max(0, min(chunk, topk - first));
    const int* idx = sparse_indices + (size_t)token * topk + first;
#if defined(GATHER_BULK)
    if (tid == 0) {
        for (int b = 0; b < GROUPS; ++b) mbar_init(smem_u32(sm.bar + b), 1);
        fence_mbarrier_init();
    }
#endif

    // the queries: a copy group of their own, older than every row's
    for (int c = tid; c < HEADS * ROW_CHUNKS; c += THREADS) {
        const int r = c / ROW_CHUNKS;
        const int piece = c - r * ROW_CHUNKS;
        const u16* src = piece < 64 ? q_nope + ((size_t)token * HEADS + r) * CKV + piece * 8
                                    : q_pe + ((size_t)token * HEADS + r) * KPE + (piece - 64) * 8;
        cp_async16(smem_u32(sm.q + r * ROW_ELEMS + piece * 8), src, true);
    }
    cp_async_commit();

    const float scale = __ldg(sm_scale) * LOG2E;  // logits in base 2
    const int row = tid / ROW_THREADS;             // the head row this thread's softmax serves
    const int sub = tid - row * ROW_THREADS;
    float m_run = NEG_INF, l_run = 0.f;
    float acc[COLS_PER_WARP / 8][4];
#pragma unroll
    for (int i = 0; i < COLS_PER_WARP / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const u32 q_base = smem_u32(sm.q);
    const u32 kv_base = smem_u32(sm.kv);

    for (int base = 0, round = 0; base < span; base += MAX_ROWS, ++round) {
        const int rows = min(MAX_ROWS, span - base);
        const int groups = (rows + BLOCK_N - 1) / BLOCK_N;
        const int width = groups * BLOCK_N;  // the round's slots, padded with -1

        // the round's slot ids in one coalesced pass (the previous round's last
        // __syncthreads freed the slots, rows, logits and probabilities)
        for (int r = tid; r < width; r += THREADS) {
            const int id = r < rows ? __ldg(idx + base + r) : -1;
            sm.slot[r] = id >= 0 ? id : -1;
        }
        __syncthreads();
#if defined(GATHER_BULK)
        if (warp == 0)
            for (int gr = 0; gr < groups; ++gr) issue_group(sm, gr, ckv, kpe);
        cp_async_wait<0>();  // the queries (the only cp.async copies)
#else
        for (int gr = 0; gr < groups; ++gr) issue_group(sm, gr, ckv, kpe);
#endif

        // logits of each copy group as soon as it lands
        for (int gr = 0; gr < groups; ++gr) {
#if defined(GATHER_BULK)
            mbar_wait(smem_u32(sm.bar + gr), round & 1);
#else
            cp_async_wait_pending(groups - 1 - gr);
#endif
            __syncthreads();  // every thread's copies (and warp 0's zeroed rows) are visible
            for (int job = warp; job < COL_TILES * KSPLIT; job += NWARPS) {
                const int nt = job % COL_TILES;
                const int part = job / COL_TILES;
                const int k_lo = part * K_PER_JOB;
                const int col = gr * BLOCK_N + nt * 8;
                float c0[4] = {0.f, 0.f, 0.f, 0.f};
                float c1[4] = {0.f, 0.f, 0.f, 0.f};
                const u32 a_row = q_base + (lane & 15) * ROW_BYTES + (lane >> 4) * 16;
                const u32 b_row = kv_base + (col + (lane & 7)) * ROW_BYTES + (lane >> 3) * 16;
#pragma unroll 3
                for (int k0 = k_lo; k0 < k_lo + K_PER_JOB; k0 += 32) {
                    u32 a0[4], a1[4], b[4];
                    ldsm_x4(a_row + k0 * 2, a0);
                    ldsm_x4(a_row + (k0 + 16) * 2, a1);
                    ldsm_x4(b_row + k0 * 2, b);
                    mma_bf16(c0, a0, b[0], b[1]);  // two chains: half the dependent depth
                    mma_bf16(c1, a1, b[2], b[3]);
                }
                float* s0 = sm.s + (part * HEADS + g) * S_STRIDE + col + 2 * t;
                float* s1 = s0 + 8 * S_STRIDE;
                s0[0] = c0[0] + c1[0]; s0[1] = c0[1] + c1[1];
                s1[0] = c0[2] + c1[2]; s1[1] = c0[3] + c1[3];
            }
        }
        __syncthreads();

        // softmax over the round, base 2: ROW_THREADS threads per head row
        {
            float* srow = sm.s + row * S_STRIDE;
            float peak = NEG_INF;
            for (int n = sub; n < width; n += ROW_THREADS) {
                float v = srow[n];
                if (KSPLIT > 1) v += srow[HEADS * S_STRIDE + n];
                v = sm.slot[n] >= 0 ? v * scale : NEG_INF;
                srow[n] = v;
                peak = fmaxf(peak, v);
            }
            const float m_new = fmaxf(m_run, row_max(peak));
            const float shift = m_new == NEG_INF ? 0.f : m_new;
            float total = 0.f;
            u16* prow = sm.p + row * P_STRIDE;
            for (int n = sub; n < width; n += ROW_THREADS) {
                const float p = exp2f(srow[n] - shift);
                prow[n] = to_bf16(p);
                total += p;
            }
            const float alpha = exp2f(m_run - shift);
            l_run = l_run * alpha + row_sum(total);
            m_run = m_new;
            if (sub == 0) sm.alpha[row] = alpha;
        }
        __syncthreads();

        // acc = acc * alpha + P @ V over the round's rows, this warp's output columns
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
            for (int kk = 0; kk < width; kk += 16) {
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
        __syncthreads();  // the rows, slots, logits and probabilities are free again
    }
    cp_async_wait<0>();  // an empty span never waited for its queries

    if (sub == 0) {
        sm.m[row] = m_run;
        sm.l[row] = l_run;
    }
    __syncthreads();

    // the normalised outputs, staged in the row buffer (every copy has landed) so that
    // they leave in 16-byte stores: [HEADS][STAGE_STRIDE] floats, 33 KB (rows 8 banks apart)
    float* stage = reinterpret_cast<float*>(sm.kv);
    {
        const int col0 = warp * COLS_PER_WARP + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = g + 8 * half;
            const float l = sm.l[r];
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int i = 0; i < COLS_PER_WARP / 8; ++i)
                *reinterpret_cast<float2*>(stage + r * STAGE_STRIDE + col0 + i * 8) =
                    make_float2(acc[i][2 * half] * inv, acc[i][2 * half + 1] * inv);
        }
    }
    __syncthreads();
    for (int i = tid; i < HEADS * CKV / 4 && !CLUSTER_MERGE; i += THREADS) {  // a cluster's stay here
        const int h = i / (CKV / 4);
        const int c4 = i - h * (CKV / 4);
        const float4 v = *reinterpret_cast<const float4*>(stage + h * STAGE_STRIDE + c4 * 4);
        const size_t pair = (size_t)token * HEADS + h;
        if (splits == 1) {
            uint2 packed;
            packed.x = to_bf16x2(v.x, v.y);
            packed.y = to_bf16x2(v.z, v.w);
            *reinterpret_cast<uint2*>(out + pair * CKV + c4 * 4) = packed;
        } else {
#if defined(PARTIALS_BFLOAT16)
            uint2 packed;
            packed.x = to_bf16x2(v.x, v.y);
            packed.y = to_bf16x2(v.z, v.w);
            reinterpret_cast<uint2*>(reinterpret_cast<u16*>(part_out) + (pair * splits + split) * CKV)[c4] = packed;
#else
            reinterpret_cast<float4*>(part_out + (pair * splits + split) * CKV)[c4] = v;
#endif
        }
    }
    if (tid < HEADS) {
        const float l = sm.l[tid];
        const float value = l > 0.f ? sm.m[tid] + log2f(l) : NEG_INF;
        const size_t pair = (size_t)token * HEADS + tid;
        if (CLUSTER_MERGE) sm.alpha[tid] = value;  // free since the last P @ V
        else if (splits == 1) lse[pair] = value;
        else part_lse[pair * splits + split] = value;
    }
    if (CLUSTER_MERGE) {
        cluster_merge(sm, stage, out, lse, token, split);
        return;
    }
    if (splits == 1) return;

    // the spread merge: wait for every span of this token, then merge this CTA's slice
    if ((CKV % (4 * splits)) != 0 || (splits & (splits - 1)) != 0) __trap();  // host: a power of two <= 128
    __syncthreads();  // the CTA's partial stores come first
    if (tid == 0) {
        u32* counter = counters + token;
        const u32 add = EPOCH / (u32)splits;
        __threadfence();
        const u32 old = add_acq_rel(counter, add);
        const u32 start = old - (old & (EPOCH - 1u));  // the counter before this call's arrivals
        u32 seen = old + add;
        u32 polls = 0;
        while (seen - start < EPOCH) {  // unsigned difference: wrap-around is harmless
            if (++polls > SPIN_LIMIT) __trap();  // the grid is not resident at once
            __nanosleep(32);
            seen = load_acquire(counter);
        }
        __threadfence();
    }
    __syncthreads();  // every thread's loads below follow thread 0's acquire

    // per head its weight of each span, normalised (scratch in the row buffer: every copy
    // has landed): a warp per head, its lanes over the spans
    float* weight = reinterpret_cast<float*>(sm.kv);  // [HEADS][splits]
    const size_t pair0 = (size_t)token * HEADS;
    for (int i = tid; i < HEADS * splits; i += THREADS) weight[i] = __ldcg(part_lse + pair0 * splits + i);
    __syncthreads();
    for (int h = warp; h < HEADS; h += NWARPS) {
        float* w = weight + h * splits;
        float peak = NEG_INF;
        for (int s = lane; s < splits; s += 32) peak = fmaxf(peak, w[s]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, o));
        const float shift = peak == NEG_INF ? 0.f : peak;  // every span empty: weights 0
        float total = 0.f;
        for (int s = lane; s < splits; s += 32) {
            const float e = exp2f(w[s] - shift);
            w[s] = e;
            total += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
        const float inv = total > 0.f ? 1.f / total : 0.f;
        for (int s = lane; s < splits; s += 32) w[s] *= inv;
        if (split == 0 && lane == 0) lse[pair0 + h] = total > 0.f ? shift + log2f(total) : NEG_INF;
    }
    __syncthreads();

    // float4 columns of this CTA's slice for every head: `lanes` consecutive threads share
    // one (head, float4) and take every lanes-th span, then add up by shuffles. Every
    // span's partial is read (an empty one holds zeros, weight 0), so the loads of a
    // thread do not wait on each other.
    const int slice4 = CKV / 4 / splits;
    const int vecs = HEADS * slice4;  // a power of two, at least 16
    const int lanes = vecs >= THREADS ? 1 : THREADS / vecs;  // at most 16: within a warp
    for (int it = tid; it < vecs * lanes; it += THREADS) {  // the same trip count in a warp
        const int v = it / lanes;
        const int r = it - v * lanes;
        const int h = v / slice4;
        const int c4 = split * slice4 + (v - h * slice4);
        const float* w = weight + h * splits;
#if defined(PARTIALS_BFLOAT16)
        const uint2* src = reinterpret_cast<const uint2*>(reinterpret_cast<const u16*>(part_out) +
                                                          (pair0 + h) * splits * CKV) + c4;
#else
        const float4* src = reinterpret_cast<const float4*>(part_out + (pair0 + h) * splits * CKV) + c4;
#endif
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int s = r; s < splits; s += lanes) {
            const float ws = w[s];
#if defined(PARTIALS_BFLOAT16)
            const uint2 p = __ldcg(src + (size_t)s * (CKV / 4));
            const float4 x = make_float4(bf16_lo(p.x), bf16_hi(p.x), bf16_lo(p.y), bf16_hi(p.y));
#else
            const float4 x = __ldcg(src + (size_t)s * (CKV / 4));
#endif
            sum.x += ws * x.x; sum.y += ws * x.y; sum.z += ws * x.z; sum.w += ws * x.w;
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
}

extern "C" __global__ __launch_bounds__(THREADS, CTAS_PER_SM) void sparse_mla_resident(MLA_PARAMS) {
    attend<false>(MLA_ARGS, blockIdx.x, blockIdx.y);
}

// CLUSTER: the cluster kernel, grid (CLUSTER_SIZE, T): a token's spans are one cluster
// (a cluster shape is declared on a declaration of its own).
extern "C" { __global__ void __cluster_dims__(CLUSTER_SIZE, 1, 1) sparse_mla_resident_cluster(MLA_PARAMS); }
extern "C" __global__ __launch_bounds__(THREADS, 1) void sparse_mla_resident_cluster(MLA_PARAMS) {
    attend<true>(MLA_ARGS, blockIdx.y, blockIdx.x);
}
