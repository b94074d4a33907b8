/* y = x @ W^T (+ bias) (+ residual) with W kept in GGUF's quantized blocks, dequantized in the inner loop.

W is [N][K] as llama.cpp stores it: each output's row is K/32 blocks of 32 weights, one scale (and for
Q4_1 a minimum) per block:
  Q8_0 (34 bytes): fp16 d, int8 q[32]            w = d * q
  Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles    w = d * (q - 8)
  Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes       w = d * q + m
(byte j holds weight j in its low nibble and weight j + 16 in its high one). A decode step reads each
row once: 0.56-1.06 bytes a weight against bf16's 2.

Where the CPU has AVX2 (every x86 CPU of the last decade), x's rows (at most MAX_M) are quantized once a
call to int8 per block of 32, scale amax / 127, as llama.cpp quantizes activations for these formats,
and each weight block is one integer dot product of 32 pairs (vpmaddubsw + vpmaddwd, or one vpdpbusd
with AVX512_VNNI), scaled into fp32 lanes summed once a row. The exact path (`exact`, and CPUs without
AVX2) dequantizes each block to fp32 and keeps x in fp32: the same result as dequantize-then-matmul.
Longer inputs (prefill) are the caller's: it dequantizes the weight once (agentkv_qdequant) and
multiplies with torch.

K-quants are super-blocks of 256 weights: eight sub-blocks of 32 with 6-bit scales and minimums in
Q4_K, which the fast path reads as eight Q4_1 blocks (qlinear_fast_q4k); sixteen sub-blocks of 16 with
8-bit scales in Q6_K, whose 6-bit integers it rebuilds 32 at a time (qlinear_fast_q6k). The exact
path dequantizes a super-block to fp32 once a row and dots it with every row of x. */

#include <stdlib.h>

#include "cpu_blocks.h"

/* out[m, n] = v + bias[n] + res[m, n] (either absent where NULL), in x's dtype: every path's last step */
INLINE void put_out(float v, int64_t m, int64_t n, const void *bias, const void *res, int64_t r_ld, void *out,
                    int64_t out_ld, const int bf) {
    if (bias) v += load1(bias, n, bf);
    if (res) v += load1(res, m * r_ld + n, bf);
    store1(out, m * out_ld + n, v, bf);
}

/* ---- the exact path: blocks dequantized to fp32, x in fp32 (CPUs without AVX2) ------------------- */

INLINE void qlinear_exact(const int qtype, const int bf, const void *x, int64_t x_ld, int64_t M, int64_t K,
                          const uint8_t *w, int64_t N, const void *bias, const void *res, int64_t r_ld, void *out,
                          int64_t out_ld, int nthreads) {
    const int64_t bw = BLOCK_WEIGHTS[qtype], nb = K / bw, rb = nb * BLOCK_BYTES[qtype];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * K * M > 131072)
    for (int64_t n = 0; n < N; n++) {
        float acc[MAX_M][QK];  /* lane i sums the weights at i mod 32, as the 32-weight blocks always did */
        for (int64_t m = 0; m < M; m++)
            for (int i = 0; i < QK; i++) acc[m][i] = 0.f;
        const uint8_t *row = w + n * rb;
        for (int64_t b = 0; b < nb; b++) {
            float wf[QK_K];
            dequant_any(qtype, row, b, wf);
            for (int64_t m = 0; m < M; m++)
                for (int64_t c = 0; c < bw; c += QK)
                    for (int i = 0; i < QK; i++) acc[m][i] += load1(x, m * x_ld + b * bw + c + i, bf) * wf[c + i];
        }
        for (int64_t m = 0; m < M; m++) {
            float v = 0.f;
            for (int i = 0; i < QK; i++) v += acc[m][i];
            put_out(v, m, n, bias, res, r_ld, out, out_ld, bf);
        }
    }
}

/* ---- the fast path: x quantized per block of 32 to int8 (scale amax / 127, as llama.cpp's Q8_0),
   each weight block's 32 integers dotted with it in one or two instructions -------------------- */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AGENTKV_QFAST 1

