// FP8 block-scale DeepSeek MoE rank for small batches (at most 64 tokens), in three launches
// that stream every routed expert's weights once:
//
//   moe_route   one CTA. Routing, one warp per token: sigmoid scores, the biased scores'
//               group top-2 sums, the 4 best groups, the 8 best experts in them, weights
//               from the unbiased scores, normalised, times the scaling factor. Then the
//               permutation: the local (token, slot) pairs listed by expert, tokens
//               ascending, and each expert's list cut into passes of at most PASS_PAIRS
//               pairs. A pass (expert, first pair row, pair count) is what both GEMMs work
//               on: one pass's pairs are the 8 * PASS_FRAGS columns of their mma tiles.
//   moe_gemm1   persistent. Every warp is a worker of its own: it takes units (a 16-row
//               tile of GEMM1's weights, up or gate rows; a pass; a range of the 56 K
//               blocks) round-robin and streams their weight tiles, the pass's gathered
//               activation rows and the scales through a cp.async ring of its own, with
//               the next unit's loads in flight while the current one computes. Products
//               on fp8 mma.sync (m16n8k32, f32 accumulate); each 128-deep K block's
//               product is scaled by its weight and activation scales. Partial sums are
//               added to an fp32 buffer; the warp that completes a (pass, 128-column
//               block), counted per block, applies SwiGLU silu(gate) * up, quantises the
//               block to fp8 per pair (scale amax / 448) for GEMM2, and returns the sums
//               and the counter to zero.
//   moe_gemm2   persistent, the same stream over GEMM2's weights (16 hidden rows, a pass,
//               a range of the 16 K blocks) against the fp8 intermediate. Results times the
//               pair's routing weight are added into an fp32 [T, 7168] buffer; the warp
//               that completes a 16-row tile (every pass and K range of it) writes those
//               rows of the bf16 output for every token (zeros where a token chose no local
//               expert) and zeroes the buffer.
//
// Why this shape (hypotheses, unmeasured when written): up to ~64 tokens a call is bound by
// the bytes of the chosen experts' weights (44 MB an expert). The work is cut into many
// small independent units, so that every SM streams weights whatever the number of
// experts chosen (one at one token, ~20 at 60), units are balanced across all warps
// without a host sync (the kernels read the pass count and pick their split-K from it,
// see pick_split), and no launch waits on an idle grid: three launches a call, no memset.
// A review (no GPU) found each unit's fixed costs the likely limit at a few tokens; hence
// the pass and pair tables in shared memory, one fence per unit outside the last warp,
// batched loads in the fixups, and a split-K chosen for the fewest rounds of units.
//
// The mma operands. m16n8k32 takes, per thread, 8 bytes of A row g (= lane / 4) and of
// row g + 8 as registers (a0, a2) and (a1, a3), and 8 bytes of B column g as (b0, b1),
// where a0/b0 and a2/b1 cover the same k. A dot product does not depend on the order of
// its k, so each thread loads 32 contiguous bytes of its rows and of its column per
// 128-deep K block, in four 8-byte pieces, one mma each: any k order the instruction uses
// is the same for A and B. Shared memory rows are 128 bytes with their 16-byte chunks
// XOR-swizzled by (row & 7), so the fragment reads are free of bank conflicts.
//
// Memory ordering of the fixups: each lane's atomic adds, __syncwarp() (ordering them
// before lane 0's next steps), then lane 0's fence and acq_rel count. The warp that reads
// count - 1 back is the last one; its lanes fence and read the sums with ld.global.cg (L2,
// where the atomics land).
// Counters and sums are zero between calls (zeroed once at allocation, returned to zero
// by the warp that used them), so no call needs a memset and a CUDA graph can replay it.
// Two concurrent calls must not share one workspace.
//
// Layouts: routing_logits [T, 256] f32; routing_bias [256] bf16; hidden_states [T, 7168]
// fp8 e4m3; hidden_states_scale [56, T] f32; gemm1_weights [32, 4096, 7168] fp8 (up rows,
// then gate rows); gemm1_weights_scale [32, 32, 56]; gemm2_weights [32, 7168, 2048];
// gemm2_weights_scale [32, 56, 16]; output [T, 7168] bf16. Workspace: see
// cuda_small_batch_host.py.
//
// Parameters (each arrives as a #define from the harness; defaults below):
//   PASS_FRAGS   8-column mma tiles per pass (a pass holds at most 8 * PASS_FRAGS pairs).
//   STAGES       ring depth per warp (reduced where the ring does not fit, see RING).
//   WARPS        warps per CTA of both GEMM kernels.
//   CTAS_PER_SM  CTAs the host launches per SM (the ring is sized to let them fit).
//   SPLIT_UNIT_COST  a unit's fixed cost in K blocks, for the automatic split-K.
// No #include: NVRTC has no host headers.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#ifndef PASS_FRAGS
#define PASS_FRAGS 1
#endif
#ifndef STAGES
#define STAGES 6
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 1
#endif
#ifndef SPLIT_UNIT_COST
#define SPLIT_UNIT_COST 2
#endif

