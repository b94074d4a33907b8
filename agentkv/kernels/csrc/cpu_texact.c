/* The exact product of a tiled W (a prompt's rows: x in fp32, what the dequantized model computes) and a
whole tiled W read back, with each column's weights made in a register from the tile's bytes: a block
of 32 columns (cpu_tiles.c's layouts) column by column, a K-quant's or IQ4_XS's super-block through
cpu_ktiles.c's, F16 and BF16 through cpu_ftiles.c's. One fused multiply-add per row of x and column,
x's rows 8 at a time so that their two accumulators (even and odd blocks) stay in registers; the
plain-C body (tile_weight) makes the same values and the same sums: the same bits. */

#include <stdlib.h>

#include "cpu_tiles.h"

#if AGENTKV_TILES_FAST
/* column k of a tile's block: its 16 rows' weights, tile_weight's values (tile_u's integer, as cpu_tiles.h's
   unpacking reads it, then the block's scale) */
INLINE __m512 col_avx512(const int qtype, const uint8_t *blk, int k) {
    const uint8_t *qs = blk + weights_at(qtype);
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    const int kk = qtype == Q8_0 ? k : k % 16;
    const __m512i r = _mm512_loadu_si512((const void *)(qs + (kk / 4) * 64)), one = _mm512_set1_epi32(1);
    __m512i q = _mm512_and_si512(_mm512_srli_epi32(r, 8 * (kk % 4)), _mm512_set1_epi32(0xff));
    if (qtype != Q8_0) q = k < 16 ? _mm512_and_si512(q, _mm512_set1_epi32(15)) : _mm512_srli_epi32(q, 4);
    if (qtype == IQ4_NL)
        q = _mm512_permutexvar_epi32(q, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)IQ4_NL_U8)));
    if (high_at(qtype)) {
        const __m512i hv = _mm512_loadu_si512((const void *)(blk + high_at(qtype)));
        q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hv, q5_bit(k)), one), 4));
    }
    if (has_min(qtype)) {
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        return _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(q), mv);
    }
    return _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32((int32_t)quant_offset(qtype)))));
}

#endif

#if AGENTKV_TILES_AVX2
/* col_avx512 for rows 8 h..8 h + 7 */
INLINE __m256 col_avx2(const int qtype, const uint8_t *blk, int k, int h) {
    const uint8_t *qs = blk + weights_at(qtype);
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
    const int kk = qtype == Q8_0 ? k : k % 16;
    const __m256i r = _mm256_loadu_si256((const __m256i *)(qs + (kk / 4) * 64 + 32 * h)), one = _mm256_set1_epi32(1);
    __m256i q = _mm256_and_si256(_mm256_srli_epi32(r, 8 * (kk % 4)), _mm256_set1_epi32(0xff));
    if (qtype != Q8_0) q = k < 16 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
    if (qtype == IQ4_NL) {  /* (two tables of 8, the code's bit 3 choosing) */
        const __m256i lo8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)IQ4_NL_U8));
        const __m256i hi8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(IQ4_NL_U8 + 8)));
        q = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(lo8, q), _mm256_permutevar8x32_epi32(hi8, q),
                               _mm256_cmpgt_epi32(q, _mm256_set1_epi32(7)));
    }
    if (high_at(qtype)) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(blk + high_at(qtype) + 32 * h));
        q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hv, q5_bit(k)), one), 4));
    }
    if (has_min(qtype)) {
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
        return _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(q), mv);
    }
    return _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32((int32_t)quant_offset(qtype)))));
}
#endif

#if AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2
/* tile t of W (all its rows) into out's rows 16 t..: each block's columns made in registers (col_avx512 /
   col_avx2, agentkv_ktile_cols: the values rows read back hold), then written out row by row from L1 */
