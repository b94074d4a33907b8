/* A LoRA adapter's update of a linear, y += ((x A^T) B^T) * scale, a row at a time: what the Python path's
entry point (cpu_lora.c) and the native decode step (cpu_step.c) both call, so their sums are the same bits.

An update is split in its two products (Punica's and S-LoRA's shrink and expand): `lora_shrink` takes a row
x [K] to t [rank] (one dot product of K per rank), `lora_expand` adds t's product with B to a range of the
linear's output columns. A fused linear (q, k and v side by side; gate and up) has one piece per part the
adapter targets, each with its own A, B and output columns. The scale is in B (B^T times the adapter's
alpha / r at load). An output column's sum runs over the rank in order, whatever range it is computed in,
so a thread's share of the columns does not change its bits. */

#ifndef AGENTKV_CPU_LORA_H
#define AGENTKV_CPU_LORA_H

#include "cpu_kernels.h"

#define LORA_PIECES 3 /* q, k, v */
#define LORA_TARGETS 4 /* qkv, o, gate_up, down: a layer's linears, in this order */
#define LORA_MAX_RANK 768 /* a linear's pieces' ranks together (each at most 256: engine/lora/adapter.py) */

typedef struct {
    const float *a;      /* [rank, K]: PEFT's lora_A */
    const float *bt;     /* [rank, n]: lora_B transposed, times the scale */
    int64_t rank, n0, n; /* the update's outputs: the linear's columns n0 .. n0 + n */
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

INLINE float lora_dot(const float *a, const float *x, int64_t K, int generic) {
#if AGENTKV_AVX512
    if (!generic) {
        __m512 acc = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(x + k), acc);
        if (k < K) {
            const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, x + k), acc);
        }
        return _mm512_reduce_add_ps(acc);
    }
#endif
    (void)generic;
    float acc[16] = {0};
    for (int64_t k = 0; k < K; k++) acc[k % 16] += a[k] * x[k];
    float s = 0.f;
    for (int i = 0; i < 16; i++) s += acc[i];
    return s;
}

/* t [m->rank] = x [K] times every piece's A, the pieces' ranks in order */
INLINE void lora_shrink(const LoraMat *m, const float *x, int64_t K, float *t, int generic) {
    for (int64_t p = 0, at = 0; p < m->pieces; p++) {
        const LoraPiece *pc = m->piece + p;
        for (int64_t j = 0; j < pc->rank; j++) t[at + j] = lora_dot(pc->a + j * K, x, K, generic);
        at += pc->rank;
    }
}

/* y's columns [c0, c1) (of the linear's) += t's product with the pieces' B there */
INLINE void lora_expand(const LoraMat *m, const float *t, int64_t c0, int64_t c1, float *y, int generic) {
    for (int64_t p = 0, at = 0; p < m->pieces; p++) {
        const LoraPiece *pc = m->piece + p;
        const float *tp = t + at;
        at += pc->rank;
        const int64_t lo = (c0 > pc->n0 ? c0 : pc->n0) - pc->n0, hi = (c1 < pc->n0 + pc->n ? c1 : pc->n0 + pc->n) - pc->n0;
        float *yp = y + pc->n0;
        int64_t i = lo;
#if AGENTKV_AVX512
        if (!generic) {
            for (; i < hi; i += 16) {
                const __mmask16 mk = hi - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hi - i)) - 1);
                __m512 d = _mm512_setzero_ps();
                for (int64_t j = 0; j < pc->rank; j++)
                    d = _mm512_fmadd_ps(_mm512_set1_ps(tp[j]), _mm512_maskz_loadu_ps(mk, pc->bt + j * pc->n + i), d);
                _mm512_mask_storeu_ps(yp + i, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yp + i), d));
            }
        }
#endif
        (void)generic;
        for (; i < hi; i++) {
            float d = 0.f;
            for (int64_t j = 0; j < pc->rank; j++) d += tp[j] * pc->bt[j * pc->n + i];
            yp[i] += d;
        }
    }
}

#endif
