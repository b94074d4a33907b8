/* The tiled quantized linear (cpu_tiles.c) as the native decode step (cpu_step.c) calls it: one
thread's share of a matrix's tiles, x quantized once per normed input, rows dequantized from tiles. */

#ifndef AGENTKV_CPU_TILES_H
#define AGENTKV_CPU_TILES_H

#include "cpu_blocks.h"

#define TILE_ROWS 16 /* output rows interleaved in a tile: one 32-bit lane each of an AVX-512 register */

/* x's rows quantized to int8 per block of 32 (scale amax / 127, as llama.cpp's Q8_0): q [M][K]; per
   block d (the scale), s (the integers' sum) and ds (d * s) [M][K / 32] */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *s;
    float *ds;
    int64_t K;
} QRows;

/* row m, blocks [b0, b1) of x (fp32) into `x` */
INLINE void quantize_blocks(const float *v, const QRows *x, int64_t m, int64_t b0, int64_t b1) {
    const int64_t nb = x->K / QK;
    for (int64_t b = b0; b < b1; b++)
        quantize_block32(v + b * QK, x->q + m * x->K + b * QK, x->d + m * nb + b, x->s + m * nb + b,
                         x->ds + m * nb + b);
}

/* room for x's M rows of K quantized (agentkv_qrows_free frees it, also after a failure: nonzero) */
int agentkv_qrows_alloc(QRows *q, int64_t M, int64_t K);
void agentkv_qrows_free(QRows *q);

/* bytes of one tile's block of 32 columns (TILE_ROWS rows of the type's blocks: the same bytes) */
INLINE int64_t tile_block_bytes(int qtype) { return (int64_t)TILE_ROWS * BLOCK_BYTES[qtype]; }

/* tiles [t0, t1) of W (N rows, K columns) times x's M rows: out[m, n] (+ bias[n]) (+ res[m, n]) */
void agentkv_qtile_range(int qtype, const uint8_t *tiles, int64_t N, int64_t K, const QRows *x, int64_t M,
                         int64_t t0, int64_t t1, const void *bias, const void *res, int64_t r_ld, void *out,
                         int64_t out_ld, int bf, int generic);

/* row n of a tiled W as fp32 [K] */
void agentkv_qtile_row(int qtype, const uint8_t *tiles, int64_t K, int64_t n, float *out);

/* x . w over K in fp32, summed in 32 lanes (lane i the columns i mod 32) then across them: the exact
   re-score of a logit */
float agentkv_exact_dot(const float *x, const float *w, int64_t K);

/* the exact logit of row n of a tiled W for x [K] (fp32): the row dequantized into w [K], dotted as above */
float agentkv_exact_logit(int qtype, const uint8_t *tiles, int64_t K, const float *x, int64_t n, float *w);

/* The `R` largest of v[n0, n1) (ties: the lower index first) merged into (idx, val)[*count], kept in
   descending order, at most R entries. */
void agentkv_top_merge(const float *v, int64_t n0, int64_t n1, int R, int64_t *idx, float *val, int *count);

#endif
