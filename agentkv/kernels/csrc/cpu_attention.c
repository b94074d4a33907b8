/* Paged attention on the CPU: the new tokens' K/V written to their slots, then each query attends to its
request's slots read in place through the slot table (no gather into a padded copy).

Work comes as tiles: `m` consecutive tokens of one request whose first token sees `len0` keys and each
next one key more (a decode is a tile of one token; an extend's tokens come in tiles). A task is one
tile, one KV head and up to MAX_Q of the query heads that share it: every K and V row it loads serves
all of its m x G query vectors. Softmax is online over blocks of 16 keys (flash attention's
recurrence), so a query's keys are read once whatever the context length.

A sliding window (`window` > 0) limits each query to its last `window` keys, its own included: a task
starts at its first query's first key, and each query masks the keys before its own first.

A prompt's tokens come in tiles of their own (the tile's fifth field), whose tasks run another body:
the task's query vectors are the 16 lanes of a register, so that a block's scores are 16 registers (one
a key, each lane a query's score: D fused multiply-adds of a key's broadcast value by the queries'
values, no sum across lanes), the online softmax is lane-wise, and the output accumulates 16 queries
a dimension per FMA. A written token's attention (decodes, drafts, forced runs) stays in the first
body whatever its pass: its numbers do not depend on what else the pass holds. Each query's sums are
in the same order in either body whatever its tile's other queries.

A written token's keys are attended in parts of PART_KEYS keys at fixed positions ([0, 512), [512,
1024), ...), each part a task of its own leaving (max, sum, unnormalized output) per query, merged in
part order (flash-decoding): a lone decoding token's long context is shared among the threads, and since
the parts do not depend on the pass, the batch or the threads, neither do its numbers (the native step
and this call give the same bits). A token whose keys fit one part is attended whole. A prompt's tiles,
of which a pass has many, are split only when there are fewer tasks than twice the threads (their keys
in as many parts as that takes). */

#include <stdlib.h>

#include "cpu_kernels.h"

#define MAX_Q 16            /* query vectors in one task */
#define MAX_D 256           /* head_dim */
#define BLOCK 16            /* keys a step */
#define SPLIT_MIN_KEYS 512  /* keys a part of a prompt's task has at least when its keys are split */
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
} Task;

/* the first key query i of a task sees (keys before it are outside its window) */
INLINE int64_t first_key(const Task *t, int64_t lim) { return t->window ? lim - t->window : 0; }

/* query vector i of a task: token tok0 + i / ng, head h * G + g0 + i % ng */
INLINE int64_t q_offset(const Task *t, int i, int64_t ld) {
    return (t->tok0 + i / t->ng) * ld + (int64_t)(t->h * t->G + t->g0 + i % t->ng) * t->D;
}