#if PASS_FRAGS != 1 && PASS_FRAGS != 2 && PASS_FRAGS != 4
#error "PASS_FRAGS must be 1, 2 or 4"
#endif
#if WARPS != 4 && WARPS != 8 && WARPS != 16
#error "WARPS must be 4, 8 or 16"
#endif
#if STAGES < 2 || STAGES > 8
#error "STAGES must lie in [2, 8]"
#endif
#if CTAS_PER_SM < 1 || CTAS_PER_SM > 4
#error "CTAS_PER_SM must lie in [1, 4]"
#endif

#define HIDDEN 7168
#define INTER 2048
#define GEMM1_ROWS 4096            // up rows, then gate rows
#define EXPERTS 256
#define LOCAL 32
#define TOP_K 8
#define GROUPS 8
#define KEEP_GROUPS 4
#define KB1 56                     // 128-deep K blocks of GEMM1
#define KB2 16                     // ... of GEMM2
#define TILES1 256                 // 16-row weight tiles of GEMM1 (128 up, then 128 gate)
#define TILES2 448                 // ... of GEMM2
#define MAX_TOKENS 64
#define MAX_PAIRS (MAX_TOKENS * TOP_K)
#define MAX_PASSES (LOCAL + MAX_TOKENS)  // each expert's pairs / PASS_PAIRS, rounded up
#define PASS_PAIRS (8 * PASS_FRAGS)
#define THREADS (WARPS * 32)
#define ROUTE_THREADS 1024

// One ring stage of a warp: the 16 x 128 weight tile, the pass's 8 * PASS_FRAGS activation
// rows (128 bytes each), their scales, the weight tile's scale (padded to 16 bytes).
#define A_BYTES 2048
#define B_BYTES (PASS_PAIRS * 128)
#define AS_BYTES (PASS_PAIRS * 4)
#define STAGE_BYTES (A_BYTES + B_BYTES + AS_BYTES + 16)
#define SMEM_PER_SM 232448         // 227 KiB on sm_90
#define SMEM_PER_CTA (SMEM_PER_SM / CTAS_PER_SM - 1024)   // the driver reserves 1 KiB a CTA
#define TABLE_BYTES ((3 * MAX_PASSES + 2 * MAX_PAIRS) * 4)  // struct Tables, static
#define FITTING_STAGES ((SMEM_PER_CTA - TABLE_BYTES) / (WARPS * STAGE_BYTES))
#define RING (STAGES < FITTING_STAGES ? STAGES : FITTING_STAGES)
#define SMEM_BYTES (WARPS * RING * STAGE_BYTES)
#if FITTING_STAGES < 2
#error "two ring stages per warp do not fit: fewer WARPS, CTAS_PER_SM or PASS_FRAGS"
#endif

#define FP8_MAX 448.0f
#define NEG_INF __int_as_float(0xff800000)

// ------------------------------------------------------------------------------------
// PTX helpers (sm_89+: fp8 mma.sync). Every inline PTX of this file is here: a CPU
// emulation for the tests (tests/workloads/cuda_emulation) defines EVOKERNEL_EMULATION
// and brings its own versions of these functions.

