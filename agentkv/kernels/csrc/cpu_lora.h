/* A LoRA adapter's update of a linear, y += ((x A^T) B^T) * scale, a row at a time: what the Python path's
entry point (cpu_lora.c) and the native decode step (cpu_step.c) both call, so their sums are the same bits.

An update is split in its two products (Punica's and S-LoRA's shrink and expand): `lora_shrink` takes a row
x [K] to t [rank] (one dot product of K per rank), `lora_expand` adds t's product with B, times the scale
(alpha / r), to a range of the linear's output columns, as PEFT rounds it. A fused linear (q, k and v side
by side; gate and up) has one piece per part the adapter targets, each with its own A, B and output columns.
A and B are fp32 or bf16 (an adapter saved in bf16 is kept so: half the bytes a decode step reads), products
and sums in fp32. An output column's sum runs over the rank in order, whatever range it is computed in, so
a thread's share of the columns does not change its bits. */

#ifndef AGENTKV_CPU_LORA_H
#define AGENTKV_CPU_LORA_H

#include "cpu_kernels.h"

#define LORA_PIECES 3 /* q, k, v */
#define LORA_TARGETS 4 /* qkv, o, gate_up, down: a layer's linears, in this order */
#define LORA_MAX_RANK 768 /* a linear's pieces' ranks together (each at most 256: engine/lora/adapter.py) */

typedef struct {
    const void *a;       /* [rank, K]: PEFT's lora_A */
    const void *bt;      /* [rank, n]: lora_B transposed */
    int64_t rank, n0, n; /* the update's outputs: the linear's columns n0 .. n0 + n */
    int64_t bf;          /* A and B hold bf16, else fp32 */
    float scale;
} LoraPiece;

typedef struct {
    int64_t pieces, rank; /* rank: all pieces' ranks (t's length) */
    LoraPiece piece[LORA_PIECES];
} LoraMat;

typedef struct {
    LoraMat mat[LORA_TARGETS];
} LoraLayer;

/* one adapter: its layers' updates ([layers], a linear it leaves alone with no pieces) */
typedef struct {
    const LoraLayer *layer;
} LoraAdapter;

#if AGENTKV_AVX512
/* 16 values of an fp32 or bf16 row from i, those past `mk` zero */
INLINE __m512 lora_load(const void *p, int64_t i, __mmask16 mk, const int bf) {
    if (bf)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const bf16 *)p + i)), 16));
    return _mm512_maskz_loadu_ps(mk, (const float *)p + i);
}
#endif

INLINE float lora_dot(const void *a, const float *x, int64_t K, const int bf, int generic) {
#if AGENTKV_AVX512
    if (!generic) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k += 16) {
            const __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
            acc = _mm512_fmadd_ps(lora_load(a, k, m, bf), _mm512_maskz_loadu_ps(m, x + k), acc);
        }
        return _mm512_reduce_add_ps(acc);
    }
#endif
    (void)generic;
    float acc[16] = {0};
    for (int64_t k = 0; k < K; k++) acc[k % 16] += load1(a, k, bf) * x[k];
    float s = 0.f;
    for (int i = 0; i < 16; i++) s += acc[i];
    return s;
}

#if AGENTKV_AVX512
/* t[j] for 4 ranks side by side: x read once for the four, each rank's sum in lora_dot's order (its own
   accumulator, the same lanes, the same reduction), so its bits are lora_dot's */
INLINE void lora_dot4(const void *a, int64_t K, const float *x, const int bf, float *t) {
    const size_t row = (size_t)K * (bf ? 2 : 4);
    const char *a0 = (const char *)a;
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
        c0 = _mm512_fmadd_ps(lora_load(a0, k, m, bf), xv, c0);
        c1 = _mm512_fmadd_ps(lora_load(a0 + row, k, m, bf), xv, c1);
        c2 = _mm512_fmadd_ps(lora_load(a0 + 2 * row, k, m, bf), xv, c2);
        c3 = _mm512_fmadd_ps(lora_load(a0 + 3 * row, k, m, bf), xv, c3);
    }
    t[0] = _mm512_reduce_add_ps(c0), t[1] = _mm512_reduce_add_ps(c1);
    t[2] = _mm512_reduce_add_ps(c2), t[3] = _mm512_reduce_add_ps(c3);
}
#endif