/* query vector i's result: its slice of `out`, or its partial result for the merge */
INLINE void finish(const Task *t, int i, float mx, float l, const float *acc, const int bf) {
    if (t->partial) {
        float *p = t->partial + (int64_t)i * (t->D + 2);
        p[0] = mx, p[1] = l;
        memcpy(p + 2, acc, (size_t)t->D * 4);
        return;
    }
    const int64_t off = q_offset(t, i, (int64_t)t->H * t->D);
    const float inv = 1.f / l;
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

/* query i's result from its task's `parts` partial results (part_stride floats apart), in part order: a
   part in which it saw no key (max -inf) adds nothing, and the first that adds is its own sum and output
   times e^0 = 1, so that one part alone gives the bits of the unsplit task */
static void merge_query(const Task *t, int i, const float *partials, int64_t parts, int64_t part_stride, int bf) {
    float top = -INFINITY, l = 0.f, acc[MAX_D];
    for (int64_t p = 0; p < parts; p++) top = fmaxf(top, partials[p * part_stride + (int64_t)i * (t->D + 2)]);
    int first = 1;
    for (int64_t p = 0; p < parts; p++) {
        const float *r = partials + p * part_stride + (int64_t)i * (t->D + 2);
        if (r[0] == -INFINITY) continue;
        const float w = expf(r[0] - top);
        if (first) {
            l = w * r[1];
            for (int d = 0; d < t->D; d++) acc[d] = w * r[2 + d];
            first = 0;
            continue;
        }
        l += w * r[1];
        for (int d = 0; d < t->D; d++) acc[d] += w * r[2 + d];
    }
    Task whole = *t;
    whole.partial = NULL;
    if (bf) finish(&whole, i, top, l, acc, 1);
    else finish(&whole, i, top, l, acc, 0);
}

#if AGENTKV_AVX512
/* the K and V rows of the block PREFETCH_AHEAD blocks after the one at key b0 (of n): scattered over the
   pool and out of cache by now (a step reads every layer's K/V once), asked for into L2 while this block
   is computed. A decode's block is a few hundred cycles of work, less than a read from memory takes: the
   next block alone, into L1, left the loads waiting (70% of the decode body's samples at 2k keys), and a
   decode step of the embedded model at 2k tokens of context took 14 ms against 11 with these. */
INLINE void prefetch_next_block(const Task *t, int64_t b0, int64_t n, int kes) {
    const int64_t row = (int64_t)t->KVH * t->D;
    for (int64_t j = b0 + PREFETCH_AHEAD * BLOCK; j < b0 + (PREFETCH_AHEAD + 1) * BLOCK && j < n; j++) {
        const int64_t off = (t->slots[j] * row + (int64_t)t->h * t->D) * kes;
        for (int b = 0; b < t->D * kes; b += 64) {
            __builtin_prefetch((const char *)t->kc + off + b, 0, 2);
            __builtin_prefetch((const char *)t->vc + off + b, 0, 2);
        }
    }
}

/* c * tanh(x / c) in 16 lanes: tanh(y) = 1 - 2 / (e^(2y) + 1), which saturates to +-1 (exp16 clamps) */
INLINE __m512 cap16(__m512 x, float c) {
    const __m512 e = exp16(_mm512_mul_ps(x, _mm512_set1_ps(2.f / c)));
    const __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.f), _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, _mm512_set1_ps(1.f))));
    return _mm512_mul_ps(t, _mm512_set1_ps(c));
}

/* A block's K and V rows are converted to fp32 once, then each query vector in turn takes them from
   L1 with its accumulators in registers (kept there across the block's keys because NV is a
   constant of each specialization), rather than every key updating every query's accumulators in
   memory. */
