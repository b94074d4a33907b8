/* y = x @ W (+ bias) (+ residual) on CPUs with AVX-512, W packed for it once at load: bf16 (with
AVX512_BF16) and fp32.

A decode step reads every weight once from memory, with 1-16 rows to multiply: at that size oneDNN's
kernels here (AMD Zen 4, no AMX) wait on memory about as long as they compute. This kernel streams
each 16-column block of W as one run of 64-byte lines, every line an operand for each row, and asks
for the lines 2 KB ahead: the embedded model's 30 layers' linears, weights out of cache as in a step
(benchmarks/cpu_kernels.py), took 5.5 / 10.8 ms at 1 / 16 rows in bf16 against 10.4 / 14.9 for oneDNN,
and 9.1 / 20.2 against 17.3 / 24.3 in fp32. Past 16 rows (prefill) a block's lines stay in cache while
rows go by in blocks of 12, within 4% of oneDNN at 550 rows.

Packed layouts, column block b (16 columns; N padded with zero columns):
  bf16 [N/16][K/2][16][2]: a line holds 16 columns x 2 k, one vdpbf16ps operand (K even);
  fp32 [N/16][K][16]:      a line holds 16 columns x 1 k, one FMA operand.
Sums are fp32 (bf16 products are exact in fp32); the result is rounded once, after the bias and the
residual are added. */

#include <stdlib.h>

#include "cpu_kernels.h"

#if AGENTKV_AVX512

#define PREFETCH_BYTES 2048 /* how far ahead in a block's run of lines */

/* rows [0, MR) of x times one packed column block w into out's 16 (or `cols`) columns */
INLINE void rows_block(const char *x, int64_t x_ld, const int MR, int64_t K, const char *w, const char *bias,
                       const char *res, int64_t r_ld, char *out, int64_t out_ld, int64_t cols, const int prefetch,
                       const int bf) {
    const int es = bf ? 2 : 4;
    __m512 acc[16];
    for (int m = 0; m < MR; m++) acc[m] = _mm512_setzero_ps();
    const int64_t steps = bf ? K / 2 : K;  /* one 64-byte line a step */
    for (int64_t s = 0; s < steps; s++) {
        const char *line = w + s * 64;
        if (prefetch) __builtin_prefetch(line + PREFETCH_BYTES, 0, 0);
#if defined(__AVX512BF16__)
        if (bf) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)line);
            for (int m = 0; m < MR; m++) {
                int32_t pair;  /* x[m][2s], x[m][2s + 1] */
                memcpy(&pair, x + m * x_ld * 2 + s * 4, 4);
                acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), wv);
            }
            continue;
        }
#endif
        const __m512 wv = _mm512_loadu_ps((const float *)line);
        for (int m = 0; m < MR; m++)
            acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)x)[m * x_ld + s]), wv, acc[m]);
    }
    const __mmask16 mask = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __m512 b = bias ? load16_masked(bias, mask, bf) : _mm512_setzero_ps();
    for (int m = 0; m < MR; m++) {
        __m512 v = _mm512_add_ps(acc[m], b);
        if (res) v = _mm512_add_ps(v, load16_masked(res + m * r_ld * es, mask, bf));
        store16_masked(out + m * out_ld * es, v, mask, bf);
    }
}

#define ROWS_CASE(n) case n: rows_block(x, x_ld, n, K, w, bias, res, r_ld, out, out_ld, cols, prefetch, bf); break;

/* any row count up to 16 as a constant of its own body (the accumulators stay in registers) */
INLINE void rows_any(const char *x, int64_t x_ld, int mr, int64_t K, const char *w, const char *bias,
                     const char *res, int64_t r_ld, char *out, int64_t out_ld, int64_t cols, int prefetch,
                     const int bf) {
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7) ROWS_CASE(8)
        ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13) ROWS_CASE(14) ROWS_CASE(15)
        ROWS_CASE(16)
    }
}

INLINE void linear(const char *x, int64_t x_ld, int64_t M, int64_t K, const char *wp, int64_t N, const char *bias,
                   const char *res, int64_t r_ld, char *out, int64_t out_ld, int nthreads, const int bf) {
    const int es = bf ? 2 : 4;
    const int64_t NB = (N + 15) / 16, block_bytes = K * 16 * es;
    const int rows = M <= 16 ? 16 : 12; /* past 16, blocks of 12 rows: the lines come from cache */
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nb = 0; nb < NB; nb++) {
        const int64_t cols = N - nb * 16 < 16 ? N - nb * 16 : 16;
        for (int64_t m0 = 0; m0 < M; m0 += rows) {
            const int mr = M - m0 < rows ? (int)(M - m0) : rows;
            rows_any(x + m0 * x_ld * es, x_ld, mr, K, wp + nb * block_bytes, bias ? bias + nb * 16 * es : NULL,
                     res ? res + (m0 * r_ld + nb * 16) * es : NULL, r_ld, out + (m0 * out_ld + nb * 16) * es, out_ld,
                     cols, m0 == 0, bf);
        }
    }
}

/* which dtypes this build multiplies: bf16 needs AVX512_BF16 */
int agentkv_linear_available(int bf) {
#if defined(__AVX512BF16__)
    (void)bf;
    return 1;
#else
    return !bf;
#endif
}

/* x [M, K] (row stride x_ld), wp packed from W [K, N], bias [N] or NULL, res [M, N] (stride r_ld) or
   NULL, out [M, N] (stride out_ld), all of one dtype. Column blocks are split over the threads in
   runs, so each thread streams one contiguous part of wp. */
void agentkv_linear(int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const void *wp, int64_t N,
                    const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld, int nthreads) {
    if (bf && !agentkv_linear_available(1)) abort(); /* callers ask agentkv_linear_available first */
    if (bf) linear(x, x_ld, M, K, wp, N, bias, res, r_ld, out, out_ld, nthreads, 1);
    else linear(x, x_ld, M, K, wp, N, bias, res, r_ld, out, out_ld, nthreads, 0);
}

/* agentkv_linear's column blocks [nb0, nb1) of x's M <= 16 rows, fp32, on the calling thread: the same bits
   for those columns (a block's sums never depend on the others), for a thread's share of the native decode step
   (its mixture of experts' router) */
void agentkv_linear_blocks(const float *x, int64_t x_ld, int64_t M, int64_t K, const float *wp, int64_t N,
                           const float *bias, int64_t nb0, int64_t nb1, float *out, int64_t out_ld) {
    for (int64_t nb = nb0; nb < nb1; nb++) {
        const int64_t cols = N - nb * 16 < 16 ? N - nb * 16 : 16;
        const char *b = bias ? (const char *)(bias + nb * 16) : NULL;
        rows_any((const char *)x, x_ld, (int)M, K, (const char *)(wp + nb * K * 16), b, NULL, 0,
                 (char *)(out + nb * 16), out_ld, cols, 1, 0);
    }
}

#else

int agentkv_linear_available(int bf) { (void)bf; return 0; } /* and no agentkv_linear: torch's linears run */

/* (the native step takes no router where agentkv_linear is absent: never called) */
void agentkv_linear_blocks(const float *x, int64_t x_ld, int64_t M, int64_t K, const float *wp, int64_t N,
                           const float *bias, int64_t nb0, int64_t nb1, float *out, int64_t out_ld) {
    (void)x, (void)x_ld, (void)M, (void)K, (void)wp, (void)N, (void)bias, (void)nb0, (void)nb1, (void)out, (void)out_ld;
    abort();
}

#endif
