/* The tiled quantized linear (cpu_tiles.c) as the native decode step (cpu_step.c) calls it: one
thread's share of a matrix's tiles, x quantized once per normed input, rows dequantized from tiles. */

#ifndef AGENTKV_CPU_TILES_H
#define AGENTKV_CPU_TILES_H

#include "cpu_blocks.h"

#define TILE_ROWS 16 /* output rows interleaved in a tile: one 32-bit lane each of an AVX-512 register */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define AGENTKV_TILES_FAST 1 /* the AVX-512 VNNI bodies */
#define AGENTKV_TILES_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AGENTKV_TILES_FAST 0
#define AGENTKV_TILES_AVX2 1 /* the AVX2 bodies: each tile's rows as two halves of 8 lanes, maddubs for the dots */
#else
#define AGENTKV_TILES_FAST 0
#define AGENTKV_TILES_AVX2 0
#endif

/* x's rows quantized to int8 per block of 32 (scale amax / 127, as llama.cpp's Q8_0): q [M][K]; per
   block d (the scale), s (the integers' sum), ds (d * s) and s16 (the sum of its first 16 integers:
   Q6_K's scales change every 16 columns) [M][K / 32] */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *s;
    float *ds;
    int32_t *s16;
    int64_t K;
} QRows;

/* every cache line of the `bytes` at p asked for into L1 (a weight block ahead of the one computed) */
INLINE void prefetch_block(const uint8_t *p, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

/* row m, block b of x (32 fp32 values at v) into `x` */
INLINE void quantize_into(const float *v, const QRows *x, int64_t m, int64_t b) {
    const int64_t nb = x->K / QK, at = m * nb + b;
    int8_t *q = x->q + m * x->K + b * QK;
    quantize_block32(v, q, x->d + at, x->s + at, x->ds + at);
    int32_t s16 = 0;
    for (int i = 0; i < QK / 2; i++) s16 += q[i];
    x->s16[at] = s16;
}

/* row m, blocks [b0, b1) of x (fp32) into `x` */
INLINE void quantize_blocks(const float *v, const QRows *x, int64_t m, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) quantize_into(v + b * QK, x, m, b);
}

/* where in a tile's block (past its scales) row i keeps byte j of its row-major block's weights:
   the layout above, in one place for the packing, the reading back and the plain-C bodies */
INLINE int tile_pos(int i, int j) { return (j / 4) * 64 + 4 * i + j % 4; }

/* where a tile row's word of fifth bits (Q5_0, Q5_1, Q5_K: one uint32 a row of a block of 32) keeps column
   j's: byte e of the lane of nibble register c holds columns 4c + e (low nibble) and 16 + 4c + e (high),
   whose bits sit at 8e + c and 8e + 4 + c, so that a shift and a mask put them over the nibbles */
INLINE int q5_bit(int j) { return 8 * (j % 16 % 4) + j % 16 / 4 + 4 * (j >= 16); }

/* a row's 32 fifth bits (bit j: column j's) as q5_bit places them */
INLINE uint32_t q5_word(uint32_t qh) {
    uint32_t h = 0;
    for (int j = 0; j < QK; j++) h |= ((qh >> j) & 1u) << q5_bit(j);
    return h;
}

/* IQ4_NL's (and IQ4_XS's) values + 128, as unsigned bytes (a shuffle's table); MXFP4's the same way */
static const uint8_t IQ4_NL_U8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static const uint8_t MXFP4_U8[16] = {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116};
INLINE const uint8_t *lut4_u8(int qtype) { return qtype == MXFP4 ? MXFP4_U8 : IQ4_NL_U8; }

/* the result of one tile for x's M rows: out[m, 16 t + i] for i < valid, plus bias and residual */
INLINE void tile_store(const float *v, int64_t m, int64_t n0, int valid, const void *bias, const void *res,
                       int64_t r_ld, void *out, int64_t out_ld, const int bf) {
    for (int i = 0; i < valid; i++) {
        float y = v[i];
        if (bias) y += load1(bias, n0 + i, bf);
        if (res) y += load1(res, m * r_ld + n0 + i, bf);
        store1(out, m * out_ld + n0 + i, y, bf);
    }
}

INLINE int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if AGENTKV_TILES_FAST

