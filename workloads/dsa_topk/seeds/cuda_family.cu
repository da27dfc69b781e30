// DSA top-k indexer (DeepSeek-V3.2), a family of kernels whose parameters are structural.
//
// Every score is  s[t] = scale[t] * sum_h w[h] * relu(sum_d q[h][d] * k[t][d])  (scales
// are positive, so relu(scale*x) = scale*relu(x) and the scale is applied after the head
// sum), and every row keeps the global ids (physical_page*64 + offset) of its top-k
// tokens; rows of at most k tokens keep all of them, and -1 pads every row to k.
//
// K cache: 8448 bytes per physical page = 64 tokens x 128 fp8 e4m3 bytes (token major),
// then 64 float32 scales. q: [B, 64, 128] fp8; weights: [B, 64] f32; block_table [B, P].
//
// The host (cuda_family_host.py) picks one of five kernels from the static shapes:
//   pt_topk   no row can exceed k tokens (max_pages*64 <= k): ids and -1, no scoring.
//   ms_topk   max_pages <= 64,  batch <= 16     (mid rows, small batch)
//   ml_topk   max_pages <= 64,  batch >  16     (mid rows, large batch)
//   ls_topk   max_pages <= 128, batch <= 16     (long rows, small batch)
//   ll_topk   max_pages <= 128, batch >  16     (long rows, large batch)
// Each of the four scoring kernels is one instantiation of band_kernel<Band<...>> with
// its own parameters (prefix MS_, ML_, LS_, LL_):
//   MODE      fused    one launch, grid (CTAS, B): every CTA scores a slice of its row's
//                      pages into a global key buffer; the last CTA of a row to finish
//                      (a per-row arrival counter) selects.
//             cluster  one launch, each row's CTAS CTAs form a thread-block cluster; each
//                      keeps its keys in shared memory and the leader gathers them
//                      through distributed shared memory, then selects (GATHER leader;
//                      GATHER split selects without the gather).
//             two_pass two launches of the same kernel: phase 0 scores, phase 1 selects.
//   SCORE     fp8      mma.sync m16n8k32 e4m3 on the raw bytes, fp32 accumulation
//             f16      e4m3 -> f16 (exact), mma.sync m16n8k16, fp32 accumulation
//             simt     fp32 FMA, q dequantised into shared memory
//             wgmma    Hopper wgmma m64n32k32 e4m3 from shared memory: one warpgroup
//                      (4 warps) scores a whole page (64 tokens x 64 heads x 128) with
//                      8 instructions, each K slice summed in fp32 (not in the tensor
//                      core's fp8 accumulator); q staged once per CTA in shared memory.
//                      Pages go to warpgroups, not warps; needs WARPS >= 4, LOAD cp_async.
//   LOAD      ldg      key fragments straight into registers (STAGES 2: next tile ahead)
//             cp_async whole pages into per-warp shared buffers, STAGES deep
//             bulk     whole pages by the TMA bulk copy (cp.async.bulk + mbarrier)
//   SWIZZLE   1: cp_async stores 16-byte chunks XOR-swizzled by row (no bank conflicts);
//             with wgmma, 1 is the hardware's 128-byte swizzle (the same XOR, atoms
//             1024-byte aligned) and 0 the unswizzled layout of 8x16-byte core matrices
//   SELECT    radix    histogram of the top RADIX_BITS bits, winners above the k-th
//                      bin written at once, candidates refined by the lower digits
//             bitonic  sort of (key, position) pairs in shared memory
//   HIST      score    the top-digit histogram is counted as the keys are made
//             select   it is counted by the select
//   SHORT     which CTAs write rows of at most k tokens: first_cta or all_ctas
//   EARLY     wgmma only. 0: a scoring row's loads in turn (q staged by loads and stores,
//             barrier, then each warpgroup's first pages; head weights after each wgmma
//             wait); 1: issued together before the barrier: the block-table entries and
//             head weights into registers, q by cp.async (a commit group of its own), the
//             first STAGES pages of each warpgroup, so their DRAM round trips overlap
//   SLICES    wgmma only: the 32-wide K slices of a head half in flight per tensor-core
//             wait (1, 2 or 4: 8, 4 or 2 waits a page, with 32, 48 or 80 accumulator
//             registers); each slice from zero, the slices summed in fp32
//   GATHER    leader   the selecting CTA has every key of the row in its shared memory
//                      (cluster: gathered by the leader) and selects alone
//             split    MODE cluster, SELECT radix, CTAS > 1 only: keys stay in the CTA
//                      that scored them; every CTA counts its keys' top digits into the
//                      leader's histogram (distributed shared memory atomics, while
//                      scoring or after it as HIST says), the leader finds the top
//                      digit's bin and tells every CTA, each CTA writes the ids of its own
//                      keys above that bin to the output and pushes those in it (key and
//                      row position) into the leader's candidates, and the leader refines
//                      the candidates alone (split_select)
//   DIGIT     radix with HIST select in one selecting CTA (GATHER leader) only.
//             top      the first digit is the key's top RADIX_BITS bits: sign, exponent
//                      and two mantissa bits at 11, so a row's scores, of similar size,
//                      share a few bins (long candidate lists, contended counters)
//             span     the first digit is linear in the score between the row's smallest
//                      and largest (one min/max over the CTA first), so a row spreads
//                      over every bin; the few keys left in the threshold's bin are ranked
//                      by comparing them with each other (more than a CTA's threads of
//                      them: refined by the key's digits from the top)
//   COMPACT   radix only: how the winners and candidates of a pass get their slots.
//             atomic   warp-aggregated atomics on two shared counters
//             scan     a prefix sum over the warps' counts (ballots), no atomics
//             registers  MODE fused or two_pass, HIST select, 8+ warps: the selecting CTA
//                      holds the row's keys in registers (thread t: keys t, t + threads,
//                      ...), loaded by one round of independent L2 loads; the first-digit
//                      histogram is counted from them, and winners and candidates get
//                      their slots from one prefix sum over the warps' counts, handed out
//                      by ballots in row order, with no second pass over shared memory
//                      (register_select). Refinement passes, if any, hand out slots as
//                      atomic does.
//   HANDOFF   MODE fused with CTAS > 1 only: how a row's keys reach its selecting CTA.
//             fence    every thread fences (fence.sc.gpu) before its CTA's arrival, and
//                      every thread of the last CTA again after it
//             acq_rel  no fence: thread 0's arrival is one acquire-release atomic, between
//                      the CTA's barriers (the release covers what the barrier ordered
//                      before it, the acquire what follows the next barrier)
//   CTAS      CTAs per row;  WARPS  warps per CTA (each warp owns whole pages)
// Parameters arrive as #defines (strings as <NAME>_<VALUE> flags); the manifest
// (cuda_family.yaml) declares which combinations are valid. No #include: NVRTC has no
// host headers.
// EVK_PHASES, never a parameter (benchmarks/probe_kernels.py --phases defines it on its
// own builds), adds phase timers: see "phase timers" below.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define PAGE_TOKENS 64
#define MID_ROW_PAGES 64    // the widest row of bands MS and ML (BAND_MAX_PAGES in cuda_family_host.py)
#define MAX_ROW_PAGES 128  // of LS and LL, the widest any band takes (the host refuses wider)
#define NUM_HEADS 64
#define HEAD_DIM 128
#define PAGE_BYTES 8448
#define KEY_BYTES 8192
#define QT_STRIDE 65
#define QT_BYTES (HEAD_DIM * QT_STRIDE * 4)
#define SIMT_TILE_BYTES 1024
#define WG_STAGE_BYTES 9216  // a page for wgmma: 8192 key bytes, 256 of scales, padded to 1 KiB
#define WG_ALIGN 1024        // 128-byte swizzle atoms (8 rows of 128 bytes) are 1 KiB aligned
#define HIST_STRIDE 4096
#define XCHG_BIN 0      // GATHER split, the xchg region: bin0, above0, hist[bin0] (every CTA)
#define XCHG_GT 3       // the leader's: slots of out[0, above0) reserved so far (by CTAs)
#define XCHG_CAND 4     // the leader's: slots of its cand reserved so far (by CTAs)
#define XCHG_MY_GT 5    // this CTA's: its first slot of out
#define XCHG_MY_CAND 6  // this CTA's: its first slot of the leader's cand
#define XCHG_WORDS 7
#define FULL_MASK 0xffffffffu

#define MODE_FUSED 0
#define MODE_CLUSTER 1
#define MODE_TWO_PASS 2
#define SCORE_FP8 0
#define SCORE_F16 1
#define SCORE_SIMT 2
#define SCORE_WGMMA 3
#define LOAD_LDG 0
#define LOAD_CP_ASYNC 1
#define LOAD_BULK 2
#define SELECT_RADIX 0
#define SELECT_BITONIC 1
#define HIST_SELECT 0
#define HIST_SCORE 1
#define SHORT_FIRST_CTA 0
#define SHORT_ALL_CTAS 1
#define GATHER_LEADER 0
#define GATHER_SPLIT 1
#define DIGIT_TOP 0
#define DIGIT_SPAN 1
#define COMPACT_ATOMIC 0
#define COMPACT_SCAN 1
#define COMPACT_REGISTERS 2
#define HANDOFF_FENCE 0
#define HANDOFF_ACQ_REL 1

// ------------------------------------------------------------------------------------
// parameters: string flags -> ids, one block per band

#if defined(MS_MODE_FUSED)
#define MS_MODE_ID MODE_FUSED
#elif defined(MS_MODE_CLUSTER)
#define MS_MODE_ID MODE_CLUSTER
#elif defined(MS_MODE_TWO_PASS)
#define MS_MODE_ID MODE_TWO_PASS
#else
#error "MS_MODE must be fused, cluster or two_pass"
#endif
#if defined(MS_SCORE_FP8)
#define MS_SCORE_ID SCORE_FP8
#elif defined(MS_SCORE_F16)
#define MS_SCORE_ID SCORE_F16
#elif defined(MS_SCORE_SIMT)
#define MS_SCORE_ID SCORE_SIMT
#elif defined(MS_SCORE_WGMMA)
#define MS_SCORE_ID SCORE_WGMMA
#else
#error "MS_SCORE must be fp8, f16, simt or wgmma"
#endif
#if defined(MS_LOAD_LDG)
#define MS_LOAD_ID LOAD_LDG
#elif defined(MS_LOAD_CP_ASYNC)
#define MS_LOAD_ID LOAD_CP_ASYNC
#elif defined(MS_LOAD_BULK)
#define MS_LOAD_ID LOAD_BULK
#else
#error "MS_LOAD must be ldg, cp_async or bulk"
#endif
#if defined(MS_SELECT_RADIX)
#define MS_SELECT_ID SELECT_RADIX
#elif defined(MS_SELECT_BITONIC)
#define MS_SELECT_ID SELECT_BITONIC
#else
#error "MS_SELECT must be radix or bitonic"
#endif
#if defined(MS_HIST_SCORE)
#define MS_HIST_ID HIST_SCORE
#elif defined(MS_HIST_SELECT)
#define MS_HIST_ID HIST_SELECT
#else
#error "MS_HIST must be score or select"
#endif
#if defined(MS_SHORT_FIRST_CTA)
#define MS_SHORT_ID SHORT_FIRST_CTA
#elif defined(MS_SHORT_ALL_CTAS)
#define MS_SHORT_ID SHORT_ALL_CTAS
#else
#error "MS_SHORT must be first_cta or all_ctas"
#endif
#if defined(MS_GATHER_LEADER)
#define MS_GATHER_ID GATHER_LEADER
#elif defined(MS_GATHER_SPLIT)
#define MS_GATHER_ID GATHER_SPLIT
#else
#error "MS_GATHER must be leader or split"
#endif
#if defined(MS_DIGIT_TOP)
#define MS_DIGIT_ID DIGIT_TOP
#elif defined(MS_DIGIT_SPAN)
#define MS_DIGIT_ID DIGIT_SPAN
#else
#error "MS_DIGIT must be top or span"
#endif
#if defined(MS_COMPACT_ATOMIC)
#define MS_COMPACT_ID COMPACT_ATOMIC
#elif defined(MS_COMPACT_SCAN)
#define MS_COMPACT_ID COMPACT_SCAN
#elif defined(MS_COMPACT_REGISTERS)
#define MS_COMPACT_ID COMPACT_REGISTERS
#else
#error "MS_COMPACT must be atomic, scan or registers"
#endif
#if defined(MS_HANDOFF_FENCE)
#define MS_HANDOFF_ID HANDOFF_FENCE
#elif defined(MS_HANDOFF_ACQ_REL)
#define MS_HANDOFF_ID HANDOFF_ACQ_REL
#else
#error "MS_HANDOFF must be fence or acq_rel"
#endif

