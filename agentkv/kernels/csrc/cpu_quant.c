/* y = x @ W^T (+ bias) (+ residual) with W kept in GGUF's quantized blocks, dequantized in the inner loop.

W is [N][K] as llama.cpp stores it: each output's row is K/32 blocks of 32 weights, one scale (and for
Q4_1 a minimum) per block:
  Q8_0 (34 bytes): fp16 d, int8 q[32]            w = d * q
  Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles    w = d * (q - 8)
  Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes       w = d * q + m
(byte j holds weight j in its low nibble and weight j + 16 in its high one). A decode step reads each
row once: 0.56-1.06 bytes a weight against bf16's 2, and the block is turned into fp32 in registers
while the x rows (at most MAX_M of them, converted to fp32 once a call) take it. Written as plain C
loops over 32 lanes that the compiler vectorizes for the machine (-march=native: AVX-512 or AVX2).
Longer inputs (prefill) are the caller's: it dequantizes the weight once (agentkv_qdequant) and
multiplies with torch. */

#include <stdlib.h>

#include "cpu_kernels.h"

#define QK 32
#define MAX_M 16

enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };
static const int BLOCK_BYTES[3] = {34, 18, 20};

INLINE float half_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (e == 0) { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((e + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* one block's 32 weights as fp32 */
INLINE void dequant_block(const int qtype, const uint8_t *b, float *w) {
    if (qtype == Q8_0) {
        const float d = half_to_f32(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int i = 0; i < QK; i++) w[i] = d * (float)q[i];
    } else if (qtype == Q4_0) {
        const float d = half_to_f32(b);
        const uint8_t *q = b + 2;
        for (int i = 0; i < QK / 2; i++) {
            w[i] = d * (float)((int)(q[i] & 15) - 8);
            w[i + QK / 2] = d * (float)((int)(q[i] >> 4) - 8);
        }
    } else {
        const float d = half_to_f32(b), m = half_to_f32(b + 2);
        const uint8_t *q = b + 4;
        for (int i = 0; i < QK / 2; i++) {
            w[i] = d * (float)(q[i] & 15) + m;
            w[i + QK / 2] = d * (float)(q[i] >> 4) + m;
        }
    }
}

INLINE void qlinear_body(const int qtype, const int bf, const float *xf, int64_t M, int64_t K, const uint8_t *w,
                         int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                         int nthreads) {
    const int64_t nb = K / QK, rb = nb * BLOCK_BYTES[qtype];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * nb * M > 4096)
    for (int64_t n = 0; n < N; n++) {
        float acc[MAX_M][QK];
        for (int64_t m = 0; m < M; m++)
            for (int i = 0; i < QK; i++) acc[m][i] = 0.f;
        const uint8_t *row = w + n * rb;
        for (int64_t b = 0; b < nb; b++) {
            float wf[QK];
            dequant_block(qtype, row + b * BLOCK_BYTES[qtype], wf);
            for (int64_t m = 0; m < M; m++) {
                const float *xb = xf + m * K + b * QK;
#pragma omp simd
                for (int i = 0; i < QK; i++) acc[m][i] += xb[i] * wf[i];
            }
        }
        for (int64_t m = 0; m < M; m++) {
            float v = 0.f;
            for (int i = 0; i < QK; i++) v += acc[m][i];
            if (bias) v += load1(bias, n, bf);
            if (res) v += load1(res, m * r_ld + n, bf);
            store1(out, m * out_ld + n, v, bf);
        }
    }
}

/* x [M, K] (row stride x_ld; bf16 or fp32), w [N][K/32 blocks], out [M, N] (row stride out_ld), bias [N]
   and residual [M, N] (row stride r_ld) optional, in x's dtype. Returns 0, 1 for K not a multiple of
   32 or a bad type, 2 for M over MAX_M (nothing done then). */
int agentkv_qlinear(int qtype, int bf, const void *x, int64_t x_ld, int64_t M, int64_t K, const uint8_t *w,
                    int64_t N, const void *bias, const void *res, int64_t r_ld, void *out, int64_t out_ld,
                    int nthreads) {
    if (K % QK || qtype < 0 || qtype > Q4_1) return 1;
    if (M < 1 || M > MAX_M) return 2;
    float *xs = malloc((size_t)(M * K) * sizeof(float));  /* x in fp32, once */
    if (!xs) return 2;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) xs[m * K + k] = load1(x, m * x_ld + k, bf);
#define CASE(Q, B) qlinear_body(Q, B, xs, M, K, w, N, bias, res, r_ld, out, out_ld, nthreads)
    if (qtype == Q8_0) { if (bf) CASE(Q8_0, 1); else CASE(Q8_0, 0); }
    else if (qtype == Q4_0) { if (bf) CASE(Q4_0, 1); else CASE(Q4_0, 0); }
    else { if (bf) CASE(Q4_1, 1); else CASE(Q4_1, 0); }
#undef CASE
    free(xs);
    return 0;
}

/* rows `rows[0..n)` of w (all N rows in order when rows is NULL), dequantized into out [n, K] (row
   stride out_ld; bf16 or fp32): an embedding lookup, or a whole weight for a long input. */
int agentkv_qdequant(int qtype, int bf, const uint8_t *w, int64_t N, int64_t K, const int64_t *rows, int64_t n,
                     void *out, int64_t out_ld, int nthreads) {
    if (K % QK || qtype < 0 || qtype > Q4_1) return 1;
    for (int64_t r = 0; r < n; r++)
        if (rows && (rows[r] < 0 || rows[r] >= N)) return 3;
    const int64_t nb = K / QK, rb = nb * BLOCK_BYTES[qtype];
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n * nb > 256)
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = w + (rows ? rows[r] : r) * rb;
        for (int64_t b = 0; b < nb; b++) {
            float wf[QK];
            if (qtype == Q8_0) dequant_block(Q8_0, row + b * BLOCK_BYTES[Q8_0], wf);
            else if (qtype == Q4_0) dequant_block(Q4_0, row + b * BLOCK_BYTES[Q4_0], wf);
            else dequant_block(Q4_1, row + b * BLOCK_BYTES[Q4_1], wf);
            for (int i = 0; i < QK; i++) store1(out, r * out_ld + b * QK + i, wf[i], bf);
        }
    }
    return 0;
}
