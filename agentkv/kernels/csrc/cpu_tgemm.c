/* The exact product of a tiled W: x's rows in fp32 (a prompt's tokens, as the dequantized model computes
them) times W^T, as a GEMM over the tiles, so that a pass of n rows reads and dequantizes the weights
once and then runs at the cores' FMA rate.

Threads take the tiles two at a time as they get to them. A tile's weights are made a panel at a time
(PANEL_K columns of its 16 rows in fp32, 16 KB: they stay in L1) by agentkv_tile_block_cols, and every
row of x is multiplied against the panel before the next one is made. In the micro-kernel a column's 16
weights are one register, multiplied by GEMM_R rows of x at once (per column: one load, GEMM_R
broadcasts, GEMM_R FMAs into independent accumulators, which hide the FMA's latency; the columns of an
even block and of the odd one after it in turn, so that a single row has two chains); x's rows in
groups of even sizes, each packed column by column. A long pass takes x X_BLOCK_BYTES of rows at a time
through every tile, so that the rows a tile reads stay in L2.

Each output sums its products over k in order, the columns of even blocks of 32 in one accumulator and
of odd ones in another (the order the int8 tiled products sum in), the two added at the end. The plain-C
body makes the same operations in that order from the same dequantized values: the same bits. */

#include <stdlib.h>

#include "cpu_tiles.h"

#define PANEL_K 256                /* columns a panel: a K-quant's super-block, 16 KB of fp32 */
#define X_BLOCK_BYTES (384 * 1024) /* x's rows (fp32) taken through all the tiles before the next ones */
#define PREFETCH_BLOCKS 16         /* how far ahead a tile's blocks are asked for */

#if AGENTKV_TILES_FAST
#define GEMM_R 12 /* rows a group: 2 x 12 accumulators and the column in 32 zmm registers */
/* rows [R] of x (x[k * R + m], k < kc) against a panel wt [kc][16] into acc [R][2][16] */
INLINE void micro_avx512(const float *wt, int64_t kc, const float *x, float *acc, const int R) {
    __m512 a0[GEMM_R], a1[GEMM_R];
#pragma GCC unroll 12
    for (int m = 0; m < R; m++) a0[m] = _mm512_loadu_ps(acc + 32 * m), a1[m] = _mm512_loadu_ps(acc + 32 * m + 16);
    for (int64_t k0 = 0; k0 < kc; k0 += 2 * QK) {
        if (k0 + QK < kc)  /* an even block and the odd one after it, their columns in turn: two chains */
            for (int64_t k = k0; k < k0 + QK; k++) {
                const __m512 w0 = _mm512_load_ps(wt + TILE_ROWS * k), w1 = _mm512_load_ps(wt + TILE_ROWS * (k + QK));
#pragma GCC unroll 12
                for (int m = 0; m < R; m++) {
                    a0[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[k * R + m]), a0[m]);
                    a1[m] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[(k + QK) * R + m]), a1[m]);
                }
            }
        else  /* a last even block alone */
            for (int64_t k = k0; k < kc; k++) {
                const __m512 w = _mm512_load_ps(wt + TILE_ROWS * k);
#pragma GCC unroll 12
                for (int m = 0; m < R; m++) a0[m] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[k * R + m]), a0[m]);
            }
    }
