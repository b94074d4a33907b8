/* GGUF's K-quants (Q4_K, Q5_K, Q6_K) and IQ4_XS in tiles of 16 rows, as cpu_tiles.c keeps the blocks of
32: a tile holds super-blocks of 256 columns of its 16 rows, each sub-block of 32 columns in Q4_0's tile layout (so the
same unpacking and VNNI dot products serve) and the scales as vectors of the 16 rows. A Q4_K_M file
(most of its matrices Q4_K, some Q6_K) then streams its weights as the tiled types do.

A tile's super-block (row i of the tile = output row 16 t + i):
  Q4_K (2368 bytes): fp16 d[16], fp16 dmin[16]; each sub-block j's 6-bit scale sc[j][16] and minimum
                     mn[j][16], a byte each (148 bytes a row against the file's 144: unpacked once at
                     load instead of in every step); then each sub-block's nibbles as a Q4_0 tile block
                     (256 bytes: row i's byte l at tile_pos(i, l) holds column l low, 16 + l high)
  Q6_K (3360 bytes): fp16 d[16], int8 sc[g][16] for the 16 groups of 16 columns; then each sub-block's
                     low 4 bits as a Q4_0 tile block (256 bytes) and its high 2 bits (128 bytes, two
                     registers: register h's byte 4 i + e holds from bit 0 the pairs of columns 4 h + e,
                     16 + 4 h + e, 4 (h + 2) + e and 16 + 4 (h + 2) + e, where a 16-bit shift and a mask
                     put them over the low nibbles)
  Q5_K (2880 bytes): Q4_K's, then each sub-block's fifth bits (64 bytes: a uint32 a row, as cpu_tiles.h's
                     q5_bit places them; 180 bytes a row against the file's 176)
  IQ4_XS (2208 bytes): fp16 d[16], each sub-block's 6-bit scale less 32 an int8 (sc[8][16]); then each
                     sub-block's codes as a Q4_0 tile block (138 bytes a row against the file's 136)
A weight is d sc q - dmin mn (Q4_K, q 0..15; Q5_K, q 0..31), d sc (q - 32) (Q6_K, q 0..63) or
(d sc) v[q] (IQ4_XS, v IQ4_NL's table), as llama.cpp's dequantize_row_* compute it; rows read back from
tiles are those fp32 values.

With x quantized to int8 blocks of 32 (QRows), sub-block j of a Q4_K row adds
  (d sc_j d_x) dot - (dmin mn_j) d_x s_x                                  (Q4_1's form)
(Q5_K's the same), of a Q6_K row
  (d d_x) (sc_a (dot_a - 32 s_a) + sc_b (dot_b - 32 s_b))                 (integer within: < 5e7)
over its halves a and b of 16 columns, and of an IQ4_XS row (d sc_j d_x) (dot - 128 s_x), its codes
shuffled into the table's values + 128 as cpu_tiles.c's IQ4_NL. Even and odd sub-blocks sum in two
accumulators, as the tiled types' blocks do. The plain-C bodies make the AVX-512 (and AVX2: two halves
of 8 rows) ones' fp32 operations in their order: the same bits. The exact product (x in fp32,
cpu_tgemm.c) takes a super-block's columns from agentkv_ktile_cols: each column's weights made in a
register (AVX-512, AVX2), the values agentkv_ktile_weights computes row by row (plain C). */

#include "cpu_tiles.h"

#define K4_DMIN 32
#define K4_SC 64
#define K4_MN 192
#define K4_Q 320
#define K6_SC 32
#define K6_Q 288
#define K6_SUB 384 /* a Q6_K sub-block in a tile: 256 bytes of low nibbles, 128 of high pairs */
#define K5_H 2368  /* Q5_K: Q4_K's tile, then 64 bytes of fifth bits a sub-block */
#define KX_SC 32
#define KX_Q 160

INLINE int k4_like(int qtype) { return qtype == Q4_K || qtype == Q5_K; } /* d sc q - dmin mn */

INLINE uint8_t *ksub(int qtype, const uint8_t *sblk, int j) {
    return (uint8_t *)sblk + (k4_like(qtype) ? K4_Q + 256 * j : qtype == IQ4_XS ? KX_Q + 256 * j : K6_Q + K6_SUB * j);
}