#if defined(ML_MODE_FUSED)
#define ML_MODE_ID MODE_FUSED
#elif defined(ML_MODE_CLUSTER)
#define ML_MODE_ID MODE_CLUSTER
#elif defined(ML_MODE_TWO_PASS)
#define ML_MODE_ID MODE_TWO_PASS
#else
#error "ML_MODE must be fused, cluster or two_pass"
#endif
#if defined(ML_SCORE_FP8)
#define ML_SCORE_ID SCORE_FP8
#elif defined(ML_SCORE_F16)
#define ML_SCORE_ID SCORE_F16
#elif defined(ML_SCORE_SIMT)
#define ML_SCORE_ID SCORE_SIMT
#elif defined(ML_SCORE_WGMMA)
#define ML_SCORE_ID SCORE_WGMMA
#else
#error "ML_SCORE must be fp8, f16, simt or wgmma"
#endif
#if defined(ML_LOAD_LDG)
#define ML_LOAD_ID LOAD_LDG
#elif defined(ML_LOAD_CP_ASYNC)
#define ML_LOAD_ID LOAD_CP_ASYNC
#elif defined(ML_LOAD_BULK)
#define ML_LOAD_ID LOAD_BULK
#else
#error "ML_LOAD must be ldg, cp_async or bulk"
#endif
#if defined(ML_SELECT_RADIX)
#define ML_SELECT_ID SELECT_RADIX
#elif defined(ML_SELECT_BITONIC)
#define ML_SELECT_ID SELECT_BITONIC
#else
#error "ML_SELECT must be radix or bitonic"
#endif
#if defined(ML_HIST_SCORE)
#define ML_HIST_ID HIST_SCORE
#elif defined(ML_HIST_SELECT)
#define ML_HIST_ID HIST_SELECT
#else
#error "ML_HIST must be score or select"
#endif
#if defined(ML_SHORT_FIRST_CTA)
#define ML_SHORT_ID SHORT_FIRST_CTA
#elif defined(ML_SHORT_ALL_CTAS)
#define ML_SHORT_ID SHORT_ALL_CTAS
#else
#error "ML_SHORT must be first_cta or all_ctas"
#endif
#if defined(ML_GATHER_LEADER)
#define ML_GATHER_ID GATHER_LEADER
#elif defined(ML_GATHER_SPLIT)
#define ML_GATHER_ID GATHER_SPLIT
#else
#error "ML_GATHER must be leader or split"
#endif
#if defined(ML_DIGIT_TOP)
#define ML_DIGIT_ID DIGIT_TOP
#elif defined(ML_DIGIT_SPAN)
#define ML_DIGIT_ID DIGIT_SPAN
#else
#error "ML_DIGIT must be top or span"
#endif
#if defined(ML_COMPACT_ATOMIC)
#define ML_COMPACT_ID COMPACT_ATOMIC
#elif defined(ML_COMPACT_SCAN)
#define ML_COMPACT_ID COMPACT_SCAN
#elif defined(ML_COMPACT_REGISTERS)
#define ML_COMPACT_ID COMPACT_REGISTERS
#else
#error "ML_COMPACT must be atomic, scan or registers"
#endif
#if defined(ML_HANDOFF_FENCE)
#define ML_HANDOFF_ID HANDOFF_FENCE
#elif defined(ML_HANDOFF_ACQ_REL)
#define ML_HANDOFF_ID HANDOFF_ACQ_REL
#else
#error "ML_HANDOFF must be fence or acq_rel"
#endif

#if defined(LS_MODE_FUSED)
#define LS_MODE_ID MODE_FUSED
#elif defined(LS_MODE_CLUSTER)
#define LS_MODE_ID MODE_CLUSTER
#elif defined(LS_MODE_TWO_PASS)
#define LS_MODE_ID MODE_TWO_PASS
#else
#error "LS_MODE must be fused, cluster or two_pass"
#endif
#if defined(LS_SCORE_FP8)
#define LS_SCORE_ID SCORE_FP8
#elif defined(LS_SCORE_F16)
#define LS_SCORE_ID SCORE_F16
#elif defined(LS_SCORE_SIMT)
#define LS_SCORE_ID SCORE_SIMT
#elif defined(LS_SCORE_WGMMA)
#define LS_SCORE_ID SCORE_WGMMA
#else
#error "LS_SCORE must be fp8, f16, simt or wgmma"
#endif
#if defined(LS_LOAD_LDG)
#define LS_LOAD_ID LOAD_LDG
#elif defined(LS_LOAD_CP_ASYNC)
#define LS_LOAD_ID LOAD_CP_ASYNC
#elif defined(LS_LOAD_BULK)
#define LS_LOAD_ID LOAD_BULK
#else
#error "LS_LOAD must be ldg, cp_async or bulk"
#endif
#if defined(LS_SELECT_RADIX)
#define LS_SELECT_ID SELECT_RADIX
#elif defined(LS_SELECT_BITONIC)
#define LS_SELECT_ID SELECT_BITONIC
#else
#error "LS_SELECT must be radix or bitonic"
#endif
#if defined(LS_HIST_SCORE)
#define LS_HIST_ID HIST_SCORE
#elif defined(LS_HIST_SELECT)
#define LS_HIST_ID HIST_SELECT
#else
#error "LS_HIST must be score or select"
#endif
#if defined(LS_SHORT_FIRST_CTA)
#define LS_SHORT_ID SHORT_FIRST_CTA
#elif defined(LS_SHORT_ALL_CTAS)
#define LS_SHORT_ID SHORT_ALL_CTAS
#else
#error "LS_SHORT must be first_cta or all_ctas"
#endif
#if defined(LS_GATHER_LEADER)
#define LS_GATHER_ID GATHER_LEADER
#elif defined(LS_GATHER_SPLIT)
#define LS_GATHER_ID GATHER_SPLIT
#else
#error "LS_GATHER must be leader or split"
#endif
#if defined(LS_DIGIT_TOP)
#define LS_DIGIT_ID DIGIT_TOP
#elif defined(LS_DIGIT_SPAN)
#define LS_DIGIT_ID DIGIT_SPAN
#else
#error "LS_DIGIT must be top or span"
#endif
#if defined(LS_COMPACT_ATOMIC)
#define LS_COMPACT_ID COMPACT_ATOMIC
#elif defined(LS_COMPACT_SCAN)
#define LS_COMPACT_ID COMPACT_SCAN
#elif defined(LS_COMPACT_REGISTERS)
#define LS_COMPACT_ID COMPACT_REGISTERS
#else
#error "LS_COMPACT must be atomic, scan or registers"
#endif
#if defined(LS_HANDOFF_FENCE)
#define LS_HANDOFF_ID HANDOFF_FENCE
#elif defined(LS_HANDOFF_ACQ_REL)
#define LS_HANDOFF_ID HANDOFF_ACQ_REL
#else
#error "LS_HANDOFF must be fence or acq_rel"
#endif

#if defined(LL_MODE_FUSED)
#define LL_MODE_ID MODE_FUSED
#elif defined(LL_MODE_CLUSTER)
#define LL_MODE_ID MODE_CLUSTER
#elif defined(LL_MODE_TWO_PASS)
#define LL_MODE_ID MODE_TWO_PASS
#else
#error "LL_MODE must be fused, cluster or two_pass"
#endif
#if defined(LL_SCORE_FP8)
#define LL_SCORE_ID SCORE_FP8
#elif defined(LL_SCORE_F16)
#define LL_SCORE_ID SCORE_F16
#elif defined(LL_SCORE_SIMT)
#define LL_SCORE_ID SCORE_SIMT
#elif defined(LL_SCORE_WGMMA)
#define LL_SCORE_ID SCORE_WGMMA
#else
#error "LL_SCORE must be fp8, f16, simt or wgmma"
#endif
#if defined(LL_LOAD_LDG)
#define LL_LOAD_ID LOAD_LDG
#elif defined(LL_LOAD_CP_ASYNC)
#define LL_LOAD_ID LOAD_CP_ASYNC
#elif defined(LL_LOAD_BULK)
#define LL_LOAD_ID LOAD_BULK
#else
#error "LL_LOAD must be ldg, cp_async or bulk"
#endif
#if defined(LL_SELECT_RADIX)
#define LL_SELECT_ID SELECT_RADIX
#elif defined(LL_SELECT_BITONIC)
#define LL_SELECT_ID SELECT_BITONIC
#else
#error "LL_SELECT must be radix or bitonic"
#endif
#if defined(LL_HIST_SCORE)
#define LL_HIST_ID HIST_SCORE
#elif defined(LL_HIST_SELECT)
#define LL_HIST_ID HIST_SELECT
#else
#error "LL_HIST must be score or select"
#endif
#if defined(LL_SHORT_FIRST_CTA)
#define LL_SHORT_ID SHORT_FIRST_CTA
#elif defined(LL_SHORT_ALL_CTAS)
#define LL_SHORT_ID SHORT_ALL_CTAS
#else
#error "LL_SHORT must be first_cta or all_ctas"
#endif
#if defined(LL_GATHER_LEADER)
#define LL_GATHER_ID GATHER_LEADER
#elif defined(LL_GATHER_SPLIT)
#define LL_GATHER_ID GATHER_SPLIT
#else
#error "LL_GATHER must be leader or split"
#endif
#if defined(LL_DIGIT_TOP)
#define LL_DIGIT_ID DIGIT_TOP
#elif defined(LL_DIGIT_SPAN)
#define LL_DIGIT_ID DIGIT_SPAN
#else
#error "LL_DIGIT must be top or span"
#endif
#if defined(LL_COMPACT_ATOMIC)
#define LL_COMPACT_ID COMPACT_ATOMIC
#elif defined(LL_COMPACT_SCAN)
#define LL_COMPACT_ID COMPACT_SCAN
#elif defined(LL_COMPACT_REGISTERS)
#define LL_COMPACT_ID COMPACT_REGISTERS
#else
#error "LL_COMPACT must be atomic, scan or registers"
#endif
#if defined(LL_HANDOFF_FENCE)
#define LL_HANDOFF_ID HANDOFF_FENCE
#elif defined(LL_HANDOFF_ACQ_REL)
#define LL_HANDOFF_ID HANDOFF_ACQ_REL
#else
#error "LL_HANDOFF must be fence or acq_rel"
#endif

#if !defined(PT_VEC) || !defined(PT_THREADS)
#error "PT_VEC and PT_THREADS must be defined"
#endif
#if !defined(MS_EARLY) || !defined(ML_EARLY) || !defined(LS_EARLY) || !defined(LL_EARLY)
#error "MS_EARLY, ML_EARLY, LS_EARLY and LL_EARLY must be defined (0 or 1)"
#endif
#if !defined(MS_SLICES) || !defined(ML_SLICES) || !defined(LS_SLICES) || !defined(LL_SLICES)
#error "MS_SLICES, ML_SLICES, LS_SLICES and LL_SLICES must be defined (1, 2 or 4)"
#endif

// ------------------------------------------------------------------------------------
// small helpers

// fp8 e4m3 (finite) -> float, exact: exponent and mantissa moved into float position and
// rebiased by 2^(127-7); subnormals come out right because the multiply is exact.
__device__ __forceinline__ float fp8_to_float(u32 b) {
    const u32 bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
    return __uint_as_float(bits) * 0x1p120f;
}

// Order-preserving map float -> u32 (larger float, larger key).
__device__ __forceinline__ u32 float_key(float f) {
    const u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// 32 contiguous bytes (16-byte aligned) of global memory -> 8 words.
__device__ __forceinline__ void ldg32(const u8* __restrict__ p, u32 (&w)[8]) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

// PTX helpers. Every inline PTX of this file (but the phase timers of EVK_PHASES builds)
// is in the three blocks guarded by EVOKERNEL_EMULATION: a CPU emulation for the tests
// (tests/workloads/cuda_emulation) defines it and brings its own versions of these
// functions (and of the wgmma, named-barrier and cluster helpers further down).

#ifndef EVOKERNEL_EMULATION
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// HANDOFF acq_rel: a row's arrival ticket. Release: the writes of the CTA's threads,
// ordered before it by a barrier, are visible to whoever acquires the counter after it;
// acquire: the writes released by earlier arrivals are visible to this CTA's threads after
// the barrier that follows it.
__device__ __forceinline__ u32 add_acq_rel(u32* counter, u32 add) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(add) : "memory");
    return old;
}

__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + D, fp32 accumulation.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                         u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D = A(16x16 f16, row) * B(16x8 f16, col) + D, fp32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                        u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two e4m3 bytes (the low 16 bits of w) -> f16x2, exactly (every e4m3 value is an f16).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 w) {
    u32 out;
    asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
        : "=r"(out) : "r"(w));
    return out;
}

// -- asynchronous copies --------------------------------------------------------------

__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif  // EVOKERNEL_EMULATION

// -- warpgroup MMA (sm_90a) ----------------------------------------------------------
//
// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start
// address >> 4, 16-29 leading dimension byte offset >> 4, 32-45 stride dimension byte
// offset >> 4, 49-51 base offset (0: our swizzle atoms start on 1 KiB boundaries), 62-63
// swizzle mode (0 none, 1 128-byte). Both operands here are K-major 64 x 128-byte
// matrices (64 rows of 128 fp8 values):
//   128-byte swizzle: row r at 128 r, 16-byte chunk c of it at chunk c ^ (r & 7); SBO =
//     1024 (8-row groups), LBO unused (1); the k-th 32-byte slice starts 32 k further.
//   no swizzle: core matrices of 8 rows x 16 bytes (128 contiguous bytes); core matrix
//     (row group r/8, chunk c) at 1024 (r/8) + 128 c: LBO = 128 (next core matrix along
//     K), SBO = 1024 (next 8-row group); the k-th 32-byte slice starts 256 k further.
template <bool SWIZZLE128>
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    const u64 lbo = SWIZZLE128 ? 1u : 128u >> 4;
    const u64 sbo = 1024u >> 4;
    return (u64)((addr & 0x3FFFFu) >> 4) | (lbo << 16) | (sbo << 32) |
           ((u64)(SWIZZLE128 ? 1u : 0u) << 62);
}
// Descriptor increment (in 16-byte units) from one 32-byte K slice to the next.
template <bool SWIZZLE128>
__device__ __forceinline__ constexpr u64 wg_kstep() {
    return SWIZZLE128 ? 32u >> 4 : 256u >> 4;
}

#ifndef EVOKERNEL_EMULATION
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

#define WG_OUT(x) "=f"(x)

#define WG_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_D16_OPERANDS(C)                                                                   \
    C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]),         \
        C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15])

// D (64 x 32 f32) = A (64 x 32 e4m3, K-major) * B (32 x 32 e4m3, K-major): no accumulate.
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], u64 a, u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " WG_D16
                 ", %16, %17, 0, 1, 1;\n"
                 : WG_D16_OPERANDS(WG_OUT) : "l"(a), "l"(b) : "memory");
}

// Keeps the compiler from moving reads of d above the wait for the wgmma that wrote it.
template <int N>
__device__ __forceinline__ void wgmma_hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// Barrier of the 128 threads of warpgroup `wg` < N (ids 1..N; 0 is __syncthreads'). The
// id is an immediate: with a register id ptxas reserves all 16 barriers.
template <int ID>
__device__ __forceinline__ void named_sync_128() {
    asm volatile("bar.sync %0, 128;\n" :: "n"(ID) : "memory");
}
#endif  // EVOKERNEL_EMULATION