#pragma GCC unroll 12
    for (int m = 0; m < R; m++) _mm512_storeu_ps(acc + 32 * m, a0[m]), _mm512_storeu_ps(acc + 32 * m + 16, a1[m]);
}
#define MICRO micro_avx512
#elif AGENTKV_TILES_AVX2
#define GEMM_R 6 /* 2 x 6 accumulators, the column and a broadcast in 16 ymm registers, each half of 8 rows */
INLINE void micro_avx2(const float *wt, int64_t kc, const float *x, float *acc, const int R) {
    for (int h = 0; h < 2; h++) {
        __m256 a0[GEMM_R], a1[GEMM_R];
#pragma GCC unroll 6
        for (int m = 0; m < R; m++)
            a0[m] = _mm256_loadu_ps(acc + 32 * m + 8 * h), a1[m] = _mm256_loadu_ps(acc + 32 * m + 16 + 8 * h);
        for (int64_t k0 = 0; k0 < kc; k0 += 2 * QK) {
            if (k0 + QK < kc)
                for (int64_t k = k0; k < k0 + QK; k++) {
                    const __m256 w0 = _mm256_load_ps(wt + TILE_ROWS * k + 8 * h);
                    const __m256 w1 = _mm256_load_ps(wt + TILE_ROWS * (k + QK) + 8 * h);
#pragma GCC unroll 6
                    for (int m = 0; m < R; m++) {
                        a0[m] = _mm256_fmadd_ps(w0, _mm256_set1_ps(x[k * R + m]), a0[m]);
                        a1[m] = _mm256_fmadd_ps(w1, _mm256_set1_ps(x[(k + QK) * R + m]), a1[m]);
                    }
                }
            else
                for (int64_t k = k0; k < kc; k++) {
                    const __m256 w = _mm256_load_ps(wt + TILE_ROWS * k + 8 * h);
#pragma GCC unroll 6
                    for (int m = 0; m < R; m++) a0[m] = _mm256_fmadd_ps(w, _mm256_set1_ps(x[k * R + m]), a0[m]);
                }
        }
#pragma GCC unroll 6
        for (int m = 0; m < R; m++)
            _mm256_storeu_ps(acc + 32 * m + 8 * h, a0[m]), _mm256_storeu_ps(acc + 32 * m + 16 + 8 * h, a1[m]);
    }
}
#define MICRO micro_avx2
#else
#define GEMM_R 4
#endif

#if AGENTKV_TILES_FAST && defined(__AVX512BF16__)
#define AGENTKV_TGEMM_BF16 1
/* The opt-in bf16 body (prompt_precision="bfloat16"): x and the panel rounded to bf16 (nearest even), each
   pair of columns one vdpbf16ps, 32 products an instruction where fp32 FMAs make 16, summed in fp32. rows
   [R] of x as column pairs (xb[kp * R + m], kp < kc / 2) against a panel wb [kc / 2][16] of weight pairs */
INLINE void micro_bf16(const uint32_t *wb, int64_t kc, const uint32_t *xb, float *acc, const int R) {
    __m512 a0[GEMM_R], a1[GEMM_R];
#pragma GCC unroll 12
    for (int m = 0; m < R; m++) a0[m] = _mm512_loadu_ps(acc + 32 * m), a1[m] = _mm512_loadu_ps(acc + 32 * m + 16);
    int64_t kp = 0;
    for (; kp + 2 <= kc / 2; kp += 2) {  /* two pairs in turn: two chains a row */
        const __m512bh w0 = (__m512bh)_mm512_load_si512(wb + TILE_ROWS * kp);
        const __m512bh w1 = (__m512bh)_mm512_load_si512(wb + TILE_ROWS * (kp + 1));
#pragma GCC unroll 12
        for (int m = 0; m < R; m++) {
            a0[m] = _mm512_dpbf16_ps(a0[m], w0, (__m512bh)_mm512_set1_epi32((int)xb[kp * R + m]));
            a1[m] = _mm512_dpbf16_ps(a1[m], w1, (__m512bh)_mm512_set1_epi32((int)xb[(kp + 1) * R + m]));
        }
    }
    for (; kp < kc / 2; kp++) {
        const __m512bh w = (__m512bh)_mm512_load_si512(wb + TILE_ROWS * kp);
#pragma GCC unroll 12
        for (int m = 0; m < R; m++) a0[m] = _mm512_dpbf16_ps(a0[m], w, (__m512bh)_mm512_set1_epi32((int)xb[kp * R + m]));
    }
#pragma GCC unroll 12
    for (int m = 0; m < R; m++) _mm512_storeu_ps(acc + 32 * m, a0[m]), _mm512_storeu_ps(acc + 32 * m + 16, a1[m]);
}

static void micro_b(const uint32_t *wb, int64_t kc, const uint32_t *xb, float *acc, int R) {
    switch (R) {
#define CASE(r) case r: micro_bf16(wb, kc, xb, acc, r); return;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#undef CASE
    }
}

INLINE uint32_t bf16_pair(float lo, float hi) {
    return (uint32_t)f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16;
}

