/* GGUF's quantized blocks as the CPU kernels read them: the types, their sizes, fp16 scales, and each
block dequantized to fp32 (llama.cpp's dequantize_row_*), shared by the row-major kernels
(cpu_quant.c) and the tiled ones (cpu_tiles.c). */

#ifndef AGENTKV_CPU_BLOCKS_H
#define AGENTKV_CPU_BLOCKS_H

#include "cpu_kernels.h"
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32
#define MAX_M 16

#define QK_K 256

/* Q5_0, Q5_1 and IQ4_NL: blocks of 32 (fp16 d, Q5_1's fp16 m, Q5's 32 fifth bits, 16 bytes of nibbles);
   Q5_K and IQ4_XS: super-blocks of 256 (Q4_K's with 32 bytes of fifth bits; IQ4_XS: fp16 d, 6-bit scales
   of its 8 sub-blocks, IQ4_NL's codes); F16 and BF16 taken as blocks of 32 values. MXFP4 (gpt-oss's
   experts) is held as IQ4_NL's block: fp16 d (the file's power of two, which the loader checks fits) and
   the file's nibbles, codes into MXFP4_VALUES instead */
enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2, Q4_K = 3, Q6_K = 4, Q5_0 = 5, Q5_1 = 6, IQ4_NL = 7, Q5_K = 8, IQ4_XS = 9,
       F16 = 10, BF16 = 11, MXFP4 = 12, NQTYPES = 13 };
static const int BLOCK_BYTES[NQTYPES] = {34, 18, 20, 144, 210, 22, 24, 18, 176, 136, 64, 64, 18};
static const int BLOCK_WEIGHTS[NQTYPES] = {QK, QK, QK, QK_K, QK_K, QK, QK, QK, QK_K, QK_K, QK, QK, QK};
/* IQ4_NL's (and IQ4_XS's) values for its 16 codes (ggml-common.h: kvalues_iq4nl) */
static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's E2M1 values, doubled (ggml-common.h: kvalues_mxfp4; its scale is halved to match) */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* a 4-bit table type (IQ4_NL, MXFP4): a block of an fp16 d and 16 bytes of codes into the table */
INLINE int is_lut4(int qtype) { return qtype == IQ4_NL || qtype == MXFP4; }
INLINE const int8_t *lut4_values(int qtype) { return qtype == MXFP4 ? MXFP4_VALUES : IQ4_NL_VALUES; }

INLINE float half_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#endif
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

INLINE uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* a BF16 value at p (little-endian bytes) as fp32 */
INLINE float bf16_bytes_to_f32(const uint8_t *p) { return bf16_to_f32((bf16)(p[0] | p[1] << 8)); }