static void tile_dequant(const int qtype, const int bf, const uint8_t *tiles, int64_t N, int64_t K, int64_t t,
                         void *out, int64_t out_ld) {
    const int64_t bw = BLOCK_WEIGHTS[qtype], nb = K / bw, tb = tile_block_bytes(qtype);
    const int valid = N - t * TILE_ROWS < TILE_ROWS ? (int)(N - t * TILE_ROWS) : TILE_ROWS;
    float cols[QK_K][TILE_ROWS];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tiles + (t * nb + b) * tb;
        if (is_kquant(qtype)) agentkv_ktile_cols(qtype, blk, cols);
        else if (is_float(qtype))
            for (int k = 0; k < QK; k++)
                for (int i = 0; i < TILE_ROWS; i++) cols[k][i] = ftile_weight(qtype, blk, i, k);
        else
            for (int k = 0; k < QK; k++) {
#if AGENTKV_TILES_FAST
                _mm512_storeu_ps(cols[k], col_avx512(qtype, blk, k));
#else
                _mm256_storeu_ps(cols[k], col_avx2(qtype, blk, k, 0));
                _mm256_storeu_ps(cols[k] + 8, col_avx2(qtype, blk, k, 1));
#endif
            }
        for (int i = 0; i < valid; i++)
            for (int64_t k = 0; k < bw; k++) store1(out, (t * TILE_ROWS + i) * out_ld + b * bw + k, cols[k][i], bf);
    }
}
#endif

/* rows `rows[0..n)` of a tiled W (all N in order when NULL) into out [n, K] (row stride out_ld) */
int agentkv_qtile_dequant(int qtype, int bf, const uint8_t *tiles, int64_t N, int64_t K, const int64_t *rows, int64_t n,
                          void *out, int64_t out_ld, int nthreads) {
    if (!tiled_shape(qtype, K)) return 1;
    for (int64_t r = 0; r < n; r++)
        if (rows && (rows[r] < 0 || rows[r] >= N)) return 3;
#if AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2
    if (!rows) {  /* the whole weight (a long prompt's product): a tile at a time */
        const int64_t ntiles = (N + TILE_ROWS - 1) / TILE_ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * K > 8192)
        for (int64_t t = 0; t < ntiles; t++) {
            if (bf) tile_dequant(qtype, 1, tiles, N, K, t, out, out_ld);
            else tile_dequant(qtype, 0, tiles, N, K, t, out, out_ld);
        }
        return 0;
    }
#endif
    float *buf = malloc((size_t)K * sizeof(float) * (size_t)(nthreads > 0 ? nthreads : 1));
    if (!buf) return 2;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n * K > 8192)
    for (int64_t r = 0; r < n; r++) {
        float *w = buf + (int64_t)omp_me() * K;
        agentkv_qtile_row(qtype, tiles, K, rows ? rows[r] : r, w);
        for (int64_t k = 0; k < K; k++) store1(out, r * out_ld + k, w[k], bf);
    }
    free(buf);
    return 0;
}

/* ---- the exact product: x in fp32 against the weights dequantized in registers ------------------- */

/* x's rows [M <= 16] against one tile: sums over k in order, even blocks in one accumulator and odd
   ones in another */
INLINE void exact_generic(const int qtype, const uint8_t *tile, int64_t nb, const float *x, int64_t K, int64_t M,
                          float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < TILE_ROWS; i++) {
            float acc[2] = {0.f, 0.f};
            for (int64_t b = 0; b < nb; b++)
                for (int k = 0; k < QK; k++)
                    acc[b & 1] = fmaf(tile_weight(qtype, tile + b * tb, i, k), x[m * K + b * QK + k], acc[b & 1]);
            res[m][i] = acc[0] + acc[1];
        }
}

#if AGENTKV_TILES_FAST
#define EXACT_GROUP 8

INLINE void exact_avx512(const int qtype, const uint8_t *tile, int64_t nb, const float *x, int64_t K, int64_t M,
                         float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    /* x's rows EXACT_GROUP at a time: their two accumulators each stay in registers (16 rows' 32 did not:
       spilled, a prompt row cost twice its share), each column's weights made again for each group */
    for (int64_t m0 = 0; m0 < M; m0 += EXACT_GROUP) {
        const int64_t rows = M - m0 < EXACT_GROUP ? M - m0 : EXACT_GROUP;
        __m512 acc[2][EXACT_GROUP];
        for (int64_t m = 0; m < rows; m++) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * tb;
            if (m0 == 0) __builtin_prefetch(blk + 24 * tb, 0, 3);
            __m512 *a = acc[b & 1];
            for (int k = 0; k < QK; k++) {  /* 16 rows' weight k, then each row of x */
                const __m512 w = col_avx512(qtype, blk, k);
                for (int64_t m = 0; m < rows; m++)
                    a[m] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[(m0 + m) * K + b * QK + k]), a[m]);
            }
        }
        for (int64_t m = 0; m < rows; m++) _mm512_storeu_ps(res[m0 + m], _mm512_add_ps(acc[0][m], acc[1][m]));
    }
}
#endif