/* 32 unsigned bytes times 32 signed bytes, summed in pairs into 8 int32 lanes */
INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE void qlinear_fast(const int qtype, const int bf, const int8_t *xq, const float *dx, const float *sx,
                         int64_t M, int64_t K, const uint8_t *w, int64_t N, const void *bias, const void *res,
                         int64_t r_ld, void *out, int64_t out_ld, int nthreads) {
    const int64_t nb = K / QK, bb = BLOCK_BYTES[qtype], rb = nb * bb;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * nb * M > 4096)
    for (int64_t n = 0; n < N; n++) {
        __m256 acc[MAX_M];
        float lin[MAX_M];  /* the block minimum's (Q4_1) or offset's (Q4_0) share: scale * sum of x's integers */
        for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps(), lin[m] = 0.f;
        const uint8_t *row = w + n * rb;
        int64_t b = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
        /* two blocks at a time in 512-bit lanes: their 64 integers against x's 64 consecutive ones */
        __m512 acc2[MAX_M];
        for (int64_t m = 0; m < M; m++) acc2[m] = _mm512_setzero_ps();
        for (; qtype != Q8_0 && b + 1 < nb; b += 2) {  /* (Q8_0 runs faster 256 bits at a time here) */
            const uint8_t *b0 = row + b * bb, *b1 = b0 + bb;
            const float d0 = half_to_f32(b0), d1 = half_to_f32(b1);
            __m512i u;
            float lo0 = 0.f, lo1 = 0.f;
            if (qtype == Q8_0) {
                u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                       _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
            } else {
                const int off = qtype == Q4_1 ? 4 : 2;
                const __m128i r0 = _mm_loadu_si128((const __m128i *)(b0 + off));
                const __m128i r1 = _mm_loadu_si128((const __m128i *)(b1 + off));
                const __m256i n0 = _mm256_set_m128i(_mm_srli_epi16(r0, 4), r0);
                const __m256i n1 = _mm256_set_m128i(_mm_srli_epi16(r1, 4), r1);
                u = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(n0), n1, 1), _mm512_set1_epi8(0x0f));
                lo0 = qtype == Q4_1 ? half_to_f32(b0 + 2) : -8.f * d0;
                lo1 = qtype == Q4_1 ? half_to_f32(b1 + 2) : -8.f * d1;
            }
            const __mmask64 neg = qtype == Q8_0 ? _mm512_movepi8_mask(u) : 0;
            const __m512i uw = qtype == Q8_0 ? _mm512_abs_epi8(u) : u;
            __builtin_prefetch(b1 + bb + 64, 0, 0);
            for (int64_t m = 0; m < M; m++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + m * K + b * QK));
                if (qtype == Q8_0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                const float *sc = dx + m * nb + b;
                const __m512 scale = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0 * sc[0])),
                                                        _mm256_set1_ps(d1 * sc[1]), 1);
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), uw, xv);
                acc2[m] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc2[m]);
                if (qtype != Q8_0) lin[m] += lo0 * sx[m * nb + b] + lo1 * sx[m * nb + b + 1];
            }
        }
        for (int64_t m = 0; m < M; m++) lin[m] += _mm512_reduce_add_ps(acc2[m]);
#endif
        for (; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            const float d = half_to_f32(blk);
            __m256i u;
            float lo = 0.f;  /* what each unit of x's integer sum adds: Q4_0 -8 d, Q4_1 the minimum */
            if (qtype == Q8_0) {
                u = _mm256_loadu_si256((const __m256i *)(blk + 2));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
                u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
                lo = qtype == Q4_1 ? half_to_f32(blk + 2) : -8.f * d;
            }
            /* Q8_0's weights are signed: |w| times x with w's sign */
            const __m256i uw = qtype == Q8_0 ? _mm256_sign_epi8(u, u) : u;
            if (__builtin_expect(b + 1 < nb, 1)) __builtin_prefetch(blk + bb + 64, 0, 0);
            for (int64_t m = 0; m < M; m++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + m * K + b * QK));
                if (qtype == Q8_0) xv = _mm256_sign_epi8(xv, u);
                const float scale = dx[m * nb + b];
                acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * scale), _mm256_cvtepi32_ps(dot_u8s8(uw, xv)), acc[m]);
                if (qtype != Q8_0) lin[m] += lo * sx[m * nb + b];
            }
        }
        for (int64_t m = 0; m < M; m++) put_out(hsum8(acc[m]) + lin[m], m, n, bias, res, r_ld, out, out_ld, bf);
    }
}

/* Q4_K on the fast path. A super-block's eight sub-blocks of 32 are Q4_1 blocks in all but layout:
   sub-block s has scale d * sc_s and minimum dmin * m_s (6-bit sc_s, m_s), and sub-blocks 2p and 2p + 1
   share 32 bytes, the first in their low nibbles and the second in their high ones. So each is one
   integer dot of its 32 nibbles with x's int8 block, scaled, less its minimum times x's block sum. */