/* Q5_K's sub-block j's fifth bits (16 rows' words) */
INLINE const uint8_t *k5_high(const uint8_t *sblk, int j) { return sblk + K5_H + 64 * j; }

/* where column c (0..31) of row i keeps its high pair in a Q6_K sub-block's last 128 bytes */
INLINE int k6_high_byte(int i, int c) { return 64 * ((c % 16 / 4) % 2) + 4 * i + c % 4; }
INLINE int k6_high_shift(int c) { return 4 * ((c % 16 / 4) / 2) + 2 * (c >= 16); }

/* the unsigned integer of column c (0..31) of row i in a tile's sub-block j (IQ4_XS: its value + 128) */
INLINE int ksub_q(int qtype, const uint8_t *sblk, int j, int i, int c) {
    const uint8_t *qs = ksub(qtype, sblk, j);
    const int v = qs[tile_pos(i, c % 16)];
    const int q = c < 16 ? v & 15 : v >> 4;
    if (qtype == Q4_K) return q;
    if (qtype == IQ4_XS) return IQ4_NL_U8[q];
    if (qtype == Q5_K) return q | (int)((load_u32(k5_high(sblk, j) + 4 * i) >> q5_bit(c)) & 1) << 4;
    return q | ((qs[256 + k6_high_byte(i, c)] >> k6_high_shift(c)) & 3) << 4;
}

void agentkv_ktile_pack_row(int qtype, const uint8_t *src, int i, uint8_t *dst) {
    uint8_t q[QK_K]; /* the row's unsigned integers in column order (IQ4_XS: its codes) */
    if (k4_like(qtype)) {
        memcpy(dst + 2 * i, src, 2);
        memcpy(dst + K4_DMIN + 2 * i, src + 2, 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(j, src + 4, &sc, &mn);
            dst[K4_SC + 16 * j + i] = (uint8_t)sc, dst[K4_MN + 16 * j + i] = (uint8_t)mn;
        }
        const uint8_t *ql = src + (qtype == Q5_K ? 48 : 16);
        for (int c = 0; c < 4; c++) /* each 32 bytes: 32 weights low, the next 32 high */
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = ql[32 * c + l] & 15;
                q[64 * c + 32 + l] = ql[32 * c + l] >> 4;
            }
        if (qtype == Q5_K)  /* column l of sub-block j: bit j of qh[l] */
            for (int j = 0; j < 8; j++) {
                uint32_t qh = 0;
                for (int l = 0; l < 32; l++) qh |= (uint32_t)((src[16 + l] >> j) & 1) << l;
                const uint32_t h = q5_word(qh);
                memcpy(dst + K5_H + 64 * j + 4 * i, &h, 4);
            }
    } else if (qtype == IQ4_XS) {
        memcpy(dst + 2 * i, src, 2);
        for (int j = 0; j < 8; j++) dst[KX_SC + 16 * j + i] = (uint8_t)(int8_t)iq4xs_scale(src, j);
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 16; l++) {
                q[32 * j + l] = src[8 + 16 * j + l] & 15;
                q[32 * j + 16 + l] = src[8 + 16 * j + l] >> 4;
            }
    } else {
        memcpy(dst + 2 * i, src + 208, 2);
        for (int g = 0; g < 16; g++) dst[K6_SC + 16 * g + i] = src[192 + g];
        q6k_integers(src, q);
    }
    for (int j = 0; j < 8; j++) {
        uint8_t *qs = ksub(qtype, dst, j);
        const uint8_t *w = q + 32 * j;
        for (int l = 0; l < 16; l++) qs[tile_pos(i, l)] = (uint8_t)((w[l] & 15) | (w[16 + l] & 15) << 4);
        if (qtype == Q6_K)
            for (int c = 0; c < 32; c++) qs[256 + k6_high_byte(i, c)] |= (uint8_t)((w[c] >> 4) << k6_high_shift(c));
    }
}

