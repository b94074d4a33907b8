/* GGUF's F16 and BF16 matrices in tiles of 16 rows, as cpu_tiles.c keeps the quantized ones, so that a
file's float matrices are multiplied in its own 2-byte values (and the native step takes them) instead
of being widened to fp32 at load.

A tile's block (32 columns of TILE_ROWS rows, 1024 bytes): column k's 16 rows' values at 32 k, so that
one load (and one conversion: F16's vcvtph2ps, BF16's widening shift) makes a column's 16 weights in a
register. Rows past N are zeros. Each output is sum over k of w[k] x[k] in fp32, even blocks of 32 in
one accumulator and odd ones in another (as the quantized tiles sum), x being:
  - a written token's row as the int8 blocks every tiled product reads (QRows: d_x q_x[k], one fp32
    multiply: the same x the quantized types see, so a token's numbers never depend on its pass);
  - a prompt's row in fp32 (the exact product).
The plain-C bodies make the AVX-512 and AVX2 ones' fp32 operations in their order: the same bits. */

#include "cpu_tiles.h"

void agentkv_ftile_pack_row(int qtype, const uint8_t *src, int i, uint8_t *dst) {
    (void)qtype;
    for (int k = 0; k < QK; k++) memcpy(dst + 32 * k + 2 * i, src + 2 * k, 2);
}

/* ---- the bodies: x's rows [M <= 16] against one tile (`xf` fp32 rows, or QRows' int8 ones) ---------- */

/* x[m][k] of block b: the fp32 row's, or the int8 row's value d q */
INLINE float fx(const float *xf, const QRows *x, int64_t K, int64_t m, int64_t b, int k) {
    if (xf) return xf[m * K + b * QK + k];
    return x->d[m * (x->K / QK) + b] * (float)x->q[m * x->K + b * QK + k];
}

static void ftile_generic(const int qtype, const uint8_t *tile, int64_t nb, const float *xf, const QRows *x,
                          int64_t K, int64_t M, float res[MAX_M][TILE_ROWS]) {
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < TILE_ROWS; i++) {
            float acc[2] = {0.f, 0.f};
            for (int64_t b = 0; b < nb; b++)
                for (int k = 0; k < QK; k++)
                    acc[b & 1] = fmaf(ftile_weight(qtype, tile + b * TILE_ROWS * 64, i, k), fx(xf, x, K, m, b, k),
                                      acc[b & 1]);
            res[m][i] = acc[0] + acc[1];
        }
}

#if AGENTKV_TILES_FAST
/* x's rows 8 at a time (their two accumulators stay in registers), each column loaded again per group */
static void ftile_avx512(const int qtype, const uint8_t *tile, int64_t nb, const float *xf, const QRows *x,
                         int64_t K, int64_t M, float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = TILE_ROWS * 64;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const int64_t rows = M - m0 < 8 ? M - m0 : 8;
        __m512 acc[2][8];
        for (int64_t m = 0; m < rows; m++) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * tb;
            if (m0 == 0) __builtin_prefetch(blk + 8 * tb, 0, 3);
            __m512 *a = acc[b & 1];
            for (int k = 0; k < QK; k++) {
                const __m512 w = fcol_avx512(qtype, blk, k);
                for (int64_t m = 0; m < rows; m++)
                    a[m] = _mm512_fmadd_ps(w, _mm512_set1_ps(fx(xf, x, K, m0 + m, b, k)), a[m]);
            }
        }
        for (int64_t m = 0; m < rows; m++) _mm512_storeu_ps(res[m0 + m], _mm512_add_ps(acc[0][m], acc[1][m]));
    }
}
#endif

#if AGENTKV_TILES_AVX2
/* ftile_avx512 in two halves of 8 rows */
static void ftile_avx2(const int qtype, const uint8_t *tile, int64_t nb, const float *xf, const QRows *x, int64_t K,
                       int64_t M, float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = TILE_ROWS * 64;
    for (int h = 0; h < 2; h++)
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            const int64_t rows = M - m0 < 8 ? M - m0 : 8;
            __m256 acc[2][8];
            for (int64_t m = 0; m < rows; m++) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = tile + b * tb;
                __m256 *a = acc[b & 1];
                for (int k = 0; k < QK; k++) {
                    const __m256 w = fcol_avx2(qtype, blk, k, h);
                    for (int64_t m = 0; m < rows; m++)
                        a[m] = _mm256_fmadd_ps(w, _mm256_set1_ps(fx(xf, x, K, m0 + m, b, k)), a[m]);
                }
            }
            for (int64_t m = 0; m < rows; m++)
                _mm256_storeu_ps(res[m0 + m] + 8 * h, _mm256_add_ps(acc[0][m], acc[1][m]));
        }
}
#endif

void agentkv_ftile_rows(int qtype, const uint8_t *tile, int64_t nb, const float *xf, const QRows *x, int64_t K,
                        int64_t M, float res[MAX_M][TILE_ROWS], int generic) {
#if AGENTKV_TILES_FAST
    if (!generic) {
        ftile_avx512(qtype, tile, nb, xf, x, K, M, res);
        return;
    }
#elif AGENTKV_TILES_AVX2
    if (!generic) {
        ftile_avx2(qtype, tile, nb, xf, x, K, M, res);
        return;
    }
#endif
    ftile_generic(qtype, tile, nb, xf, x, K, M, res);
    (void)generic;
}
