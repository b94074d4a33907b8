/* y = x @ W^T for W in GGUF's blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) repacked into tiles of 16
rows: the bytes of the
row-major blocks in another order, so that one AVX-512 register holds 16 rows' weights and each 32-bit
lane accumulates one output row. Decode is a matrix-vector product whose cost is reading the weights;
the row-major kernel (cpu_quant.c) spends ~20 instructions per block on scales, unpacking and a
horizontal sum per row, and reads them at a third of what the memory gives. Here a block of 32
columns of 16 rows is 8 VNNI dot products against x's 4-byte groups broadcast, one scale conversion
and two fused multiply-adds, for every row of x at once.

A tile's block b (TILE_ROWS = 16 rows, row i of the tile = output row 16 t + i):
  Q8_0 (544 bytes): fp16 d[16]; then for each group g of 4 columns (4g..4g+3), 16 x 4 bytes: row i's
                    four weights, each stored + 128 (x ^ 0x80) so that it reads as an unsigned byte
  Q4_0 (288 bytes): fp16 d[16]; then for c = 0..3, 16 x 4 bytes: row i's bytes 4c..4c+3 of the block
                    (low nibbles: columns 4c.., high nibbles: columns 16 + 4c..)
  Q4_1 (320 bytes): fp16 d[16], fp16 m[16], then the nibbles as Q4_0
  Q5_0 (352 bytes): fp16 d[16]; uint32 h[16]: row i's 32 fifth bits, column j's at bit q5_bit(j), so that
                    a shift and a mask put the four columns of a nibble register's lane over their
                    nibbles; then the nibbles as Q4_0
  Q5_1 (384 bytes): fp16 d[16], fp16 m[16], then as Q5_0
  IQ4_NL (288 bytes): fp16 d[16], then the nibbles (codes into IQ4_NL_VALUES) as Q4_0; a shuffle turns a
                    register of codes into the values + 128, read as Q8_0's are
  MXFP4 (288 bytes): as IQ4_NL, codes into MXFP4_VALUES (the loader gives its power-of-two scale as fp16)
Each holds as many bytes a row as the file's blocks.
Rows past N (the last tile's padding) are zero blocks. A tile's blocks are consecutive, tiles follow
each other: a thread's share of tiles is one linear stream.

x is quantized once per input to int8 blocks (QRows: scale d_x, integer sum s_x), and each output is
  sum over blocks of (d_w * d_x) * (int dot - off * s_x)  (+ m_w * d_x s_x for Q4_1 and Q5_1)
with off = 128 (Q8_0's and IQ4_NL's stored + 128), 8 (Q4_0's) or 16 (Q5_0's), summed in two accumulators (even and odd
blocks) added at the end. The integer parts are exact; the plain-C body makes the same fp32
operations in the same order as the AVX-512 one, so both give the same bits (the tests check).

CPUs with AVX2 but not AVX-512 VNNI (most laptops and desktops) run the same tiles through 256-bit
bodies: a tile's rows as two halves of 8 lanes, each block unpacked once per half for all rows of x,
the dots by maddubs + madd (Q8_0's weights back to signed bytes whose sign moves onto x, so that each
pair stays below 2^15); the same integers, the same fp32 operations per row, the same bits. */

#include <stdlib.h>

#include "cpu_tiles.h"

/* ---- repacking and reading back --------------------------------------------------------------- */

/* W row-major [N][K / 32 blocks] into tiles [ceil(N / 16)][K / 32][tile block]; returns 0, or 1 for a
   type that is not tiled or K not a multiple of 32 */