void agentkv_ktile_weights(int qtype, const uint8_t *sblk, int i, float *w) {
    const float d = half_to_f32(sblk + 2 * i);
    for (int j = 0; j < 8; j++) {
        if (k4_like(qtype)) {
            const float d1 = d * (float)sblk[K4_SC + 16 * j + i];
            const float c1 = half_to_f32(sblk + K4_DMIN + 2 * i) * (float)sblk[K4_MN + 16 * j + i];
            for (int c = 0; c < QK; c++) w[QK * j + c] = d1 * (float)ksub_q(qtype, sblk, j, i, c) - c1;
        } else if (qtype == IQ4_XS) {
            const float dl = d * (float)(int8_t)sblk[KX_SC + 16 * j + i];
            for (int c = 0; c < QK; c++) w[QK * j + c] = dl * (float)(ksub_q(IQ4_XS, sblk, j, i, c) - 128);
        } else {
            for (int c = 0; c < QK; c++) {
                const float s = d * (float)(int8_t)sblk[K6_SC + 16 * (2 * j + c / 16) + i];
                w[QK * j + c] = s * (float)(ksub_q(Q6_K, sblk, j, i, c) - 32);
            }
        }
    }
}

/* ---- int8 rows ---------------------------------------------------------------------------------------- */

/* sub-block j (x's block b) of row i for x's row m: the plain-C form of ksub_avx512 */
INLINE float ksub_generic(const int qtype, const uint8_t *sblk, int j, int i, const QRows *x, int64_t m, int64_t b,
                          float acc) {
    const int64_t at = m * (x->K / QK) + b;
    const int8_t *xb = x->q + m * x->K + b * QK;
    int32_t dot[2] = {0, 0};
    for (int c = 0; c < QK; c++) dot[c >= 16] += ksub_q(qtype, sblk, j, i, c) * xb[c];
    const float d = half_to_f32(sblk + 2 * i);
    if (qtype == IQ4_XS) {
        const float dv = d * (float)(int8_t)sblk[KX_SC + 16 * j + i];
        return fmaf(dv * x->d[at], (float)(dot[0] + dot[1] - 128 * x->s[at]), acc);
    }
    if (k4_like(qtype)) {
        const float dv = d * (float)sblk[K4_SC + 16 * j + i];
        const float mv = -(half_to_f32(sblk + K4_DMIN + 2 * i) * (float)sblk[K4_MN + 16 * j + i]);
        acc = fmaf(dv * x->d[at], (float)(dot[0] + dot[1]), acc);
        return fmaf(mv, x->ds[at], acc);
    }
    const int32_t sa = x->s16[at], sb = x->s[at] - sa;
    const int32_t sum = (int8_t)sblk[K6_SC + 32 * j + i] * (dot[0] - 32 * sa) +
                        (int8_t)sblk[K6_SC + 32 * j + 16 + i] * (dot[1] - 32 * sb);
    return fmaf(d * x->d[at], (float)sum, acc);
}

static void ktile_generic(const int qtype, const uint8_t *tile, int64_t nsb, const QRows *x, int64_t M,
                          float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < TILE_ROWS; i++) {
            float a[2] = {0.f, 0.f};
            for (int64_t s = 0; s < nsb; s++)
                for (int j = 0; j < 8; j++)
                    a[j & 1] = ksub_generic(qtype, tile + s * tb, j, i, x, m, 8 * s + j, a[j & 1]);
            res[m][i] = a[0] + a[1];
        }
}

/* the super-block 3 ahead of sblk (tb bytes each, as the tiled types' 24 blocks), an eighth of its lines
   while sub-block j is computed */
INLINE void prefetch_ahead(const uint8_t *sblk, int64_t tb, int j) {
    prefetch_block(sblk + 3 * tb + j * tb / 8, (j + 1) * tb / 8 - j * tb / 8);
}