INLINE void attend_avx512(const Task *t, const int NV, const int bf, const int kbf) {
    const int D = NV * 16, nq = (int)t->m * t->ng, es = bf ? 2 : 4, kes = kbf ? 2 : 4;
    __m512 qf[MAX_Q][MAX_D / 16], acc[MAX_Q][MAX_D / 16];
    float mx[MAX_Q], l[MAX_Q];
    int64_t lim[MAX_Q], lo[MAX_Q];
    const __m512 sc = _mm512_set1_ps(t->scale);
    for (int i = 0; i < nq; i++) {
        const char *qp = (const char *)t->q + q_offset(t, i, t->q_ld) * es;
        for (int c = 0; c < NV; c++) {
            qf[i][c] = _mm512_mul_ps(load16(qp + c * 16 * es, bf), sc);
            acc[i][c] = _mm512_setzero_ps();
        }
        mx[i] = -INFINITY, l[i] = 0.f, lim[i] = t->len0 + i / t->ng, lo[i] = first_key(t, lim[i]);
    }
    const int64_t n = t->k1;
    const int64_t row = (int64_t)t->KVH * D;
    __m512 kf[BLOCK][MAX_D / 16], vf[BLOCK][MAX_D / 16];
    for (int64_t b0 = t->k0; b0 < n; b0 += BLOCK) {
        const int nb = (int)(n - b0 < BLOCK ? n - b0 : BLOCK);
        for (int j = 0; j < nb; j++) {
            const int64_t off = (t->slots[b0 + j] * row + (int64_t)t->h * D) * kes;
            for (int c = 0; c < NV; c++) {
                kf[j][c] = load16((const char *)t->kc + off + c * 16 * kes, kbf);
                vf[j][c] = load16((const char *)t->vc + off + c * 16 * kes, kbf);
            }
        }
        prefetch_next_block(t, b0, n, kes);
        for (int i = 0; i < nq; i++) {
            const int64_t live_n = lim[i] - b0;  /* keys of this block that query i sees */
            if (live_n <= 0 || lo[i] >= b0 + nb) continue;
            const int nl = live_n < nb ? (int)live_n : nb;
            const int dead = lo[i] > b0 ? (int)(lo[i] - b0) : 0;  /* before its window */
            if (dead >= nl) continue;
            __m512 part[BLOCK];
            for (int j = 0; j < nl; j++) {
                __m512 a = _mm512_mul_ps(qf[i][0], kf[j][0]);
                for (int c = 1; c < NV; c++) a = _mm512_fmadd_ps(qf[i][c], kf[j][c], a);
                part[j] = a;
            }
            for (int j = nl; j < BLOCK; j++) part[j] = _mm512_setzero_ps();
            const __mmask16 live = (__mmask16)((nl == BLOCK ? 0xffffu : (1u << nl) - 1) & ~((1u << dead) - 1));
            __m512 raw = sum_lanes16(part);
            if (t->softcap > 0.f) raw = cap16(raw, t->softcap);
            __m512 s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), raw);
            float bm = _mm512_reduce_max_ps(s);
            float mn = bm > mx[i] ? bm : mx[i];
            float corr = expf(mx[i] - mn);  /* 0 on the first block (mx = -inf) */
            __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, _mm512_set1_ps(mn))));
            l[i] = l[i] * corr + _mm512_reduce_add_ps(p);
            mx[i] = mn;
            float ps[BLOCK];
            _mm512_storeu_ps(ps, p);
            __m512 a[MAX_D / 16];
            const __m512 cv = _mm512_set1_ps(corr);
            for (int c = 0; c < NV; c++) a[c] = _mm512_mul_ps(acc[i][c], cv);
            for (int j = 0; j < nl; j++) {
                const __m512 pj = _mm512_set1_ps(ps[j]);
                for (int c = 0; c < NV; c++) a[c] = _mm512_fmadd_ps(pj, vf[j][c], a[c]);
            }
            for (int c = 0; c < NV; c++) acc[i][c] = a[c];
        }
    }
    for (int i = 0; i < nq; i++) {
        if (t->partial) {
            float a[MAX_D];
            for (int c = 0; c < NV; c++) _mm512_storeu_ps(a + c * 16, acc[i][c]);
            finish(t, i, mx[i], l[i], a, bf);
            continue;
        }
        char *op = (char *)t->out + q_offset(t, i, (int64_t)t->H * D) * es;
        __m512 inv = _mm512_set1_ps(1.f / l[i]);
        for (int c = 0; c < NV; c++) store16(op + c * 16 * es, _mm512_mul_ps(acc[i][c], inv), bf);
    }
}

/* A prompt tile's task, its query vectors as lanes (see the top). A lane past the task's queries sees
   no key; a key outside a query's window or past its position is masked in its lane. */