/* a panel wt [kc][16] (fp32) as column pairs wb [kc / 2][16] of bf16 (nearest even, as f32_to_bf16) */
INLINE void panel_pairs(const float *wt, int64_t kc, uint32_t *wb) {
    /* element 2i the even column's row i, 2i + 1 the odd one's */
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t k = 0; k < kc; k += 2) {
        const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(wt + TILE_ROWS * k));
        const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(wt + TILE_ROWS * (k + 1)));
        _mm512_store_si512(wb + k / 2 * TILE_ROWS,
                           _mm512_permutexvar_epi16(inter, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)));
    }
}
#else
#define AGENTKV_TGEMM_BF16 0
#endif

/* whether this build has the bf16 body (AVX512_BF16): agentkv_qtile_exact's `generic & 2` asks for it */
int agentkv_qtile_exact_bf16(void) { return AGENTKV_TGEMM_BF16; }

/* the plain-C body: micro_avx512's operations in its order */
static void micro_generic(const float *wt, int64_t kc, const float *x, float *acc, int R) {
    for (int m = 0; m < R; m++)
        for (int i = 0; i < TILE_ROWS; i++) {
            float a[2] = {acc[32 * m + i], acc[32 * m + 16 + i]};
            for (int64_t k = 0; k < kc; k++)
                a[(k / QK) & 1] = fmaf(wt[TILE_ROWS * k + i], x[k * R + m], a[(k / QK) & 1]);
            acc[32 * m + i] = a[0], acc[32 * m + 16 + i] = a[1];
        }
}

/* a group of R <= GEMM_R rows, the SIMD body specialized for each R */
static void micro(int generic, const float *wt, int64_t kc, const float *x, float *acc, int R) {
#ifdef MICRO
    if (!generic) {
        switch (R) {
#define CASE(r) case r: MICRO(wt, kc, x, acc, r); return;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if GEMM_R > 6
            CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#endif
#undef CASE
        }
    }
#endif
    (void)generic;
    micro_generic(wt, kc, x, acc, R);
}

/* the first row of group i of the ng groups of M rows: groups of as even sizes as can be (51 rows as
   11 + 10 + 10 + 10 + 10, not 12 + 12 + 12 + 12 + 3), each at most GEMM_R */
INLINE int64_t group_start(int64_t M, int64_t ng, int64_t i) { return i * M / ng; }

/* x [M, K] (bf16 or fp32) @ W^T for a tiled W, x kept in fp32, out [M, N] (+ bias) (+ residual), any M.
   Returns as qtile_linear (1: a shape or type it does not take, 2: out of memory). */