#ifndef EVOKERNEL_EMULATION

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (nothing is read).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared; zero when !valid.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ float lds_f32(u32 addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

// d += A(16x32 e4m3, row) * B(32x8 e4m3, col), float32 accumulate.
__device__ __forceinline__ void mma_fp8(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as packed e4m3 (lo at the lower address), rounded to nearest, saturated.
__device__ __forceinline__ u32 to_e4m3x2(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u16 to_bf16(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float bf16_to_f32(u32 bits16) { return __uint_as_float(bits16 << 16); }

// The warp's arrival at a fixup counter after its atomic adds (see the header): true, in
// every lane, for the warp that completes the count of `expected`.
__device__ __forceinline__ bool arrive_last(u32* counter, u32 expected) {
    __syncwarp();
    u32 before = 0;
    if ((threadIdx.x & 31) == 0) {
        __threadfence();
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
    }
    before = __shfl_sync(0xffffffffu, before, 0);
    const bool last = before == expected - 1u;
    if (last) __threadfence();
    return last;
}

__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 have;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(have));
    return have;
}
#endif  // EVOKERNEL_EMULATION

// ------------------------------------------------------------------------------------
// routing and the permutation

struct Top8 {
    int id[TOP_K];
    float score[TOP_K];
};

// Route token t (one warp): the 8 chosen experts and their unbiased scores. Lane l holds
// experts 8l .. 8l+7, so a group of 32 experts is 4 lanes.
__device__ __forceinline__ Top8 route_token(const float* __restrict__ logits, const u16* __restrict__ bias, int t) {
    const int lane = threadIdx.x & 31;
    const float4* lp = reinterpret_cast<const float4*>(logits + (size_t)t * EXPERTS + lane * 8);
    const float4 x0 = __ldg(lp), x1 = __ldg(lp + 1);
    const uint4 bb = __ldg(reinterpret_cast<const uint4*>(bias + lane * 8));
    const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const u32 bw[4] = {bb.x, bb.y, bb.z, bb.w};
    float s[8], cand[8];
    float m1 = NEG_INF, m2 = NEG_INF;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s[i] = 1.0f / (1.0f + expf(-x[i]));
        const float b = s[i] + bf16_to_f32((bw[i / 2] >> (16 * (i % 2))) & 0xffffu);
        cand[i] = b;
        if (b > m1) {
            m2 = m1;
            m1 = b;
        } else if (b > m2) {
            m2 = b;
        }
    }
    // top two of the group: merge with the other 3 lanes of the group
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
        const float o1 = __shfl_xor_sync(0xffffffffu, m1, d), o2 = __shfl_xor_sync(0xffffffffu, m2, d);
        const float n2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
        m1 = fmaxf(m1, o1);
        m2 = n2;
    }
    const float mine = m1 + m2;
    const int group = lane >> 2;
    int rank = 0;  // groups ahead of this one (higher score, or equal and a lower index)
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        const float other = __shfl_sync(0xffffffffu, mine, 4 * j);
        rank += (other > mine || (other == mine && j < group)) ? 1 : 0;
    }
    if (rank >= KEEP_GROUPS) {
#pragma unroll
        for (int i = 0; i < 8; ++i) cand[i] = NEG_INF;
    }
    Top8 top;
#pragma unroll
    for (int k = 0; k < TOP_K; ++k) {
        float best = NEG_INF;
        int at = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (cand[i] > best) {
                best = cand[i];
                at = lane * 8 + i;
            }
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, d);
            const int oa = __shfl_xor_sync(0xffffffffu, at, d);
            if (ob > best || (ob == best && oa < at)) {
                best = ob;
                at = oa;
            }
        }
        float score = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (lane * 8 + i == at) {
                score = s[i];
                cand[i] = NEG_INF;
            }
        }
        top.id[k] = at;
        top.score[k] = __shfl_sync(0xffffffffu, score, (at >> 3) & 31);
    }
    return top;
}

