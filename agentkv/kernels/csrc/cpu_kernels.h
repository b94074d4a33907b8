/* Shared pieces of agentkv's CPU kernels: bf16 <-> fp32, a vectorizable exp, and the AVX-512 forms of both.

Every kernel takes its tensors as raw pointers with element strides, and an int `bf` that says whether
they hold bf16 (1) or fp32 (0). The kernels are written once as always-inline functions of `bf`, and
each entry point calls them with a constant: the compiler emits one specialized body per dtype.
Arithmetic is fp32 throughout; bf16 results are rounded once, to nearest even, as torch rounds. */

#ifndef AGENTKV_CPU_KERNELS_H
#define AGENTKV_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)  /* 16-bit lanes, 256-bit masks */
#include <immintrin.h>
#define AGENTKV_AVX512 1
#else
#define AGENTKV_AVX512 0
#endif

#define INLINE static inline __attribute__((always_inline))

/* this thread's number and its team's size inside a parallel region (0 and 1 built without OpenMP) */
#ifdef _OPENMP
#include <omp.h>
INLINE int omp_me(void) { return omp_get_thread_num(); }
INLINE int omp_threads(void) { return omp_get_num_threads(); }
#else
INLINE int omp_me(void) { return 0; }
INLINE int omp_threads(void) { return 1; }
#endif

typedef uint16_t bf16;

INLINE float bf16_to_f32(bf16 b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const int nan = (u & 0x7fffffffu) > 0x7f800000u; /* a NaN stays a NaN (quieted) */
    return (bf16)(nan ? (u >> 16) | 0x40 : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x rounded to bf16 and back (a bf16 intermediate of HF's computation) */
INLINE float through_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* element i of a bf16 (bf = 1) or fp32 (bf = 0) array */
INLINE float load1(const void *p, int64_t i, const int bf) {
    return bf ? bf16_to_f32(((const bf16 *)p)[i]) : ((const float *)p)[i];
}

INLINE void store1(void *p, int64_t i, float v, const int bf) {
    if (bf) ((bf16 *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* e^x for x in [-87, 88] (Cephes' expf: 2^n * p(r), within 2 ulp of the correctly rounded result);
   written with integer bit moves so that loops over it vectorize */
INLINE float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#if AGENTKV_AVX512
/* 16 elements of a bf16 or fp32 array as fp32 */
INLINE __m512 load16(const void *p, const int bf) {
    if (!bf) return _mm512_loadu_ps(p);
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* up to 16 elements (mask) of a bf16 or fp32 array as fp32, the other lanes 0 */
INLINE __m512 load16_masked(const void *p, __mmask16 mask, const int bf) {
    if (!bf) return _mm512_maskz_loadu_ps(mask, p);
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* each lane rounded to bf16 as f32_to_bf16 rounds, kept as fp32 bits (the low 16 bits zero) */
INLINE __m512i bf16_bits16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000)); /* a NaN stays a NaN (quieted) */
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
}

/* each lane rounded to bf16 and back (a bf16 intermediate of HF's computation) */
INLINE __m512 through_bf16_16(__m512 v) { return _mm512_castsi512_ps(bf16_bits16(v)); }

/* the lanes of `mask` stored to a bf16 or fp32 array */
INLINE void store16_masked(void *p, __m512 v, __mmask16 mask, const int bf) {
    if (!bf) _mm512_mask_storeu_ps(p, mask, v);
    else _mm512_mask_cvtepi32_storeu_epi16(p, mask, _mm512_srli_epi32(bf16_bits16(v), 16));
}

INLINE void store16(void *p, __m512 v, const int bf) {
    if (!bf) _mm512_storeu_ps(p, v);
    else _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits16(v), 16)));
}

/* exp_approx on 16 lanes (the same polynomial; -inf and x < -87 give e^-87, callers mask them) */
INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* lane i of the result is the sum of the 16 lanes of v[i] (a transpose-and-add in four levels) */
INLINE __m512 sum_lanes16(const __m512 *v) {
    __m512 s[8], u[4];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, 0x88), _mm512_shuffle_f32x4(y0, y1, 0xDD));
}
#endif

#endif