INLINE void attend_prompt_avx512(const Task *t, const int NV, const int bf, const int kbf) {
    const int D = NV * 16, nq = (int)t->m * t->ng, es = bf ? 2 : 4, kes = kbf ? 2 : 4;
    float qt[MAX_D][16] __attribute__((aligned(64))), acc[MAX_D][16] __attribute__((aligned(64)));
    float kb[BLOCK][MAX_D], vb[BLOCK][MAX_D];
    int32_t lim[16], lo[16];
    for (int i = 0; i < 16; i++) {
        const int64_t end = i < nq ? t->len0 + i / t->ng : 0;
        lim[i] = (int32_t)(end - t->k0), lo[i] = i < nq ? (int32_t)(first_key(t, end) - t->k0) : 0;
        for (int d = 0; d < D; d++) qt[d][i] = 0.f;
    }
    for (int i = 0; i < nq; i++) {
        const char *qp = (const char *)t->q + q_offset(t, i, t->q_ld) * es;
        for (int d = 0; d < D; d++) qt[d][i] = load1(qp, d, bf) * t->scale;
    }
    for (int d = 0; d < D; d++) _mm512_store_ps(acc[d], _mm512_setzero_ps());
    const __m512i lim_v = _mm512_loadu_si512(lim), lo_v = _mm512_loadu_si512(lo);
    __m512 mx = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
    const int64_t n = t->k1, row = (int64_t)t->KVH * D;
    for (int64_t b0 = t->k0; b0 < n; b0 += BLOCK) {
        const int nb = (int)(n - b0 < BLOCK ? n - b0 : BLOCK);
        for (int j = 0; j < BLOCK; j++) {
            if (j >= nb) {  /* (no key: a score masked below, a value times 0) */
                for (int c = 0; c < NV; c++) {
                    _mm512_storeu_ps(kb[j] + 16 * c, _mm512_setzero_ps());
                    _mm512_storeu_ps(vb[j] + 16 * c, _mm512_setzero_ps());
                }
                continue;
            }
            const int64_t off = (t->slots[b0 + j] * row + (int64_t)t->h * D) * kes;
            for (int c = 0; c < NV; c++) {
                _mm512_storeu_ps(kb[j] + 16 * c, load16((const char *)t->kc + off + c * 16 * kes, kbf));
                _mm512_storeu_ps(vb[j] + 16 * c, load16((const char *)t->vc + off + c * 16 * kes, kbf));
            }
        }
        prefetch_next_block(t, b0, n, kes);
        __m512 s[BLOCK];  /* s[j] lane i: query i's score of key b0 + j, summed over d in order */
        for (int j = 0; j < BLOCK; j++) s[j] = _mm512_setzero_ps();
        for (int d = 0; d < D; d++) {
            const __m512 q = _mm512_load_ps(qt[d]);
            for (int j = 0; j < BLOCK; j++) s[j] = _mm512_fmadd_ps(_mm512_set1_ps(kb[j][d]), q, s[j]);
        }
        __mmask16 live[BLOCK];
        __m512 bm = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < BLOCK; j++) {
            const __m512i at = _mm512_set1_epi32((int32_t)(b0 - t->k0) + j);
            live[j] = j < nb ? _mm512_cmpgt_epi32_mask(lim_v, at) & _mm512_cmple_epi32_mask(lo_v, at) : 0;
            if (t->softcap > 0.f) s[j] = cap16(s[j], t->softcap);
            s[j] = _mm512_mask_blend_ps(live[j], _mm512_set1_ps(-INFINITY), s[j]);
            bm = _mm512_max_ps(bm, s[j]);
        }
        const __m512 mn = _mm512_max_ps(mx, bm);
        /* lanes without a key yet keep corr at e^-87 against their zero sums */
        const __m512 corr = exp16(_mm512_sub_ps(mx, mn));
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < BLOCK; j++) {
            s[j] = _mm512_maskz_mov_ps(live[j], exp16(_mm512_sub_ps(s[j], mn)));
            sum = _mm512_add_ps(sum, s[j]);
        }
        l = _mm512_fmadd_ps(l, corr, sum);
        mx = mn;
        for (int d0 = 0; d0 < D; d0 += 8) {  /* 8 dimensions at once: 8 chains hide the FMA's latency */
            __m512 a[8];
            for (int e = 0; e < 8; e++) a[e] = _mm512_mul_ps(_mm512_load_ps(acc[d0 + e]), corr);
            for (int j = 0; j < BLOCK; j++)
                for (int e = 0; e < 8; e++) a[e] = _mm512_fmadd_ps(s[j], _mm512_set1_ps(vb[j][d0 + e]), a[e]);
            for (int e = 0; e < 8; e++) _mm512_store_ps(acc[d0 + e], a[e]);
        }
    }
    float mxs[16], ls[16];
    _mm512_storeu_ps(mxs, mx), _mm512_storeu_ps(ls, l);
    for (int i = 0; i < nq; i++) {
        float a[MAX_D];
        for (int d = 0; d < D; d++) a[d] = acc[d][i];
        finish(t, i, mxs[i], ls[i], a, bf);
    }
}
#endif