extern "C" __global__ __launch_bounds__(ROUTE_THREADS) void moe_route(
    const float* __restrict__ logits, const u16* __restrict__ bias, const float* __restrict__ factor,
    const int* __restrict__ offset, int tokens, int* __restrict__ num_passes, int* __restrict__ pass_expert,
    int* __restrict__ pass_start, int* __restrict__ pass_count, int* __restrict__ pair_token,
    float* __restrict__ pair_weight) {
    __shared__ int s_expert[MAX_PAIRS];  // each pair's local expert, -1 for another rank's
    __shared__ float s_weight[MAX_PAIRS];
    __shared__ int s_count[LOCAL];
    __shared__ int s_next[LOCAL];
    if (tokens > MAX_TOKENS) __trap();  // the host sends larger batches elsewhere
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < LOCAL) s_count[threadIdx.x] = 0;
    const float scaling = __ldg(factor);
    const int first_local = __ldg(offset);
    __syncthreads();

    for (int t = warp; t < tokens; t += ROUTE_THREADS / 32) {
        const Top8 top = route_token(logits, bias, t);
        float total = 0.f;
#pragma unroll
        for (int k = 0; k < TOP_K; ++k) total += top.score[k];
        const float norm = scaling / (total + 1e-20f);
#pragma unroll
        for (int k = 0; k < TOP_K; ++k) {
            if (lane == k) {
                const int local = top.id[k] - first_local;
                const bool here = local >= 0 && local < LOCAL;
                s_expert[t * TOP_K + k] = here ? local : -1;
                s_weight[t * TOP_K + k] = top.score[k] * norm;
                if (here) atomicAdd(&s_count[local], 1);
            }
        }
    }
    __syncthreads();
    if (warp != 0) return;

    // passes: expert e's pairs cut into ceil(count / PASS_PAIRS) passes, experts ascending
    const int count = s_count[lane];
    const int passes = (count + PASS_PAIRS - 1) / PASS_PAIRS;
    int pairs_before = count, passes_before = passes;  // inclusive scans, then exclusive
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, pairs_before, d);
        const int b = __shfl_up_sync(0xffffffffu, passes_before, d);
        if (lane >= d) {
            pairs_before += a;
            passes_before += b;
        }
    }
    if (lane == 31) *num_passes = passes_before;
    pairs_before -= count;
    passes_before -= passes;
    for (int j = 0; j < passes; ++j) {
        pass_expert[passes_before + j] = lane;
        pass_start[passes_before + j] = pairs_before + j * PASS_PAIRS;
        pass_count[passes_before + j] = min(PASS_PAIRS, count - j * PASS_PAIRS);
    }
    s_next[lane] = pairs_before;
    __syncwarp();

    // each local pair to its expert's next row, in pair order (tokens ascending)
    const int pairs = tokens * TOP_K;
    for (int base = 0; base < pairs; base += 32) {
        const int q = base + lane;
        const int e = q < pairs ? s_expert[q] : -1;
        const u32 peers = __match_any_sync(0xffffffffu, e);
        if (e >= 0) {
            const int row = s_next[e] + __popc(peers & ((1u << lane) - 1u));
            pair_token[row] = q / TOP_K;
            pair_weight[row] = s_weight[q];
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(peers) - 1) s_next[e] += __popc(peers);
        __syncwarp();
    }
}

// ------------------------------------------------------------------------------------
// the warp's stream of units

// What a lane issues for one unit: the weight tile (row 0, K block 0), its scale row, and
// for each of its B chunks the activation row (K block 0, null: zero-filled), for its
// activation-scale slot the scale row (null: zero).
struct Loads {
    const u8* a;
    int a_stride;              // bytes between weight rows
    const float* ws;           // + K block
    const u8* b[2 * PASS_FRAGS];
    const float* as;
    int as_step;               // floats between one K block's activation scale and the next
    int kb0;
};

// Queue K block kb0 + step of `ld` into the ring stage at `st`.
__device__ __forceinline__ void issue(const Loads& ld, int step, u32 st, const u8* any) {
    const int lane = threadIdx.x & 31;
    const int kb = ld.kb0 + step;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 16 rows x 8 chunks
        const int q = lane + 32 * i, r = q >> 3, c = q & 7;
        cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4), ld.a + (size_t)r * ld.a_stride + kb * 128 + c * 16, true);
    }
#pragma unroll
    for (int i = 0; i < 2 * PASS_FRAGS; ++i) {  // 8 * PASS_FRAGS rows x 8 chunks
        const int q = lane + 32 * i, r = q >> 3, c = q & 7;
        const u8* src = ld.b[i] ? ld.b[i] + kb * 128 + c * 16 : any;
        cp_async16(st + A_BYTES + r * 128 + ((c ^ (r & 7)) << 4), src, ld.b[i] != nullptr);
    }
    if (lane < PASS_PAIRS) {
        const float* src = ld.as ? ld.as + kb * ld.as_step : reinterpret_cast<const float*>(any);
        cp_async4(st + A_BYTES + B_BYTES + lane * 4, src, ld.as != nullptr);
    }
    if (lane == 0) cp_async4(st + A_BYTES + B_BYTES + AS_BYTES, ld.ws + kb, true);
}