template <int N>
__device__ __forceinline__ void warpgroup_sync(int wg) {  // wg is uniform over the warpgroup
    if constexpr (N > 1) {
        if (wg == N - 1) {
            named_sync_128<N>();
            return;
        }
        warpgroup_sync<N - 1>(wg);
    } else {
        named_sync_128<1>();
    }
}

// -- clusters -------------------------------------------------------------------------

#ifndef EVOKERNEL_EMULATION
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The word at the same shared-memory offset as `local`, in the CTA of cluster rank `rank`.
__device__ __forceinline__ u32 dsmem_load(const u32* local, u32 rank) {
    u32 remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(local)), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(remote) : "memory");
    return v;
}
// GATHER split. The two halves of cluster_sync, for work between them (arrive: this
// thread's earlier writes are released; wait: the writes released by every arrival of the
// cluster's threads are visible after it); each thread alternates them.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The shared::cluster address of the word (or half word) at `local`'s offset in the CTA of
// rank `rank` (relaxed accesses; a cluster barrier orders them).
__device__ __forceinline__ u32 dsmem_map(const void* local, u32 rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(local)), "r"(rank));
    return remote;
}
__device__ __forceinline__ void dsmem_red_add(const u32* local, u32 rank, u32 v) {
    asm volatile("red.shared::cluster.add.u32 [%0], %1;\n" :: "r"(dsmem_map(local, rank)), "r"(v) : "memory");
}
__device__ __forceinline__ u32 dsmem_atom_add(const u32* local, u32 rank, u32 v) {
    u32 old;
    asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;\n"
                 : "=r"(old) : "r"(dsmem_map(local, rank)), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void dsmem_store(const u32* local, u32 rank, u32 v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" :: "r"(dsmem_map(local, rank)), "r"(v) : "memory");
}
__device__ __forceinline__ void dsmem_store_u16(const u16* local, u32 rank, u16 v) {
    asm volatile("st.shared::cluster.u16 [%0], %1;\n" :: "r"(dsmem_map(local, rank)), "h"(v) : "memory");
}
#endif  // EVOKERNEL_EMULATION

// ------------------------------------------------------------------------------------
// configuration of one band

template <int MODE, int SCORE, int LOAD, int STAGES, int SWIZZLE, int SELECT, int BITS, int HIST,
          int SHORT, int EARLY, int SLICES, int GATHER, int DIGIT, int COMPACT, int HANDOFF, int CTAS,
          int WARPS>
struct Band {
    static constexpr int mode = MODE;
    static constexpr int score = SCORE;
    static constexpr int load = LOAD;
    static constexpr int stages = STAGES;
    static constexpr bool swizzle = SWIZZLE != 0;
    static constexpr int select = SELECT;
    static constexpr int bits = BITS;
    static constexpr int bins = 1 << BITS;
    static constexpr int hist = HIST;
    static constexpr int short_rows = SHORT;
    static constexpr bool early = EARLY != 0;  // wgmma: a row's independent loads at once
    static constexpr int slices = SLICES;      // wgmma: K slices in flight per wait
    static constexpr bool split = GATHER == GATHER_SPLIT;  // cluster radix: no gather
    static constexpr bool span = DIGIT == DIGIT_SPAN;      // radix: first digit linear in the score
    static constexpr int compact = COMPACT;                // radix: how winners get their slots
    static constexpr bool acq_rel = HANDOFF == HANDOFF_ACQ_REL;  // fused: the ticket orders the keys
    static constexpr int ctas = CTAS;
    static constexpr int warps = WARPS;
    static constexpr int threads = WARPS * 32;
    static constexpr bool staged = LOAD != LOAD_LDG;
    static constexpr bool clustered = MODE == MODE_CLUSTER && CTAS > 1;
    static constexpr bool wgmma = SCORE == SCORE_WGMMA;
    static constexpr int warpgroups = WARPS / 4;  // wgmma: page owners
    static_assert(CTAS >= 1 && WARPS >= 1 && WARPS <= 32, "bad launch shape");
    static_assert(BITS >= 4 && BITS <= 12, "RADIX_BITS must lie in [4, 12]");
    static_assert(STAGES >= 1, "STAGES must be >= 1");
    static_assert(LOAD != LOAD_LDG || STAGES <= 2, "ldg prefetches at most one tile");
    static_assert(MODE != MODE_CLUSTER || CTAS <= 8, "portable clusters hold at most 8 CTAs");
    static_assert(SELECT == SELECT_RADIX || HIST == HIST_SELECT, "bitonic needs no histogram");
    static_assert(SCORE != SCORE_WGMMA || (WARPS % 4 == 0 && LOAD == LOAD_CP_ASYNC),
                  "wgmma scores with whole warpgroups from pages staged by cp.async");
    static_assert(EARLY == 0 || (EARLY == 1 && SCORE == SCORE_WGMMA), "EARLY 1 is wgmma's");
    static_assert(SLICES == 1 || SLICES == 2 || SLICES == 4, "SLICES must be 1, 2 or 4");
    static_assert(GATHER == GATHER_LEADER ||
                      (GATHER == GATHER_SPLIT && MODE == MODE_CLUSTER && SELECT == SELECT_RADIX && CTAS > 1),
                  "GATHER split selects across a cluster: MODE cluster, SELECT radix, CTAS > 1");
    static_assert(DIGIT == DIGIT_TOP ||
                      (DIGIT == DIGIT_SPAN && SELECT == SELECT_RADIX && HIST == HIST_SELECT && GATHER == GATHER_LEADER),
                  "DIGIT span: a radix select that counts its own histogram in one CTA");
    static_assert(COMPACT == COMPACT_ATOMIC || (COMPACT == COMPACT_SCAN && SELECT == SELECT_RADIX) ||
                      (COMPACT == COMPACT_REGISTERS && SELECT == SELECT_RADIX && MODE != MODE_CLUSTER &&
                       HIST == HIST_SELECT && GATHER == GATHER_LEADER && WARPS >= 8),
                  "COMPACT is the radix select's; registers: MODE fused or two_pass, HIST select, 8+ warps");
    static_assert(HANDOFF == HANDOFF_FENCE || (HANDOFF == HANDOFF_ACQ_REL && MODE == MODE_FUSED && CTAS > 1),
                  "HANDOFF is the fused mode's, with several CTAs a row");
};

// Byte offsets of the dynamic shared memory regions; cuda_family_host.py mirrors this
// (smem_layout) and the kernel traps if the host gave less than `total`.
struct Layout {
    int stage, bars, qt, hist, keys, sorted, cand, bts, xchg, total;
};

__host__ __device__ __forceinline__ int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

template <class B>
__host__ __device__ __forceinline__ Layout make_layout(int max_pages) {
    const int slots = max_pages * PAGE_TOKENS;
    Layout L;
    int off = 0;
    auto take = [&off](int bytes) {
        const int at = off;
        off += (bytes + 15) & ~15;
        return at;
    };
    // wgmma: up to 1 KiB of slack to align, q (8 KiB), then each warpgroup's stages
    L.stage = take(B::wgmma ? WG_ALIGN + KEY_BYTES + B::warpgroups * B::stages * WG_STAGE_BYTES
                   : B::staged ? B::warps * B::stages * PAGE_BYTES
                               : (B::score == SCORE_SIMT ? B::warps * SIMT_TILE_BYTES : 0));
    L.bars = take(B::load == LOAD_BULK ? B::warps * B::stages * 8 : 0);
    L.qt = take(B::score == SCORE_SIMT ? QT_BYTES : 0);
    L.hist = take(B::select == SELECT_RADIX ? 4 * B::bins : 0);
    L.keys = take(B::select == SELECT_RADIX || B::mode == MODE_CLUSTER ? 4 * slots : 0);
    L.sorted = take(B::select == SELECT_BITONIC ? 8 * pow2_at_least(slots) : 0);
    L.cand = take(B::select == SELECT_RADIX ? 2 * slots : 0);
    L.bts = take(4 * max_pages);
    // GATHER split: the words of split_select (XCHG_*): the top-digit bin, written into
    // every CTA by the leader, the leader's slot counters, each CTA's first slots
    L.xchg = take(B::split ? 4 * XCHG_WORDS : 0);
    L.total = off;
    return L;
}

extern __shared__ __align__(16) u8 smem[];

// ------------------------------------------------------------------------------------
// rows of at most k tokens: every valid id, then -1

__device__ __forceinline__ int token_id(const int* __restrict__ bt, int i) {
    return bt[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
}

// Entries [begin, end) of such a row, by `nthreads` threads.
template <int VEC>
__device__ __forceinline__ void write_short_row(int* __restrict__ out, const int* __restrict__ bt,
                                                int len, int begin, int end, int tid, int nthreads) {
    const bool vec = VEC == 4 && ((reinterpret_cast<u64>(out) & 15ull) == 0) && (begin % 4) == 0 &&
                     (end % 4) == 0;
    if (vec) {
        for (int i = begin + 4 * tid; i < end; i += 4 * nthreads) {
            int4 v;
            v.x = i < len ? token_id(bt, i) : -1;
            v.y = i + 1 < len ? token_id(bt, i + 1) : -1;
            v.z = i + 2 < len ? token_id(bt, i + 2) : -1;
            v.w = i + 3 < len ? token_id(bt, i + 3) : -1;
            *reinterpret_cast<int4*>(out + i) = v;
        }
    } else {
        for (int i = begin + tid; i < end; i += nthreads) out[i] = i < len ? token_id(bt, i) : -1;
    }
}

extern "C" __global__ __launch_bounds__(PT_THREADS) void pt_topk(
    const int* __restrict__ seq_lens, const int* __restrict__ block_table, int* __restrict__ out,
    int max_pages, int topk) {
    const int row = blockIdx.x;
    const int len = max(0, min(seq_lens[row], max_pages * PAGE_TOKENS));
    write_short_row<PT_VEC>(out + (size_t)row * topk, block_table + (size_t)row * max_pages, len, 0,
                            topk, threadIdx.x, PT_THREADS);
}

// ------------------------------------------------------------------------------------
// scoring: where the keys of one row go

struct RowSink {
    u32* keys;       // row-relative: shared memory (cluster) or the global key buffer
    u32* hist;       // top-digit histogram to count into (nullptr: none)
    int len;
};

template <class B>
__device__ __forceinline__ void emit(const RowSink& sink, int tok, float score) {
    if (tok >= sink.len) return;
    const u32 key = float_key(score);
    sink.keys[tok] = key;
    if constexpr (B::hist == HIST_SCORE) {
        if constexpr (B::split) {  // into the leader's histogram (rank 0, same offset)
            dsmem_red_add(sink.hist + (key >> (32 - B::bits)), 0u, 1u);
        } else {
            atomicAdd(sink.hist + (key >> (32 - B::bits)), 1u);
        }
    }
}

// The q and weights a lane needs: mma paths hold q bytes [32t, 32t+32) of heads 8i+g in
// registers (64 words) and the weights of the same heads; simt holds two heads' weights;
// wgmma (q in shared memory) reads the weights of heads 8i+2t and 8i+2t+1, i = 0..7,
// from `w` (the row's weights in global memory, L1-resident) as it needs them, which
// leaves the registers to its two accumulators; with EARLY it holds them in `wv`
// (wv[4h + j]: heads 32h+8j+2t, +1), loaded before its first page arrives.
template <class B>
struct Query {
    u32 qa[B::score == SCORE_SIMT || B::wgmma ? 1 : 8][8];
    float wt[B::wgmma ? 1 : 8];
    float2 wv[B::early ? 8 : 1];
    const float* __restrict__ w;
};

// -- tensor-core tile: 8 tokens x 64 heads -------------------------------------------
//
// Heads are the mma M dimension (4 tiles of 16), tokens N (8), head_dim K. The sum over d
// does not depend on the order of d, so lane (g = lane/4, t = lane%4) uses bytes
// [32t, 32t+32) of its q rows and of its key row g for every k step; the same byte ->
// k mapping on both operands keeps every product paired correctly:
//   fp8 (k32 steps s = 0..3): k 4t..4t+3 <- bytes 32t+8s..+3, k 16+4t..+3 <- 32t+8s+4..+7
//   f16 (k16 steps s = 0..7): k 2t,2t+1 <- bytes 32t+4s, +1; k 2t+8, 2t+9 <- +2, +3
// Accumulator c0,c1: head 16m+g, tokens 2t, 2t+1; c2,c3: head 16m+g+8, same tokens.
// Returns the head-weighted relu sums of tokens 2t and 2t+1 (valid in lanes with g == 0).
template <class B>
__device__ __forceinline__ float2 mma_tile(const Query<B>& qr, const u32 (&kw)[8]) {
    float acc[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        acc[m][0] = 0.f; acc[m][1] = 0.f; acc[m][2] = 0.f; acc[m][3] = 0.f;
    }
    if constexpr (B::score == SCORE_FP8) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                mma_e4m3(acc[m], qr.qa[2 * m][2 * s], qr.qa[2 * m + 1][2 * s],
                         qr.qa[2 * m][2 * s + 1], qr.qa[2 * m + 1][2 * s + 1], kw[2 * s],
                         kw[2 * s + 1]);
            }
        }
    } else {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const u32 b0 = e4m3x2_to_f16x2(kw[s]);
            const u32 b1 = e4m3x2_to_f16x2(kw[s] >> 16);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const u32 lo = qr.qa[2 * m][s], hi = qr.qa[2 * m + 1][s];
                mma_f16(acc[m], e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi),
                        e4m3x2_to_f16x2(lo >> 16), e4m3x2_to_f16x2(hi >> 16), b0, b1);
            }
        }
    }
    float p0 = 0.f, p1 = 0.f;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        p0 += qr.wt[2 * m] * fmaxf(acc[m][0], 0.f) + qr.wt[2 * m + 1] * fmaxf(acc[m][2], 0.f);
        p1 += qr.wt[2 * m] * fmaxf(acc[m][1], 0.f) + qr.wt[2 * m + 1] * fmaxf(acc[m][3], 0.f);
    }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        p0 += __shfl_xor_sync(FULL_MASK, p0, off);
        p1 += __shfl_xor_sync(FULL_MASK, p1, off);
    }
    return make_float2(p0, p1);
}

