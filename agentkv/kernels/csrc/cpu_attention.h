/* What csrc/cpu_attention.c's bodies and csrc/cpu_attention_tasks.c's calls share: a task (a tile of
tokens, one KV head, some of its query heads, a range of its keys) and how a query's result is written
(whole, or as one part's (max, sum, unnormalized output) for the merge). */

#ifndef AGENTKV_CPU_ATTENTION_H
#define AGENTKV_CPU_ATTENTION_H

#include "cpu_kernels.h"

#define MAX_Q 16            /* query vectors in one task */
#define MAX_D 512           /* head_dim (Gemma 4's full layers') */
#define BLOCK 16            /* keys a step */
#define PART_KEYS 512       /* a written token's keys are attended in parts of this many, at fixed positions */
#define PREFETCH_AHEAD 3    /* blocks between the one computed and the one prefetched */

typedef struct {
    const void *q; int64_t q_ld;   /* [T, H, D], token stride q_ld */
    const void *kc, *vc;           /* [slots, KVH, D] */
    const int64_t *slots;          /* the request's row of the slot table */
    int64_t tok0, m, len0;         /* the tile */
    int g0, ng, G, KVH, h, H, D;   /* query heads h*G + g0 .. + ng of KV head h */
    float scale;
    void *out;                     /* [T, H, D] contiguous */
    int64_t k0, k1;                /* the keys this task reads: [k0, k1) of the request's */
    int64_t window;                /* keys a query sees, its own included; 0: all before it */
    float softcap;                 /* > 0: scores capped to softcap * tanh(score / softcap) (Gemma 2) */
    float *partial;                /* NULL: write `out`; else [nq][D + 2]: max, sum, unnormalized output */
    int prompt;                    /* a prompt's tokens: attend_prompt_avx512's body */
    const float *sinks;            /* [H] or NULL: a learned logit per query head in each softmax's sum (gpt-oss) */
} Task;

/* the first key of the task that a query whose keys end at `lim` sees: its window's first, or the
   task's (a part's) first */
INLINE int64_t first_key(const Task *t, int64_t lim) {
    const int64_t w = t->window ? lim - t->window : 0;
    return w > t->k0 ? w : t->k0;
}

/* where a task's blocks of BLOCK keys start: at a multiple of BLOCK, whatever its first key, so that a
   query's blocks (and so the order of its sums) are the same whatever its tile, the keys before its
   first masked in the first block */
INLINE int64_t first_block(const Task *t) { return t->k0 - t->k0 % BLOCK; }

/* query vector i of a task: token tok0 + i / ng, head h * G + g0 + i % ng */
INLINE int64_t q_offset(const Task *t, int i, int64_t ld) {
    return (t->tok0 + i / t->ng) * ld + (int64_t)(t->h * t->G + t->g0 + i % t->ng) * t->D;
}

/* query vector i's sink (gpt-oss) as a term of its softmax's sum, whose terms are relative to `mx`: a
   key that is never read (0 without sinks) */
INLINE float sink_term(const Task *t, int i, float mx) {
    return t->sinks ? expf(t->sinks[t->h * t->G + t->g0 + i % t->ng] - mx) : 0.f;
}

/* query vector i's result: its slice of `out`, or its partial result for the merge (which adds the
   sink once, to the whole sum) */
INLINE void finish(const Task *t, int i, float mx, float l, const float *acc, const int bf) {
    if (t->partial) {
        float *p = t->partial + (int64_t)i * (t->D + 2);
        p[0] = mx, p[1] = l;
        memcpy(p + 2, acc, (size_t)t->D * 4);
        return;
    }
    const int64_t off = q_offset(t, i, (int64_t)t->H * t->D);
    const float inv = 1.f / (l + sink_term(t, i, mx));
    for (int d = 0; d < t->D; d++) store1(t->out, off + d, acc[d] * inv, bf);
}

/* how many of the fixed parts keys [k0, k1) fall in (k0 < k1) */
INLINE int64_t parts_over(int64_t k0, int64_t k1) { return (k1 - 1) / PART_KEYS - k0 / PART_KEYS + 1; }

/* t restricted to the p-th of the fixed parts its keys fall in */
INLINE void to_part(Task *t, int64_t p) {
    const int64_t a = (t->k0 / PART_KEYS + p) * PART_KEYS, b = a + PART_KEYS;
    t->k0 = a > t->k0 ? a : t->k0;
    t->k1 = b < t->k1 ? b : t->k1;
}

/* a task's queries attended over its keys [k0, k1) by the body that fits it (cpu_attention.c): bf: q and out
   in bf16 (else fp32); kbf: the caches in bf16 (else fp32); generic: the plain-C body */
void agentkv_attend_task(const Task *t, int bf, int kbf, int generic);

#endif