// acc += the scaled product of one ring stage (a 128-deep K block) for the pass's first
// `frags` 8-column tiles.
__device__ __forceinline__ void compute(u32 st, int frags, float (&acc)[PASS_FRAGS][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const u32 c0 = ((2 * tig) ^ g) << 4, c1 = ((2 * tig + 1) ^ g) << 4;  // rows r with r & 7 == g
    const uint4 lo0 = lds128(st + g * 128 + c0), lo1 = lds128(st + g * 128 + c1);
    const uint4 hi0 = lds128(st + (g + 8) * 128 + c0), hi1 = lds128(st + (g + 8) * 128 + c1);
    const float w_scale = lds_f32(st + A_BYTES + B_BYTES + AS_BYTES);
#pragma unroll
    for (int f = 0; f < PASS_FRAGS; ++f) {
        if (f < frags) {
            const u32 row = st + A_BYTES + (f * 8 + g) * 128;
            const uint4 b0 = lds128(row + c0), b1 = lds128(row + c1);
            float t[4] = {0.f, 0.f, 0.f, 0.f};
            mma_fp8(t, lo0.x, hi0.x, lo0.y, hi0.y, b0.x, b0.y);
            mma_fp8(t, lo0.z, hi0.z, lo0.w, hi0.w, b0.z, b0.w);
            mma_fp8(t, lo1.x, hi1.x, lo1.y, hi1.y, b1.x, b1.y);
            mma_fp8(t, lo1.z, hi1.z, lo1.w, hi1.w, b1.z, b1.w);
            const u32 scales = st + A_BYTES + B_BYTES + (f * 8 + 2 * tig) * 4;
            const float s0 = w_scale * lds_f32(scales), s1 = w_scale * lds_f32(scales + 4);
            acc[f][0] += t[0] * s0;
            acc[f][1] += t[1] * s1;
            acc[f][2] += t[2] * s0;
            acc[f][3] += t[3] * s1;
        }
    }
}

// The split of the K blocks (one of `choices`, divisors of `blocks`) whose units take the
// fewest rounds over the grid's warps, a round costing a unit's K blocks plus
// SPLIT_UNIT_COST; the smaller split on a tie (fewer atomics).
__device__ __forceinline__ int pick_split(int requested, int units_per_split, int blocks, const int* choices, int n) {
    if (requested > 0) return requested;
    const int workers = gridDim.x * WARPS;
    int best = choices[0];
    long long best_cost = -1;
    for (int i = 0; i < n; ++i) {
        const long long units = (long long)units_per_split * choices[i];
        const long long cost = (units + workers - 1) / workers * (blocks / choices[i] + SPLIT_UNIT_COST);
        if (best_cost < 0 || cost < best_cost) {
            best = choices[i];
            best_cost = cost;
        }
    }
    return best;
}

// The routing's pass and pair tables, copied to shared memory once per CTA.
struct Tables {
    int expert[MAX_PASSES];
    int start[MAX_PASSES];
    int count[MAX_PASSES];
    int token[MAX_PAIRS];
    float weight[MAX_PAIRS];
};

__device__ __forceinline__ void load_tables(Tables& t, int passes, int tokens, const int* pass_expert,
                                            const int* pass_start, const int* pass_count, const int* pair_token,
                                            const float* pair_weight) {
    for (int i = threadIdx.x; i < passes; i += THREADS) {
        t.expert[i] = __ldg(pass_expert + i);
        t.start[i] = __ldg(pass_start + i);
        t.count[i] = __ldg(pass_count + i);
    }
    for (int i = threadIdx.x; i < tokens * TOP_K; i += THREADS) {
        t.token[i] = __ldg(pair_token + i);
        if (pair_weight) t.weight[i] = __ldg(pair_weight + i);
    }
    __syncthreads();
}

// A unit's coordinates: the K range fastest, then the pass, then the weight tile (so that
// the passes of one expert, adjacent in the pass list, read a tile at about the same time).
struct Unit {
    int part, pass, tile;
};
__device__ __forceinline__ Unit unit_of(int u, int split, int passes) {
    return Unit{u % split, (u / split) % passes, u / (split * passes)};
}

// f(pair, row, value) for each of this lane's accumulator elements that belongs to one of
// the pass's `count` pairs: element i of 8-column tile f is (row g + 8 (i / 2), pair
// 8 f + 2 t + i % 2), g = lane / 4, t = lane % 4.
template <class F>
__device__ __forceinline__ void each_result(int frags, int count, const float (&acc)[PASS_FRAGS][4], F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int t = 0; t < PASS_FRAGS; ++t) {
        if (t < frags) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int pair = t * 8 + 2 * tig + (i & 1);
                if (pair < count) f(pair, g + 8 * (i >> 1), acc[t][i]);
            }
        }
    }
}