// -- SIMT tile: 8 tokens whose key bytes are in shared memory ------------------------
//
// Lane l owns heads l and l+32; q (dequantised, transposed [d][h], stride 65) is in
// shared memory. `row_word(r, w)` gives word w (bytes 4w..4w+3) of tile token r.
// Returns, in every lane, the eight head-weighted relu sums (before the scale).
template <class RowWord>
__device__ __forceinline__ void simt_tile(const float* __restrict__ qt, float w0, float w1,
                                          RowWord row_word, float (&p)[8]) {
    const int lane = threadIdx.x & 31;
    float a0[8], a1[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) { a0[r] = 0.f; a1[r] = 0.f; }
#pragma unroll 2
    for (int w = 0; w < HEAD_DIM / 4; ++w) {
        float q0[4], q1[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            q0[e] = qt[(4 * w + e) * QT_STRIDE + lane];
            q1[e] = qt[(4 * w + e) * QT_STRIDE + lane + 32];
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const u32 kb = row_word(r, w);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float k = fp8_to_float((kb >> (8 * e)) & 0xffu);
                a0[r] = fmaf(q0[e], k, a0[r]);
                a1[r] = fmaf(q1[e], k, a1[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        float v = w0 * fmaxf(a0[r], 0.f) + w1 * fmaxf(a1[r], 0.f);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
        p[r] = v;
    }
}

// Shared-memory byte offset of 16-byte chunk c of key row r in a staged page (and, for
// wgmma, of head r's q bytes): see wg_desc for the two wgmma layouts.
template <class B>
__device__ __forceinline__ int chunk_offset(int r, int c) {
    if constexpr (B::wgmma && !B::swizzle) return (r >> 3) * 1024 + c * 128 + (r & 7) * 16;
    return r * HEAD_DIM + 16 * (B::swizzle ? (c ^ (r & 7)) : c);
}

// Scores the valid tiles of one page staged in shared memory at `buf`.
template <class B>
__device__ __forceinline__ void score_staged_page(const Query<B>& qr, const float* qt, const u8* buf,
                                                  int page, const RowSink& sink) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 1
    for (int j = 0; j < PAGE_TOKENS / 8; ++j) {
        const int tok0 = page * PAGE_TOKENS + 8 * j;
        if (tok0 >= sink.len) break;  // warp-uniform
        if constexpr (B::score == SCORE_SIMT) {
            auto row_word = [&](int r, int w) {
                const int rr = 8 * j + r;
                return *reinterpret_cast<const u32*>(buf + chunk_offset<B>(rr, w >> 2) + 4 * (w & 3));
            };
            float p[8];
            simt_tile(qt, qr.wt[0], qr.wt[1], row_word, p);
            float mine = 0.f;
#pragma unroll
            for (int r = 0; r < 8; ++r)
                if (lane == r) mine = p[r];
            if (lane < 8) {
                const float sc = reinterpret_cast<const float*>(buf + KEY_BYTES)[8 * j + lane];
                emit<B>(sink, tok0 + lane, mine * sc);
            }
        } else {
            const int r = 8 * j + g;
            const uint4 a = *reinterpret_cast<const uint4*>(buf + chunk_offset<B>(r, 2 * t));
            const uint4 b = *reinterpret_cast<const uint4*>(buf + chunk_offset<B>(r, 2 * t + 1));
            const u32 kw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            const float2 p = mma_tile<B>(qr, kw);
            if (g == 0) {
                const float2 sc = reinterpret_cast<const float2*>(buf + KEY_BYTES)[4 * j + t];
                emit<B>(sink, tok0 + 2 * t, p.x * sc.x);
                emit<B>(sink, tok0 + 2 * t + 1, p.y * sc.y);
            }
        }
    }
}

// Copies one page (8448 bytes) into a staged buffer with cp.async (one commit group is
// left to the caller). Key rows may be swizzled; the scales are copied as they are.
template <class B>
__device__ __forceinline__ void stage_page_cp_async(u8* buf, const u8* __restrict__ page) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = lane; k < PAGE_BYTES / 16; k += 32) {
        const int dst = k < KEY_BYTES / 16 ? chunk_offset<B>(k >> 3, k & 7) : 16 * k;
        cp_async16(smem_u32(buf + dst), page + 16 * k);
    }
}

// -- wgmma: one warpgroup scores one page ------------------------------------------

// The 1 KiB-aligned start of the wgmma region: q (8 KiB), then the warpgroups' stages.
template <class B>
__device__ __forceinline__ u8* wg_region(const Layout& L) {
    const u32 at = smem_u32(smem + L.stage);
    return smem + L.stage + ((WG_ALIGN - (at & (WG_ALIGN - 1))) & (WG_ALIGN - 1));
}

// Copies one page into a wgmma stage buffer with cp.async by the 128 threads of a
// warpgroup (wtid = 0..127): key rows in the wgmma layout, scales after them.
template <class B>
__device__ __forceinline__ void stage_page_wg(u8* buf, const u8* __restrict__ page, int wtid) {
#pragma unroll
    for (int k = wtid; k < PAGE_BYTES / 16; k += 128) {
        const int dst = k < KEY_BYTES / 16 ? chunk_offset<B>(k >> 3, k & 7) : 16 * k;
        cp_async16(smem_u32(buf + dst), page + 16 * k);
    }
}

// EARLY: a scoring row's independent loads, issued together (none waits for another):
// the block-table entries of this warpgroup's first B::stages pages and the 8 weight
// pairs score_pages_wgmma's thread needs go into registers; q's 512 16-byte chunks into
// shared memory (the same layout as the staging by loads and stores) by cp.async, in a
// commit group of its own; then the warpgroup's first pages by cp.async, one commit group
// per stage as without EARLY (empty past its last page). q's group is the oldest, so the
// page loop's cp_async_wait<stages - 1> still finds page i complete at iteration i.
// Returns once this thread's q copies are complete (the pages may still be in flight);
// the caller's fence_proxy_async and barrier make q visible to wgmma.
template <class B>
__device__ __forceinline__ void wg_early_loads(const Layout& L, Query<B>& qr, const u8* __restrict__ qrow,
                                               const float* __restrict__ wrow,
                                               const u8* __restrict__ cache,
                                               const int* __restrict__ bt, int lo, int hi) {
    const int tid = threadIdx.x;
    const int group = tid >> 7, wtid = tid & 127, t = tid & 3;
    u8* region = wg_region<B>(L);
    u8* bufs = region + KEY_BYTES + group * B::stages * WG_STAGE_BYTES;
    const int first = lo + group;
    int phys[B::stages];
#pragma unroll
    for (int s = 0; s < B::stages; ++s) {
        const int page = first + s * B::warpgroups;
        phys[s] = page < hi ? bt[page] : 0;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            qr.wv[4 * h + j] = __ldg(reinterpret_cast<const float2*>(wrow) + 16 * h + 4 * j + t);
    }
    for (int k = tid; k < KEY_BYTES / 16; k += B::threads)
        cp_async16(smem_u32(region + chunk_offset<B>(k >> 3, k & 7)), qrow + 16 * k);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < B::stages; ++s) {
        if (first + s * B::warpgroups < hi)
            stage_page_wg<B>(bufs + s * WG_STAGE_BYTES, cache + (size_t)phys[s] * PAGE_BYTES, wtid);
        cp_async_commit();
    }
    cp_async_wait<B::stages>();  // q's group
}

// Scores the logical pages [lo, hi) of one row by warpgroups: warpgroup v takes pages
// lo+v, lo+v+WARPS/4, ... D[token][head] = sum_d k[token][d] q[head][d] comes, for each
// half of the heads, from 4 wgmma m64n32k32 (A: the page's 64 key rows, B: 32 of q's head
// rows, both K-major in shared memory), one per 32-wide K slice, summed in fp32. Thread
// (warp w of the group, lane 4g+t) holds D rows 16w+g and 16w+g+8, columns 8j+2t and
// 8j+2t+1 (j = 0..3) of a half in d[4j..4j+3]: it weighs and relu-sums its 16 heads, and
// 4 lanes sum a token's 64. With EARLY the first B::stages pages were issued (and q's
// commit group before them) by wg_early_loads, and the weights are in qr.wv.
template <class B>
__device__ __forceinline__ void score_pages_wgmma(const Layout& L, const Query<B>& qr,
                                                  const u8* __restrict__ cache,
                                                  const int* __restrict__ bt, int lo, int hi,
                                                  const RowSink& sink) {
    constexpr bool SW = B::swizzle;
    const int tid = threadIdx.x;
    const int group = tid >> 7, wtid = tid & 127, w = wtid >> 5;
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    u8* region = wg_region<B>(L);
    u8* bufs = region + KEY_BYTES + group * B::stages * WG_STAGE_BYTES;
    const u64 qdesc = wg_desc<SW>(smem_u32(region));
    const int first = lo + group;
    const int npw = first < hi ? (hi - first + B::warpgroups - 1) / B::warpgroups : 0;
    auto page_ptr = [&](int i) { return cache + (size_t)bt[first + i * B::warpgroups] * PAGE_BYTES; };

    if constexpr (!B::early) {
#pragma unroll
        for (int s = 0; s < B::stages; ++s) {
            if (s < npw) stage_page_wg<B>(bufs + s * WG_STAGE_BYTES, page_ptr(s), wtid);
            cp_async_commit();
        }
    }
#pragma unroll 1
    for (int i = 0; i < npw; ++i) {  // uniform over the warpgroup
        const int s = i % B::stages;
        u8* buf = bufs + s * WG_STAGE_BYTES;
        cp_async_wait<B::stages - 1>();
        fence_proxy_async();   // this thread's copies, visible to the tensor cores
        warpgroup_sync<B::warpgroups>(group); // everyone's copies
        const u64 kdesc = wg_desc<SW>(smem_u32(buf));
        // Precision: the tensor core sums fp8 products in fixed point aligned to the
        // largest exponent among them AND the accumulator it adds them to, keeping ~13-14
        // bits (Hopper's fp8 accumulator is effectively fp22). Chaining the four 32-wide K
        // slices in it (D += A*B) aligns each slice's products to the running dot product,
        // whose magnitude (hundreds of raw fp8 units) makes the dropped bits worth up to
        // ~4e-2 of a score in a CPU model (benchmarks/fp8_accumulation_model.py), enough to
        // swap tokens across the top-k boundary by more than the checker's 0.01 where the
        // boundary lies near zero (as on one H200 row). So every slice starts from a
        // zero accumulator and the slices are summed in fp32 here. Two head halves (n32)
        // keep each accumulator at 16 registers; B::slices of them are in flight per wait
        // (each wait is a round trip to the tensor cores, serialised within the page).
        float p0 = 0.f, p1 = 0.f;  // head-weighted relu sums of tokens r and r + 8
        const int r = 16 * w + g;  // this thread's tokens in the page: r and r + 8
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // heads 32h .. 32h + 31: q rows 4 KiB further
            const u64 qh = qdesc + (u64)h * ((32 * HEAD_DIM) >> 4);
            float acc[16];  // the fp32 sum of the K slices
#pragma unroll
            for (int k0 = 0; k0 < HEAD_DIM / 32; k0 += B::slices) {
                float d[B::slices][16];  // B::slices slices in flight, each from zero
                wgmma_fence();
#pragma unroll
                for (int u = 0; u < B::slices; ++u)
                    wgmma_m64n32k32_e4m3(d[u], kdesc + (k0 + u) * wg_kstep<SW>(), qh + (k0 + u) * wg_kstep<SW>());
                wgmma_commit();
                wgmma_wait_all();
#pragma unroll
                for (int u = 0; u < B::slices; ++u) wgmma_hold(d[u]);
#pragma unroll
                for (int x = 0; x < 16; ++x) {
                    float sum = d[0][x];
#pragma unroll
                    for (int u = 1; u < B::slices; ++u) sum += d[u][x];
                    acc[x] = k0 == 0 ? sum : acc[x] + sum;
                }
            }
            // acc[4j..4j+3]: heads 32h+8j+2t, +1 of token r, then of token r + 8
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float2 wv;
                if constexpr (B::early) {
                    wv = qr.wv[4 * h + j];
                } else {
                    wv = __ldg(reinterpret_cast<const float2*>(qr.w) + 16 * h + 4 * j + t);
                }
                p0 += wv.x * fmaxf(acc[4 * j], 0.f) + wv.y * fmaxf(acc[4 * j + 1], 0.f);
                p1 += wv.x * fmaxf(acc[4 * j + 2], 0.f) + wv.y * fmaxf(acc[4 * j + 3], 0.f);
            }
        }
        const float* scales = reinterpret_cast<const float*>(buf + KEY_BYTES);
        const float s0 = scales[r], s1 = scales[r + 8];
        warpgroup_sync<B::warpgroups>(group);  // the buffer is read (tensor cores and scales): refill it
        if (i + B::stages < npw) stage_page_wg<B>(buf, page_ptr(i + B::stages), wtid);
        cp_async_commit();

        p0 += __shfl_xor_sync(FULL_MASK, p0, 1);
        p1 += __shfl_xor_sync(FULL_MASK, p1, 1);
        p0 += __shfl_xor_sync(FULL_MASK, p0, 2);
        p1 += __shfl_xor_sync(FULL_MASK, p1, 2);
        const int tok = (first + i * B::warpgroups) * PAGE_TOKENS + r;
        if (t == 0) emit<B>(sink, tok, p0 * s0);
        if (t == 1) emit<B>(sink, tok + 8, p1 * s1);
    }
    cp_async_wait<0>();
}