#if AGENTKV_TILES_FAST
/* the 16 rows' high pairs of a Q6_K sub-block over its low nibbles (u as unpack_avx512 leaves them) */
INLINE void k6_high_avx512(const uint8_t *qs, __m512i *u) {
    const __m512i h[2] = {_mm512_loadu_si512((const void *)(qs + 256)), _mm512_loadu_si512((const void *)(qs + 320))};
    const __m512i pair = _mm512_set1_epi8(0x30);
    for (int c = 0; c < 4; c++) { /* the pairs at bits 0 / 2 (c < 2) or 4 / 6, moved to bits 4 and 5 */
        const __m512i r = h[c % 2];
        const __m512i lo = c < 2 ? _mm512_slli_epi16(r, 4) : r;
        const __m512i hi = c < 2 ? _mm512_slli_epi16(r, 2) : _mm512_srli_epi16(r, 2);
        u[c] = _mm512_or_si512(u[c], _mm512_and_si512(lo, pair));
        u[c + 4] = _mm512_or_si512(u[c + 4], _mm512_and_si512(hi, pair));
    }
}

INLINE __m512i dots4(const __m512i *u, const int8_t *xb) {
    const __m512i z = _mm512_setzero_si512();
    __m512i a = _mm512_dpbusd_epi32(z, u[0], _mm512_set1_epi32(load_i32(xb)));
    __m512i b = _mm512_dpbusd_epi32(z, u[1], _mm512_set1_epi32(load_i32(xb + 4)));
    a = _mm512_dpbusd_epi32(a, u[2], _mm512_set1_epi32(load_i32(xb + 8)));
    b = _mm512_dpbusd_epi32(b, u[3], _mm512_set1_epi32(load_i32(xb + 12)));
    return _mm512_add_epi32(a, b);
}

static void ktile_avx512(const int qtype, const uint8_t *tile, int64_t nsb, const QRows *x, int64_t M,
                         float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype), nb = x->K / QK;
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 acc[2][MAX_M];
    for (int64_t m = 0; m < M; m++) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sblk = tile + s * tb;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sblk));
        const __m512 dmin = k4_like(qtype) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sblk + K4_DMIN)))
                                           : _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = ksub(qtype, sblk, j);
            prefetch_ahead(sblk, tb, j);
            __m512i u[8];
            unpack_avx512(Q4_0, qs, u);
            if (qtype == Q5_K) q5_high_avx512(k5_high(sblk, j), u);
            const int64_t b = 8 * s + j;
            __m512 *a = acc[j & 1];
            if (qtype == IQ4_XS) {
                iq4_values_avx512(u, IQ4_NL_U8);
                const __m128i scb = _mm_loadu_si128((const __m128i *)(sblk + KX_SC + 16 * j));
                const __m512 dj = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scb)));
                for (int64_t m = 0; m < M; m++) {
                    const int8_t *xb = x->q + m * x->K + b * QK;
                    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(dots4(u, xb), dots4(u + 4, xb + 16)),
                                                         _mm512_set1_epi32(128 * x->s[m * nb + b]));
                    const __m512 dd = _mm512_mul_ps(dj, _mm512_set1_ps(x->d[m * nb + b]));
                    a[m] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(dot), a[m]);
                }
            } else if (k4_like(qtype)) {
                const __m128i scb = _mm_loadu_si128((const __m128i *)(sblk + K4_SC + 16 * j));
                const __m128i mnb = _mm_loadu_si128((const __m128i *)(sblk + K4_MN + 16 * j));
                const __m512 dj = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(scb)));
                const __m512 mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mnb)));
                const __m512 mj = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(mn), sign));
                for (int64_t m = 0; m < M; m++) {
                    const int8_t *xb = x->q + m * x->K + b * QK;
                    const __m512i dot = _mm512_add_epi32(dots4(u, xb), dots4(u + 4, xb + 16));
                    const __m512 dd = _mm512_mul_ps(dj, _mm512_set1_ps(x->d[m * nb + b]));
                    a[m] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(dot), a[m]);
                    a[m] = _mm512_fmadd_ps(mj, _mm512_set1_ps(x->ds[m * nb + b]), a[m]);
                }
            } else {
                k6_high_avx512(qs, u);
                const __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sblk + K6_SC + 32 * j)));
                const __m512i sb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sblk + K6_SC + 32 * j + 16)));
                for (int64_t m = 0; m < M; m++) {
                    const int8_t *xb = x->q + m * x->K + b * QK;
                    const int32_t xa = x->s16[m * nb + b], xs = x->s[m * nb + b] - xa;
                    const __m512i da = _mm512_sub_epi32(dots4(u, xb), _mm512_set1_epi32(32 * xa));
                    const __m512i db = _mm512_sub_epi32(dots4(u + 4, xb + 16), _mm512_set1_epi32(32 * xs));
                    const __m512i sum = _mm512_add_epi32(_mm512_mullo_epi32(sa, da), _mm512_mullo_epi32(sb, db));
                    const __m512 dd = _mm512_mul_ps(dv, _mm512_set1_ps(x->d[m * nb + b]));
                    a[m] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), a[m]);
                }
            }
        }
    }
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(res[m], _mm512_add_ps(acc[0][m], acc[1][m]));
}
#endif

