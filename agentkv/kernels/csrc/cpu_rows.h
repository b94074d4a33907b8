/* The per-row bodies of the element-wise steps (RMSNorm, silu(gate) * up or GELU's, the rotation), shared by
their entry points (cpu_elementwise.c) and the native decode step (cpu_step.c), so both round alike. */

#ifndef AGENTKV_CPU_ROWS_H
#define AGENTKV_CPU_ROWS_H

#include "cpu_kernels.h"

#define ES(bf) ((bf) ? 2 : 4) /* bytes per element */
#define AT(p, i, bf) ((const char *)(p) + (int64_t)(i) * ES(bf))
#define AT_MUT(p, i, bf) ((char *)(p) + (int64_t)(i) * ES(bf))

/* RMSNorm of one row of n: bf16 as HF's LlamaRMSNorm (normalized in fp32, rounded, times the weight) */
INLINE void rms_row(const void *x, const void *w, int64_t n, float eps, void *out, const int bf, const int generic) {
#if AGENTKV_AVX512
    if (!generic && n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            __m512 v = load16(AT(x, i, bf), bf);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        const __m512 inv = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
        for (int64_t i = 0; i < n; i += 16) {
            __m512 v = _mm512_mul_ps(load16(AT(x, i, bf), bf), inv);
            store16(AT_MUT(out, i, bf), _mm512_mul_ps(load16(AT(w, i, bf), bf), bf ? through_bf16_16(v) : v), bf);
        }
        return;
    }
#endif
    (void)generic;
    float ss = 0.f;
    for (int64_t i = 0; i < n; i++) {
        float v = load1(x, i, bf);
        ss += v * v;
    }
    const float inv = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) {
        float v = load1(x, i, bf) * inv;
        store1(out, i, load1(w, i, bf) * (bf ? through_bf16(v) : v), bf);
    }
}

#define GELU_K 0.7978845608f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* act(gate) * up over one row, act silu or (gelu) GELU's tanh form: 0.5 x (1 + tanh(y)) is x / (1 + e^-2y),
   y = sqrt(2 / pi) (x + 0.044715 x^3), silu's form with another exponent. bf16 as HF's MLP: the
   activation rounded to bf16, then the product rounded. Where limit > 0, gpt-oss's clamped SwiGLU instead:
   gate clamped above and up on both sides to limit, gate * sigmoid(alpha gate) * (up + 1) */
INLINE void glu_row(const void *g, const void *u, int64_t n, void *out, const int bf, const int gelu,
                    const float limit, const float alpha, const int generic) {
    const int clamp = limit > 0.f;
#if AGENTKV_AVX512
    if (!generic && n % 16 == 0) {
        const __m512 one = _mm512_set1_ps(1.f), c = _mm512_set1_ps(GELU_C), k2 = _mm512_set1_ps(-2.f * GELU_K);
        const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit), na = _mm512_set1_ps(-alpha);
        for (int64_t i = 0; i < n; i += 16) {
            __m512 gv = load16(AT(g, i, bf), bf), uv = load16(AT(u, i, bf), bf);
            if (clamp) {
                gv = _mm512_min_ps(gv, hi);
                uv = _mm512_add_ps(_mm512_max_ps(_mm512_min_ps(uv, hi), lo), one);
            }
            const __m512 e = gelu ? _mm512_mul_ps(k2, _mm512_fmadd_ps(_mm512_mul_ps(c, gv), _mm512_mul_ps(gv, gv), gv))
                             : clamp ? _mm512_mul_ps(na, gv) : _mm512_sub_ps(_mm512_setzero_ps(), gv);
            __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(e)));
            store16(AT_MUT(out, i, bf), _mm512_mul_ps(bf ? through_bf16_16(s) : s, uv), bf);
        }
        return;
    }
#endif
    (void)generic;
    for (int64_t i = 0; i < n; i++) {
        float gv = load1(g, i, bf), uv = load1(u, i, bf);
        if (clamp) {
            gv = fminf(gv, limit);
            uv = fmaxf(fminf(uv, limit), -limit) + 1.f;
        }
        const float e = gelu ? -2.f * GELU_K * fmaf(GELU_C * gv, gv * gv, gv) : clamp ? -alpha * gv : -gv;
        float s = gv / (1.f + exp_approx(e));
        store1(out, i, (bf ? through_bf16(s) : s) * uv, bf);
    }
}

/* one head of D rotated in place by the fp32 rows c, s: half-split (NeoX / HF), fp32, rounded once */
INLINE void rope_head(void *x, int64_t D, const float *c, const float *s, const int bf, const int generic) {
    const int64_t half = D / 2;
#if AGENTKV_AVX512
    if (!generic && half % 16 == 0) {
        for (int64_t j = 0; j < half; j += 16) {
            __m512 a = load16(AT(x, j, bf), bf), b = load16(AT(x, j + half, bf), bf);
            __m512 lo = _mm512_fmsub_ps(a, _mm512_loadu_ps(c + j), _mm512_mul_ps(b, _mm512_loadu_ps(s + j)));
            __m512 hi = _mm512_fmadd_ps(b, _mm512_loadu_ps(c + j + half), _mm512_mul_ps(a, _mm512_loadu_ps(s + j + half)));
            store16(AT_MUT(x, j, bf), lo, bf);
            store16(AT_MUT(x, j + half, bf), hi, bf);
        }
        return;
    }
#endif
    (void)generic;
    for (int64_t j = 0; j < half; j++) {
        float a = load1(x, j, bf), b = load1(x, j + half, bf);
        store1(x, j, a * c[j] - b * s[j], bf);
        store1(x, j + half, b * c[j + half] + a * s[j + half], bf);
    }
}

#endif