/* the same recurrence in plain C, for any head_dim up to MAX_D and any CPU */
INLINE void attend_generic(const Task *t, const int bf, const int kbf) {
    const int D = t->D, nq = (int)t->m * t->ng;
    float qf[MAX_Q][MAX_D], acc[MAX_Q][MAX_D], mx[MAX_Q], l[MAX_Q];
    int64_t lim[MAX_Q], lo[MAX_Q];
    for (int i = 0; i < nq; i++) {
        int64_t off = q_offset(t, i, t->q_ld);
        for (int d = 0; d < D; d++) qf[i][d] = load1(t->q, off + d, bf) * t->scale, acc[i][d] = 0.f;
        mx[i] = -INFINITY, l[i] = 0.f, lim[i] = t->len0 + i / t->ng, lo[i] = first_key(t, lim[i]);
    }
    const int64_t n = t->k1;
    const int64_t row = (int64_t)t->KVH * D;
    for (int64_t b0 = t->k0; b0 < n; b0 += BLOCK) {
        const int nb = (int)(n - b0 < BLOCK ? n - b0 : BLOCK);
        float s[MAX_Q][BLOCK], kf[MAX_D];
        for (int j = 0; j < nb; j++) {
            int64_t off = t->slots[b0 + j] * row + (int64_t)t->h * D;
            for (int d = 0; d < D; d++) kf[d] = load1(t->kc, off + d, kbf);
            for (int i = 0; i < nq; i++) {
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < D; d++) dot += qf[i][d] * kf[d];
                if (t->softcap > 0.f) dot = t->softcap * tanhf(dot / t->softcap);
                s[i][j] = b0 + j < lim[i] && b0 + j >= lo[i] ? dot : -INFINITY;
            }
        }
        for (int i = 0; i < nq; i++) {
            if (b0 >= lim[i] || b0 + nb <= lo[i]) {  /* no key of this block in its window */
                for (int j = 0; j < nb; j++) s[i][j] = 0.f;
                continue;
            }
            float mn = mx[i];
            for (int j = 0; j < nb; j++) mn = s[i][j] > mn ? s[i][j] : mn;
            float corr = expf(mx[i] - mn), sum = 0.f;
            for (int j = 0; j < nb; j++) {
                s[i][j] = b0 + j < lim[i] && b0 + j >= lo[i] ? exp_approx(s[i][j] - mn) : 0.f;
                sum += s[i][j];
            }
            l[i] = l[i] * corr + sum;
            mx[i] = mn;
            for (int d = 0; d < D; d++) acc[i][d] *= corr;
        }
        for (int j = 0; j < nb; j++) {
            int64_t off = t->slots[b0 + j] * row + (int64_t)t->h * D;
            for (int d = 0; d < D; d++) kf[d] = load1(t->vc, off + d, kbf);
            for (int i = 0; i < nq; i++) {
                float p = s[i][j];
#pragma omp simd
                for (int d = 0; d < D; d++) acc[i][d] += p * kf[d];
            }
        }
    }
    for (int i = 0; i < nq; i++) finish(t, i, mx[i], l[i], acc[i], bf);
}

