/* The element-wise steps of a decoder layer, one call each instead of the 3-8 torch ops they take:
RMSNorm, silu(gate) * up (or GELU's), and the rotary embedding (in place). bf16 results are rounded where HF's
bf16 modules round (see each), so they match them up to the last bit of a sum or an exp.

Each has an AVX-512 body for rows whose length is a multiple of 16 and a plain-C body for the rest
(and for other CPUs); `generic` in the entry points forces the plain one (tests). */

#include "cpu_rows.h"

/* out [rows * heads, n]: row (r, h) of x at x + r * x_ld + h * n (heads = 1 but for per-head q/k norms) */
void agentkv_rms_norm(int bf, const void *x, int64_t x_ld, int64_t heads, const void *w, int64_t rows, int64_t n,
                      float eps, void *out, int nthreads, int generic) {
    const int64_t total = rows * heads;
#pragma omp parallel for num_threads(nthreads) if (total * n >= 65536)
    for (int64_t r = 0; r < total; r++) {
        const void *in = AT(x, (r / heads) * x_ld + (r % heads) * n, bf);
        if (bf) rms_row(in, w, n, eps, AT_MUT(out, r * n, 1), 1, generic);
        else rms_row(in, w, n, eps, AT_MUT(out, r * n, 0), 0, generic);
    }
}

/* out [rows, n] = act(gate) * up, act silu or (gelu) GELU's tanh form, or where limit > 0 gpt-oss's clamped
   SwiGLU (glu_row); gate and up are the two halves of gu's rows [rows, 2n] (row stride ld) */
void agentkv_glu_mul(int bf, int gelu, float limit, float alpha, const void *gu, int64_t ld, int64_t rows, int64_t n,
                     void *out, int nthreads, int generic) {
#pragma omp parallel for num_threads(nthreads) if (rows * n >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        if (bf)
            glu_row(AT(gu, r * ld, 1), AT(gu, r * ld + n, 1), n, AT_MUT(out, r * n, 1), 1, gelu, limit, alpha, generic);
        else
            glu_row(AT(gu, r * ld, 0), AT(gu, r * ld + n, 0), n, AT_MUT(out, r * n, 0), 0, gelu, limit, alpha, generic);
    }
}

/* x [T, heads, D] (token stride x_ld, heads contiguous); cos/sin [positions, D] fp32, row pos[t]; the
   first `rot` dims of each head rotate (partial rotary), the others are left as they are */
void agentkv_rope(int bf, void *x, int64_t x_ld, int64_t T, int64_t heads, int64_t D, int64_t rot,
                  const int64_t *pos, const float *cos_t, const float *sin_t, int nthreads, int generic) {
#pragma omp parallel for num_threads(nthreads) if (T * heads * D >= 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_t + pos[t] * D, *s = sin_t + pos[t] * D;
        for (int64_t h = 0; h < heads; h++) {
            if (bf) rope_head(AT_MUT(x, t * x_ld + h * D, 1), rot, c, s, 1, generic);
            else rope_head(AT_MUT(x, t * x_ld + h * D, 0), rot, c, s, 0, generic);
        }
    }
}