// Scores the logical pages [lo, hi) of one row; warp w takes pages lo+w, lo+w+WARPS, ...
template <class B>
__device__ __forceinline__ void score_pages_warps(const Layout& L, const Query<B>& qr,
                                                  const u8* __restrict__ cache,
                                                  const int* __restrict__ bt, int lo, int hi,
                                                  const RowSink& sink) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const float* qt = reinterpret_cast<const float*>(smem + L.qt);
    const int first = lo + warp;
    const int npw = first < hi ? (hi - first + B::warps - 1) / B::warps : 0;
    auto page_ptr = [&](int i) { return cache + (size_t)bt[first + i * B::warps] * PAGE_BYTES; };

    if constexpr (B::staged) {
        u8* bufs = smem + L.stage + warp * B::stages * PAGE_BYTES;
        if constexpr (B::load == LOAD_CP_ASYNC) {
#pragma unroll
            for (int s = 0; s < B::stages; ++s) {
                if (s < npw) stage_page_cp_async<B>(bufs + s * PAGE_BYTES, page_ptr(s));
                cp_async_commit();
            }
#pragma unroll 1
            for (int i = 0; i < npw; ++i) {
                const int s = i % B::stages;
                cp_async_wait<B::stages - 1>();
                __syncwarp();
                score_staged_page<B>(qr, qt, bufs + s * PAGE_BYTES, first + i * B::warps, sink);
                __syncwarp();  // every lane is done with the buffer before it is refilled
                if (i + B::stages < npw) stage_page_cp_async<B>(bufs + s * PAGE_BYTES, page_ptr(i + B::stages));
                cp_async_commit();
            }
            cp_async_wait<0>();
        } else {  // LOAD_BULK: one mbarrier per buffer, armed and filled by lane 0
            const u32 bars = smem_u32(smem + L.bars) + 8u * (u32)(warp * B::stages);
            if (lane == 0) {
#pragma unroll
                for (int s = 0; s < B::stages; ++s) {
                    if (s < npw) {
                        mbar_expect_tx(bars + 8u * s, PAGE_BYTES);
                        bulk_copy(smem_u32(bufs + s * PAGE_BYTES), page_ptr(s), PAGE_BYTES, bars + 8u * s);
                    }
                }
            }
#pragma unroll 1
            for (int i = 0; i < npw; ++i) {
                const int s = i % B::stages;
                mbar_wait(bars + 8u * s, (u32)((i / B::stages) & 1));
                score_staged_page<B>(qr, qt, bufs + s * PAGE_BYTES, first + i * B::warps, sink);
                __syncwarp();  // every lane has read the buffer before it is refilled
                if (lane == 0 && i + B::stages < npw) {
                    fence_proxy_async();
                    mbar_expect_tx(bars + 8u * s, PAGE_BYTES);
                    bulk_copy(smem_u32(bufs + s * PAGE_BYTES), page_ptr(i + B::stages), PAGE_BYTES,
                              bars + 8u * s);
                }
            }
        }
    } else {
        // LOAD_LDG: tiles f = 8i + j (page i of this warp, tile j of it) in order; every
        // page before the row's last is full, so the first invalid tile ends the stream.
        const int ntiles = npw * (PAGE_TOKENS / 8);
        auto tile_tok0 = [&](int f) { return (first + (f >> 3) * B::warps) * PAGE_TOKENS + 8 * (f & 7); };
        auto tile_live = [&](int f) { return f < ntiles && tile_tok0(f) < sink.len; };
        auto load_tile = [&](int f, u32 (&kw)[8], float2& sc) {
            const u8* page = page_ptr(f >> 3);
            const int j = f & 7;
            ldg32(page + (8 * j + g) * HEAD_DIM + 32 * t, kw);
            sc = __ldg(reinterpret_cast<const float2*>(page + KEY_BYTES) + 4 * j + t);
        };
        u8* tile = smem + L.stage + warp * SIMT_TILE_BYTES;  // simt only
        int f = 0;
        bool live = tile_live(0);
        u32 kw[8];
        float2 sc = make_float2(0.f, 0.f);
        if (live) load_tile(0, kw, sc);
#pragma unroll 1
        while (live) {
            const bool live_n = tile_live(f + 1);
            u32 kn[8];
            float2 sn = make_float2(0.f, 0.f);
            if constexpr (B::stages >= 2) {
                if (live_n) load_tile(f + 1, kn, sn);
            }
            const int tok0 = tile_tok0(f);
            if constexpr (B::score == SCORE_SIMT) {
                // this lane's 32 bytes of token g -> the warp's tile buffer; scales by lane
                uint4* dst = reinterpret_cast<uint4*>(tile + g * HEAD_DIM + 32 * t);
                dst[0] = make_uint4(kw[0], kw[1], kw[2], kw[3]);
                dst[1] = make_uint4(kw[4], kw[5], kw[6], kw[7]);
                __syncwarp();
                auto row_word = [&](int r, int w) {
                    return *reinterpret_cast<const u32*>(tile + r * HEAD_DIM + 4 * w);
                };
                float p[8];
                simt_tile(qt, qr.wt[0], qr.wt[1], row_word, p);
                __syncwarp();  // the tile buffer is rewritten by the next tile
                float mine = 0.f;
#pragma unroll
                for (int r = 0; r < 8; ++r)
                    if (lane == r) mine = p[r];
                // lane r < 8 scores token r: its scale is component (r & 1) of lane r/2's pair
                const float sx = __shfl_sync(FULL_MASK, sc.x, (lane & 7) >> 1);
                const float sy = __shfl_sync(FULL_MASK, sc.y, (lane & 7) >> 1);
                if (lane < 8) emit<B>(sink, tok0 + lane, mine * ((lane & 1) ? sy : sx));
            } else {
                const float2 p = mma_tile<B>(qr, kw);
                if (g == 0) {
                    emit<B>(sink, tok0 + 2 * t, p.x * sc.x);
                    emit<B>(sink, tok0 + 2 * t + 1, p.y * sc.y);
                }
            }
            ++f;
            live = live_n;
            if constexpr (B::stages >= 2) {
#pragma unroll
                for (int i = 0; i < 8; ++i) kw[i] = kn[i];
                sc = sn;
            } else {
                if (live) load_tile(f, kw, sc);
            }
        }
    }
}

template <class B>
__device__ __forceinline__ void score_pages(const Layout& L, const Query<B>& qr, const u8* __restrict__ cache,
                                            const int* __restrict__ bt, int lo, int hi,
                                            const RowSink& sink) {
    if constexpr (B::wgmma) {
        score_pages_wgmma<B>(L, qr, cache, bt, lo, hi, sink);
    } else {
        score_pages_warps<B>(L, qr, cache, bt, lo, hi, sink);
    }
}

// ------------------------------------------------------------------------------------
// selection (one CTA, B::threads threads): keys of the row in shared memory

struct SelectScratch {
    u32 warp_tot[32];
    u32 warp_max[32];        // DIGIT span: each warp's largest key
    float span_lo, span_scale;  // DIGIT span: first digit = (score - span_lo) * span_scale
    u32 res[3];
    u32 cnt_gt, ncand, cnt_gt2, cnt_eq;
    u32 ticket;
#if defined(EVK_PHASES)
    u64* phases;  // this CTA's phase record (read and written by thread 0 only)
#endif
};

// -- phase timers (probe builds only) ------------------------------------------------
//
// Defined only by `benchmarks/probe_kernels.py --phases` (an extra #define on the probe's
// own build, never a parameter the search sees); without EVK_PHASES every EVK_* mark
// below is empty and the kernels are exactly the judged ones. With it, thread 0 of each
// band CTA stamps %globaltimer (ns, one clock for every SM) and %clock64 (its SM's
// cycles) into its record of `evk_phases` at each phase boundary, right after a barrier
// of the CTA (an existing one where there is one; EVK_SYNC_MARK adds one where not).
// A record is EVK_SLOTS u64 times then EVK_SLOTS u64 clocks, indexed by the PH_* below;
// a phase not reached stays 0 (the probe zeroes the buffer before each call); slot
// EVK_META of the times holds row | cta << 16 | launch << 24 (launch: two_pass's phase).
// The CTA (row, cta) owns record row * (CTAS + 1) + cta; two_pass's selecting launch owns
// cta = CTAS. The last record is an overflow sink the probe requires to stay empty.
// GATHER split (split_select) stamps at its cluster barriers, in every CTA: HANDOFF when
// the leader's histogram is complete (barrier A), BIN0 when every CTA knows the bin (B),
// CAND when every CTA has pushed its candidates to the leader (C); then each CTA writes
// the ids of its keys above the bin, and the others stamp EXIT. Only the leader stamps
// LOADED (nothing is gathered: the same time as HANDOFF; it also marks the selecting CTA
// for the probe's groups), PASS1.. and OUTPUT.
#define PH_ENTRY 0    // thread 0 starts
#define PH_Q 1        // q staged (wgmma, simt: in shared memory; mma: its loads issued;
                      // wgmma EARLY: the first pages' copies issued, maybe in flight)
#define PH_SCORED 2   // this CTA's pages scored, its keys stored (before any fence)
#define PH_HANDOFF 3  // fused: arrival counted, last CTA known; cluster: every CTA scored
                      // (split: and counted into the leader's histogram)
#define PH_LOADED 4   // selecting CTA: keys, top-digit histogram, block table in shared memory
                      // (split: the leader only, = HANDOFF)
#define PH_BIN0 5     // radix: the top digit's bin found (split: known to every CTA)
#define PH_CAND 6     // radix: ids above that bin written, candidates gathered (split: the
                      // candidates pushed by every CTA; each writes its ids above the bin
                      // after it, then the others exit)
#define PH_PASS1 7    // radix: refinement pass 1 done (PH_PASS1 + 1, + 2: passes 2, 3)
#define PH_OUTPUT 10  // every id written
#define PH_EXIT 11    // thread 0 leaves
#define EVK_META 15
#define EVK_SLOTS 16
#define EVK_RECORDS 2048

#if defined(EVK_PHASES)
__device__ u64 evk_phases[EVK_RECORDS * 2 * EVK_SLOTS];  // unmangled: a global-scope variable

__device__ __forceinline__ void evk_stamp(u64* record, int phase) {
    if (threadIdx.x != 0) return;
    u64 ns, cycles;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns) :: "memory");
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(cycles) :: "memory");
    record[phase] = ns;
    record[EVK_SLOTS + phase] = cycles;
}

template <class B>
__device__ __forceinline__ void evk_begin(SelectScratch& s, int row, int cta, int phase) {
    if (threadIdx.x != 0) return;
    const int launch = B::mode == MODE_TWO_PASS ? phase : 0;
    const int index = row * (B::ctas + 1) + (launch ? B::ctas : cta);
    s.phases = evk_phases + 2 * EVK_SLOTS * min(index, EVK_RECORDS - 1);
    s.phases[EVK_META] = (u64)row | ((u64)cta << 16) | ((u64)launch << 24);
    evk_stamp(s.phases, PH_ENTRY);
}
#define EVK_BEGIN(B, s, row, cta, phase) evk_begin<B>(s, row, cta, phase)
#define EVK_MARK(s, phase) evk_stamp((s).phases, phase)
#define EVK_SYNC_MARK(s, phase) do { __syncthreads(); evk_stamp((s).phases, phase); } while (0)
#else
#define EVK_BEGIN(B, s, row, cta, phase) ((void)0)
#define EVK_MARK(s, phase) ((void)0)
#define EVK_SYNC_MARK(s, phase) ((void)0)
#endif

// Exclusive prefix sum of v over the threads of the CTA, in thread order.
template <class B>
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
        u32 w = lane < B::warps ? warp_tot[lane] : 0u;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const u32 y = __shfl_up_sync(FULL_MASK, w, off);
            if (lane >= off) w += y;
        }
        if (lane < B::warps) warp_tot[lane] = w;  // inclusive totals
    }
    __syncthreads();
    const u32 before = warp > 0 ? warp_tot[warp - 1] : 0u;
    __syncthreads();  // warp_tot may be reused right after
    return before + x - v;
}

// Finds the bin b with above(b) < krem <= above(b) + hist[b], where above(b) counts the
// keys in bins > b: res[0] = bin, res[1] = above, res[2] = hist[bin]. Ends with a barrier.
template <class B>
__device__ __forceinline__ void find_bin(const u32* hist, int nbins, u32 krem, SelectScratch& s) {
    const int per = (nbins + B::threads - 1) / B::threads;
    const int top = nbins - 1 - (int)threadIdx.x * per;  // highest owned bin (may be < 0)
    u32 own = 0u;
    for (int c = 0; c < per; ++c)
        if (top - c >= 0) own += hist[top - c];
    const u32 above = block_exclusive_scan<B>(own, s.warp_tot);
    if (above < krem && above + own >= krem) {  // exactly one thread
        u32 cum = above;
        for (int c = 0; c < per; ++c) {
            const u32 h = hist[top - c];
            if (cum + h >= krem) {
                s.res[0] = (u32)(top - c); s.res[1] = cum; s.res[2] = h;
                break;
            }
            cum += h;
        }
    }
    __syncthreads();
}

// Warp-aggregated slot reservation (all lanes of the warp call it).
__device__ __forceinline__ u32 warp_reserve(bool want, u32* counter) {
    const int lane = threadIdx.x & 31;
    const u32 vote = __ballot_sync(FULL_MASK, want);
    u32 base = 0u;
    if (lane == 0 && vote) base = atomicAdd(counter, (u32)__popc(vote));
    base = __shfl_sync(FULL_MASK, base, 0);
    return base + (u32)__popc(vote & ((1u << lane) - 1u));
}

// COMPACT scan: every item i of [0, n) of class 1 or 2 (classify(i); 0: neither) gets its
// rank among the items of its class in index order, and emit(i, class, rank) is called.
// Each warp takes a contiguous chunk, counts its classes by ballots, one scan over the
// warps gives each warp its first slots, and a second sweep hands them out: no atomics
// (COMPACT atomic reserves slots with two shared counters, which every warp of the CTA
// hits once per 32 items). n < 65536: the two counts share one 32-bit scan. Every thread
// of the CTA calls it (the scan has barriers).
template <class B, class Classify, class Emit>
__device__ __forceinline__ void scan_compact(int n, Classify classify, Emit emit, SelectScratch& s) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int chunk = (((n + B::warps - 1) / B::warps) + 31) & ~31;
    const int begin = min(n, warp * chunk);
    const int end = min(n, begin + chunk);
    u32 n1 = 0u, n2 = 0u;
    for (int base = begin; base < end; base += 32) {  // uniform over the warp
        const int i = base + lane;
        const int c = i < end ? classify(i) : 0;
        n1 += (u32)__popc(__ballot_sync(FULL_MASK, c == 1));
        n2 += (u32)__popc(__ballot_sync(FULL_MASK, c == 2));
    }
    const u32 first = __shfl_sync(FULL_MASK, block_exclusive_scan<B>(lane == 0 ? (n1 << 16) | n2 : 0u, s.warp_tot), 0);
    u32 at1 = first >> 16, at2 = first & 0xffffu;
    const u32 below = (1u << lane) - 1u;
    for (int base = begin; base < end; base += 32) {
        const int i = base + lane;
        const int c = i < end ? classify(i) : 0;
        const u32 v1 = __ballot_sync(FULL_MASK, c == 1);
        const u32 v2 = __ballot_sync(FULL_MASK, c == 2);
        if (c == 1) emit(i, 1, at1 + (u32)__popc(v1 & below));
        if (c == 2) emit(i, 2, at2 + (u32)__popc(v2 & below));
        at1 += (u32)__popc(v1);
        at2 += (u32)__popc(v2);
    }
}