/* bf: q, k, v and out in bf16 (else fp32); kbf: the caches in bf16 (else fp32) */
INLINE void attend(const Task *t, const int bf, const int kbf, const int generic) {
#if AGENTKV_AVX512
    if (!generic && t->prompt && t->D == 64) return attend_prompt_avx512(t, 4, bf, kbf);
    if (!generic && t->prompt && t->D == 128) return attend_prompt_avx512(t, 8, bf, kbf);
    if (!generic && t->prompt && t->D % 16 == 0) return attend_prompt_avx512(t, t->D / 16, bf, kbf);
    if (!generic && t->D == 64) return attend_avx512(t, 4, bf, kbf);
    if (!generic && t->D == 128) return attend_avx512(t, 8, bf, kbf);
    if (!generic && t->D % 16 == 0) return attend_avx512(t, t->D / 16, bf, kbf);
#endif
    (void)generic;
    attend_generic(t, bf, kbf);
}

/* the specializations a call picks from at run time (each flag a constant inside) */
static void attend_any(const Task *t, const int bf, const int kbf, const int generic) {
    if (bf && kbf) attend(t, 1, 1, generic);
    else if (bf) attend(t, 1, 0, generic);
    else if (kbf) attend(t, 0, 1, generic);
    else attend(t, 0, 0, generic);
}

/* n K or V values from x (bf16 where bf, else fp32) into a cache row (bf16 where kbf, else fp32),
   rounded to nearest even as torch's conversion rounds */
INLINE void store_row(void *cache, const void *x, int64_t n, const int bf, const int kbf) {
    if (bf == kbf) memcpy(cache, x, (size_t)n * (bf ? 2 : 4));
    else for (int64_t d = 0; d < n; d++) store1(cache, d, load1(x, d, bf), kbf);
}

/* Query heads of a KV head per task: all G of them when the tile's tokens times G fit in MAX_Q. */
int agentkv_attention_heads_per_task(int G) { return G < MAX_Q ? G : MAX_Q; }
int agentkv_attention_max_queries(void) { return MAX_Q; }
int agentkv_attention_max_head_dim(void) { return MAX_D; }

#define TILE_FIELDS 5 /* a tile: (first token, tokens m, table row, keys of the first token, a prompt's) */

/* the keys a tile's last token sees */
INLINE int64_t tile_keys(const int64_t *tile) { return tile[3] + tile[1] - 1; }

/* Every index the call will follow, checked before any memory is touched: 0 when all are in bounds,
   else which kind is not (the caller raises; nothing was written). */
static int check_indices(const int64_t *out_loc, int64_t T, int64_t num_slots, const int64_t *table,
                         int64_t table_rows, int64_t table_ld, const int64_t *tiles, int64_t ntiles) {
    for (int64_t i = 0; i < T; i++)
        if (out_loc[i] < 0 || out_loc[i] >= num_slots) return 1;
    for (int64_t n = 0; n < ntiles; n++) {
        const int64_t *tile = tiles + n * TILE_FIELDS, keys = tile_keys(tile);
        if (tile[0] < 0 || tile[1] < 1 || tile[0] + tile[1] > T || tile[2] < 0 || tile[2] >= table_rows ||
            tile[3] < 1 || keys > table_ld || (tile[4] != 0 && tile[4] != 1))
            return 2;
        for (int64_t j = 0; j < keys; j++) {
            const int64_t slot = table[tile[2] * table_ld + j];
            if (slot < 0 || slot >= num_slots) return 3;
        }
    }
    return 0;
}

typedef struct { /* what the tasks of one call share */
    const void *q; int64_t q_ld;
    const void *kc, *vc;
    const int64_t *table, *tiles; int64_t table_ld;
    int G, ng, chunks, KVH, H, D;
    float scale;
    void *out;
    int64_t window;
    float softcap;
} Call;

/* task n of a call: its tile, KV head and first query head; all of the tile's keys (from the
   first query's window on) */
static Task task_of(const Call *c, int64_t n) {
    const int64_t *tile = c->tiles + (n / (c->KVH * c->chunks)) * TILE_FIELDS;
    const int h = (int)(n / c->chunks % c->KVH), g0 = (int)(n % c->chunks) * c->ng;
    const int64_t k0 = c->window && tile[3] > c->window ? tile[3] - c->window : 0;
    Task t = {c->q, c->q_ld, c->kc, c->vc, c->table + tile[2] * c->table_ld, tile[0], tile[1], tile[3],
              g0, c->G - g0 < c->ng ? c->G - g0 : c->ng, c->G, c->KVH, h, c->H, c->D, c->scale, c->out,
              k0, tile_keys(tile), c->window, c->softcap, NULL, (int)tile[4]};
    return t;
}