#if AGENTKV_AVX512
/* lora_dot4 for `rows` (2-4) rows of x (`xld` apart) at once: A read once for them; t[r * tld + q] */
INLINE void lora_dot4_rows(const void *a, int64_t K, const float *x, int64_t xld, int rows, const int bf, float *t,
                           int64_t tld) {
    const size_t row = (size_t)K * (bf ? 2 : 4);
    const char *a0 = (const char *)a;
    __m512 c[4][4];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        const __m512 a0v = lora_load(a0, k, m, bf), a1v = lora_load(a0 + row, k, m, bf);
        const __m512 a2v = lora_load(a0 + 2 * row, k, m, bf), a3v = lora_load(a0 + 3 * row, k, m, bf);
        for (int r = 0; r < 4; r++) {
            if (r >= rows) break;
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * xld + k);
            c[r][0] = _mm512_fmadd_ps(a0v, xv, c[r][0]), c[r][1] = _mm512_fmadd_ps(a1v, xv, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(a2v, xv, c[r][2]), c[r][3] = _mm512_fmadd_ps(a3v, xv, c[r][3]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++) t[r * tld + q] = _mm512_reduce_add_ps(c[r][q]);
}
#endif

/* t[j] for the ranks j0 <= j < j1 of the pieces' ranks in order (a thread's share of one row's shrink): each
   rank's number lora_shrink's */
INLINE void lora_shrink_range(const LoraMat *m, const float *x, int64_t K, float *t, int64_t j0, int64_t j1,
                              int generic) {
    for (int64_t p = 0, at = 0; p < m->pieces; p++) {
        const LoraPiece *pc = m->piece + p;
        const int bf = (int)pc->bf;
        const size_t row = (size_t)K * (bf ? 2 : 4);
        int64_t j = (j0 > at ? j0 : at) - at;
        const int64_t end = (j1 < at + pc->rank ? j1 : at + pc->rank) - at;
#if AGENTKV_AVX512
        if (!generic)
            for (; j + 4 <= end; j += 4) {
                if (bf) lora_dot4((const char *)pc->a + j * row, K, x, 1, t + at + j);
                else lora_dot4((const char *)pc->a + j * row, K, x, 0, t + at + j);
            }
#endif
        for (; j < end; j++)
            t[at + j] = bf ? lora_dot((const char *)pc->a + j * row, x, K, 1, generic)
                           : lora_dot((const char *)pc->a + j * row, x, K, 0, generic);
        at += pc->rank;
    }
}

/* lora_shrink of `rows` (1-4) rows of x (`xld` apart) into t (`tld` apart), A read once for them; each row's
   numbers those of lora_shrink alone */
INLINE void lora_shrink_rows(const LoraMat *m, const float *x, int64_t xld, int rows, int64_t K, float *t,
                             int64_t tld, int generic) {
    if (rows == 1) {
        lora_shrink_range(m, x, K, t, 0, m->rank, generic);
        return;
    }
    for (int64_t p = 0, at = 0; p < m->pieces; p++) {
        const LoraPiece *pc = m->piece + p;
        const int bf = (int)pc->bf;
        const size_t row = (size_t)K * (bf ? 2 : 4);
        int64_t j = 0;
#if AGENTKV_AVX512
        if (!generic)
            for (; j + 4 <= pc->rank; j += 4) {
                if (bf) lora_dot4_rows((const char *)pc->a + j * row, K, x, xld, rows, 1, t + at + j, tld);
                else lora_dot4_rows((const char *)pc->a + j * row, K, x, xld, rows, 0, t + at + j, tld);
            }
#endif
        for (int r = 0; r < rows; r++)
            for (int64_t jj = j; jj < pc->rank; jj++)
                t[r * tld + at + jj] = bf ? lora_dot((const char *)pc->a + jj * row, x + r * xld, K, 1, generic)
                                          : lora_dot((const char *)pc->a + jj * row, x + r * xld, K, 0, generic);
        at += pc->rank;
    }
}

/* t [m->rank] = x [K] times every piece's A, the pieces' ranks in order */
INLINE void lora_shrink(const LoraMat *m, const float *x, int64_t K, float *t, int generic) {
    lora_shrink_range(m, x, K, t, 0, m->rank, generic);
}

#if AGENTKV_AVX512
INLINE __mmask16 lora_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* y[r] += (t[r] B) * scale over 64 columns from i (those before hi) for `rows` (1-4) rows whose t and y are
   `tld` and `yld` apart: four chains of FMAs a row in flight, B read once for the rows, each column's sum in
   the order of one column alone (over the rank, then times the scale) */
INLINE void lora_cols(const LoraPiece *pc, const float *tp, int64_t tld, int rows, int64_t i, int64_t hi,
                      float *yp, int64_t yld, const int bf) {
    const __mmask16 m0 = lora_mask(hi - i), m1 = lora_mask(hi - i - 16), m2 = lora_mask(hi - i - 32),
                    m3 = lora_mask(hi - i - 48);
    __m512 d[4][4];
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < 4; b++) d[r][b] = _mm512_setzero_ps();
    const void *bt = pc->bt;
    const int64_t es = bf ? 2 : 4;
    for (int64_t j = 0; j < pc->rank; j++) {
        const int64_t at = j * pc->n + i;
        /* the row's next 64 columns, while these are summed (16 rows of B a rank apart: more streams than
           the hardware's prefetcher follows) */
        _mm_prefetch((const char *)bt + (at + 64) * es, _MM_HINT_T0);
        _mm_prefetch((const char *)bt + (at + 64) * es + 64, _MM_HINT_T0);
        const __m512 b0 = lora_load(bt, at, m0, bf), b1 = lora_load(bt, at + 16, m1, bf);
        const __m512 b2 = lora_load(bt, at + 32, m2, bf), b3 = lora_load(bt, at + 48, m3, bf);
        for (int r = 0; r < 4; r++) {
            if (r >= rows) break;
            const __m512 tj = _mm512_set1_ps(tp[r * tld + j]);
            d[r][0] = _mm512_fmadd_ps(tj, b0, d[r][0]), d[r][1] = _mm512_fmadd_ps(tj, b1, d[r][1]);
            d[r][2] = _mm512_fmadd_ps(tj, b2, d[r][2]), d[r][3] = _mm512_fmadd_ps(tj, b3, d[r][3]);
        }
    }
    const __m512 scale = _mm512_set1_ps(pc->scale);
    const __mmask16 mk[4] = {m0, m1, m2, m3};
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < 4; b++) {
            float *yb = yp + r * yld + i + b * 16;
            _mm512_mask_storeu_ps(yb, mk[b], _mm512_add_ps(_mm512_maskz_loadu_ps(mk[b], yb),
                                                           _mm512_mul_ps(d[r][b], scale)));
        }
}
#endif