int agentkv_qtile_pack(int qtype, const uint8_t *w, int64_t N, int64_t K, uint8_t *out, int nthreads) {
    if (!tiled_shape(qtype, K)) return 1;
    const int64_t nb = K / BLOCK_WEIGHTS[qtype], bb = BLOCK_BYTES[qtype], tb = tile_block_bytes(qtype);
    const int64_t ntiles = (N + 15) / 16;
    const int sb = weights_at(qtype);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < ntiles; t++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *dst = out + (t * nb + b) * tb;
            memset(dst, 0, (size_t)tb);
            for (int i = 0; i < TILE_ROWS && t * TILE_ROWS + i < N; i++) {
                const uint8_t *src = w + (t * TILE_ROWS + i) * nb * bb + b * bb;
                if (is_kquant(qtype) || is_float(qtype)) {
                    if (is_kquant(qtype)) agentkv_ktile_pack_row(qtype, src, i, dst);
                    else agentkv_ftile_pack_row(qtype, src, i, dst);
                    continue;
                }
                memcpy(dst + 2 * i, src, 2);                               /* d */
                if (has_min(qtype)) memcpy(dst + 32 + 2 * i, src + 2, 2);  /* m */
                const uint8_t *qs = src + 2 + 2 * has_min(qtype) + (high_at(qtype) ? 4 : 0);
                if (high_at(qtype)) {  /* the fifth bits, moved to where the unpacking reads them */
                    const uint32_t h = q5_word(load_u32(qs - 4));
                    memcpy(dst + high_at(qtype) + 4 * i, &h, 4);
                }
                for (int j = 0; j < (qtype == Q8_0 ? QK : QK / 2); j++)
                    dst[sb + tile_pos(i, j)] = qtype == Q8_0 ? (uint8_t)(qs[j] ^ 0x80) : qs[j];
            }
        }
    return 0;
}

/* row n of a tiled W rebuilt as its row-major blocks, then dequantized as they are */
void agentkv_qtile_row(int qtype, const uint8_t *tiles, int64_t K, int64_t n, float *out) {
    const int64_t nb = K / BLOCK_WEIGHTS[qtype], tb = tile_block_bytes(qtype), t = n / TILE_ROWS;
    const int i = (int)(n % TILE_ROWS), sb = weights_at(qtype);
    if (is_kquant(qtype)) {
        for (int64_t b = 0; b < nb; b++) agentkv_ktile_weights(qtype, tiles + (t * nb + b) * tb, i, out + b * QK_K);
        return;
    }
    if (is_float(qtype)) {
        for (int64_t b = 0; b < nb; b++)
            for (int k = 0; k < QK; k++) out[b * QK + k] = ftile_weight(qtype, tiles + (t * nb + b) * tb, i, k);
        return;
    }
    if (qtype == Q5_0 || qtype == Q5_1 || is_lut4(qtype)) {  /* tile_weight: dequant_block's values */
        for (int64_t b = 0; b < nb; b++)
            for (int k = 0; k < QK; k++) out[b * QK + k] = tile_weight(qtype, tiles + (t * nb + b) * tb, i, k);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *src = tiles + (t * nb + b) * tb;
        uint8_t blk[34];
        memcpy(blk, src + 2 * i, 2);
        if (qtype == Q4_1) memcpy(blk + 2, src + 32 + 2 * i, 2);
        uint8_t *qs = blk + (qtype == Q4_1 ? 4 : 2);
        for (int j = 0; j < (qtype == Q8_0 ? QK : QK / 2); j++) {
            const uint8_t v = src[sb + tile_pos(i, j)];
            qs[j] = qtype == Q8_0 ? (uint8_t)(v ^ 0x80) : v;
        }
        dequant_block(qtype, blk, out + b * QK);
    }
}

/* ---- the products -------------------------------------------------------------------------------- */

/* one block's contribution to one row's accumulator: the plain-C form of the AVX-512 body below */
INLINE float block_generic(const int qtype, const uint8_t *blk, int i, const QRows *x, int64_t m, int64_t b,
                           float acc) {
    const int64_t nb = x->K / QK;
    const int8_t *xb = x->q + m * x->K + b * QK;
    int32_t dot = 0;
    for (int j = 0; j < QK; j++) dot += (int32_t)tile_u(qtype, blk, i, j) * xb[j];
    dot -= (int32_t)quant_offset(qtype) * x->s[m * nb + b];
    const float dd = half_to_f32(blk + 2 * i) * x->d[m * nb + b];
    acc = fmaf(dd, (float)dot, acc);
    if (has_min(qtype)) acc = fmaf(half_to_f32(blk + 32 + 2 * i), x->ds[m * nb + b], acc);
    return acc;
}

INLINE void tile_generic(const int qtype, const uint8_t *tile, int64_t nb, const QRows *x, int64_t M,
                         float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < TILE_ROWS; i++) {
            float a0 = 0.f, a1 = 0.f;
            int64_t b = 0;
            for (; b + 1 < nb; b += 2) {
                a0 = block_generic(qtype, tile + b * tb, i, x, m, b, a0);
                a1 = block_generic(qtype, tile + (b + 1) * tb, i, x, m, b + 1, a1);
            }
            if (b < nb) a0 = block_generic(qtype, tile + b * tb, i, x, m, b, a0);
            res[m][i] = a0 + a1;
        }
}