#if AGENTKV_TILES_AVX2
/* exact_avx512 in two halves of 8 rows */
INLINE void exact_avx2(const int qtype, const uint8_t *tile, int64_t nb, const float *x, int64_t K, int64_t M,
                       float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    for (int h = 0; h < 2; h++) {
        __m256 acc[2][MAX_M];
        for (int64_t m = 0; m < M; m++) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * tb;
            __m256 *a = acc[b & 1];
            for (int k = 0; k < QK; k++) {
                const __m256 w = col_avx2(qtype, blk, k, h);
                for (int64_t m = 0; m < M; m++)
                    a[m] = _mm256_fmadd_ps(w, _mm256_set1_ps(x[m * K + b * QK + k]), a[m]);
            }
        }
        for (int64_t m = 0; m < M; m++) _mm256_storeu_ps(res[m] + 8 * h, _mm256_add_ps(acc[0][m], acc[1][m]));
    }
}
#endif

/* x [M, K] (bf16 or fp32) @ W^T for a tiled W with x kept in fp32 (a prompt's rows: what the dequantized
   model computes, but the weights never leave registers), out [M, N] (+ bias) (+ residual), any M.
   Returns as qtile_linear. */
int agentkv_qtile_exact(int qtype, int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *tiles,
                        int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                        int nthreads, int generic) {
    if (!tiled_shape(qtype, K)) return 1;
    if (M < 1) return 2;
    float *xf = malloc((size_t)(M * K) * sizeof(float));
    if (!xf) return 2;
    const int64_t ntiles = (N + 15) / 16, nb = K / QK;
#pragma omp parallel num_threads(nthreads) if (ntiles * K * M > 65536)
    {
        const int64_t nt = omp_threads(), me = omp_me();
        for (int64_t m = me; m < M; m += nt)
            for (int64_t k = 0; k < K; k++) xf[m * K + k] = load1(x, m * x_ld + k, bf);
#pragma omp barrier
        float v[MAX_M][TILE_ROWS];
        for (int64_t t = ntiles * me / nt; t < ntiles * (me + 1) / nt; t++) {
            const uint8_t *tile = tiles + t * tile_bytes(qtype, K);
            const int valid = N - t * TILE_ROWS < TILE_ROWS ? (int)(N - t * TILE_ROWS) : TILE_ROWS;
            for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
                const int64_t rows = M - m0 < MAX_M ? M - m0 : MAX_M;
#if AGENTKV_TILES_FAST
#define BODY(Q) do { \
        if (!generic) exact_avx512(Q, tile, nb, xf + m0 * K, K, rows, v); \
        else exact_generic(Q, tile, nb, xf + m0 * K, K, rows, v); } while (0)
#elif AGENTKV_TILES_AVX2
#define BODY(Q) do { \
        if (!generic) exact_avx2(Q, tile, nb, xf + m0 * K, K, rows, v); \
        else exact_generic(Q, tile, nb, xf + m0 * K, K, rows, v); } while (0)
#else
#define BODY(Q) exact_generic(Q, tile, nb, xf + m0 * K, K, rows, v)
#endif
                if (is_kquant(qtype)) agentkv_ktile_exact_rows(qtype, tile, K / QK_K, xf + m0 * K, K, rows, v, generic);
                else if (is_float(qtype)) agentkv_ftile_rows(qtype, tile, nb, xf + m0 * K, NULL, K, rows, v, generic);
                else if (qtype == Q8_0) BODY(Q8_0);
                else if (qtype == Q4_0) BODY(Q4_0);
                else if (qtype == Q4_1) BODY(Q4_1);
                else if (qtype == Q5_0) BODY(Q5_0);
                else if (qtype == Q5_1) BODY(Q5_1);
                else BODY(IQ4_NL);
#undef BODY
                for (int64_t m = 0; m < rows; m++)
                    if (bf) tile_store(v[m], m0 + m, t * TILE_ROWS, valid, bias, res, r_ld, out, out_ld, 1);
                    else tile_store(v[m], m0 + m, t * TILE_ROWS, valid, bias, res, r_ld, out, out_ld, 0);
            }
        }
    }
    free(xf);
    return 0;
}