// A warp's stream: units gw, gw + GW, ... of `units`, each `steps` K blocks; `Op` says what
// a unit loads (Op::loads) and what it does with its sums (Op::finish).
template <class Op>
__device__ __forceinline__ void run_units(const Op& op, int units, int steps, u32 ring, const u8* any) {
    const int warp = threadIdx.x >> 5;
    const int worker = blockIdx.x * WARPS + warp, workers = gridDim.x * WARPS;
    const int mine = worker < units ? (units - worker + workers - 1) / workers : 0;
    const int total = mine * steps;
    Loads ld;
    int loading = -1;  // the unit `ld` describes (ordinal among this warp's)
#pragma unroll
    for (int s = 0; s < RING - 1; ++s) {
        if (s < total) {
            const int j = s / steps;
            if (j != loading) {
                ld = op.loads(worker + j * workers);
                loading = j;
            }
            issue(ld, s - j * steps, ring + (s % RING) * STAGE_BYTES, any);
        }
        cp_async_commit();
    }
    float acc[PASS_FRAGS][4];
    int frags = 0;
    for (int s = 0; s < total; ++s) {
        const int ahead = s + RING - 1;
        if (ahead < total) {
            const int j = ahead / steps;
            if (j != loading) {
                ld = op.loads(worker + j * workers);
                loading = j;
            }
            issue(ld, ahead - j * steps, ring + (ahead % RING) * STAGE_BYTES, any);
        }
        cp_async_commit();
        cp_async_wait<RING - 1>();
        __syncwarp();
        const int j = s / steps, step = s - j * steps;
        if (step == 0) {
            frags = (op.pairs(worker + j * workers) + 7) / 8;
#pragma unroll
            for (int f = 0; f < PASS_FRAGS; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
        }
        compute(ring + (s % RING) * STAGE_BYTES, frags, acc);
        __syncwarp();  // every lane is done with the stage before it is refilled
        if (step == steps - 1) op.finish(worker + j * workers, frags, acc);
    }
    cp_async_wait<0>();
}

__device__ __forceinline__ u32 ring_of_warp(const u8* smem) {
    return smem_u32(smem) + (threadIdx.x >> 5) * RING * STAGE_BYTES;
}

__device__ __forceinline__ void check_shared_memory() {
    if (dynamic_smem_bytes() < SMEM_BYTES) __trap();  // the host's shared_bytes() disagrees with this file
}

// ------------------------------------------------------------------------------------
// GEMM1 + SwiGLU + quantisation

struct Gemm1 {
    const u8* w1;
    const float* w1_scale;
    const u8* x;            // hidden_states
    const float* x_scale;   // [56, T]
    const Tables* t;
    float* sums;            // [pairs, 4096] f32, zero between calls
    u8* h;                  // [pairs, 2048] e4m3
    float* h_scale;         // [pairs, 16]
    u32* arrived;           // [passes, 16]
    int tokens, passes, split;

    __device__ __forceinline__ int pairs(int u) const { return t->count[unit_of(u, split, passes).pass]; }

    __device__ __forceinline__ Loads loads(int u) const {
        const int lane = threadIdx.x & 31;
        const Unit at = unit_of(u, split, passes);
        const int expert = t->expert[at.pass], start = t->start[at.pass], count = t->count[at.pass];
        Loads ld;
        ld.a = w1 + ((size_t)expert * GEMM1_ROWS + at.tile * 16) * HIDDEN;
        ld.a_stride = HIDDEN;
        ld.ws = w1_scale + ((size_t)expert * (GEMM1_ROWS / 128) + at.tile / 8) * KB1;
#pragma unroll
        for (int i = 0; i < 2 * PASS_FRAGS; ++i) {
            const int r = (lane >> 3) + 4 * i;
            ld.b[i] = r < count ? x + (size_t)t->token[start + r] * HIDDEN : nullptr;
        }
        ld.as = lane < count ? x_scale + t->token[start + lane] : nullptr;
        ld.as_step = tokens;
        ld.kb0 = at.part * (KB1 / split);
        return ld;
    }

    __device__ __forceinline__ void finish(int u, int frags, const float (&acc)[PASS_FRAGS][4]) const {
        const int lane = threadIdx.x & 31;
        const Unit at = unit_of(u, split, passes);
        const int pass = at.pass, tile = at.tile;
        const int start = t->start[pass], count = t->count[pass];
        each_result(frags, count, acc, [&](int pair, int row, float value) {
            atomicAdd(sums + (size_t)(start + pair) * GEMM1_ROWS + tile * 16 + row, value);
        });
        const int block = (tile & 127) >> 3;  // 128-column block of the intermediate
        u32* counter = arrived + pass * (INTER / 128) + block;
        if (!arrive_last(counter, 16u * split)) return;  // 8 up and 8 gate tiles, each split ways
        // the last one: SwiGLU and quantisation of columns [128 block, +128) of every pair,
        // four pairs' sums loaded at a time
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int p0 = 0; p0 < count; p0 += 4) {
            float4 up4[4], gate4[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (p0 + j < count) {
                    const float* up = sums + (size_t)(start + p0 + j) * GEMM1_ROWS + block * 128 + lane * 4;
                    up4[j] = __ldcg(reinterpret_cast<const float4*>(up));
                    gate4[j] = __ldcg(reinterpret_cast<const float4*>(up + INTER));
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (p0 + j < count) {
                    const int p = p0 + j;
                    const float uv[4] = {up4[j].x, up4[j].y, up4[j].z, up4[j].w};
                    const float gv[4] = {gate4[j].x, gate4[j].y, gate4[j].z, gate4[j].w};
                    float hv[4], amax = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        hv[i] = gv[i] / (1.0f + expf(-gv[i])) * uv[i];
                        amax = fmaxf(amax, fabsf(hv[i]));
                    }
#pragma unroll
                    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
                    const float scale = fmaxf(amax, 1e-10f) / FP8_MAX;
                    const float inv = 1.0f / scale;
                    const u32 q = to_e4m3x2(hv[0] * inv, hv[1] * inv) | (to_e4m3x2(hv[2] * inv, hv[3] * inv) << 16);
                    *reinterpret_cast<u32*>(h + (size_t)(start + p) * INTER + block * 128 + lane * 4) = q;
                    if (lane == 0) h_scale[(size_t)(start + p) * (INTER / 128) + block] = scale;
                    float* up = sums + (size_t)(start + p) * GEMM1_ROWS + block * 128 + lane * 4;
                    __stcg(reinterpret_cast<float4*>(up), zero);
                    __stcg(reinterpret_cast<float4*>(up + INTER), zero);
                }
            }
        }
        if (lane == 0) *counter = 0u;
    }
};