#if AGENTKV_TILES_FAST
/* a tile block's 16 rows' weights as tile_u's unsigned bytes in 8 registers, u[g] columns 4g..4g+3 */
INLINE void block_unpack_avx512(const int qtype, const uint8_t *blk, __m512i *u) {
    unpack_avx512(qtype == Q8_0 ? Q8_0 : Q4_0, blk + weights_at(qtype), u);
    if (high_at(qtype)) q5_high_avx512(blk + high_at(qtype), u);
    else if (is_lut4(qtype)) iq4_values_avx512(u, lut4_u8(qtype));
}

INLINE __m512 block_avx512(const int qtype, const __m512i *u, __m512 dv, __m512 mv, const QRows *x, int64_t m,
                           int64_t b, __m512 acc) {
    const int64_t nb = x->K / QK;
    const int8_t *xb = x->q + m * x->K + b * QK;  /* each group of 4 broadcast from memory */
    /* four chains of two dot products (a chain's latency is what bounds a prompt's rows) */
    const __m512i z = _mm512_setzero_si512();
    __m512i s0 = _mm512_dpbusd_epi32(z, u[0], _mm512_set1_epi32(load_i32(xb)));
    __m512i s1 = _mm512_dpbusd_epi32(z, u[1], _mm512_set1_epi32(load_i32(xb + 4)));
    __m512i s2 = _mm512_dpbusd_epi32(z, u[2], _mm512_set1_epi32(load_i32(xb + 8)));
    __m512i s3 = _mm512_dpbusd_epi32(z, u[3], _mm512_set1_epi32(load_i32(xb + 12)));
    s0 = _mm512_dpbusd_epi32(s0, u[4], _mm512_set1_epi32(load_i32(xb + 16)));
    s1 = _mm512_dpbusd_epi32(s1, u[5], _mm512_set1_epi32(load_i32(xb + 20)));
    s2 = _mm512_dpbusd_epi32(s2, u[6], _mm512_set1_epi32(load_i32(xb + 24)));
    s3 = _mm512_dpbusd_epi32(s3, u[7], _mm512_set1_epi32(load_i32(xb + 28)));
    __m512i dot = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
    if (!has_min(qtype))
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32((int32_t)quant_offset(qtype) * x->s[m * nb + b]));
    const __m512 dd = _mm512_mul_ps(dv, _mm512_set1_ps(x->d[m * nb + b]));
    acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(dot), acc);
    if (has_min(qtype)) acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(x->ds[m * nb + b]), acc);
    return acc;
}

INLINE void tile_avx512(const int qtype, const uint8_t *tile, int64_t nb, const QRows *x, int64_t M,
                        float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    __m512 a0[MAX_M], a1[MAX_M];
    for (int64_t m = 0; m < M; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * tb;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 mv = has_min(qtype) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                                         : _mm512_setzero_ps();
        __m512i u[8];
        block_unpack_avx512(qtype, blk, u);
        /* 24 blocks ahead (7.5 KiB of Q4_1) into L1, every line of the block: the hardware's streams
           restart at each matrix and page; a step of the embedded model with caches cold took 5.3 against
           5.8 ms with 8 blocks ahead as non-temporal, and a 1 GB Q4_0 file's step 36 against 40 ms with
           every line asked for rather than a block's first */
        prefetch_block(blk + 24 * tb, tb);
        if (b & 1)
            for (int64_t m = 0; m < M; m++) a1[m] = block_avx512(qtype, u, dv, mv, x, m, b, a1[m]);
        else
            for (int64_t m = 0; m < M; m++) a0[m] = block_avx512(qtype, u, dv, mv, x, m, b, a0[m]);
    }
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(res[m], _mm512_add_ps(a0[m], a1[m]));
}
#endif

#if AGENTKV_TILES_AVX2
/* tile_avx512's sums in two halves of 8 rows, each block unpacked once for all rows of x. Q8_0's weights
   go back to signed bytes whose sign moves onto x (|w| <= 128 and |x| <= 127 keep maddubs' pairs in
   range): its dot is signed already, the offset's correction made; IQ4_NL's codes are shuffled into
   their signed values and read the same way. Q5's fifth bits join the nibbles as tile_avx512's do. */
