/* The native step's LoRA updates (cpu_step.c): each token's input shrunk by cpu_lora.h's row bodies in the
phase that finishes it, and the product with B added to the columns each thread's tiles wrote. */

#ifndef AGENTKV_CPU_STEP_LORA_H
#define AGENTKV_CPU_STEP_LORA_H

#include "cpu_step.h"

/* token m's adapter's update of linear `target` of layer l (NULL: none) */
INLINE const LoraMat *lora_of(const StepRun *run, int64_t l, int target, int64_t m) {
    if (!run->lora || run->lora->row_adapter[m] < 0) return NULL;
    const LoraMat *mat = &run->lora->adapters[run->lora->row_adapter[m]].layer[l].mat[target];
    return mat->pieces ? mat : NULL;
}

INLINE float *lora_t(const StepRun *run, int64_t m, int target) {
    return run->s.lt + (m * LORA_TARGETS + target) * LORA_MAX_RANK;
}

/* token m's input x (K) of linear `target` shrunk, where its adapter updates it */
INLINE void lora_in(const StepRun *run, int64_t l, int target, int64_t m, const float *x, int64_t K) {
    const LoraMat *mat = lora_of(run, l, target, m);
    if (mat) lora_shrink(mat, x, K, lora_t(run, m, target), run->generic);
}

/* thread `me`'s share (whole groups of 4 ranks) of token m's shrink of x */
INLINE void lora_in_share(const StepRun *run, int64_t l, int target, int64_t m, const float *x, int64_t K, int me,
                          int nt) {
    const LoraMat *mat = lora_of(run, l, target, m);
    if (!mat) return;
    const int64_t groups = (mat->rank + 3) / 4, j0 = groups * me / nt * 4, j1 = groups * (me + 1) / nt * 4;
    lora_shrink_range(mat, x, K, lora_t(run, m, target), j0, j1 < mat->rank ? j1 : mat->rank, run->generic);
}

/* every token's shrink of a normed input (linear `target`), in the phase that norms it: with fewer tokens than
   threads (a lone decode) each thread norms a token again into its own row and takes a share of its ranks, where
   the token's thread would do all of them while the others wait at the barrier */
INLINE void lora_in_normed(const StepRun *run, int64_t l, int target, const float *norm, int me, int nt) {
    const StepModel *md = run->md;
    const int64_t hid = md->hidden;
    for (int64_t m = 0; run->lora && m < run->M; m++) {
        if (!run->lora_split) {
            if (m % nt == me) lora_in(run, l, target, m, run->s.h + m * run->width, hid);
            continue;
        }
        if (!lora_of(run, l, target, m)) continue;
        float *x = run->s.hn + (int64_t)me * run->width;  /* (the same numbers norm_quant puts in s.h) */
        rms_row(run->s.x + m * hid, norm, hid, md->eps, x, 0, run->generic);
        lora_in_share(run, l, target, m, x, hid, me, nt);
    }
}

/* every token's shrink of a whole input `in` (rows `ld` apart, K columns): a share each with fewer tokens than
   threads, else a token each */
INLINE void lora_in_rows(const StepRun *run, int64_t l, int target, const float *in, int64_t ld, int64_t K, int me,
                         int nt) {
    for (int64_t m = 0; run->lora && m < run->M; m++) {
        if (run->lora_split) lora_in_share(run, l, target, m, in + m * ld, K, me, nt);
        else if (m % nt == me) lora_in(run, l, target, m, in + m * ld, K);
    }
}

/* every token's update of linear `target` added to the columns this thread's tiles of w wrote into out */
INLINE void lora_out(const StepRun *run, int64_t l, int target, const StepMat *w, float *out, int64_t ld, int me,
                     int nt) {
    if (!run->lora) return;
    int64_t c0, c1;
    mat_cols(w, me, nt, &c0, &c1);
    for (int64_t m = 0; m < run->M;) {  /* consecutive tokens of one adapter (up to 4) together: B read once */
        const LoraMat *mat = lora_of(run, l, target, m);
        int64_t e = m + 1;
        while (mat && e < run->M && e < m + 4 && lora_of(run, l, target, e) == mat) e++;
        if (mat)
            lora_expand_rows(mat, lora_t(run, m, target), LORA_TARGETS * LORA_MAX_RANK, (int)(e - m), c0, c1,
                             out + m * ld, ld, run->generic);
        m = e;
    }
}

#endif