// The slots of a pass's two classes of items (classify: 1, 2 or 0 for neither): COMPACT
// scan by scan_compact, COMPACT atomic by warp-aggregated atomics on the counters `c1` and
// `c2` (zero before the pass). Every thread of the CTA calls it.
template <class B, class Classify, class Emit>
__device__ __forceinline__ void compact(int n, Classify classify, Emit emit, u32* c1, u32* c2,
                                        SelectScratch& s) {
    if constexpr (B::compact == COMPACT_SCAN) {
        scan_compact<B>(n, classify, emit, s);
    } else {
        for (int base = 0; base < n; base += B::threads) {
            const int i = base + (int)threadIdx.x;
            const int c = i < n ? classify(i) : 0;
            const u32 p1 = warp_reserve(c == 1, c1);
            const u32 p2 = warp_reserve(c == 2, c2);
            if (c == 1) emit(i, 1, p1);
            if (c == 2) emit(i, 2, p2);
        }
    }
}

// The float a key was made from (float_key's inverse).
__device__ __forceinline__ float key_float(u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The radix select's first digit of a key. DIGIT top: its top RADIX_BITS bits (sign,
// exponent and the leading mantissa bits: a row of scores of one sign and similar size
// falls in a few bins). DIGIT span: linear in the score between the row's smallest and
// largest (span_histogram sets span_lo and span_scale), so the row spreads over every bin
// as its scores do; 0 for every key of a row it cannot spread (span_scale 0: an infinity
// or a NaN would make the product a NaN there). Both never decrease as the key grows.
template <class B>
__device__ __forceinline__ u32 first_digit(u32 key, const SelectScratch& s) {
    if constexpr (B::span) {
        if (s.span_scale == 0.0f) return 0u;  // a row span_histogram could not spread
        const float x = (key_float(key) - s.span_lo) * s.span_scale;  // >= 0, finite
        return (u32)fminf(x, (float)(B::bins - 1));
    } else {
        return key >> (32 - B::bits);
    }
}

// DIGIT span: the row's extremes from every thread's `lo` and `hi` (a min/max over the
// CTA), and from them span_lo and span_scale (see span_histogram). Every thread calls it;
// ends with a barrier, after which first_digit may be used.
template <class B>
__device__ void span_bounds(u32 lo, u32 hi, SelectScratch& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        lo = min(lo, __shfl_xor_sync(FULL_MASK, lo, off));
        hi = max(hi, __shfl_xor_sync(FULL_MASK, hi, off));
    }
    if (lane == 0) {
        s.warp_tot[warp] = lo;
        s.warp_max[warp] = hi;
    }
    __syncthreads();
    if (warp == 0) {
        lo = lane < B::warps ? s.warp_tot[lane] : 0xffffffffu;
        hi = lane < B::warps ? s.warp_max[lane] : 0u;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            lo = min(lo, __shfl_xor_sync(FULL_MASK, lo, off));
            hi = max(hi, __shfl_xor_sync(FULL_MASK, hi, off));
        }
        if (lane == 0) {
            const float flo = key_float(lo);
            const float width = key_float(hi) - flo;
            const float scale = (float)B::bins / width;
            const bool linear = width > 0.0f && width - width == 0.0f && scale - scale == 0.0f;  // finite
            s.span_lo = linear ? flo : 0.0f;
            s.span_scale = linear ? scale : 0.0f;
        }
    }
    __syncthreads();
}

// DIGIT span: the row's smallest and largest key (a min/max over the CTA), then every
// key's first digit counted into hist (zeroed here). `lo` and `hi` are this thread's
// extremes so far: with `tracked` (the fused path's loads kept them) every key has been
// seen by some thread, else they are read here. A row whose extremes are equal, or so far
// apart that the width or the scale is not finite (or that holds a NaN or an infinity),
// puts every key in bin 0, where the refinement orders them by all 32 bits. Every thread
// calls it; ends with a barrier.
template <class B>
__device__ void span_histogram(const u32* keys, u32* hist, int len, SelectScratch& s, u32 lo, u32 hi,
                               bool tracked) {
    const int tid = threadIdx.x;
    for (int i = tid; i < B::bins; i += B::threads) hist[i] = 0u;
    if (!tracked) {
        for (int i = tid; i < len; i += B::threads) {
            const u32 k = keys[i];
            lo = min(lo, k);
            hi = max(hi, k);
        }
    }
    span_bounds<B>(lo, hi, s);
    for (int i = tid; i < len; i += B::threads) atomicAdd(&hist[first_digit<B>(keys[i], s)], 1u);
    __syncthreads();
}


// DIGIT span, a few candidates: each candidate's rank among them (larger key first, the
// lower candidate index first among equal keys) by comparing it with all of them; the
// `krem` ranked first are written to out[above0 + rank). ncand is at most B::threads.
template <class B>
__device__ __forceinline__ void rank_refine(const u32* keys, const u16* cand, const int* bts, int ncand,
                                            u32 above0, u32 krem, int* __restrict__ out) {
    const int j = threadIdx.x;
    if (j >= ncand) return;
    const u32 kj = keys[cand[j]];
    u32 rank = 0u;
    for (int i = 0; i < ncand; ++i) {  // every thread reads the same word: a broadcast
        const u32 ki = keys[cand[i]];
        rank += (u32)((ki > kj) | ((ki == kj) & (i < j)));
    }
    if (rank < krem) {
        const int pos = cand[j];
        out[above0 + rank] = bts[pos / PAGE_TOKENS] * PAGE_TOKENS + (pos % PAGE_TOKENS);
    }
}