#if AGENTKV_TILES_AVX2
/* ktile_avx512's sums in two halves of 8 rows, each sub-block unpacked once for all rows of x */
static void ktile_avx2(const int qtype, const uint8_t *tile, int64_t nsb, const QRows *x, int64_t M,
                       float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype), nb = x->K / QK;
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    for (int h = 0; h < 2; h++) {
        __m256 acc[2][MAX_M];
        for (int64_t m = 0; m < M; m++) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
        for (int64_t s = 0; s < nsb; s++) {
            const uint8_t *sblk = tile + s * tb;
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sblk + 16 * h)));
            const __m256 dmin = k4_like(qtype)
                                    ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sblk + K4_DMIN + 16 * h)))
                                    : _mm256_setzero_ps();
            for (int j = 0; j < 8; j++) {
                const uint8_t *qs = ksub(qtype, sblk, j);
                if (h == 0) prefetch_ahead(sblk, tb, j);
                const int64_t b = 8 * s + j;
                __m256i u[8], w[8];
                nib_unpack_avx2(qs, qtype == Q6_K ? qs + 256 : NULL, h, u);
                if (qtype == Q5_K) q5_high_avx2(k5_high(sblk, j), h, u);
                __m256 *a = acc[j & 1];
                if (qtype == IQ4_XS) {  /* (signed values, as tile_avx2 reads IQ4_NL) */
                    iq4_values_avx2(u, w, IQ4_NL_U8);
                    const __m128i scb = _mm_loadl_epi64((const __m128i *)(sblk + KX_SC + 16 * j + 8 * h));
                    const __m256 dj = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb)));
                    for (int64_t m = 0; m < M; m++) {
                        const int8_t *xb = x->q + m * x->K + b * QK;
                        __m256i dot = _mm256_setzero_si256();
                        for (int g = 0; g < 8; g++) {
                            const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb + 4 * g)), w[g]);
                            dot = _mm256_add_epi32(dot, madd_u8s8(u[g], xs));
                        }
                        const __m256 dd = _mm256_mul_ps(dj, _mm256_set1_ps(x->d[m * nb + b]));
                        a[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot), a[m]);
                    }
                } else if (k4_like(qtype)) {
                    const __m128i scb = _mm_loadl_epi64((const __m128i *)(sblk + K4_SC + 16 * j + 8 * h));
                    const __m128i mnb = _mm_loadl_epi64((const __m128i *)(sblk + K4_MN + 16 * j + 8 * h));
                    const __m256 dj = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scb)));
                    const __m256 mn = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mnb)));
                    const __m256 mj = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(mn), sign));
                    for (int64_t m = 0; m < M; m++) {
                        const int8_t *xb = x->q + m * x->K + b * QK;
                        const __m256i dot = _mm256_add_epi32(dots4_avx2(u, xb), dots4_avx2(u + 4, xb + 16));
                        const __m256 dd = _mm256_mul_ps(dj, _mm256_set1_ps(x->d[m * nb + b]));
                        a[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot), a[m]);
                        a[m] = _mm256_fmadd_ps(mj, _mm256_set1_ps(x->ds[m * nb + b]), a[m]);
                    }
                } else {
                    const uint8_t *sc = sblk + K6_SC + 32 * j + 8 * h;
                    const __m256i sa = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc));
                    const __m256i sb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16)));
                    for (int64_t m = 0; m < M; m++) {
                        const int8_t *xb = x->q + m * x->K + b * QK;
                        const int32_t xa = x->s16[m * nb + b], xs = x->s[m * nb + b] - xa;
                        const __m256i da = _mm256_sub_epi32(dots4_avx2(u, xb), _mm256_set1_epi32(32 * xa));
                        const __m256i db = _mm256_sub_epi32(dots4_avx2(u + 4, xb + 16), _mm256_set1_epi32(32 * xs));
                        const __m256i sum = _mm256_add_epi32(_mm256_mullo_epi32(sa, da), _mm256_mullo_epi32(sb, db));
                        const __m256 dd = _mm256_mul_ps(dv, _mm256_set1_ps(x->d[m * nb + b]));
                        a[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), a[m]);
                    }
                }
            }
        }
        for (int64_t m = 0; m < M; m++) _mm256_storeu_ps(res[m] + 8 * h, _mm256_add_ps(acc[0][m], acc[1][m]));
    }
}
#endif