int agentkv_qtile_exact(int qtype, int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *tiles,
                        int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                        int nthreads, int generic) {
    /* generic & 2: the bf16 body where the build has it (x and the weights rounded to bf16) */
    const int use_bf16 = AGENTKV_TGEMM_BF16 && (generic & 2) && K % 2 == 0;
    generic &= 1;
    if (!tiled_shape(qtype, K)) return 1;
    if (M < 1) return 2;
    if (nthreads < 1) nthreads = 1;
    const int64_t ntiles = (N + TILE_ROWS - 1) / TILE_ROWS, bw = BLOCK_WEIGHTS[qtype], tb = tile_block_bytes(qtype);
    const int64_t ng = (M + GEMM_R - 1) / GEMM_R;
    int64_t gpb = X_BLOCK_BYTES / (K * (int64_t)sizeof(float)) / GEMM_R; /* groups an x block */
    if (gpb < 4) gpb = 4;
    /* a panel (and its bf16 pairs), the rows' accumulators */
    const int64_t per_thread = PANEL_K * TILE_ROWS + PANEL_K / 2 * TILE_ROWS + gpb * GEMM_R * 32;
    float *xf = malloc((size_t)(M * K) * sizeof(float));
    float *work = aligned_alloc(64, (size_t)(nthreads * per_thread) * sizeof(float));
    if (!xf || !work) {
        free(xf), free(work);
        return 2;
    }
#if AGENTKV_TGEMM_BF16
    uint32_t *xb = (uint32_t *)xf; /* x as bf16 column pairs, in place of its fp32 packing (half its size) */
#endif
#pragma omp parallel num_threads(nthreads) if (ntiles * K * M > 65536)
    {
        const int64_t nt = omp_threads(), me = omp_me();
        for (int64_t i = me; i < ng; i += nt) {  /* each group's rows packed, column by column */
            const int64_t g = group_start(M, ng, i), R = group_start(M, ng, i + 1) - g;
#if AGENTKV_TGEMM_BF16
            if (use_bf16) {
                for (int64_t m = 0; m < R; m++)
                    for (int64_t k = 0; k < K; k += 2)
                        xb[g * K / 2 + k / 2 * R + m] = bf16_pair(load1(x, (g + m) * x_ld + k, bf),
                                                                  load1(x, (g + m) * x_ld + k + 1, bf));
                continue;
            }
#endif
            for (int64_t m = 0; m < R; m++)
                for (int64_t k = 0; k < K; k++) xf[g * K + k * R + m] = load1(x, (g + m) * x_ld + k, bf);
        }
#pragma omp barrier
        float *wt = work + me * per_thread, *acc = wt + PANEL_K * TILE_ROWS + PANEL_K / 2 * TILE_ROWS;
        for (int64_t i0 = 0; i0 < ng; i0 += gpb) {
            const int64_t i1 = i0 + gpb < ng ? i0 + gpb : ng, m0 = group_start(M, ng, i0);
            const int64_t rows = group_start(M, ng, i1) - m0;
            /* tiles handed out two at a time as threads get to them: a thread whose core is shared with
               another process takes fewer, rather than the pass waiting on its fixed half */
#pragma omp for schedule(dynamic, 2) nowait
            for (int64_t t = 0; t < ntiles; t++) {
                const uint8_t *tile = tiles + t * tile_bytes(qtype, K);
                memset(acc, 0, (size_t)rows * 32 * sizeof(float));
                for (int64_t c0 = 0; c0 < K; c0 += PANEL_K) {
                    const int64_t kc = K - c0 < PANEL_K ? K - c0 : PANEL_K;
                    for (int64_t b = c0 / bw; b < (c0 + kc) / bw; b++) {
                        /* the weights stream from memory once a pass: ask for them ahead (a short pass,
                           the vocabulary's last row, is bound by this read) */
                        for (int64_t ahead = 0; ahead < tb; ahead += 64)
                            __builtin_prefetch(tile + (b + PREFETCH_BLOCKS) * tb + ahead, 0, 0);
                        agentkv_tile_block_cols(qtype, tile + b * tb, wt + TILE_ROWS * (b * bw - c0), generic);
                    }
#if AGENTKV_TGEMM_BF16
                    if (use_bf16) {  /* the panel as bf16 pairs of columns, then every group against it */
                        uint32_t *wb = (uint32_t *)(wt + PANEL_K * TILE_ROWS);
                        panel_pairs(wt, kc, wb);
                        for (int64_t i = i0; i < i1; i++) {
                            const int64_t g = group_start(M, ng, i), R = group_start(M, ng, i + 1) - g;
                            micro_b(wb, kc, xb + g * K / 2 + c0 / 2 * R, acc + 32 * (g - m0), (int)R);
                        }
                        continue;
                    }
#endif
                    for (int64_t i = i0; i < i1; i++) {
                        const int64_t g = group_start(M, ng, i), R = group_start(M, ng, i + 1) - g;
                        micro(generic, wt, kc, xf + g * K + c0 * R, acc + 32 * (g - m0), (int)R);
                    }
                }
                const int valid = N - t * TILE_ROWS < TILE_ROWS ? (int)(N - t * TILE_ROWS) : TILE_ROWS;
                for (int64_t m = 0; m < rows; m++) {
                    float v[TILE_ROWS];
                    for (int i = 0; i < TILE_ROWS; i++) v[i] = acc[32 * m + i] + acc[32 * m + 16 + i];
                    if (bf) tile_store(v, m0 + m, t * TILE_ROWS, valid, bias, res, r_ld, out, out_ld, 1);
                    else tile_store(v, m0 + m, t * TILE_ROWS, valid, bias, res, r_ld, out, out_ld, 0);
                }
            }
        }
    }
    free(xf), free(work);
    return 0;
}