INLINE void qlinear_fast_q4k(const int bf, const int8_t *xq, const float *dx, const float *sx, int64_t M,
                             int64_t K, const uint8_t *w, int64_t N, const void *bias, const void *res,
                             int64_t r_ld, void *out, int64_t out_ld, int nthreads) {
    const int64_t nsb = K / QK_K, nb = K / QK, rb = nsb * BLOCK_BYTES[Q4_K];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * K * M > 131072)
    for (int64_t n = 0; n < N; n++) {
        __m256 acc[MAX_M];
        float lin[MAX_M];  /* the minimums' share: - dmin * m_s * (x's block sum, scaled) */
        for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps(), lin[m] = 0.f;
        const uint8_t *row = w + n * rb;
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * BLOCK_BYTES[Q4_K];
            const float d = half_to_f32(blk), dmin = half_to_f32(blk + 2);
            if (__builtin_expect(sb + 1 < nsb, 1)) __builtin_prefetch(blk + BLOCK_BYTES[Q4_K] + 64, 0, 0);
            for (int p = 0; p < QK_K / 64; p++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * p));
                const __m256i lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
                int s0, m0, s1, m1;
                scale_min_k4(2 * p, blk + 4, &s0, &m0);
                scale_min_k4(2 * p + 1, blk + 4, &s1, &m1);
                const float d0 = d * s0, d1 = d * s1, c0 = dmin * m0, c1 = dmin * m1;
                const int64_t b = sb * (QK_K / QK) + 2 * p;  /* x's block of sub-block 2p */
                for (int64_t m = 0; m < M; m++) {
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + m * K + b * QK));
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + m * K + (b + 1) * QK));
                    const float *sc = dx + m * nb + b;
                    acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * sc[0]), _mm256_cvtepi32_ps(dot_u8s8(lo, x0)), acc[m]);
                    acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * sc[1]), _mm256_cvtepi32_ps(dot_u8s8(hi, x1)), acc[m]);
                    lin[m] -= c0 * sx[m * nb + b] + c1 * sx[m * nb + b + 1];
                }
            }
        }
        for (int64_t m = 0; m < M; m++) put_out(hsum8(acc[m]) + lin[m], m, n, bias, res, r_ld, out, out_ld, bf);
    }
}

/* Q6_K on the fast path. Each run of 32 weights is rebuilt as unsigned 6-bit integers q (the weight is
   d * sc_g * (q - 32), g its sub-block of 16), dotted with x's int8 block: the integer dot puts each 4
   consecutive products in one of 8 lanes, so lanes 0-3 hold the first sub-block and 4-7 the second, and
   a lane's sum less 32 times its x's sum (a second dot, with 32s) is scaled by its own sub-block's. */
INLINE void qlinear_fast_q6k(const int bf, const int8_t *xq, const float *dx, int64_t M, int64_t K,
                             const uint8_t *w, int64_t N, const void *bias, const void *res, int64_t r_ld,
                             void *out, int64_t out_ld, int nthreads) {
    const int64_t nsb = K / QK_K, nb = K / QK, rb = nsb * BLOCK_BYTES[Q6_K];
    const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30), b32 = _mm256_set1_epi8(32);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * K * M > 131072)
    for (int64_t n = 0; n < N; n++) {
        __m256 acc[MAX_M];
        for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
        const uint8_t *row = w + n * rb;
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *blk = row + sb * BLOCK_BYTES[Q6_K];
            const int8_t *scales = (const int8_t *)(blk + 192);
            const float d = half_to_f32(blk + 208);
            if (__builtin_expect(sb + 1 < nsb, 1)) __builtin_prefetch(blk + BLOCK_BYTES[Q6_K] + 64, 0, 0);
            for (int h = 0; h < 2; h++) {  /* a half: 64 bytes of low nibbles, 32 of high bit pairs */
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                __m256i u[4];  /* its four runs of 32, in weight order */
                u[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
                u[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
                u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
                u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
                for (int c = 0; c < 4; c++) {
                    const int g = 8 * h + 2 * c;  /* the run's two sub-blocks: g and g + 1 */
                    const __m256 wscale = _mm256_setr_ps(d * scales[g], d * scales[g], d * scales[g], d * scales[g],
                                                         d * scales[g + 1], d * scales[g + 1], d * scales[g + 1],
                                                         d * scales[g + 1]);
                    const int64_t b = sb * (QK_K / QK) + 4 * h + c;
                    for (int64_t m = 0; m < M; m++) {
                        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + m * K + b * QK));
                        const __m256i dot = _mm256_sub_epi32(dot_u8s8(u[c], xv), dot_u8s8(b32, xv));
                        acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(wscale, _mm256_set1_ps(dx[m * nb + b])),
                                                 _mm256_cvtepi32_ps(dot), acc[m]);
                    }
                }
            }
        }
        for (int64_t m = 0; m < M; m++) put_out(hsum8(acc[m]), m, n, bias, res, r_ld, out, out_ld, bf);
    }
}
#else
#define AGENTKV_QFAST 0
#endif