void agentkv_ktile_rows(int qtype, const uint8_t *tile, int64_t nsb, const QRows *x, int64_t M,
                        float res[MAX_M][TILE_ROWS], int generic) {
#if AGENTKV_TILES_FAST
    if (!generic) {
        ktile_avx512(qtype, tile, nsb, x, M, res);
        return;
    }
#elif AGENTKV_TILES_AVX2
    if (!generic) {
        ktile_avx2(qtype, tile, nsb, x, M, res);
        return;
    }
#endif
    ktile_generic(qtype, tile, nsb, x, M, res);
    (void)generic;
}

/* ---- a super-block's columns in fp32, for the exact product (cpu_tgemm.c) ----------------------------- */

#if AGENTKV_TILES_FAST
/* column c (0..31) of sub-block j of a tile's super-block, its 16 rows' weights as agentkv_ktile_weights
   computes them (each an exact product or one rounding, so the same bits) */
INLINE __m512 kcol_avx512(const int qtype, const uint8_t *sblk, int j, int c, __m512 dv, __m512 mv) {
    const uint8_t *qs = ksub(qtype, sblk, j);
    const __m512i byte = _mm512_set1_epi32(0xff), one = _mm512_set1_epi32(1);
    const int kk = c % 16;
    __m512i q = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512((const void *)(qs + (kk / 4) * 64)),
                                                   8 * (kk % 4)), byte);
    q = c < 16 ? _mm512_and_si512(q, _mm512_set1_epi32(15)) : _mm512_srli_epi32(q, 4);
    if (qtype == Q5_K) {
        const __m512i h = _mm512_loadu_si512((const void *)k5_high(sblk, j));
        q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, q5_bit(c)), one), 4));
    } else if (qtype == Q6_K) {
        const __m512i h = _mm512_loadu_si512((const void *)(qs + 256 + 64 * (kk / 4 % 2)));
        const __m512i pair =
            _mm512_and_si512(_mm512_srli_epi32(h, 8 * (kk % 4) + k6_high_shift(c)), _mm512_set1_epi32(3));
        q = _mm512_or_si512(q, _mm512_slli_epi32(pair, 4));
    } else if (qtype == IQ4_XS) {
        q = _mm512_permutexvar_epi32(q, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)IQ4_NL_U8)));
    }
    const __m512 qf = _mm512_cvtepi32_ps(q);
    if (k4_like(qtype)) return _mm512_fmsub_ps(dv, qf, mv);  /* d sc q - dmin mn (d sc q is exact) */
    return _mm512_mul_ps(dv, _mm512_sub_ps(qf, _mm512_set1_ps(qtype == Q6_K ? 32.f : 128.f)));
}

/* the per-row scale vectors of sub-block j's columns c0..c0+15 (dv: d sc; mv: Q4_K's and Q5_K's dmin mn) */
INLINE void kscales_avx512(const int qtype, const uint8_t *sblk, int j, int half, __m512 *dv, __m512 *mv) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sblk));
    const uint8_t *sc = sblk + (k4_like(qtype) ? K4_SC + 16 * j : qtype == IQ4_XS ? KX_SC + 16 * j
                                                                               : K6_SC + 16 * (2 * j + half));
    const __m128i b = _mm_loadu_si128((const __m128i *)sc);
    *dv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(k4_like(qtype) ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b)));
    *mv = _mm512_setzero_ps();
    if (k4_like(qtype)) {
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sblk + K4_DMIN)));
        const __m128i mn = _mm_loadu_si128((const __m128i *)(sblk + K4_MN + 16 * j));
        *mv = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
    }
}