/* the block's 16 rows' weights as 8 registers of unsigned bytes, u[g] holding columns 4g..4g+3 */
INLINE void unpack_avx512(const int qtype, const uint8_t *qs, __m512i *u) {
    if (qtype == Q8_0) {
        for (int g = 0; g < 8; g++) u[g] = _mm512_loadu_si512((const void *)(qs + 64 * g));
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        const __m512i r = _mm512_loadu_si512((const void *)(qs + 64 * c));
        u[c] = _mm512_and_si512(r, low);
        u[c + 4] = _mm512_and_si512(_mm512_srli_epi16(r, 4), low);
    }
}

/* the 16 rows' fifth bits (`h`: their words, q5_bit's places) over nibbles as unpack_avx512 leaves them */
INLINE void q5_high_avx512(const uint8_t *h, __m512i *u) {
    const __m512i hv = _mm512_loadu_si512((const void *)h), bit = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; c++) {  /* (8e + c and 8e + 4 + c to 8e + 4) */
        u[c] = _mm512_or_si512(u[c], _mm512_and_si512(_mm512_slli_epi32(hv, 4 - c), bit));
        u[c + 4] = _mm512_or_si512(u[c + 4], _mm512_and_si512(_mm512_srli_epi32(hv, c), bit));
    }
}

/* 4-bit table codes (nibbles as unpack_avx512 leaves them) as their values + 128 (`table`: lut4_u8's) */
INLINE void iq4_values_avx512(__m512i *u, const uint8_t *table) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table));
    for (int g = 0; g < 8; g++) u[g] = _mm512_shuffle_epi8(values, u[g]);
}

#endif

#if AGENTKV_TILES_AVX2
/* q5_high_avx512 for rows 8 h..8 h + 7 */
INLINE void q5_high_avx2(const uint8_t *h, int half, __m256i *u) {
    const __m256i hv = _mm256_loadu_si256((const __m256i *)(h + 32 * half)), bit = _mm256_set1_epi8(0x10);
    for (int c = 0; c < 4; c++) {
        u[c] = _mm256_or_si256(u[c], _mm256_and_si256(_mm256_slli_epi32(hv, 4 - c), bit));
        u[c + 4] = _mm256_or_si256(u[c + 4], _mm256_and_si256(_mm256_srli_epi32(hv, c), bit));
    }
}

/* 4-bit table codes as their signed values (w) and those values' magnitudes (u), as the AVX2 bodies read
   Q8_0 (`table`: lut4_u8's) */
INLINE void iq4_values_avx2(__m256i *u, __m256i *w, const uint8_t *table) {
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int g = 0; g < 8; g++) {
        w[g] = _mm256_xor_si256(_mm256_shuffle_epi8(values, u[g]), flip);
        u[g] = _mm256_abs_epi8(w[g]);
    }
}

/* unsigned bytes times signed ones, each 4 summed into an int32 lane (a pair's sum stays below 2^15:
   at most 2 x 63 x 127 here) */
INLINE __m256i madd_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* rows 8 h..8 h + 7 of a block of 32 columns in Q4_0's tile layout (`qs`, 256 bytes; with Q6_K's high
   pairs `high` over them) as 8 registers of unsigned bytes: u[c] columns 4 c.., u[c + 4] 16 + 4 c.. */
INLINE void nib_unpack_avx2(const uint8_t *qs, const uint8_t *high, int h, __m256i *u) {
    const __m256i low = _mm256_set1_epi8(0x0f), pair = _mm256_set1_epi8(0x30);
    for (int c = 0; c < 4; c++) {
        const __m256i r = _mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32 * h));
        u[c] = _mm256_and_si256(r, low), u[c + 4] = _mm256_and_si256(_mm256_srli_epi16(r, 4), low);
        if (high) { /* the pairs at bits 0 / 2 (c < 2) or 4 / 6, moved to bits 4 and 5 */
            const __m256i p = _mm256_loadu_si256((const __m256i *)(high + 64 * (c % 2) + 32 * h));
            const __m256i pl = c < 2 ? _mm256_slli_epi16(p, 4) : p;
            const __m256i ph = c < 2 ? _mm256_slli_epi16(p, 2) : _mm256_srli_epi16(p, 2);
            u[c] = _mm256_or_si256(u[c], _mm256_and_si256(pl, pair));
            u[c + 4] = _mm256_or_si256(u[c + 4], _mm256_and_si256(ph, pair));
        }
    }
}