// The radix select's passes after the first digit: the `ncand` candidates (keys[cand[j]],
// whose first digit is bin0; the `above0` keys above them are written to out[0, above0))
// are refined by the lower digits of the key, then the ids above the threshold and
// `krem` (= topk - above0) equal to it are written after out[above0]. With `whole_key`
// (DIGIT span: the first digit was not the key's top bits) the refinement starts from the
// key's top digit. The scratch counters cnt_gt2 and cnt_eq start at zero.
template <class B>
__device__ __forceinline__ void radix_refine(const u32* keys, u32* hist, const u16* cand, const int* bts,
                                             int ncand, u32 bin0, u32 above0, u32 krem, int topk,
                                             int* __restrict__ out, SelectScratch& s, bool whole_key) {
    constexpr int NUM_PASSES = (32 + B::bits - 1) / B::bits;
    const int tid = threadIdx.x;
    const int lo0 = 32 - B::bits;
    u32 matching = (u32)ncand;  // candidates whose decided bits match the prefix
    u32 prefix = whole_key ? 0u : bin0 << lo0;
    u32 pmask = whole_key ? 0u : (u32)(B::bins - 1) << lo0;
#pragma unroll 1
    for (int pass = whole_key ? 0 : 1; pass < NUM_PASSES && matching != krem; ++pass) {  // uniform
        const int hi = 32 - B::bits * pass;  // this digit covers bits [lo, hi)
        const int lo = hi - B::bits > 0 ? hi - B::bits : 0;
        const int nbins = 1 << (hi - lo);
        const u32 dmask = (u32)(nbins - 1);
        for (int i = tid; i < nbins; i += B::threads) hist[i] = 0u;
        __syncthreads();
        for (int j = tid; j < ncand; j += B::threads) {
            const u32 k = keys[cand[j]];
            if ((k & pmask) == prefix) atomicAdd(&hist[(k >> lo) & dmask], 1u);
        }
        __syncthreads();
        find_bin<B>(hist, nbins, krem, s);
        prefix |= s.res[0] << lo;
        pmask |= dmask << lo;
        krem -= s.res[1];
        matching = s.res[2];
        __syncthreads();  // res and hist are rewritten by the next pass
        EVK_MARK(s, PH_PASS1 + (pass > 0 ? pass - 1 : 0));
    }

    // Candidates above the threshold (in the decided bits) are winners; `krem` of those
    // equal to it fill the remaining slots.
    const u32 first_eq = (u32)topk - krem;
    compact<B>(
        ncand,
        [&](int j) {
            const u32 km = keys[cand[j]] & pmask;
            return km > prefix ? 1 : km == prefix ? 2 : 0;
        },
        [&](int j, int c, u32 slot) {
            const int i = cand[j];
            const int id = bts[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
            if (c == 1) out[above0 + slot] = id;
            else if (slot < krem) out[first_eq + slot] = id;
        },
        &s.cnt_gt2, &s.cnt_eq, s);
}

// After the first digit: the `matching` candidates (positions in cand, keys in keys) in
// the threshold's bin bin0, the `above0` ids above it already written to out[0, above0):
// DIGIT span ranks a few candidates directly, otherwise radix_refine's passes decide.
template <class B>
__device__ __forceinline__ void refine_candidates(const u32* keys, u32* hist, const u16* cand, const int* bts,
                                                  u32 matching, u32 bin0, u32 above0, int topk,
                                                  int* __restrict__ out, SelectScratch& s) {
    const u32 krem = (u32)topk - above0;  // still wanted among the candidates
    if constexpr (B::span) {
        if (matching <= (u32)B::threads) {  // the usual case: a few keys share the threshold's bin
            rank_refine<B>(keys, cand, bts, (int)matching, above0, krem, out);
            return;
        }
    }
    radix_refine<B>(keys, hist, cand, bts, (int)matching, bin0, above0, krem, topk, out, s, B::span);
}

// Radix select: keys[0, len) and their first-digit histogram are in shared memory (with
// DIGIT span, span_histogram made it), the block table of the row in bts; writes the ids
// of the top `topk` keys to out.
template <class B>
__device__ void radix_select(const u32* keys, u32* hist, u16* cand, const int* bts, int len, int topk,
                             int* __restrict__ out, SelectScratch& s) {
    const int tid = threadIdx.x;
    if (tid == 0) { s.cnt_gt = 0u; s.ncand = 0u; s.cnt_gt2 = 0u; s.cnt_eq = 0u; }
    find_bin<B>(hist, B::bins, (u32)topk, s);  // its barriers also publish the counters
    EVK_MARK(s, PH_BIN0);
    const u32 bin0 = s.res[0];
    const u32 above0 = s.res[1];
    const u32 matching = s.res[2];  // candidates: keys whose first digit is bin0
    compact<B>(
        len,
        [&](int i) {
            const u32 d = first_digit<B>(keys[i], s);
            return d > bin0 ? 1 : d == bin0 ? 2 : 0;
        },
        [&](int i, int c, u32 slot) {
            if (c == 1) out[slot] = bts[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
            else cand[slot] = (u16)i;
        },
        &s.cnt_gt, &s.ncand, s);
    __syncthreads();  // candidates complete; res and hist free again
    EVK_MARK(s, PH_CAND);
    refine_candidates<B>(keys, hist, cand, bts, matching, bin0, above0, topk, out, s);
}

// COMPACT registers: radix_select with the row's keys in registers. Thread t holds the
// keys t, t + threads, t + 2 threads, ... (as many as the band's widest row needs,
// B::max_pages; loops stop at the row's end, a bound uniform over the CTA), all asked of L2 in one round of
// independent loads (shared memory holds the keys too, for the refinement); the block
// table follows, the extremes (DIGIT span) and the first-digit histogram come from the
// registers. Once the threshold's bin is known each thread marks its keys' classes in two
// bit masks (bit j: key j above the bin, or in it), one prefix sum over the warps' counts
// gives each warp its first slots, and the warps hand them out key by key in row order
// (ballots), as scan_compact does, so that a warp's winners land in consecutive slots:
// no shared counter and no second pass over shared memory.
template <class B>
__device__ void register_select(const u32* __restrict__ global_keys, u32* keys, u32* hist, u16* cand, int* bts,
                                const int* __restrict__ bt, int len, int topk, int* __restrict__ out,
                                SelectScratch& s) {
    constexpr int T = B::threads;
    constexpr int J = (B::max_pages * PAGE_TOKENS + T - 1) / T;  // keys a thread holds
    static_assert(J <= 32, "a thread's key classes are bits of one word");
    const int tid = threadIdx.x, lane = tid & 31;
    if (len > J * T) __trap();  // wider than the band: the host sends such rows elsewhere
    const int npages = (len + PAGE_TOKENS - 1) / PAGE_TOKENS;
    const int bt_first = tid < npages ? bt[tid] : 0;  // in flight with the keys
    u32 k[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        if (j * T >= len) break;
        const int i = j * T + tid;
        k[j] = i < len ? __ldcg(global_keys + i) : 0u;
    }
    u32 lo = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        if (j * T >= len) break;
        const int i = j * T + tid;
        if (i < len) {
            keys[i] = k[j];
            lo = min(lo, k[j]);
            hi = max(hi, k[j]);
        }
    }
    if (tid < npages) bts[tid] = bt_first;
    for (int i = tid + T; i < npages; i += T) bts[i] = bt[i];
    for (int b = tid; b < B::bins; b += T) hist[b] = 0u;
    if (tid == 0) { s.cnt_gt2 = 0u; s.cnt_eq = 0u; }  // radix_refine's slot counters
    if constexpr (B::span) {
        span_bounds<B>(lo, hi, s);  // its barriers also publish the zeroed histogram
    } else {
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
        if (j * T >= len) break;
        if (j * T + tid < len) atomicAdd(&hist[first_digit<B>(k[j], s)], 1u);
    }
    __syncthreads();
    EVK_MARK(s, PH_LOADED);  // (here: with the extremes and the histogram)

    find_bin<B>(hist, B::bins, (u32)topk, s);
    EVK_MARK(s, PH_BIN0);
    const u32 bin0 = s.res[0];
    const u32 above0 = s.res[1];
    const u32 matching = s.res[2];
    u32 above = 0u, in_bin = 0u;  // bit j: key j's class
#pragma unroll
    for (int j = 0; j < J; ++j) {
        if (j * T >= len) break;
        if (j * T + tid < len) {
            const u32 d = first_digit<B>(k[j], s);
            above |= (u32)(d > bin0) << j;
            in_bin |= (u32)(d == bin0) << j;
        }
    }
    // the warp's counts, then one scan over the warps (lane 0 carries them); a row has
    // fewer than 65536 keys, so the two 16-bit halves never carry into each other
    u32 counts = ((u32)__popc(above) << 16) | (u32)__popc(in_bin);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) counts += __shfl_xor_sync(FULL_MASK, counts, off);
    const u32 first = __shfl_sync(FULL_MASK, block_exclusive_scan<B>(lane == 0 ? counts : 0u, s.warp_tot), 0);
    u32 at1 = first >> 16, at2 = first & 0xffffu;
    const u32 lanes_below = (1u << lane) - 1u;
#pragma unroll 1
    for (int j = 0; j < J; ++j) {  // (no register array read here: a loop, not J copies)
        if (j * T >= len) break;   // uniform: every lane of the warp votes below
        const bool win = (above >> j) & 1u, cut = (in_bin >> j) & 1u;
        const u32 v1 = __ballot_sync(FULL_MASK, win);
        const u32 v2 = __ballot_sync(FULL_MASK, cut);
        const int i = j * T + tid;
        if (win) out[at1 + (u32)__popc(v1 & lanes_below)] = bts[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
        if (cut) cand[at2 + (u32)__popc(v2 & lanes_below)] = (u16)i;
        at1 += (u32)__popc(v1);
        at2 += (u32)__popc(v2);
    }
    __syncthreads();  // candidates complete; res and hist free again
    EVK_MARK(s, PH_CAND);
    refine_candidates<B>(keys, hist, cand, bts, matching, bin0, above0, topk, out, s);
}

// GATHER split: the radix select of one row across its cluster, no key gathered. Every
// CTA holds the keys of its own pages [lo, hi) (row positions [begin, end)) in its `keys`;
// the leader (rank 0) holds the row's top-digit histogram (counted into it by every CTA
// through distributed shared memory), cand, and the slot counters xchg[XCHG_GT] and
// xchg[XCHG_CAND]. Before this, band_kernel had the leader zero its histogram and those
// counters, and every CTA zero its cnt_gt and ncand (the leader its cnt_gt2 and cnt_eq),
// before its cluster arrival ahead of scoring; every CTA waits for that arrival before
// its first remote add (HIST score: before scoring; HIST select: here). The cluster
// barriers, each passed by every thread of every CTA:
//   (0) band_kernel's arrive, this wait: the leader's zeroed words before anyone adds
//   (A) the histogram is complete: the leader finds the top digit's bin (bin0; above0 =
//       keys above it; matching = keys in it) and stores the three into every CTA's xchg
//   (B) every CTA knows them. Each counts its own keys above bin0 and in it, reserves a
//       range of each with one atomic on the leader's counters (XCHG_GT: slots of
//       out[0, above0); XCHG_CAND: slots of cand), and pushes its keys in bin0 into the
//       leader: the row position into cand, the key into the leader's keys at that
//       position (a position of another CTA's page, which the leader's keys never hold)
//   (C) every candidate is in the leader's shared memory. Nobody touches another CTA's
//       shared memory after C: each CTA writes the ids of its own keys above bin0 into
//       its range of out (global stores after C, so that no barrier waits for them), the
//       others exit, and the leader refines the candidates as radix_select does.
// Ids are bt[page] * 64 + offset from the block table in global memory (the leader stages
// it in bts for the refinement).
template <class B>
__device__ __forceinline__ void split_select(u32* keys, u32* hist, u16* cand, int* bts, u32* xchg,
                                             const int* __restrict__ bt, int cta, int len, int topk,
                                             int* __restrict__ out, SelectScratch& s) {
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int lo0 = 32 - B::bits;
    const int npages = (len + PAGE_TOKENS - 1) / PAGE_TOKENS;
    const int per = (npages + B::ctas - 1) / B::ctas;
    const int lo = min(npages, cta * per);  // this CTA's pages, as band_kernel scored them
    const int hi = min(npages, lo + per);
    const int begin = lo * PAGE_TOKENS;
    const int end = min(len, hi * PAGE_TOKENS);
    if constexpr (B::hist == HIST_SELECT) {
        __syncthreads();  // this CTA's keys are stored
        cluster_wait();   // (0): the leader's histogram is zeroed
        for (int i = begin + tid; i < end; i += B::threads) dsmem_red_add(hist + (keys[i] >> lo0), 0u, 1u);
    }
    cluster_sync();  // (A) every key of the row is counted in the leader's histogram
    EVK_MARK(s, PH_HANDOFF);
    if (cta == 0) {
        EVK_MARK(s, PH_LOADED);  // nothing to gather: the same time as the handoff
        find_bin<B>(hist, B::bins, (u32)topk, s);  // ends with a barrier: res is set
        if (tid < B::ctas) {
            for (int w = 0; w < 3; ++w) dsmem_store(xchg + XCHG_BIN + w, (u32)tid, s.res[w]);
        }
    }
    cluster_sync();  // (B) every CTA's xchg holds bin0, above0, matching
    EVK_MARK(s, PH_BIN0);
    const u32 bin0 = xchg[XCHG_BIN];
    const u32 above0 = xchg[XCHG_BIN + 1];
    const u32 matching = xchg[XCHG_BIN + 2];

    // this CTA's keys above bin0 and in it: counted (per warp, then into cnt_gt, ncand)
    u32 ngt = 0u, neq = 0u;
    for (int base = begin; base < end; base += B::threads) {  // uniform over the CTA
        const int i = base + tid;
        const u32 d = i < end ? keys[i] >> lo0 : 0u;
        ngt += (u32)__popc(__ballot_sync(FULL_MASK, i < end && d > bin0));
        neq += (u32)__popc(__ballot_sync(FULL_MASK, i < end && d == bin0));
    }
    if (lane == 0 && ngt) atomicAdd(&s.cnt_gt, ngt);
    if (lane == 0 && neq) atomicAdd(&s.ncand, neq);
    __syncthreads();
    if (tid == 0) {  // this CTA's ranges, then cnt_gt and ncand count slots within them
        xchg[XCHG_MY_GT] = s.cnt_gt ? dsmem_atom_add(xchg + XCHG_GT, 0u, s.cnt_gt) : 0u;
        xchg[XCHG_MY_CAND] = s.ncand ? dsmem_atom_add(xchg + XCHG_CAND, 0u, s.ncand) : 0u;
        s.cnt_gt = 0u;
        s.ncand = 0u;
    }
    __syncthreads();
    const u32 first_gt = xchg[XCHG_MY_GT];
    const u32 first_cand = xchg[XCHG_MY_CAND];
    for (int base = begin; base < end; base += B::threads) {  // uniform over the CTA
        const int i = base + tid;
        const u32 k = i < end ? keys[i] : 0u;
        const bool eq = i < end && (k >> lo0) == bin0;
        const u32 pc = warp_reserve(eq, &s.ncand);
        if (eq) {
            if (cta != 0) dsmem_store(keys + i, 0u, k);  // the leader has its own keys
            dsmem_store_u16(cand + first_cand + pc, 0u, (u16)i);
        }
    }
    if (cta == 0) {
        for (int i = tid; i < npages; i += B::threads) bts[i] = bt[i];
    }
    cluster_sync();  // (C) the leader's cand (and keys at their positions) are complete
    EVK_MARK(s, PH_CAND);
    for (int base = begin; base < end; base += B::threads) {  // uniform over the CTA
        const int i = base + tid;
        const bool gt = i < end && (keys[i] >> lo0) > bin0;
        const u32 pg = warp_reserve(gt, &s.cnt_gt);
        if (gt) out[first_gt + pg] = bt[i / PAGE_TOKENS] * PAGE_TOKENS + (i % PAGE_TOKENS);
    }
    if (cta != 0) return;
    radix_refine<B>(keys, hist, cand, bts, (int)matching, bin0, above0, (u32)topk - above0, topk, out, s,
                    false);
}

// Bitonic select: sorts (key << 32 | position) descending over the next power of two
// (padding 0 sorts last: every real key is above it) and keeps the first topk.
template <class B>
__device__ void bitonic_select(u64* sorted, const int* bts, int len, int topk, int* __restrict__ out) {
    const int n = pow2_at_least(len);
    const int tid = threadIdx.x;
#pragma unroll 1
    for (int k = 2; k <= n; k <<= 1) {
#pragma unroll 1
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int p = tid; p < n / 2; p += B::threads) {
                const int a = 2 * j * (p / j) + (p % j);
                const int b = a + j;
                const u64 x = sorted[a], y = sorted[b];
                const bool larger_first = (a & k) == 0;
                if ((x < y) == larger_first) { sorted[a] = y; sorted[b] = x; }
            }
            __syncthreads();
        }
    }
    for (int i = tid; i < topk; i += B::threads) {
        const int pos = (int)(u32)sorted[i];
        out[i] = bts[pos / PAGE_TOKENS] * PAGE_TOKENS + (pos % PAGE_TOKENS);
    }
}

// ------------------------------------------------------------------------------------
// the band kernel

