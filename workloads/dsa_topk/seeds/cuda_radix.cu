// DSA top-k indexer (DeepSeek-V3.2 style), two kernels:
//
//   score_pages  grid (ceil(max_pages / ppb), B): scores `ppb` logical pages of one row.
//                score[t] = scale[t] * sum_h w[h] * relu(sum_d q[h][d] * k[t][d])
//                (scales are positive, so relu(s*x) = s*relu(x)).
//   select_topk  grid (B): radix-selects the top-k scores of one row and writes the
//                global ids (physical_page*64 + offset); -1 pads rows shorter than k.
//
// Page layout: 8448 bytes per physical page = 64 tokens x 128 fp8 e4m3 bytes (token
// major) followed by 64 float32 scales.
//
// Parameters (each arrives as a #define from the harness; defaults below):
//   SCORE_IMPL_MMA / SCORE_IMPL_SIMT  tensor-core fp8 mma.sync (sm_89+) or fp32 SIMT;
//                                     mma silently falls back to SIMT below sm_89.
//   VEC              bytes per global load of the fp8 fragments (4, 8 or 16; mma path).
//   PREFETCH         1: load the next key tile before the mma of the current one.
//   SCORE_THREADS    threads per score block (multiple of 32).
//   RADIX_BITS       digit width of the radix select (11: 3 digits, 8: 4 digits).
//   SELECT_THREADS   threads per select block (multiple of 32, at most 1024).
// The pages per score block are a runtime argument (the host chooses them).
// No #include: NVRTC has no host headers.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

#if !defined(SCORE_IMPL_MMA) && !defined(SCORE_IMPL_SIMT)
#define SCORE_IMPL_MMA 1
#endif
#if defined(SCORE_IMPL_MMA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 890)
#undef SCORE_IMPL_MMA
#define SCORE_IMPL_SIMT 1
#endif
#if defined(SCORE_IMPL_MMA) && defined(SCORE_IMPL_SIMT)
#undef SCORE_IMPL_SIMT
#endif
#ifndef VEC
#define VEC 16
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef SCORE_THREADS
#define SCORE_THREADS 128
#endif
#ifndef RADIX_BITS
#define RADIX_BITS 11
#endif
#ifndef SELECT_THREADS
#define SELECT_THREADS 1024
#endif

#if (SCORE_THREADS % 32) != 0 || SCORE_THREADS < 32 || SCORE_THREADS > 1024
#error "SCORE_THREADS must be a multiple of 32 in [32, 1024]"
#endif
#if (SELECT_THREADS % 32) != 0 || SELECT_THREADS < 32 || SELECT_THREADS > 1024
#error "SELECT_THREADS must be a multiple of 32 in [32, 1024]"
#endif
#if VEC != 4 && VEC != 8 && VEC != 16
#error "VEC must be 4, 8 or 16"
#endif
#if RADIX_BITS < 4 || RADIX_BITS > 12
#error "RADIX_BITS must lie in [4, 12]"
#endif

#define PAGE_TOKENS 64
#define NUM_HEADS 64
#define HEAD_DIM 128
#define PAGE_BYTES 8448
#define KEY_BYTES 8192
#define FULL_MASK 0xffffffffu

// ------------------------------------------------------------------------------------
// helpers

// 32 contiguous bytes (16-byte aligned) -> 8 words, loaded VEC bytes at a time.
__device__ __forceinline__ void load32(const u8* __restrict__ p, u32 (&w)[8]) {
#if VEC == 16
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
#elif VEC == 8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(p) + i);
        w[2 * i] = a.x; w[2 * i + 1] = a.y;
    }
#else
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __ldg(reinterpret_cast<const u32*>(p) + i);
#endif
}

// fp8 e4m3 (finite values) -> float, exact: move exponent/mantissa into float position
// and rebias by 2^(127-7). Subnormals come out right because the multiply is exact.
__device__ __forceinline__ float fp8_to_float(u32 b) {
    const u32 bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
    return __uint_as_float(bits) * 0x1p120f;
}