/* q [T, H, D], k and v [T, KVH, D] (token strides q_ld, k_ld, v_ld; heads contiguous), out [T, H, D];
   caches [num_slots, KVH, D]; table [table_rows, table_ld].
   tiles [ntiles, 5]: (first token, tokens m, slot-table row, keys of the first token, 1 for a prompt's
   tokens); tokens of no tile are left to the caller (their K/V are still stored). `window` > 0: sliding-window attention.
   `generic` forces the plain-C path (tests). `bf`: q, k, v and out are bf16 (else fp32); `kvbf`: the
   caches are (else fp32), so fp32 activations can keep 16-bit KV.
   Returns check_indices' verdict: 0, or nonzero with nothing done; 4 when memory for the parts ran out. */
int agentkv_attention(int bf, int kvbf, const void *q, int64_t q_ld, const void *k, int64_t k_ld, const void *v,
                      int64_t v_ld, void *k_cache, void *v_cache, int64_t num_slots, const int64_t *out_loc, int64_t T,
                      const int64_t *table, int64_t table_rows, int64_t table_ld, const int64_t *tiles,
                      int64_t ntiles, int H, int KVH, int D, float scale, void *out, int64_t window, float softcap,
                      int nthreads, int generic) {
    const int bad = check_indices(out_loc, T, num_slots, table, table_rows, table_ld, tiles, ntiles);
    if (bad) return bad;
    const int64_t es = bf ? 2 : 4, kes = kvbf ? 2 : 4, row = (int64_t)KVH * D;
    for (int64_t i = 0; i < T; i++) {
        store_row((char *)k_cache + out_loc[i] * row * kes, (const char *)k + i * k_ld * es, row, bf, kvbf);
        store_row((char *)v_cache + out_loc[i] * row * kes, (const char *)v + i * v_ld * es, row, bf, kvbf);
    }
    const int G = H / KVH, ng = agentkv_attention_heads_per_task(G), chunks = (G + ng - 1) / ng;
    const Call call = {q, q_ld, k_cache, v_cache, table, tiles, table_ld, G, ng, chunks, KVH, H, D, scale, out, window,
                       softcap};
    const int64_t ntasks = ntiles * KVH * chunks;
    int64_t most_keys = 0, prompt_tasks = 0; /* the keys a prompt's task reads, at most */
    for (int64_t n = 0; n < ntiles; n++) {
        const int64_t *tile = tiles + n * TILE_FIELDS, keys = tile_keys(tile);
        const int64_t skipped = window && tile[3] > window ? tile[3] - window : 0;
        if (!tile[4]) continue;
        prompt_tasks += KVH * chunks;
        most_keys = keys - skipped > most_keys ? keys - skipped : most_keys;
    }
    int64_t prompt_parts = 1; /* a few long prompt tasks: each one's keys in parts, two tasks' worth a thread */
    if (prompt_tasks && ntasks < 2 * nthreads && most_keys >= 2 * SPLIT_MIN_KEYS) {
        prompt_parts = (2 * nthreads + ntasks - 1) / ntasks;
        prompt_parts = prompt_parts < most_keys / SPLIT_MIN_KEYS ? prompt_parts : most_keys / SPLIT_MIN_KEYS;
    }
    /* each task's parts (a written tile's: the fixed ones its keys fall in), numbered in task order */
    int64_t *start = malloc((size_t)(ntasks + 1) * sizeof(int64_t));
    if (!start) return 4;
    start[0] = 0;
    for (int64_t n = 0; n < ntasks; n++) {
        const Task t = task_of(&call, n);
        start[n + 1] = start[n] + (t.prompt ? prompt_parts : parts_over(t.k0, t.k1));
    }
    const int64_t work = start[ntasks], stride = (int64_t)MAX_Q * (D + 2); /* floats of one part's results */
    float *scratch = work > ntasks ? malloc((size_t)(work * stride) * sizeof(float)) : NULL;
    int64_t *owner = work > ntasks ? malloc((size_t)work * sizeof(int64_t)) : NULL;
    if (work > ntasks && (!scratch || !owner)) {
        free(start), free(scratch), free(owner);
        return 4;
    }
    for (int64_t n = 0; owner && n < ntasks; n++)
        for (int64_t w = start[n]; w < start[n + 1]; w++) owner[w] = n;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (work > 1)
    for (int64_t w = 0; w < work; w++) {
        const int64_t n = owner ? owner[w] : w, parts = start[n + 1] - start[n], part = w - start[n];
        Task t = task_of(&call, n);
        if (parts > 1 && !t.prompt) {
            to_part(&t, part);
            t.partial = scratch + w * stride;
        } else if (parts > 1) { /* parts of whole blocks; the last ones may be empty for a short tile */
            const int64_t base = t.k0, keys = t.k1 - base;
            const int64_t each = ((keys + parts - 1) / parts + BLOCK - 1) / BLOCK * BLOCK;
            t.k0 = base + (part * each < keys ? part * each : keys);
            t.k1 = t.k0 + each < t.k1 ? t.k0 + each : t.k1;
            t.partial = scratch + w * stride;
        }
        attend_any(&t, bf, kvbf, generic);
    }
    for (int64_t n = 0; scratch && n < ntasks; n++) {
        const Task t = task_of(&call, n);
        const int64_t parts = start[n + 1] - start[n];
        for (int i = 0; parts > 1 && i < (int)t.m * t.ng; i++)
            merge_query(&t, i, scratch + start[n] * stride, parts, stride, bf);
    }
    free(start), free(scratch), free(owner);
    return 0;
}