/* one block's 32 weights as fp32 (llama.cpp's dequantize_row_*; Q5_1's d q + m one fused multiply-add) */
INLINE void dequant_block(const int qtype, const uint8_t *b, float *w) {
    if (qtype == F16 || qtype == BF16) {
        for (int i = 0; i < QK; i++) w[i] = qtype == F16 ? half_to_f32(b + 2 * i) : bf16_bytes_to_f32(b + 2 * i);
    } else if (qtype == Q5_0 || qtype == Q5_1) {  /* weight j: nibble j (low: j < 16, high: j - 16), bit j of qh */
        const float d = half_to_f32(b), m = qtype == Q5_1 ? half_to_f32(b + 2) : 0.f;
        const uint32_t qh = load_u32(b + (qtype == Q5_1 ? 4 : 2));
        const uint8_t *q = b + (qtype == Q5_1 ? 8 : 6);
        for (int i = 0; i < QK / 2; i++) {
            const int lo = (q[i] & 15) | (int)((qh >> i) & 1) << 4, hi = (q[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            w[i] = qtype == Q5_0 ? d * (float)(lo - 16) : fmaf(d, (float)lo, m);
            w[i + QK / 2] = qtype == Q5_0 ? d * (float)(hi - 16) : fmaf(d, (float)hi, m);
        }
    } else if (is_lut4(qtype)) {
        const float d = half_to_f32(b);
        const uint8_t *q = b + 2;
        const int8_t *v = lut4_values(qtype);
        for (int i = 0; i < QK / 2; i++) {
            w[i] = d * (float)v[q[i] & 15];
            w[i + QK / 2] = d * (float)v[q[i] >> 4];
        }
    } else if (qtype == Q8_0) {
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

/* Q4_K's sub-block j (0..7): its 6-bit scale and minimum, packed in 12 bytes as llama.cpp's get_scale_min_k4 */
INLINE void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* a Q6_K super-block's 6-bit integers (0..63) in weight order (plain byte loops, vectorized) */
INLINE void q6k_integers(const uint8_t *b, uint8_t *q) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < QK_K; n += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            q[n + l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            q[n + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            q[n + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            q[n + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* IQ4_XS's sub-block j (0..7) scale, 6 bits less 32 */
INLINE int iq4xs_scale(const uint8_t *b, int j) {
    const int low = (b[4 + j / 2] >> 4 * (j % 2)) & 15, high = ((b[2] | b[3] << 8) >> 2 * j) & 3;
    return (low | high << 4) - 32;
}

/* one super-block's 256 weights as fp32 (llama.cpp's dequantize_row_q4_K / _q5_K / _q6_K / _iq4_xs) */
INLINE void dequant_superblock(const int qtype, const uint8_t *b, float *w) {
    if (qtype == Q5_K) {  /* Q4_K's, with column l of sub-block j's fifth bit at bit j of qh[l] */
        const float d = half_to_f32(b), dmin = half_to_f32(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
        for (int j = 0; j < QK_K / 64; j++, q += 32) {
            int s0, m0, s1, m1;
            scale_min_k4(2 * j, sc, &s0, &m0);
            scale_min_k4(2 * j + 1, sc, &s1, &m1);
            const float d0 = d * s0, c0 = dmin * m0, d1 = d * s1, c1 = dmin * m1;
            for (int l = 0; l < 32; l++) w[64 * j + l] = d0 * (float)((q[l] & 0xF) | ((qh[l] >> 2 * j) & 1) << 4) - c0;
            for (int l = 0; l < 32; l++)
                w[64 * j + 32 + l] = d1 * (float)((q[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4) - c1;
        }
    } else if (qtype == IQ4_XS) {
        const float d = half_to_f32(b);
        const uint8_t *q = b + 8;
        for (int j = 0; j < QK_K / QK; j++, q += 16) {
            const float dl = d * (float)iq4xs_scale(b, j);
            for (int l = 0; l < 16; l++) {
                w[32 * j + l] = dl * (float)IQ4_NL_VALUES[q[l] & 15];
                w[32 * j + 16 + l] = dl * (float)IQ4_NL_VALUES[q[l] >> 4];
            }
        }
    } else if (qtype == Q4_K) {  /* fp16 d, fp16 dmin, 12 bytes of scales and minimums, 128 bytes of nibbles */
        const float d = half_to_f32(b), dmin = half_to_f32(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int j = 0; j < QK_K / 64; j++, q += 32) {
            int s0, m0, s1, m1;
            scale_min_k4(2 * j, sc, &s0, &m0);
            scale_min_k4(2 * j + 1, sc, &s1, &m1);
            const float d0 = d * s0, c0 = dmin * m0, d1 = d * s1, c1 = dmin * m1;
            for (int l = 0; l < 32; l++) w[64 * j + l] = d0 * (float)(q[l] & 0xF) - c0;
            for (int l = 0; l < 32; l++) w[64 * j + 32 + l] = d1 * (float)(q[l] >> 4) - c1;
        }
    } else {  /* Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, fp16 d */
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half_to_f32(b + 208);
        uint8_t q[QK_K];  /* the 6-bit quants in weight order first, */
        q6k_integers(b, q);
        for (int g = 0; g < QK_K / 16; g++) {  /* then weight i's scale is sc[i / 16] */
            const float s = d * (float)sc[g];
            for (int i = 0; i < 16; i++) w[16 * g + i] = s * (float)((int)q[16 * g + i] - 32);
        }
    }
}

/* any type's block b of a row (32 weights, or 256 for a K-quant) as fp32 */
INLINE void dequant_any(const int qtype, const uint8_t *row, int64_t b, float *w) {
    const uint8_t *blk = row + b * BLOCK_BYTES[qtype];
    if (qtype == Q8_0) dequant_block(Q8_0, blk, w);
    else if (qtype == Q4_0) dequant_block(Q4_0, blk, w);
    else if (qtype == Q4_1) dequant_block(Q4_1, blk, w);
    else if (qtype == Q4_K) dequant_superblock(Q4_K, blk, w);
    else if (qtype == Q6_K) dequant_superblock(Q6_K, blk, w);
    else if (qtype == Q5_0) dequant_block(Q5_0, blk, w);
    else if (qtype == Q5_1) dequant_block(Q5_1, blk, w);
    else if (qtype == IQ4_NL) dequant_block(IQ4_NL, blk, w);
    else if (qtype == MXFP4) dequant_block(MXFP4, blk, w);
    else if (qtype == Q5_K) dequant_superblock(Q5_K, blk, w);
    else if (qtype == IQ4_XS) dequant_superblock(IQ4_XS, blk, w);
    else if (qtype == F16) dequant_block(F16, blk, w);
    else dequant_block(BF16, blk, w);
}

/* 32 values to one int8 block; rounding to nearest, ties away from zero, as llama.cpp's quantize_row_q8_0 */
INLINE void quantize_block32(const float *v, int8_t *q, float *d, int32_t *s, float *ds) {
    float amax = 0.f;
    for (int i = 0; i < QK; i++) {
        const float a = fabsf(v[i]);
        amax = a > amax ? a : amax;
    }
    const float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
    int32_t sum = 0;
    for (int i = 0; i < QK; i++) {
        /* roundf's value (ties away from zero) without its libm call, which kept the loop scalar: adding
           the float below 1/2 and truncating is exact for every float (checked for all |y| <= 130) */
        const float y = v[i] * id;
        const int qi = (int)(y + copysignf(0.49999997f, y));
        q[i] = (int8_t)qi;
        sum += qi;
    }
    *d = dd, *s = sum, *ds = dd * (float)sum;
}

#endif