// Order-preserving map float -> u32 (larger float, larger key).
__device__ __forceinline__ u32 float_key(float f) {
    const u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#if defined(SCORE_IMPL_MMA)
// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + D, fp32 accumulate.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                         u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// ------------------------------------------------------------------------------------
// scoring

#if defined(SCORE_IMPL_MMA)
// Heads are the mma M dimension (4 tiles of 16), tokens N (tiles of 8), head_dim K
// (4 steps of 32). The sum over d does not depend on the order of d, so lane
// (g = lane/4, t = lane%4) uses bytes [32t, 32t+32) of its rows for all four k-steps:
// k-step s, logical k 4t..4t+3 <- bytes 32t+8s..+3, k 16+4t..+3 <- bytes 32t+8s+4..+7,
// identically for q (A) and keys (B). Each lane thus holds the whole q slice it needs
// in 64 registers and reads 32 contiguous key bytes per 8-token tile.
extern "C" __global__ __launch_bounds__(SCORE_THREADS) void score_pages(
    const u8* __restrict__ q, const u8* __restrict__ cache, const float* __restrict__ weights,
    const int* __restrict__ seq_lens, const int* __restrict__ block_table,
    float* __restrict__ scores, int max_pages, int topk, int pages_per_block) {
    const int row = blockIdx.y;
    const int slots = max_pages * PAGE_TOKENS;
    const int len = min(seq_lens[row], slots);
    if (len <= topk) return;  // select_topk takes every valid token, no scores needed
    const int page0 = blockIdx.x * pages_per_block;
    if (page0 * PAGE_TOKENS >= len) return;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int ntiles = pages_per_block * (PAGE_TOKENS / 8);
    const int* __restrict__ bt = block_table + (size_t)row * max_pages;
    float* __restrict__ out = scores + (size_t)row * slots;

    // key tile j: logical page page0 + j/8, tokens (j%8)*8 .. +8 of it
    int j = warp;
    bool live = j < ntiles && (page0 + (j >> 3)) * PAGE_TOKENS + (j & 7) * 8 < len;
    const u8* page = cache;
    u32 kw[8];
    float2 sc = make_float2(0.f, 0.f);
    if (live) {
        page = cache + (size_t)bt[page0 + (j >> 3)] * PAGE_BYTES;
        load32(page + ((j & 7) * 8 + g) * HEAD_DIM + 32 * t, kw);
        sc = __ldg(reinterpret_cast<const float2*>(page + KEY_BYTES) + (j & 7) * 4 + t);
    }

    // q rows 8i+g (i = 0..7), bytes [32t, 32t+32); weights of the same rows
    u32 qa[8][8];
    float wt[8];
    const u8* __restrict__ qrow = q + (size_t)row * NUM_HEADS * HEAD_DIM;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        load32(qrow + (8 * i + g) * HEAD_DIM + 32 * t, qa[i]);
        wt[i] = __ldg(weights + (size_t)row * NUM_HEADS + 8 * i + g);
    }

    while (live) {
        const int jn = j + SCORE_THREADS / 32;
        const bool live_n =
            jn < ntiles && (page0 + (jn >> 3)) * PAGE_TOKENS + (jn & 7) * 8 < len;
#if PREFETCH
        const u8* page_n = cache;
        u32 kn[8];
        float2 sc_n = make_float2(0.f, 0.f);
        if (live_n) {
            page_n = cache + (size_t)bt[page0 + (jn >> 3)] * PAGE_BYTES;
            load32(page_n + ((jn & 7) * 8 + g) * HEAD_DIM + 32 * t, kn);
            sc_n = __ldg(reinterpret_cast<const float2*>(page_n + KEY_BYTES) + (jn & 7) * 4 + t);
        }
#endif
        float acc[4][4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            acc[m][0] = 0.f; acc[m][1] = 0.f; acc[m][2] = 0.f; acc[m][3] = 0.f;
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                mma_e4m3(acc[m], qa[2 * m][2 * s], qa[2 * m + 1][2 * s], qa[2 * m][2 * s + 1],
                         qa[2 * m + 1][2 * s + 1], kw[2 * s], kw[2 * s + 1]);
            }
        }
        // acc[m]: c0,c1 -> head 16m+g, tokens 2t,2t+1; c2,c3 -> head 16m+g+8, same tokens
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            p0 += wt[2 * m] * fmaxf(acc[m][0], 0.f) + wt[2 * m + 1] * fmaxf(acc[m][2], 0.f);
            p1 += wt[2 * m] * fmaxf(acc[m][1], 0.f) + wt[2 * m + 1] * fmaxf(acc[m][3], 0.f);
        }
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            p0 += __shfl_xor_sync(FULL_MASK, p0, off);
            p1 += __shfl_xor_sync(FULL_MASK, p1, off);
        }
        if (g == 0) {
            const int tok = (page0 + (j >> 3)) * PAGE_TOKENS + (j & 7) * 8 + 2 * t;
            *reinterpret_cast<float2*>(out + tok) = make_float2(p0 * sc.x, p1 * sc.y);
        }
        j = jn;
        live = live_n;