void agentkv_ktile_cols(int qtype, const uint8_t *sblk, float cols[QK_K][TILE_ROWS]) {
    for (int j = 0; j < 8; j++)
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m512 dv, mv;
            kscales_avx512(qtype, sblk, j, half, &dv, &mv);
#pragma GCC unroll 16
            for (int c = 16 * half; c < 16 * half + 16; c++)  /* (unrolled: the shifts are constants) */
                _mm512_storeu_ps(cols[QK * j + c], kcol_avx512(qtype, sblk, j, c, dv, mv));
        }
}
#endif

#if AGENTKV_TILES_AVX2
/* kcol_avx512 for rows 8 h..8 h + 7 */
INLINE __m256 kcol_avx2(const int qtype, const uint8_t *sblk, int j, int c, int h, __m256 dv, __m256 mv) {
    const uint8_t *qs = ksub(qtype, sblk, j);
    const __m256i byte = _mm256_set1_epi32(0xff), one = _mm256_set1_epi32(1);
    const int kk = c % 16;
    __m256i q = _mm256_and_si256(
        _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(qs + (kk / 4) * 64 + 32 * h)), 8 * (kk % 4)), byte);
    q = c < 16 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
    if (qtype == Q5_K) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(k5_high(sblk, j) + 32 * h));
        q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hv, q5_bit(c)), one), 4));
    } else if (qtype == Q6_K) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(qs + 256 + 64 * (kk / 4 % 2) + 32 * h));
        const __m256i pair =
            _mm256_and_si256(_mm256_srli_epi32(hv, 8 * (kk % 4) + k6_high_shift(c)), _mm256_set1_epi32(3));
        q = _mm256_or_si256(q, _mm256_slli_epi32(pair, 4));
    } else if (qtype == IQ4_XS) {  /* (two tables of 8, the code's bit 3 choosing) */
        const __m256i lo8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)IQ4_NL_U8));
        const __m256i hi8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(IQ4_NL_U8 + 8)));
        q = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(lo8, q), _mm256_permutevar8x32_epi32(hi8, q),
                               _mm256_cmpgt_epi32(q, _mm256_set1_epi32(7)));
    }
    const __m256 qf = _mm256_cvtepi32_ps(q);
    if (k4_like(qtype)) return _mm256_fmsub_ps(dv, qf, mv);
    return _mm256_mul_ps(dv, _mm256_sub_ps(qf, _mm256_set1_ps(qtype == Q6_K ? 32.f : 128.f)));
}

/* kscales_avx512 for rows 8 h..8 h + 7 */
INLINE void kscales_avx2(const int qtype, const uint8_t *sblk, int j, int half, int h, __m256 *dv, __m256 *mv) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sblk + 16 * h)));
    const uint8_t *sc = sblk + 8 * h + (k4_like(qtype) ? K4_SC + 16 * j : qtype == IQ4_XS ? KX_SC + 16 * j
                                                                                   : K6_SC + 16 * (2 * j + half));
    const __m128i b = _mm_loadl_epi64((const __m128i *)sc);
    *dv = _mm256_mul_ps(d, _mm256_cvtepi32_ps(k4_like(qtype) ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b)));
    *mv = _mm256_setzero_ps();
    if (k4_like(qtype)) {
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sblk + K4_DMIN + 16 * h)));
        const __m128i mn = _mm_loadl_epi64((const __m128i *)(sblk + K4_MN + 16 * j + 8 * h));
        *mv = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    }
}

void agentkv_ktile_cols(int qtype, const uint8_t *sblk, float cols[QK_K][TILE_ROWS]) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 8; j++)
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                __m256 dv, mv;
                kscales_avx2(qtype, sblk, j, half, h, &dv, &mv);
#pragma GCC unroll 16
                for (int c = 16 * half; c < 16 * half + 16; c++)
                    _mm256_storeu_ps(cols[QK * j + c] + 8 * h, kcol_avx2(qtype, sblk, j, c, h, dv, mv));
            }
}
#endif
