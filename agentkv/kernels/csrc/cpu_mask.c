/* A grammar's token mask applied to rows of logits, and each row's best allowed tokens: the constrained
part of the sampler's step (engine/sampler.py) in one read of each row and its mask.

torch's form of the same (the bits unpacked to a bool row, masked_fill, any, topk over the vocabulary)
is some ten ops of 10-130 us each on a 49k vocabulary, run on the step's critical path after the forward
pass, where the native pool's threads still hold the cores; here it is one thread over the row. */

#include "cpu_kernels.h"

/* Insert (t, v) into the row's best list ids/vals (c of k held, by value descending); an equal value
goes after those already held, so ties keep the lower token id ahead (tokens come in id order). */
INLINE int64_t best_insert(int64_t *ids, float *vals, int64_t c, int64_t k, int64_t t, float v) {
    int64_t j = c < k ? c : k - 1;
    while (j > 0 && vals[j - 1] < v) {
        vals[j] = vals[j - 1];
        ids[j] = ids[j - 1];
        j--;
    }
    vals[j] = v;
    ids[j] = t;
    return c < k ? c + 1 : c;
}

/* The tokens of a word's allowed bits b whose logits are above thr (a bit each), the disallowed ones of the
word's m tokens set to -inf first. */
INLINE uint32_t word_mask_plain(float *x, int64_t m, uint32_t b, float thr) {
    uint32_t above = 0;
    for (int64_t i = 0; i < m; i++) {
        if (!((b >> i) & 1u)) x[i] = -INFINITY;
        else if (x[i] > thr) above |= 1u << i;
    }
    return above;
}

#if AGENTKV_AVX512
INLINE uint32_t word_mask_avx512(float *x, uint32_t b, float thr) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), t = _mm512_set1_ps(thr);
    const __mmask16 lo = (__mmask16)b, hi = (__mmask16)(b >> 16);
    if (b != 0xffffffffu) {
        _mm512_mask_storeu_ps(x, (__mmask16)~lo, ninf);
        _mm512_mask_storeu_ps(x + 16, (__mmask16)~hi, ninf);
        if (b == 0) return 0;
    }
    const __mmask16 a = _mm512_mask_cmp_ps_mask(lo, _mm512_loadu_ps(x), t, _CMP_GT_OQ);
    const __mmask16 c = _mm512_mask_cmp_ps_mask(hi, _mm512_loadu_ps(x + 16), t, _CMP_GT_OQ);
    return (uint32_t)a | ((uint32_t)c << 16);
}
#endif

/* Row r of `logits` (n rows, `ls` floats apart, V tokens) gets -inf where bit t % 32 of word t / 32 of its
mask row (W int32 words a row, rows W apart) is 0; bits at or past V are ignored. alive[r] = 1 where a token
below V is allowed. With k > 0, ids / vals [n, k]: the row's k largest allowed logits above -inf, by value
descending, ties to the lower id, then -1 / -inf where fewer are allowed. The rows are written in place.
`generic`: the plain-C body on a CPU with AVX-512 too (the tests compare them). */
void agentkv_mask_logits(float *logits, int64_t ls, int64_t n, int64_t V, const int32_t *bitmask, int64_t W,
                         int64_t k, int64_t *ids, float *vals, uint8_t *alive, int generic) {
    (void)generic;
    for (int64_t r = 0; r < n; r++) {
        float *row = logits + r * ls;
        const uint32_t *bits = (const uint32_t *)(bitmask + r * W);
        int64_t *rid = ids + r * k;
        float *rval = vals + r * k;
        int64_t c = 0;
        int any = 0;
        for (int64_t w = 0; w < W && w * 32 < V; w++) {
            const int64_t base = w * 32, m = V - base < 32 ? V - base : 32;
            uint32_t b = bits[w];
            if (m < 32) b &= (1u << m) - 1u;
            any |= b != 0;
            /* the k-th best so far: only a token above it can enter the list (-inf: any allowed one can) */
            const float thr = k > 0 && c == k ? rval[k - 1] : -INFINITY;
            uint32_t above;
#if AGENTKV_AVX512
            if (!generic && m == 32) above = word_mask_avx512(row + base, b, thr);
            else
#endif
                above = word_mask_plain(row + base, m, b, thr);
            if (k == 0) continue;
            for (; above; above &= above - 1) {
                const int i = __builtin_ctz(above);
                const float v = row[base + i];
                if (c < k || v > rval[k - 1]) c = best_insert(rid, rval, c, k, base + i, v);
            }
        }
        for (int64_t j = c; j < k; j++) {
            rid[j] = -1;
            rval[j] = -INFINITY;
        }
        alive[r] = (uint8_t)any;
    }
}