#if PREFETCH
        page = page_n;
#pragma unroll
        for (int i = 0; i < 8; ++i) kw[i] = kn[i];
        sc = sc_n;
#else
        if (live) {
            page = cache + (size_t)bt[page0 + (j >> 3)] * PAGE_BYTES;
            load32(page + ((j & 7) * 8 + g) * HEAD_DIM + 32 * t, kw);
            sc = __ldg(reinterpret_cast<const float2*>(page + KEY_BYTES) + (j & 7) * 4 + t);
        }
#endif
    }
}

#else  // SCORE_IMPL_SIMT

// fp32 fallback: q (dequantised, transposed, padded) and weights in shared memory; each
// warp scores one token at a time, lane l owning heads l and l+32.
#define QT_STRIDE 65
extern "C" __global__ __launch_bounds__(SCORE_THREADS) void score_pages(
    const u8* __restrict__ q, const u8* __restrict__ cache, const float* __restrict__ weights,
    const int* __restrict__ seq_lens, const int* __restrict__ block_table,
    float* __restrict__ scores, int max_pages, int topk, int pages_per_block) {
    __shared__ float qt[HEAD_DIM * QT_STRIDE];
    __shared__ float key[SCORE_THREADS / 32][HEAD_DIM];
    const int row = blockIdx.y;
    const int slots = max_pages * PAGE_TOKENS;
    const int len = min(seq_lens[row], slots);
    if (len <= topk) return;
    const int page0 = blockIdx.x * pages_per_block;
    if (page0 * PAGE_TOKENS >= len) return;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int* __restrict__ bt = block_table + (size_t)row * max_pages;
    float* __restrict__ out = scores + (size_t)row * slots;

    const u8* __restrict__ qrow = q + (size_t)row * NUM_HEADS * HEAD_DIM;
    for (int i = threadIdx.x; i < NUM_HEADS * HEAD_DIM; i += SCORE_THREADS) {
        const int h = i / HEAD_DIM, d = i % HEAD_DIM;
        qt[d * QT_STRIDE + h] = fp8_to_float(qrow[i]);
    }
    const float w0 = weights[(size_t)row * NUM_HEADS + lane];
    const float w1 = weights[(size_t)row * NUM_HEADS + lane + 32];
    __syncthreads();

    const int end = min(len, (page0 + pages_per_block) * PAGE_TOKENS);
    for (int tok = page0 * PAGE_TOKENS + warp; tok < end; tok += SCORE_THREADS / 32) {
        const u8* page = cache + (size_t)bt[tok / PAGE_TOKENS] * PAGE_BYTES;
        const int o = tok % PAGE_TOKENS;
        const u32 kb = __ldg(reinterpret_cast<const u32*>(page + o * HEAD_DIM) + lane);
        key[warp][4 * lane + 0] = fp8_to_float(kb & 0xffu);
        key[warp][4 * lane + 1] = fp8_to_float((kb >> 8) & 0xffu);
        key[warp][4 * lane + 2] = fp8_to_float((kb >> 16) & 0xffu);
        key[warp][4 * lane + 3] = fp8_to_float(kb >> 24);
        __syncwarp();
        float a0 = 0.f, a1 = 0.f;
#pragma unroll 8
        for (int d = 0; d < HEAD_DIM; ++d) {
            const float kd = key[warp][d];
            a0 = fmaf(qt[d * QT_STRIDE + lane], kd, a0);
            a1 = fmaf(qt[d * QT_STRIDE + lane + 32], kd, a1);
        }
        float p = w0 * fmaxf(a0, 0.f) + w1 * fmaxf(a1, 0.f);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) p += __shfl_xor_sync(FULL_MASK, p, off);
        if (lane == 0) {
            const float s = __ldg(reinterpret_cast<const float*>(page + KEY_BYTES) + o);
            out[tok] = p * s;
        }
        __syncwarp();  // key[warp] is rewritten by the next token
    }
}
#endif