extern "C" __global__ __launch_bounds__(THREADS, CTAS_PER_SM) void moe_gemm1(
    const u8* __restrict__ w1, const float* __restrict__ w1_scale, const u8* __restrict__ x,
    const float* __restrict__ x_scale, const int* __restrict__ num_passes, const int* __restrict__ pass_expert,
    const int* __restrict__ pass_start, const int* __restrict__ pass_count, const int* __restrict__ pair_token,
    float* __restrict__ sums, u8* __restrict__ h, float* __restrict__ h_scale, u32* __restrict__ arrived,
    int tokens, int split) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ Tables tables;
    check_shared_memory();
    const int passes = __ldg(num_passes);
    if (passes == 0) return;
    load_tables(tables, passes, tokens, pass_expert, pass_start, pass_count, pair_token, nullptr);
    const int choices[6] = {1, 2, 4, 7, 8, 14};
    Gemm1 op{w1, w1_scale, x, x_scale, &tables, sums, h, h_scale, arrived, tokens, passes, 1};
    op.split = pick_split(split, TILES1 * passes, KB1, choices, 6);
    if (KB1 % op.split != 0) __trap();  // the host checks SPLIT_K1
    run_units(op, TILES1 * passes * op.split, KB1 / op.split, ring_of_warp(smem), w1);
}

// ------------------------------------------------------------------------------------
// GEMM2 and the combine

struct Gemm2 {
    const u8* w2;
    const float* w2_scale;
    const u8* h;
    const float* h_scale;
    const Tables* t;
    float* sums;            // [T, 7168] f32, zero between calls
    u16* out;               // [T, 7168] bf16
    u32* arrived;           // [448]
    int tokens, passes, split;