/* rows (1-4) rows' columns [c0, c1) (of the linear's) += their t's product with the pieces' B there, times
   the scale; row r's t and y at t + r tld and y + r yld */
INLINE void lora_expand_rows(const LoraMat *m, const float *t, int64_t tld, int rows, int64_t c0, int64_t c1, float *y,
                             int64_t yld, int generic) {
    for (int64_t p = 0, at = 0; p < m->pieces; p++) {
        const LoraPiece *pc = m->piece + p;
        const float *tp = t + at;
        at += pc->rank;
        const int64_t lo = (c0 > pc->n0 ? c0 : pc->n0) - pc->n0, hi = (c1 < pc->n0 + pc->n ? c1 : pc->n0 + pc->n) - pc->n0;
        float *yp = y + pc->n0;
        const int bf = (int)pc->bf;
        int64_t i = lo;
#if AGENTKV_AVX512
        if (!generic) {
            for (; i < hi; i += 64) {  /* (rows a constant in each call: the sums stay in registers) */
                switch (rows * 2 + bf) {
                case 2: lora_cols(pc, tp, tld, 1, i, hi, yp, yld, 0); break;
                case 3: lora_cols(pc, tp, tld, 1, i, hi, yp, yld, 1); break;
                case 4: lora_cols(pc, tp, tld, 2, i, hi, yp, yld, 0); break;
                case 5: lora_cols(pc, tp, tld, 2, i, hi, yp, yld, 1); break;
                case 6: lora_cols(pc, tp, tld, 3, i, hi, yp, yld, 0); break;
                case 7: lora_cols(pc, tp, tld, 3, i, hi, yp, yld, 1); break;
                case 8: lora_cols(pc, tp, tld, 4, i, hi, yp, yld, 0); break;
                default: lora_cols(pc, tp, tld, 4, i, hi, yp, yld, 1); break;
                }
            }
        }
#endif
        (void)generic;
        for (int r = 0; r < rows; r++)
            for (int64_t c = i; c < hi; c++) {
                float d = 0.f;
                for (int64_t j = 0; j < pc->rank; j++) d += tp[r * tld + j] * load1(pc->bt, j * pc->n + c, bf);
                yp[r * yld + c] += d * pc->scale;
            }
    }
}

/* y's columns [c0, c1) (of the linear's) += t's product with the pieces' B there, times their scale */
INLINE void lora_expand(const LoraMat *m, const float *t, int64_t c0, int64_t c1, float *y, int generic) {
    lora_expand_rows(m, t, 0, 1, c0, c1, y, 0, generic);
}

#endif