// ------------------------------------------------------------------------------------
// selection
//
// One block per row. For L <= topk every valid token is written. Otherwise:
//   1. stage the row's block table, turn the scores into order-preserving u32 keys in
//      shared memory and histogram their top RADIX_BITS bits on the way;
//   2. find the bin holding the topk-th largest key; keys in higher bins are certainly
//      selected and are written out at once, keys in that bin become candidates;
//   3. refine among the candidates with the remaining digits (usually few keys), then
//      write the candidates above the final threshold and as many equal to it as needed.
// Dynamic shared memory (host: select_smem_bytes): hist u32[2^RADIX_BITS] | keys
// u32[slots] | candidates u16[slots] | block table int[max_pages].

#define SEL_WARPS (SELECT_THREADS / 32)
#define NUM_PASSES ((32 + RADIX_BITS - 1) / RADIX_BITS)
#define MAX_BINS (1 << RADIX_BITS)

// Exclusive prefix sum of v over the threads of the block (in thread order).
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* warp_tot) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(FULL_MASK, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < SEL_WARPS ? warp_tot[lane] : 0u;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const u32 y = __shfl_up_sync(FULL_MASK, w, off);
            if (lane >= off) w += y;
        }
        if (lane < SEL_WARPS) warp_tot[lane] = w;  // inclusive totals
    }
    __syncthreads();
    const u32 before = warp > 0 ? warp_tot[warp - 1] : 0u;
    __syncthreads();  // warp_tot may be reused right after
    return before + x - v;
}

// Finds the bin b with above(b) < krem <= above(b) + hist[b], where above(b) counts the
// keys in bins > b. Result in res[0] (bin), res[1] (above), res[2] (hist[b]); ends with a
// barrier, so every thread may read res afterwards.
__device__ __forceinline__ void find_bin(const u32* hist, int nbins, u32 krem, u32* warp_tot,
                                         u32* res) {
    const int per = (nbins + SELECT_THREADS - 1) / SELECT_THREADS;
    const int top = nbins - 1 - (int)threadIdx.x * per;  // highest owned bin (may be < 0)
    u32 own = 0u;
    for (int c = 0; c < per; ++c)
        if (top - c >= 0) own += hist[top - c];
    const u32 above = block_exclusive_scan(own, warp_tot);
    if (above < krem && above + own >= krem) {  // exactly one thread
        u32 cum = above;
        for (int c = 0; c < per; ++c) {
            const u32 h = hist[top - c];  // still >= 0: the remaining owned bins hold keys
            if (cum + h >= krem) {
                res[0] = (u32)(top - c); res[1] = cum; res[2] = h;
                break;
            }
            cum += h;
        }
    }
    __syncthreads();
}

// Warp-aggregated slot reservation: returns this lane's slot for `want` lanes (all lanes
// of the warp must call it).
__device__ __forceinline__ u32 warp_reserve(bool want, u32* counter) {
    const int lane = threadIdx.x & 31;
    const u32 vote = __ballot_sync(FULL_MASK, want);
    u32 base = 0u;
    if (lane == 0 && vote) base = atomicAdd(counter, (u32)__popc(vote));
    base = __shfl_sync(FULL_MASK, base, 0);
    return base + (u32)__popc(vote & ((1u << lane) - 1u));
}