INLINE void tile_avx2(const int qtype, const uint8_t *tile, int64_t nb, const QRows *x, int64_t M,
                      float res[MAX_M][TILE_ROWS]) {
    const int64_t tb = tile_block_bytes(qtype);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int h = 0; h < 2; h++) {
        __m256 acc[2][MAX_M];
        for (int64_t m = 0; m < M; m++) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * tb, *qs = blk + weights_at(qtype);
            if (h == 0) prefetch_block(blk + 24 * tb, tb);
            __m256i u[8], w[8];
            if (qtype == Q8_0)
                for (int g = 0; g < 8; g++) {
                    w[g] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32 * h)), flip);
                    u[g] = _mm256_abs_epi8(w[g]);
                }
            else
                nib_unpack_avx2(qs, NULL, h, u);
            if (is_lut4(qtype)) iq4_values_avx2(u, w, lut4_u8(qtype));
            else if (high_at(qtype)) q5_high_avx2(blk + high_at(qtype), h, u);
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            const __m256 mv = has_min(qtype) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)))
                                             : _mm256_setzero_ps();
            __m256 *a = acc[b & 1];
            for (int64_t m = 0; m < M; m++) {
                const int64_t at = m * nb + b;
                const int8_t *xb = x->q + m * x->K + b * QK;
                __m256i dot;
                if (qtype == Q8_0 || is_lut4(qtype)) {
                    dot = _mm256_setzero_si256();
                    for (int g = 0; g < 8; g++)
                        dot = _mm256_add_epi32(dot, madd_u8s8(u[g], _mm256_sign_epi8(
                                                                    _mm256_set1_epi32(load_i32(xb + 4 * g)), w[g])));
                } else {
                    dot = _mm256_add_epi32(dots4_avx2(u, xb), dots4_avx2(u + 4, xb + 16));
                    if (!has_min(qtype))
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32((int32_t)quant_offset(qtype) * x->s[at]));
                }
                const __m256 dd = _mm256_mul_ps(dv, _mm256_set1_ps(x->d[at]));
                a[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot), a[m]);
                if (has_min(qtype)) a[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x->ds[at]), a[m]);
            }
        }
        for (int64_t m = 0; m < M; m++) _mm256_storeu_ps(res[m] + 8 * h, _mm256_add_ps(acc[0][m], acc[1][m]));
    }
}
#endif

INLINE void range_body(const int qtype, const int bf, const uint8_t *tiles, int64_t N, int64_t K, const QRows *x,
                       int64_t M, int64_t t0, int64_t t1, const void *bias, const void *res, int64_t r_ld, void *out,
                       int64_t out_ld, int generic) {
    const int64_t nb = K / QK;
    float v[MAX_M][TILE_ROWS];
    /* a float tile reads x's int8 rows as fp32 values d q: made once for this range's tiles */
    float *xq = is_float(qtype) && t1 > t0 ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    for (int64_t m = 0; xq && m < M; m++)
        for (int64_t k = 0; k < K; k++) xq[m * K + k] = x->d[m * nb + k / QK] * (float)x->q[m * K + k];
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = tiles + t * tile_bytes(qtype, K);
        const int valid = N - t * TILE_ROWS < TILE_ROWS ? (int)(N - t * TILE_ROWS) : TILE_ROWS;
        /* a prompt's rows 16 at a time against the tile, which stays in L1 meanwhile (a few KiB): each
           row is computed as it would be alone, whatever else the pass holds */
        for (int64_t m0 = 0; m0 < M; m0 += MAX_M) {
            const int64_t rows = M - m0 < MAX_M ? M - m0 : MAX_M;
            const QRows part = {x->q + m0 * K, x->d + m0 * nb, x->s + m0 * nb, x->ds + m0 * nb, x->s16 + m0 * nb, K};
            if (is_kquant(qtype)) agentkv_ktile_rows(qtype, tile, K / QK_K, &part, rows, v, generic);
            else if (is_float(qtype))
                agentkv_ftile_rows(qtype, tile, nb, xq ? xq + m0 * K : NULL, &part, K, rows, v, generic);
#if AGENTKV_TILES_FAST
            else if (!generic) tile_avx512(qtype, tile, nb, &part, rows, v);
#elif AGENTKV_TILES_AVX2
            else if (!generic) tile_avx2(qtype, tile, nb, &part, rows, v);
#endif
            else tile_generic(qtype, tile, nb, &part, rows, v);
            for (int64_t m = 0; m < rows; m++)
                tile_store(v[m], m0 + m, t * TILE_ROWS, valid, bias, res, r_ld, out, out_ld, bf);
        }
    }
    free(xq);
    (void)generic;
}