/* The parts a decoding token's `len` keys are attended in (1: whole), for the native step's tasks. */
int64_t agentkv_attend_parts(int64_t len, int64_t window) {
    return parts_over(window && len > window ? len - window : 0, len);
}

/* One decoding token's attention, fp32, for query heads h * G + g0 .. + ng of KV head h, its first
   `len` keys read through `slots` (its own K/V already stored): a task of the native decode step
   (cpu_step.c), which checked every index. q and out: the token's rows [H, D]; the caches bf16 where
   `kvbf`, else fp32. With `partial` (where agentkv_attend_parts says more than one), only the part-th
   part's keys, its results for the merge into `partial` [ng][D + 2]. */
void agentkv_attend_one(const float *q, const void *kc, const void *vc, const int64_t *slots, int64_t len, int h,
                        int g0, int ng, int G, int KVH, int H, int D, float scale, float *out, int64_t window,
                        float softcap, int kvbf, int generic, int64_t part, float *partial) {
    const int64_t k0 = window && len > window ? len - window : 0;
    Task t = {q, (int64_t)H * D, kc, vc, slots, 0, 1, len, g0, ng, G, KVH, h, H, D, scale, out, k0, len, window,
              softcap, NULL, 0};
    if (partial) {
        to_part(&t, part);
        t.partial = partial;
    }
    if (kvbf) attend(&t, 0, 1, generic);
    else attend(&t, 0, 0, generic);
}

/* agentkv_attend_one's parts (`parts` results [ng][D + 2], part_stride floats apart) merged into out. */
void agentkv_attend_merge(const float *partials, int64_t parts, int64_t part_stride, int g0, int ng, int G, int h,
                          int H, int D, float *out) {
    const Task t = {NULL, 0, NULL, NULL, NULL, 0, 1, 0, g0, ng, G, 0, h, H, D, 0.f, out, 0, 0, 0, 0.f, NULL, 0};
    for (int i = 0; i < ng; i++) merge_query(&t, i, partials, parts, part_stride, 0);
}
