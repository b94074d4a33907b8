/* A tiled W's weights back in fp32: a block's columns (what the exact product, cpu_tgemm.c, multiplies x
by) and whole rows read back (a row of the vocabulary, a long prompt's weight). Each column's 16 rows'
weights are made in a register from the tile's bytes: a block of 32 columns (cpu_tiles.c's layouts)
column by column, a K-quant's or IQ4_XS's super-block through cpu_ktiles.c's, F16 and BF16 through
cpu_tiles.h's; the plain-C body (tile_weight, agentkv_ktile_weights, ftile_weight) makes the same values. */

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
    if (is_lut4(qtype))
        q = _mm512_permutexvar_epi32(q, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)lut4_u8(qtype))));
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
    if (is_lut4(qtype)) {  /* (two tables of 8, the code's bit 3 choosing) */
        const __m256i lo8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)lut4_u8(qtype)));
        const __m256i hi8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lut4_u8(qtype) + 8)));
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
/* the columns of a block of 32 (Q8_0 .. IQ4_NL) in registers, stored */
INLINE void cols32(const int qtype, const uint8_t *blk, float *cols) {
#pragma GCC unroll 32
    for (int k = 0; k < QK; k++) {  /* (unrolled: each column's shifts and masks are constants) */
#if AGENTKV_TILES_FAST
        _mm512_storeu_ps(cols + TILE_ROWS * k, col_avx512(qtype, blk, k));
#elif AGENTKV_TILES_AVX2
        _mm256_storeu_ps(cols + TILE_ROWS * k, col_avx2(qtype, blk, k, 0));
        _mm256_storeu_ps(cols + TILE_ROWS * k + 8, col_avx2(qtype, blk, k, 1));
#endif
    }
}
#endif

void agentkv_tile_block_cols(int qtype, const uint8_t *blk, float *cols, int generic) {
#if AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2
    if (!generic) {
        if (is_kquant(qtype)) agentkv_ktile_cols(qtype, blk, (float(*)[TILE_ROWS])cols);
        else if (is_float(qtype))
            for (int k = 0; k < QK; k++) {
#if AGENTKV_TILES_FAST
                _mm512_storeu_ps(cols + TILE_ROWS * k, fcol_avx512(qtype, blk, k));
#else
                _mm256_storeu_ps(cols + TILE_ROWS * k, fcol_avx2(qtype, blk, k, 0));
                _mm256_storeu_ps(cols + TILE_ROWS * k + 8, fcol_avx2(qtype, blk, k, 1));
#endif
            }
        else if (qtype == Q8_0) cols32(Q8_0, blk, cols);  /* (each type's body specialized) */
        else if (qtype == Q4_0) cols32(Q4_0, blk, cols);
        else if (qtype == Q4_1) cols32(Q4_1, blk, cols);
        else if (qtype == Q5_0) cols32(Q5_0, blk, cols);
        else if (qtype == Q5_1) cols32(Q5_1, blk, cols);
        else if (qtype == IQ4_NL) cols32(IQ4_NL, blk, cols);
        else cols32(MXFP4, blk, cols);
        return;
    }
#endif
    (void)generic;
    if (is_kquant(qtype)) {
        float row[QK_K];
        for (int i = 0; i < TILE_ROWS; i++) {
            agentkv_ktile_weights(qtype, blk, i, row);
            for (int k = 0; k < QK_K; k++) cols[TILE_ROWS * k + i] = row[k];
        }
    } else
        for (int k = 0; k < QK; k++)
            for (int i = 0; i < TILE_ROWS; i++)
                cols[TILE_ROWS * k + i] =
                    is_float(qtype) ? ftile_weight(qtype, blk, i, k) : tile_weight(qtype, blk, i, k);
}

#if AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2
/* tile t of W (all its rows) into out's rows 16 t..: each block's columns made in registers, then written
   out row by row from L1 */
static void tile_dequant(const int qtype, const int bf, const uint8_t *tiles, int64_t N, int64_t K, int64_t t,
                         void *out, int64_t out_ld) {
    const int64_t bw = BLOCK_WEIGHTS[qtype], nb = K / bw, tb = tile_block_bytes(qtype);
    const int valid = N - t * TILE_ROWS < TILE_ROWS ? (int)(N - t * TILE_ROWS) : TILE_ROWS;
    float cols[QK_K][TILE_ROWS];
    for (int64_t b = 0; b < nb; b++) {
        agentkv_tile_block_cols(qtype, tiles + (t * nb + b) * tb, cols[0], 0);
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