    __device__ __forceinline__ int pairs(int u) const { return t->count[unit_of(u, split, passes).pass]; }

    __device__ __forceinline__ Loads loads(int u) const {
        const int lane = threadIdx.x & 31;
        const Unit at = unit_of(u, split, passes);
        const int expert = t->expert[at.pass], start = t->start[at.pass], count = t->count[at.pass];
        Loads ld;
        ld.a = w2 + ((size_t)expert * HIDDEN + at.tile * 16) * INTER;
        ld.a_stride = INTER;
        ld.ws = w2_scale + ((size_t)expert * (HIDDEN / 128) + at.tile / 8) * KB2;
#pragma unroll
        for (int i = 0; i < 2 * PASS_FRAGS; ++i) {
            const int r = (lane >> 3) + 4 * i;
            ld.b[i] = r < count ? h + (size_t)(start + r) * INTER : nullptr;
        }
        ld.as = lane < count ? h_scale + (size_t)(start + lane) * KB2 : nullptr;
        ld.as_step = 1;
        ld.kb0 = at.part * (KB2 / split);
        return ld;
    }

    __device__ __forceinline__ void finish(int u, int frags, const float (&acc)[PASS_FRAGS][4]) const {
        const int lane = threadIdx.x & 31;
        const Unit at = unit_of(u, split, passes);
        const int tile = at.tile, start = t->start[at.pass], count = t->count[at.pass];
        each_result(frags, count, acc, [&](int pair, int row, float value) {
            const int p = start + pair;
            atomicAdd(sums + (size_t)t->token[p] * HIDDEN + tile * 16 + row, value * t->weight[p]);
        });
        u32* counter = arrived + tile;
        if (!arrive_last(counter, (u32)(passes * split))) return;
        // the last one: rows [16 tile, +16) of every token's output (4 float4 a token, all
        // loaded before any is written), and the sums back to zero
        constexpr int PER_LANE = MAX_TOKENS * 4 / 32;
        float4 v[PER_LANE];
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < tokens * 4)
                v[j] = __ldcg(reinterpret_cast<const float4*>(sums + (size_t)(i >> 2) * HIDDEN + tile * 16) + (i & 3));
        }
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < tokens * 4) {
                const size_t at = (size_t)(i >> 2) * HIDDEN + tile * 16 + (i & 3) * 4;
                uint2 packed;
                packed.x = (u32)to_bf16(v[j].x) | ((u32)to_bf16(v[j].y) << 16);
                packed.y = (u32)to_bf16(v[j].z) | ((u32)to_bf16(v[j].w) << 16);
                *reinterpret_cast<uint2*>(out + at) = packed;
                __stcg(reinterpret_cast<float4*>(sums + at), make_float4(0.f, 0.f, 0.f, 0.f));
            }
        }
        if (lane == 0) *counter = 0u;
    }
};

extern "C" __global__ __launch_bounds__(THREADS, CTAS_PER_SM) void moe_gemm2(
    const u8* __restrict__ w2, const float* __restrict__ w2_scale, const u8* __restrict__ h,
    const float* __restrict__ h_scale, const int* __restrict__ num_passes, const int* __restrict__ pass_expert,
    const int* __restrict__ pass_start, const int* __restrict__ pass_count, const int* __restrict__ pair_token,
    const float* __restrict__ pair_weight, float* __restrict__ sums, u16* __restrict__ out,
    u32* __restrict__ arrived, int tokens, int split) {
    extern __shared__ __align__(128) u8 smem[];
    check_shared_memory();
    const int passes = __ldg(num_passes);
    if (passes == 0) {  // no token chose a local expert: the output is zero
        const int n = tokens * HIDDEN / 8;
        for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS)
            reinterpret_cast<uint4*>(out)[i] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    __shared__ Tables tables;
    load_tables(tables, passes, tokens, pass_expert, pass_start, pass_count, pair_token, pair_weight);
    const int choices[4] = {1, 2, 4, 8};
    Gemm2 op{w2, w2_scale, h, h_scale, &tables, sums, out, arrived, tokens, passes, 1};
    op.split = pick_split(split, TILES2 * passes, KB2, choices, 4);
    if (KB2 % op.split != 0) __trap();  // the host checks SPLIT_K2
    run_units(op, TILES2 * passes * op.split, KB2 / op.split, ring_of_warp(smem), w2);
}