/* 4 registers of unsigned bytes (columns 4 c..4 c + 3 of 8 rows) against x's 16 bytes: each row's dot */
INLINE __m256i dots4_avx2(const __m256i *u, const int8_t *xb) {
    __m256i a = madd_u8s8(u[0], _mm256_set1_epi32(load_i32(xb)));
    __m256i b = madd_u8s8(u[1], _mm256_set1_epi32(load_i32(xb + 4)));
    a = _mm256_add_epi32(a, madd_u8s8(u[2], _mm256_set1_epi32(load_i32(xb + 8))));
    b = _mm256_add_epi32(b, madd_u8s8(u[3], _mm256_set1_epi32(load_i32(xb + 12))));
    return _mm256_add_epi32(a, b);
}
#endif

/* room for x's M rows of K quantized (agentkv_qrows_free frees it, also after a failure: nonzero) */
int agentkv_qrows_alloc(QRows *q, int64_t M, int64_t K);
/* row m of x (bf16 or fp32, row stride x_ld) quantized into q's row m */
void agentkv_quantize_row(const void *x, int64_t x_ld, int64_t m, int bf, const QRows *q);
void agentkv_qrows_free(QRows *q);

/* bytes of one tile's block: 32 columns of TILE_ROWS rows (the same bytes as their blocks), or of a
   K-quant or IQ4_XS, its super-block of 256 columns (Q4_K's 6-bit scales and minimums one byte each: 148
   bytes a row against the file's 144; Q5_K 180 against 176; IQ4_XS 138 against 136; Q6_K's 210 as in the
   file) */
INLINE int64_t tile_block_bytes(int qtype) {
    if (qtype == Q4_K || qtype == Q5_K) return qtype == Q4_K ? 2368 : 2880;
    return qtype == Q6_K ? 3360 : qtype == IQ4_XS ? 2208 : (int64_t)TILE_ROWS * BLOCK_BYTES[qtype];
}

/* tiles [t0, t1) of W (N rows, K columns) times x's M rows: out[m, n] (+ bias[n]) (+ res[m, n]) */
void agentkv_qtile_range(int qtype, const uint8_t *tiles, int64_t N, int64_t K, const QRows *x, int64_t M,
                         int64_t t0, int64_t t1, const void *bias, const void *res, int64_t r_ld, void *out,
                         int64_t out_ld, int bf, int generic);

/* row n of a tiled W as fp32 [K] */
void agentkv_qtile_row(int qtype, const uint8_t *tiles, int64_t K, int64_t n, float *out);

/* ---- K-quants (cpu_ktiles.c): tiles of super-blocks of 256 columns ---- */

INLINE int is_kquant(int qtype) { return qtype == Q4_K || qtype == Q6_K || qtype == Q5_K || qtype == IQ4_XS; }

/* ---- F16 and BF16 (cpu_ftiles.c): a tile's block of 32 columns, column k's 16 values at 32 k ---- */

INLINE int is_float(int qtype) { return qtype == F16 || qtype == BF16; }

/* weight k of tile row i in a float tile's block */
INLINE float ftile_weight(int qtype, const uint8_t *blk, int i, int k) {
    const uint8_t *p = blk + 32 * k + 2 * i;
    return qtype == F16 ? half_to_f32(p) : bf16_bytes_to_f32(p);
}