void agentkv_qtile_range(int qtype, const uint8_t *tiles, int64_t N, int64_t K, const QRows *x, int64_t M,
                         int64_t t0, int64_t t1, const void *bias, const void *res, int64_t r_ld, void *out,
                         int64_t out_ld, int bf, int generic) {
#define CASE(Q) do { \
        if (bf) range_body(Q, 1, tiles, N, K, x, M, t0, t1, bias, res, r_ld, out, out_ld, generic); \
        else range_body(Q, 0, tiles, N, K, x, M, t0, t1, bias, res, r_ld, out, out_ld, generic); } while (0)
    if (qtype == Q8_0) CASE(Q8_0);
    else if (qtype == Q4_0) CASE(Q4_0);
    else if (qtype == Q4_1) CASE(Q4_1);
    else if (qtype == Q4_K) CASE(Q4_K);
    else if (qtype == Q6_K) CASE(Q6_K);
    else if (qtype == Q5_0) CASE(Q5_0);
    else if (qtype == Q5_1) CASE(Q5_1);
    else if (qtype == IQ4_NL) CASE(IQ4_NL);
    else if (qtype == MXFP4) CASE(MXFP4);
    else if (qtype == Q5_K) CASE(Q5_K);
    else if (qtype == IQ4_XS) CASE(IQ4_XS);
    else if (qtype == F16) CASE(F16);
    else CASE(BF16);
#undef CASE
}

int agentkv_qtile_fast(void) { return AGENTKV_TILES_FAST || AGENTKV_TILES_AVX2; }

int64_t agentkv_qtile_block_bytes(int qtype) { return tiled_type(qtype) ? tile_block_bytes(qtype) : 0; }

int agentkv_qrows_alloc(QRows *q, int64_t M, int64_t K) {
    const int64_t nb = K / QK;
    q->K = K;
    q->q = malloc((size_t)(M * K));
    q->d = malloc((size_t)(M * nb) * sizeof(float));
    q->s = malloc((size_t)(M * nb) * sizeof(int32_t));
    q->ds = malloc((size_t)(M * nb) * sizeof(float));
    q->s16 = malloc((size_t)(M * nb) * sizeof(int32_t));
    return !q->q || !q->d || !q->s || !q->ds || !q->s16;
}

void agentkv_qrows_free(QRows *q) { free(q->q), free(q->d), free(q->s), free(q->ds), free(q->s16); }

/* row m of x (bf16 or fp32) into q */
void agentkv_quantize_row(const void *x, int64_t x_ld, int64_t m, int bf, const QRows *q) {
    float v[QK];
    const int64_t nb = q->K / QK;
    for (int64_t b = 0; b < nb; b++) {
        for (int i = 0; i < QK; i++) v[i] = load1(x, m * x_ld + b * QK + i, bf);
        quantize_into(v, q, m, b);
    }
}

/* x [M, K] (bf16 or fp32, row stride x_ld) @ W^T for a tiled W [N, K], out [M, N] (+ bias) (+ residual),
   any M (a prompt's rows 16 at a time against each tile). Returns 0, 1 for a type not tiled or K not a
   multiple of 32, 2 for M < 1 or memory short. */
int agentkv_qtile_linear(int qtype, int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *tiles,
                         int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                         int nthreads, int generic) {
    if (!tiled_shape(qtype, K)) return 1;
    if (M < 1) return 2;
    QRows q;
    if (agentkv_qrows_alloc(&q, M, K)) {
        agentkv_qrows_free(&q);
        return 2;
    }
    const int64_t ntiles = (N + 15) / 16;
#pragma omp parallel num_threads(nthreads) if (ntiles * K * M > 65536)
    {
        const int64_t nt = omp_threads(), me = omp_me();
        for (int64_t m = me; m < M; m += nt) agentkv_quantize_row(x, x_ld, m, bf, &q);
#pragma omp barrier
        agentkv_qtile_range(qtype, tiles, N, K, &q, M, ntiles * me / nt, ntiles * (me + 1) / nt, bias, res, r_ld, out,
                            out_ld, bf, generic);
    }
    agentkv_qrows_free(&q);
    return 0;
}