/* x's row m, block b, to int8: scale amax / 127, each value rounded to nearest (ties away), as llama.cpp */
static void quantize_x(const void *x, int64_t x_ld, int64_t M, int64_t K, int bf, int8_t *xq, float *dx, float *sx) {
    const int64_t nb = K / QK;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            float v[QK];
            int32_t sum;
            for (int i = 0; i < QK; i++) v[i] = load1(x, m * x_ld + b * QK + i, bf);
            quantize_block32(v, xq + m * K + b * QK, dx + m * nb + b, &sum, sx + m * nb + b);
        }
}

int agentkv_qlinear_fast(void) { return AGENTKV_QFAST; }

/* x [M, K] (row stride x_ld; bf16 or fp32), w [N][K/32 blocks], out [M, N] (row stride out_ld), bias [N]
   and residual [M, N] (row stride r_ld) optional, in x's dtype. `exact`: x stays fp32 (the blocks are
   dequantized), else (where the CPU has AVX2) x is quantized to int8 per block, as llama.cpp does, and
   each block is an integer dot product. Returns 0, 1 for K not a multiple of 32 or a type it does not take
   (Q5_0, Q5_1 and IQ4_NL are multiplied in tiles, or as Q8_0 where the tiles do not run), 2 for
   M over MAX_M (nothing done then). */
int agentkv_qlinear(int qtype, int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *w,
                    int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                    int nthreads, int exact) {
    if (qtype < 0 || qtype > Q6_K || K % BLOCK_WEIGHTS[qtype]) return 1;
    if (M < 1 || M > MAX_M) return 2;
#if AGENTKV_QFAST
    if (!exact) {
        const int64_t nb = K / QK;
        int8_t stack_q[16384];
        float stack_d[512];
        float stack_s[512];
        const int small = M * K <= 16384;
        int8_t *xq = small ? stack_q : malloc((size_t)(M * K));
        float *dx = small ? stack_d : malloc((size_t)(M * nb) * sizeof(float));
        float *sx = small ? stack_s : malloc((size_t)(M * nb) * sizeof(float));
        if (!xq || !dx || !sx) return 2;
        quantize_x(x, x_ld, M, K, bf, xq, dx, sx);
#define CASE(Q, B) qlinear_fast(Q, B, xq, dx, sx, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads)
        if (qtype == Q8_0) { if (bf) CASE(Q8_0, 1); else CASE(Q8_0, 0); }
        else if (qtype == Q4_0) { if (bf) CASE(Q4_0, 1); else CASE(Q4_0, 0); }
        else if (qtype == Q4_1) { if (bf) CASE(Q4_1, 1); else CASE(Q4_1, 0); }
        else if (qtype == Q4_K) {
            if (bf) qlinear_fast_q4k(1, xq, dx, sx, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads);
            else qlinear_fast_q4k(0, xq, dx, sx, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads);
        } else if (bf) qlinear_fast_q6k(1, xq, dx, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads);
        else qlinear_fast_q6k(0, xq, dx, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads);
#undef CASE
        if (!small) free(xq), free(dx), free(sx);
        return 0;
    }
#endif
    (void)exact;
#define CASE(Q, B) qlinear_exact(Q, B, x, x_ld, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads)
    if (qtype == Q8_0) { if (bf) CASE(Q8_0, 1); else CASE(Q8_0, 0); }
    else if (qtype == Q4_0) { if (bf) CASE(Q4_0, 1); else CASE(Q4_0, 0); }
    else if (qtype == Q4_1) { if (bf) CASE(Q4_1, 1); else CASE(Q4_1, 0); }
    else if (qtype == Q4_K) { if (bf) CASE(Q4_K, 1); else CASE(Q4_K, 0); }
    else { if (bf) CASE(Q6_K, 1); else CASE(Q6_K, 0); }
#undef CASE
    return 0;
}

/* rows `rows[0..n)` of w (all N rows in order when rows is NULL), dequantized into out [n, K] (row
   stride out_ld; bf16 or fp32): an embedding lookup, or a whole weight for a long input. */
int agentkv_qdequant(int qtype, int bf, const uint8_t *w, int64_t N, int64_t K, const int64_t *rows, int64_t n,
                     void *out, int64_t out_ld, int nthreads) {
    if (qtype < 0 || qtype >= NQTYPES || K % BLOCK_WEIGHTS[qtype]) return 1;  /* (every type: an embedding's rows) */
    for (int64_t r = 0; r < n; r++)
        if (rows && (rows[r] < 0 || rows[r] >= N)) return 3;
    const int64_t bw = BLOCK_WEIGHTS[qtype], nb = K / bw, rb = nb * BLOCK_BYTES[qtype];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n * K > 8192)
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = w + (rows ? rows[r] : r) * rb;
        for (int64_t b = 0; b < nb; b++) {
            float wf[QK_K];
            dequant_any(qtype, row, b, wf);
            for (int64_t i = 0; i < bw; i++) store1(out, r * out_ld + b * bw + i, wf[i], bf);
        }
    }
    return 0;
}
