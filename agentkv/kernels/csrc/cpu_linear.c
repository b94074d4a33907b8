/* y = x @ W (+ bias) (+ residual) for bf16 on CPUs with AVX512_BF16, W packed for it once at load.

A decode step reads every weight once from memory, with 1-16 rows to multiply: at that size oneDNN's
bf16 kernel here (AMD Zen 4, no AMX) waits on memory about as long as it computes. This kernel streams
each 16-column block of W as one run of 64-byte lines, every line a vdpbf16ps operand for each row, and
asks for the lines 2 KB ahead: the 30 layers' linears of the embedded model took 12.4 ms at 16 rows
and 7.0 at one (weights out of cache, as in a step) against 18.6 and 14.5 for oneDNN. Past 16 rows
(prefill) the block's lines stay in cache while rows go by in blocks of 12, at oneDNN's speed.

Packed layout: [N/16][K/2][16][2]: for column block b and row pair kp, 16 columns x 2 k as one line
(N padded to 16 with zero columns; K even). Products of bf16 are exact in fp32 and sums are fp32;
the result is rounded to bf16 once, after the bias and residual are added. */

#include "cpu_kernels.h"

#if defined(__AVX512BF16__)

#define PREFETCH_BYTES 2048 /* how far ahead in a block's run of lines */

INLINE __m512 load_bf16_masked(const bf16 *p, __mmask16 mask) {
    __m256i r = _mm256_maskz_loadu_epi16(mask, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16));
}

/* rows [0, MR) of x times one column block w ([K/2][16][2]) into out's 16 (or `cols`) columns */
INLINE void rows_block(const bf16 *x, int64_t x_ld, const int MR, int64_t KP, const bf16 *w, const bf16 *bias,
                       const bf16 *res, int64_t r_ld, bf16 *out, int64_t out_ld, int64_t cols, const int prefetch) {
    __m512 acc[16];
    for (int m = 0; m < MR; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < KP; kp++) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w + kp * 32));
        if (prefetch) __builtin_prefetch((const char *)(w + kp * 32) + PREFETCH_BYTES, 0, 0);
        for (int m = 0; m < MR; m++) {
            int32_t pair;
            memcpy(&pair, x + m * x_ld + 2 * kp, 4);
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), wv);
        }
    }
    const __mmask16 mask = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __m512 b = bias ? load_bf16_masked(bias, mask) : _mm512_setzero_ps();
    for (int m = 0; m < MR; m++) {
        __m512 v = _mm512_add_ps(acc[m], b);
        if (res) v = _mm512_add_ps(v, load_bf16_masked(res + m * r_ld, mask));
        _mm256_mask_storeu_epi16(out + m * out_ld, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
}

#define ROWS_CASE(n) \
    case n: rows_block(x, x_ld, n, KP, w, bias, res, r_ld, out, out_ld, cols, prefetch); break;

/* any row count up to 16 as a constant of its own body (the accumulators stay in registers) */
static void rows_any(const bf16 *x, int64_t x_ld, int mr, int64_t KP, const bf16 *w, const bf16 *bias,
                     const bf16 *res, int64_t r_ld, bf16 *out, int64_t out_ld, int64_t cols, int prefetch) {
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
        ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13) ROWS_CASE(14) ROWS_CASE(15)
        ROWS_CASE(16)
    }
}

int agentkv_linear_bf16_available(void) { return 1; }

/* x [M, K] (row stride x_ld), wp packed from W [K, N], bias [N] or NULL, res [M, N] (stride r_ld) or
   NULL, out [M, N] (stride out_ld). Column blocks are split over the threads in runs, so each thread
   streams one contiguous part of wp. */
void agentkv_linear_bf16(const bf16 *x, int64_t x_ld, int64_t M, int64_t K, const bf16 *wp, int64_t N,
                         const bf16 *bias, const bf16 *res, int64_t r_ld, bf16 *out, int64_t out_ld, int nthreads) {
    const int64_t KP = K / 2, NB = (N + 15) / 16;
    const int rows = M <= 16 ? 16 : 12; /* past 16, blocks of 12 rows: the lines come from cache */
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nb = 0; nb < NB; nb++) {
        const bf16 *w = wp + nb * KP * 32;
        const int64_t cols = N - nb * 16 < 16 ? N - nb * 16 : 16;
        for (int64_t m0 = 0; m0 < M; m0 += rows) {
            const int mr = M - m0 < rows ? (int)(M - m0) : rows;
            rows_any(x + m0 * x_ld, x_ld, mr, KP, w, bias ? bias + nb * 16 : NULL, res ? res + m0 * r_ld + nb * 16 : NULL,
                     r_ld, out + m0 * out_ld + nb * 16, out_ld, cols, m0 == 0);
        }
    }
}

#else

int agentkv_linear_bf16_available(void) { return 0; } /* and no agentkv_linear_bf16: torch's linears run */

#endif