/* ---- the vocabulary projection: int8 for every logit, the top candidates re-scored exactly --------- */

float agentkv_exact_dot(const float *x, const float *w, int64_t K) {
    float lane[QK] = {0};
    for (int64_t k = 0; k < K; k += QK)
        for (int i = 0; i < QK; i++) lane[i] = fmaf(x[k + i], w[k + i], lane[i]);
    float s = 0.f;
    for (int i = 0; i < QK; i++) s += lane[i];
    return s;
}

float agentkv_exact_logit(int qtype, const uint8_t *tiles, int64_t K, const float *x, int64_t n, float *w) {
    agentkv_qtile_row(qtype, tiles, K, n, w);
    return agentkv_exact_dot(x, w, K);
}

/* whether (v, i) ranks before (u, j): larger first, the lower index first among equals */
INLINE int ranks_before(float v, int64_t i, float u, int64_t j) { return v > u || (v == u && i < j); }

void agentkv_top_merge(const float *v, int64_t n0, int64_t n1, int R, int64_t *idx, float *val, int *count) {
    for (int64_t n = n0; n < n1; n++) {
        const float x = v[n];
        if (*count == R && !ranks_before(x, n, val[R - 1], idx[R - 1])) continue;  /* the common case */
        int at = *count < R ? (*count)++ : R - 1;
        while (at > 0 && ranks_before(x, n, val[at - 1], idx[at - 1])) {
            val[at] = val[at - 1], idx[at] = idx[at - 1];
            at--;
        }
        val[at] = x, idx[at] = n;
    }
}

/* Logits [M, N] (fp32, row stride out_ld) of x [M, K] (fp32) against a tiled W: every logit through the
   int8 product, then each row's `R` largest re-scored exactly (x in fp32 against the dequantized row),
   so the greedy token and the top log-probabilities are the exact path's. Returns as qtile_linear. */
int agentkv_qtile_logits(int qtype, const float *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *tiles, int64_t N,
                         int R, float *out, int64_t out_ld, int nthreads, int generic) {
    const int bad = agentkv_qtile_linear(qtype, 0, x, x_ld, M, K, tiles, N, NULL, NULL, 0, out, out_ld, nthreads,
                                         generic);
    if (bad || R <= 0) return bad;
    R = R < N ? R : (int)N;
    int64_t *idx = malloc((size_t)R * sizeof(int64_t));
    float *val = malloc((size_t)R * sizeof(float)), *w = malloc((size_t)K * sizeof(float));
    if (!idx || !val || !w) {
        free(idx), free(val), free(w);
        return 2;
    }
    for (int64_t m = 0; m < M; m++) {
        int count = 0;
        agentkv_top_merge(out + m * out_ld, 0, N, R, idx, val, &count);
        for (int c = 0; c < count; c++)
            out[m * out_ld + idx[c]] = agentkv_exact_logit(qtype, tiles, K, x + m * x_ld, idx[c], w);
    }
    free(idx), free(val), free(w);
    return 0;
}

/* out[m, r] = the exact logit of token ids[m, r] for x's row m (fp32 [M, K], row stride x_ld) against a
   tiled W: after a grammar's mask, the best allowed tokens of an int8 projection re-scored, so a
   constrained greedy token is the exact path's too. ids < 0 are left alone. Returns 0, or 3 for an
   id out of range (nothing done). */
int agentkv_qtile_rescore(int qtype, const uint8_t *tiles, int64_t N, int64_t K, const float *x, int64_t x_ld,
                          int64_t M, const int64_t *ids, int64_t R, float *out, int nthreads) {
    if (!tiled_shape(qtype, K)) return 1;
    for (int64_t i = 0; i < M * R; i++)
        if (ids[i] >= N) return 3;
    float *buf = malloc((size_t)K * sizeof(float) * (size_t)(nthreads > 0 ? nthreads : 1));
    if (!buf) return 2;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M * R * K > 65536)
    for (int64_t i = 0; i < M * R; i++) {
        if (ids[i] < 0) continue;
        out[i] = agentkv_exact_logit(qtype, tiles, K, x + (i / R) * x_ld, ids[i], buf + (int64_t)omp_me() * K);
    }
    free(buf);
    return 0;
}