#if AGENTKV_TILES_FAST
/* column k of a float tile's block: its 16 rows' values (ftile_weight's) */
INLINE __m512 fcol_avx512(const int qtype, const uint8_t *blk, int k) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 32 * k));
    if (qtype == F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
#endif

#if AGENTKV_TILES_AVX2
/* fcol_avx512 for rows 8 h..8 h + 7 */
INLINE __m256 fcol_avx2(const int qtype, const uint8_t *blk, int k, int h) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 32 * k + 16 * h));
    if (qtype == F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
#endif

/* row i of a float tile's block from the row's 32 values `src` */
void agentkv_ftile_pack_row(int qtype, const uint8_t *src, int i, uint8_t *dst);

/* one float tile (nb blocks) against x's M <= 16 rows: fp32 rows `xf` [M, K] (the exact product) or,
   where xf is NULL, the int8 rows `x` */
void agentkv_ftile_rows(int qtype, const uint8_t *tile, int64_t nb, const float *xf, const QRows *x, int64_t K,
                        int64_t M, float res[MAX_M][TILE_ROWS], int generic);

/* row i of a tile's super-block (dst, zeroed before its first row) from the row's super-block `src` */
void agentkv_ktile_pack_row(int qtype, const uint8_t *src, int i, uint8_t *dst);

/* row i of a tile's super-block as its 256 fp32 weights */
void agentkv_ktile_weights(int qtype, const uint8_t *sblk, int i, float *w);

#if AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2
/* a tile's super-block column by column: cols[k] its 16 rows' weights k, agentkv_ktile_weights' values */
void agentkv_ktile_cols(int qtype, const uint8_t *sblk, float cols[QK_K][TILE_ROWS]);
#endif

/* one tile (nsb super-blocks) against x's M <= 16 int8 rows */
void agentkv_ktile_rows(int qtype, const uint8_t *tile, int64_t nsb, const QRows *x, int64_t M,
                        float res[MAX_M][TILE_ROWS], int generic);

/* one block of a tile (32 columns; a K-quant's super-block: 256) as fp32 columns: cols[16 k + i] row i's
   weight k, the values every body's dequantization makes (`generic`: the plain-C one; the same bits) */
void agentkv_tile_block_cols(int qtype, const uint8_t *blk, float *cols, int generic);

/* x . w over K in fp32, summed in 32 lanes (lane i the columns i mod 32) then across them: the exact
   re-score of a logit */
float agentkv_exact_dot(const float *x, const float *w, int64_t K);

/* the exact logit of row n of a tiled W for x [K] (fp32): the row dequantized into w [K], dotted as above */
float agentkv_exact_logit(int qtype, const uint8_t *tiles, int64_t K, const float *x, int64_t n, float *w);

/* The `R` largest of v[n0, n1) (ties: the lower index first) merged into (idx, val)[*count], kept in
   descending order, at most R entries. */
void agentkv_top_merge(const float *v, int64_t n0, int64_t n1, int R, int64_t *idx, float *val, int *count);

/* ---- a tile's layout, shared by the products (cpu_tiles.c) and the columns read back (cpu_texact.c) ---- */

INLINE int tiled_type(int qtype) { return qtype >= 0 && qtype < NQTYPES; }
/* whether a tiled W of K columns can be: its type tiled, K whole blocks */
INLINE int tiled_shape(int qtype, int64_t K) { return tiled_type(qtype) && K % BLOCK_WEIGHTS[qtype] == 0; }
/* bytes of one tile of W (16 rows of K columns) */
INLINE int64_t tile_bytes(int qtype, int64_t K) { return K / BLOCK_WEIGHTS[qtype] * tile_block_bytes(qtype); }
INLINE int64_t quant_offset(int qtype) {
    return qtype == Q8_0 || is_lut4(qtype) ? 128 : qtype == Q4_0 ? 8 : qtype == Q5_0 ? 16 : 0;
}
INLINE int has_min(int qtype) { return qtype == Q4_1 || qtype == Q5_1; } /* a weight is d q + m */
INLINE int high_at(int qtype) { return qtype == Q5_0 ? 32 : qtype == Q5_1 ? 64 : 0; } /* Q5's fifth bits */
/* the scales (and Q5's fifth bits) before a tile block's weights */
INLINE int weights_at(int qtype) { return high_at(qtype) ? high_at(qtype) + 64 : has_min(qtype) ? 64 : 32; }

/* column j (0..31) of tile row i in a block of 32 as the unsigned integer the dot products read
   (Q8_0's and IQ4_NL's value + 128; Q5's with its fifth bit) */
INLINE int tile_u(const int qtype, const uint8_t *blk, int i, int j) {
    const uint8_t *qs = blk + weights_at(qtype);
    if (qtype == Q8_0) return qs[tile_pos(i, j)];
    const int v = qs[tile_pos(i, j % 16)], q = j < 16 ? v & 15 : v >> 4;
    if (is_lut4(qtype)) return lut4_u8(qtype)[q];
    if (high_at(qtype)) return q | (int)((load_u32(blk + high_at(qtype) + 4 * i) >> q5_bit(j)) & 1) << 4;
    return q;
}

/* weight k of tile row i in its block (dequantized as dequant_block does, Q4_1's and Q5_1's with one
   fused multiply-add): the plain-C form of col_avx512's */
INLINE float tile_weight(const int qtype, const uint8_t *blk, int i, int k) {
    const float d = half_to_f32(blk + 2 * i);
    const int u = tile_u(qtype, blk, i, k);
    if (has_min(qtype)) return fmaf(d, (float)u, half_to_f32(blk + 32 + 2 * i));
    return d * (float)(u - (int)quant_offset(qtype));
}

#endif