extern "C" __global__ __launch_bounds__(SELECT_THREADS) void select_topk(
    const float* __restrict__ scores, const int* __restrict__ seq_lens,
    const int* __restrict__ block_table, int* __restrict__ topk_indices, int max_pages,
    int topk) {
    extern __shared__ __align__(16) u32 smem[];
    __shared__ u32 warp_tot[32];
    __shared__ u32 res[3];
    __shared__ u32 s_cnt_gt, s_ncand, s_cnt_gt2, s_cnt_eq;

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const int slots = max_pages * PAGE_TOKENS;
    const int len = min(seq_lens[row], slots);
    const int* __restrict__ bt = block_table + (size_t)row * max_pages;
    int* __restrict__ out = topk_indices + (size_t)row * topk;

    if (len <= topk) {  // block-uniform branch; shared memory is not touched
        for (int i = tid; i < topk; i += SELECT_THREADS)
            out[i] = i < len ? bt[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS) : -1;
        return;
    }

    u32* hist = smem;
    u32* keys = smem + MAX_BINS;
    unsigned short* cand = reinterpret_cast<unsigned short*>(keys + slots);
    int* bts = reinterpret_cast<int*>(cand + slots);  // slots is a multiple of 64

    // 1. block table, cleared histogram, counters
    const int npages = (len + PAGE_TOKENS - 1) / PAGE_TOKENS;
    for (int i = tid; i < npages; i += SELECT_THREADS) bts[i] = bt[i];
    for (int i = tid; i < MAX_BINS; i += SELECT_THREADS) hist[i] = 0u;
    if (tid == 0) { s_cnt_gt = 0u; s_ncand = 0u; s_cnt_gt2 = 0u; s_cnt_eq = 0u; }
    __syncthreads();

    // keys + histogram of the top digit (row start is 256-byte aligned)
    const int lo0 = 32 - RADIX_BITS;
    const float* __restrict__ srow = scores + (size_t)row * slots;
    const int len4 = len >> 2;
    for (int i = tid; i < len4; i += SELECT_THREADS) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(srow) + i);
        const uint4 k = make_uint4(float_key(f.x), float_key(f.y), float_key(f.z), float_key(f.w));
        reinterpret_cast<uint4*>(keys)[i] = k;
        atomicAdd(&hist[k.x >> lo0], 1u);
        atomicAdd(&hist[k.y >> lo0], 1u);
        atomicAdd(&hist[k.z >> lo0], 1u);
        atomicAdd(&hist[k.w >> lo0], 1u);
    }
    for (int i = (len4 << 2) + tid; i < len; i += SELECT_THREADS) {
        const u32 k = float_key(srow[i]);
        keys[i] = k;
        atomicAdd(&hist[k >> lo0], 1u);
    }
    __syncthreads();

    // 2. top digit of the threshold; split into certain winners and candidates
    find_bin(hist, MAX_BINS, (u32)topk, warp_tot, res);
    const u32 bin0 = res[0];
    const u32 above0 = res[1];
    u32 krem = (u32)topk - above0;  // still wanted among the candidates
    u32 matching = res[2];          // candidates (keys whose top digit is bin0)
    for (int base = 0; base < len; base += SELECT_THREADS) {
        const int i = base + tid;
        const u32 d = i < len ? keys[i] >> lo0 : 0u;
        const bool gt = i < len && d > bin0;
        const bool eq = i < len && d == bin0;
        const u32 pg = warp_reserve(gt, &s_cnt_gt);
        const u32 pc = warp_reserve(eq, &s_ncand);
        if (gt) out[pg] = bts[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
        if (eq) cand[pc] = (unsigned short)i;
    }
    __syncthreads();  // candidates complete; res and hist free again
    const int ncand = (int)matching;

    // 3. refine among the candidates with the lower digits
    u32 prefix = bin0 << lo0;
    u32 pmask = (u32)(MAX_BINS - 1) << lo0;
#pragma unroll 1
    for (int pass = 1; pass < NUM_PASSES && matching != krem; ++pass) {  // uniform
        const int hi = 32 - RADIX_BITS * pass;  // digit covers bits [lo, hi)
        const int lo = hi - RADIX_BITS > 0 ? hi - RADIX_BITS : 0;
        const int nbins = 1 << (hi - lo);
        const u32 dmask = (u32)(nbins - 1);
        for (int i = tid; i < nbins; i += SELECT_THREADS) hist[i] = 0u;
        __syncthreads();
        for (int j = tid; j < ncand; j += SELECT_THREADS) {
            const u32 k = keys[cand[j]];
            if ((k & pmask) == prefix) atomicAdd(&hist[(k >> lo) & dmask], 1u);
        }
        __syncthreads();
        find_bin(hist, nbins, krem, warp_tot, res);
        prefix |= res[0] << lo;
        pmask |= dmask << lo;
        krem -= res[1];
        matching = res[2];
        __syncthreads();  // res / hist are rewritten by the next pass
    }

    // Candidates above the threshold (in the decided bits) are winners; `krem` of the
    // ones equal to it fill the remaining slots.
    const u32 first = above0;                              // slots taken in step 2
    const u32 first_eq = (u32)topk - krem;                 // after the refined winners
    for (int base = 0; base < ncand; base += SELECT_THREADS) {
        const int j = base + tid;
        const int i = j < ncand ? (int)cand[j] : 0;
        const u32 km = j < ncand ? keys[i] & pmask : 0u;
        const bool gt = j < ncand && km > prefix;
        const bool eq = j < ncand && km == prefix;
        const u32 pg = warp_reserve(gt, &s_cnt_gt2);
        const u32 pe = warp_reserve(eq, &s_cnt_eq);
        const int id = bts[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
        if (gt) out[first + pg] = id;
        if (eq && pe < krem) out[first_eq + pe] = id;
    }
}