template <class B>
__device__ __forceinline__ void band_kernel(
    const u8* __restrict__ q, const u8* __restrict__ cache, const float* __restrict__ weights,
    const int* __restrict__ seq_lens, const int* __restrict__ block_table, int* __restrict__ out_all,
    u32* __restrict__ keys_ws, u32* __restrict__ hist_ws, u32* __restrict__ counters, int max_pages,
    int topk, int phase) {
    __shared__ SelectScratch scratch;
    const int row = blockIdx.y;
    const int cta = blockIdx.x;  // == cluster rank in cluster mode (cluster dims (CTAS, 1, 1))
    const int tid = threadIdx.x;
    EVK_BEGIN(B, scratch, row, cta, phase);
    const int slots = max_pages * PAGE_TOKENS;
    const int len = max(0, min(seq_lens[row], slots));
    const int* __restrict__ bt = block_table + (size_t)row * max_pages;
    int* __restrict__ out = out_all + (size_t)row * topk;
    const Layout L = make_layout<B>(max_pages);
    if (tid == 0 && (u32)L.total > dynamic_smem_bytes()) __trap();  // host/device layouts differ

    // Rows of at most k tokens (uniform over the row's CTAs): ids and -1, no scoring.
    if (len <= topk) {
        if (B::mode == MODE_TWO_PASS && phase == 1) {  // written by phase 0
            EVK_SYNC_MARK(scratch, PH_EXIT);
            return;
        }
        if constexpr (B::short_rows == SHORT_ALL_CTAS && B::ctas > 1) {
            const int chunk = (((topk + B::ctas - 1) / B::ctas) + 3) & ~3;
            const int begin = min(topk, cta * chunk);
            write_short_row<4>(out, bt, len, begin, min(topk, begin + chunk), tid, B::threads);
        } else if (cta == 0) {
            write_short_row<4>(out, bt, len, 0, topk, tid, B::threads);
        }
        EVK_SYNC_MARK(scratch, PH_EXIT);
        return;
    }

    u32* hist = reinterpret_cast<u32*>(smem + L.hist);
    u32* keys = reinterpret_cast<u32*>(smem + L.keys);
    u32* xchg = reinterpret_cast<u32*>(smem + L.xchg);  // GATHER split only
    u32* global_keys = keys_ws + (size_t)row * slots;
    u32* global_hist = hist_ws + (size_t)row * HIST_STRIDE;

    if (B::mode != MODE_TWO_PASS || phase == 0) {
        // ---- score this CTA's pages of the row
        const int npages = (len + PAGE_TOKENS - 1) / PAGE_TOKENS;
        const int per = (npages + B::ctas - 1) / B::ctas;
        const int lo = min(npages, cta * per);
        const int hi = min(npages, lo + per);
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

        if constexpr (B::split) {
            // (0) of split_select: the leader's histogram and counters are zeroed before
            // this thread's arrival; every CTA waits for the cluster before its first add
            if (cta == 0) {
                for (int i = tid; i < B::bins; i += B::threads) hist[i] = 0u;
                if (tid == 0) {
                    xchg[XCHG_GT] = 0u;
                    xchg[XCHG_CAND] = 0u;
                    scratch.cnt_gt2 = 0u;
                    scratch.cnt_eq = 0u;
                }
            }
            if (tid == 0) {
                scratch.cnt_gt = 0u;
                scratch.ncand = 0u;
            }
            cluster_arrive();
        }

        Query<B> qr;
        const u8* __restrict__ qrow = q + (size_t)row * NUM_HEADS * HEAD_DIM;
        const float* __restrict__ wrow = weights + (size_t)row * NUM_HEADS;
        if constexpr (B::score == SCORE_SIMT) {
            float* qt = reinterpret_cast<float*>(smem + L.qt);
            for (int i = tid; i < NUM_HEADS * HEAD_DIM; i += B::threads)
                qt[(i % HEAD_DIM) * QT_STRIDE + i / HEAD_DIM] = fp8_to_float(qrow[i]);
            qr.wt[0] = __ldg(wrow + lane);
            qr.wt[1] = __ldg(wrow + lane + 32);
        } else if constexpr (B::wgmma) {
            // q's 64 head rows into shared memory in the wgmma layout (the B operand)
            if constexpr (B::early) {
                // with the weights and the first pages; returns when q's copies are done
                wg_early_loads<B>(L, qr, qrow, wrow, cache, bt, lo, hi);
            } else {
                u8* region = wg_region<B>(L);
                for (int k = tid; k < KEY_BYTES / 16; k += B::threads) {
                    const uint4 v = __ldg(reinterpret_cast<const uint4*>(qrow) + k);
                    *reinterpret_cast<uint4*>(region + chunk_offset<B>(k >> 3, k & 7)) = v;
                }
            }
            fence_proxy_async();  // q's stores or copies, read by wgmma after the barrier below
            qr.w = wrow;
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                ldg32(qrow + (8 * i + g) * HEAD_DIM + 32 * t, qr.qa[i]);
                qr.wt[i] = __ldg(wrow + 8 * i + g);
            }
        }
        if constexpr (B::load == LOAD_BULK) {
            if (lane == 0) {
                const u32 bars = smem_u32(smem + L.bars) + 8u * (u32)(warp * B::stages);
                for (int s = 0; s < B::stages; ++s) mbar_init(bars + 8u * s, 1u);
                mbar_init_fence();
            }
        }
        if constexpr (B::mode == MODE_CLUSTER && !B::split) {
            if constexpr (B::hist == HIST_SCORE) {
                for (int i = tid; i < B::bins; i += B::threads) hist[i] = 0u;
            }
        }
        __syncthreads();  // q in shared memory, barriers initialised, histogram cleared
        EVK_MARK(scratch, PH_Q);
        if constexpr (B::split && B::hist == HIST_SCORE) {
            cluster_wait();  // (0): scoring counts into the leader's zeroed histogram
        }

        if constexpr (B::mode == MODE_CLUSTER) {
            const RowSink sink{keys, hist, len};
            score_pages<B>(L, qr, cache, bt, lo, hi, sink);
        } else {
            const RowSink sink{global_keys, global_hist, len};
            score_pages<B>(L, qr, cache, bt, lo, hi, sink);
        }
        EVK_SYNC_MARK(scratch, PH_SCORED);
    }

    // ---- GATHER split: the cluster selects, each CTA over its own keys
    if constexpr (B::split) {
        split_select<B>(keys, hist, reinterpret_cast<u16*>(smem + L.cand), reinterpret_cast<int*>(smem + L.bts),
                        xchg, bt, cta, len, topk, out, scratch);
        if (cta == 0) EVK_SYNC_MARK(scratch, PH_OUTPUT);
        EVK_MARK(scratch, PH_EXIT);
        return;
    }

    // ---- hand the row to one CTA
    if constexpr (B::mode == MODE_TWO_PASS) {
        if (phase == 0 || cta != 0) {
            EVK_MARK(scratch, PH_EXIT);
            return;
        }
    } else if constexpr (B::mode == MODE_FUSED) {
        if constexpr (B::ctas > 1) {
            if constexpr (B::acq_rel) {
                __syncthreads();  // the CTA's keys and counts, before thread 0 releases them
                if (tid == 0) scratch.ticket = add_acq_rel(counters + row, 1u);
            } else {
                __threadfence();  // this CTA's keys and counts are visible before it arrives
                __syncthreads();
                if (tid == 0) scratch.ticket = atomicAdd(counters + row, 1u);
            }
            __syncthreads();
            EVK_MARK(scratch, PH_HANDOFF);
            if (scratch.ticket != (u32)(B::ctas - 1)) {
                EVK_MARK(scratch, PH_EXIT);
                return;
            }
            if (tid == 0) counters[row] = 0u;  // ready for the next call
            if constexpr (!B::acq_rel) __threadfence();  // (acq_rel: the ticket acquired them)
        } else {
            __syncthreads();
            EVK_MARK(scratch, PH_HANDOFF);
        }
    }

    // ---- the selecting CTA: block table, keys (and their histogram) in shared memory
    int* bts = reinterpret_cast<int*>(smem + L.bts);
    if constexpr (B::compact == COMPACT_REGISTERS) {  // (MODE fused or two_pass) keys in registers
        register_select<B>(global_keys, keys, hist, reinterpret_cast<u16*>(smem + L.cand), bts, bt, len, topk,
                           out, scratch);
        EVK_SYNC_MARK(scratch, PH_OUTPUT);
        EVK_MARK(scratch, PH_EXIT);
        return;
    }
    u32 span_lo = 0xffffffffu, span_hi = 0u;  // DIGIT span: extremes of the keys this thread loads
    // The block table's first B::threads entries, asked for before the keys so that the two
    // round trips overlap (stored into bts with the rest after the keys).
    const int npages = (len + PAGE_TOKENS - 1) / PAGE_TOKENS;
    const int bt_first = tid < npages ? bt[tid] : 0;
    const int lo0 = 32 - B::bits;
    if constexpr (B::mode == MODE_CLUSTER) {
        if constexpr (B::clustered) {
            cluster_sync();  // every CTA of the row has its keys (and counts) in place
            EVK_MARK(scratch, PH_HANDOFF);
            const int per = (npages + B::ctas - 1) / B::ctas;
            if (cta == 0) {
                if constexpr (B::select == SELECT_RADIX && B::hist == HIST_SCORE) {
                    for (int b = tid; b < B::bins; b += B::threads) {
                        u32 sum = hist[b];
                        for (int r = 1; r < B::ctas; ++r) sum += dsmem_load(hist + b, (u32)r);
                        hist[b] = sum;
                    }
                }
                for (int i = tid; i < len; i += B::threads) {
                    const int owner = (i / PAGE_TOKENS) / per;
                    if (owner != 0) keys[i] = dsmem_load(keys + i, (u32)owner);
                }
            }
            cluster_sync();  // the leader has read the others' shared memory: they may exit
            if (cta != 0) {
                EVK_MARK(scratch, PH_EXIT);
                return;
            }
        } else {
            __syncthreads();  // every warp's keys (and counts) are in place
            EVK_MARK(scratch, PH_HANDOFF);
        }
        if constexpr (B::select == SELECT_RADIX && B::hist == HIST_SELECT && !B::span) {
            for (int i = tid; i < B::bins; i += B::threads) hist[i] = 0u;
            __syncthreads();
            for (int i = tid; i < len; i += B::threads) atomicAdd(&hist[keys[i] >> lo0], 1u);
        }
        if constexpr (B::select == SELECT_BITONIC) {
            u64* sorted = reinterpret_cast<u64*>(smem + L.sorted);
            const int n = pow2_at_least(len);
            for (int i = tid; i < n; i += B::threads)
                sorted[i] = i < len ? ((u64)keys[i] << 32) | (u32)i : 0ull;
        }
    } else {
        // keys from the global buffer (L2), written by this launch's or phase 0's CTAs
        if constexpr (B::select == SELECT_RADIX) {
            if constexpr (B::hist == HIST_SCORE) {
                for (int b = tid; b < B::bins; b += B::threads) {
                    hist[b] = __ldcg(global_hist + b);
                    global_hist[b] = 0u;  // ready for the next call
                }
            } else if constexpr (!B::span) {  // (span_histogram counts after the loads)
                for (int b = tid; b < B::bins; b += B::threads) hist[b] = 0u;
                __syncthreads();
            }
            constexpr bool count = B::hist == HIST_SELECT && !B::span;
            const int len4 = len >> 2;
            for (int i = tid; i < len4; i += B::threads) {
                const uint4 k = __ldcg(reinterpret_cast<const uint4*>(global_keys) + i);
                reinterpret_cast<uint4*>(keys)[i] = k;
                if constexpr (B::span) {
                    span_lo = min(span_lo, min(min(k.x, k.y), min(k.z, k.w)));
                    span_hi = max(span_hi, max(max(k.x, k.y), max(k.z, k.w)));
                }
                if constexpr (count) {
                    atomicAdd(&hist[k.x >> lo0], 1u);
                    atomicAdd(&hist[k.y >> lo0], 1u);
                    atomicAdd(&hist[k.z >> lo0], 1u);
                    atomicAdd(&hist[k.w >> lo0], 1u);
                }
            }
            for (int i = 4 * len4 + tid; i < len; i += B::threads) {
                const u32 k = __ldcg(global_keys + i);
                keys[i] = k;
                if constexpr (count) atomicAdd(&hist[k >> lo0], 1u);
                if constexpr (B::span) {
                    span_lo = min(span_lo, k);
                    span_hi = max(span_hi, k);
                }
            }
        } else {
            u64* sorted = reinterpret_cast<u64*>(smem + L.sorted);
            const int n = pow2_at_least(len);
            for (int i = tid; i < n; i += B::threads)
                sorted[i] = i < len ? ((u64)__ldcg(global_keys + i) << 32) | (u32)i : 0ull;
        }
    }
    if (tid < npages) bts[tid] = bt_first;
    for (int i = tid + B::threads; i < npages; i += B::threads) bts[i] = bt[i];
    __syncthreads();
    EVK_MARK(scratch, PH_LOADED);

    if constexpr (B::select == SELECT_RADIX) {
        if constexpr (B::span) {  // the global key buffer's loads tracked the extremes
            span_histogram<B>(keys, hist, len, scratch, span_lo, span_hi, B::mode != MODE_CLUSTER);
        }
        radix_select<B>(keys, hist, reinterpret_cast<u16*>(smem + L.cand), bts, len, topk, out, scratch);
    } else {
        bitonic_select<B>(reinterpret_cast<u64*>(smem + L.sorted), bts, len, topk, out);
    }
    EVK_SYNC_MARK(scratch, PH_OUTPUT);
    EVK_MARK(scratch, PH_EXIT);
}

// ------------------------------------------------------------------------------------
// the four scoring bands

#define BAND_PARAMS                                                                         \
    const u8* __restrict__ q, const u8* __restrict__ cache, const float* __restrict__ weights, \
        const int* __restrict__ seq_lens, const int* __restrict__ block_table,              \
        int* __restrict__ out, u32* __restrict__ keys_ws, u32* __restrict__ hist_ws,        \
        u32* __restrict__ counters, int max_pages, int topk, int phase
#define BAND_ARGS \
    q, cache, weights, seq_lens, block_table, out, keys_ws, hist_ws, counters, max_pages, topk, phase

typedef Band<MS_MODE_ID, MS_SCORE_ID, MS_LOAD_ID, MS_STAGES, MS_SWIZZLE, MS_SELECT_ID, MS_RADIX_BITS,
             MS_HIST_ID, MS_SHORT_ID, MS_EARLY, MS_SLICES, MS_GATHER_ID, MS_DIGIT_ID,
             MS_COMPACT_ID, MS_HANDOFF_ID, MS_CTAS,
             MS_WARPS> BandMS;
typedef Band<ML_MODE_ID, ML_SCORE_ID, ML_LOAD_ID, ML_STAGES, ML_SWIZZLE, ML_SELECT_ID, ML_RADIX_BITS,
             ML_HIST_ID, ML_SHORT_ID, ML_EARLY, ML_SLICES, ML_GATHER_ID, ML_DIGIT_ID,
             ML_COMPACT_ID, ML_HANDOFF_ID, ML_CTAS,
             ML_WARPS> BandML;
typedef Band<LS_MODE_ID, LS_SCORE_ID, LS_LOAD_ID, LS_STAGES, LS_SWIZZLE, LS_SELECT_ID, LS_RADIX_BITS,
             LS_HIST_ID, LS_SHORT_ID, LS_EARLY, LS_SLICES, LS_GATHER_ID, LS_DIGIT_ID,
             LS_COMPACT_ID, LS_HANDOFF_ID, LS_CTAS,
             LS_WARPS> BandLS;
typedef Band<LL_MODE_ID, LL_SCORE_ID, LL_LOAD_ID, LL_STAGES, LL_SWIZZLE, LL_SELECT_ID, LL_RADIX_BITS,
             LL_HIST_ID, LL_SHORT_ID, LL_EARLY, LL_SLICES, LL_GATHER_ID, LL_DIGIT_ID,
             LL_COMPACT_ID, LL_HANDOFF_ID, LL_CTAS,
             LL_WARPS> BandLL;

// A band's parameters and the widest row it takes, in pages (COMPACT registers sizes its
// per-thread key arrays by it; cuda_family_host.py picks the band by max_num_pages).
template <class B, int MAX_PAGES>
struct Widest : B {
    static constexpr int max_pages = MAX_PAGES;
};

#define MS_THREADS (MS_WARPS * 32)
#define ML_THREADS (ML_WARPS * 32)
#define LS_THREADS (LS_WARPS * 32)
#define LL_THREADS (LL_WARPS * 32)

// A cluster kernel declares its cluster shape on a declaration of its own (the
// definitions below all have the same plain form).
#if MS_MODE_ID == MODE_CLUSTER && MS_CTAS > 1
extern "C" { __global__ void __cluster_dims__(MS_CTAS, 1, 1) ms_topk(BAND_PARAMS); }
#endif
#if ML_MODE_ID == MODE_CLUSTER && ML_CTAS > 1
extern "C" { __global__ void __cluster_dims__(ML_CTAS, 1, 1) ml_topk(BAND_PARAMS); }
#endif
#if LS_MODE_ID == MODE_CLUSTER && LS_CTAS > 1
extern "C" { __global__ void __cluster_dims__(LS_CTAS, 1, 1) ls_topk(BAND_PARAMS); }
#endif
#if LL_MODE_ID == MODE_CLUSTER && LL_CTAS > 1
extern "C" { __global__ void __cluster_dims__(LL_CTAS, 1, 1) ll_topk(BAND_PARAMS); }
#endif

extern "C" __global__ __launch_bounds__(MS_THREADS) void ms_topk(BAND_PARAMS) {
    band_kernel<Widest<BandMS, MID_ROW_PAGES>>(BAND_ARGS);
}
extern "C" __global__ __launch_bounds__(ML_THREADS) void ml_topk(BAND_PARAMS) {
    band_kernel<Widest<BandML, MID_ROW_PAGES>>(BAND_ARGS);
}
extern "C" __global__ __launch_bounds__(LS_THREADS) void ls_topk(BAND_PARAMS) {
    band_kernel<Widest<BandLS, MAX_ROW_PAGES>>(BAND_ARGS);
}
extern "C" __global__ __launch_bounds__(LL_THREADS) void ll_topk(BAND_PARAMS) {
    band_kernel<Widest<BandLL, MAX_ROW_PAGES>>(BAND_ARGS);
}
