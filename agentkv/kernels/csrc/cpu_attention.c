/* Paged attention's bodies on the CPU: each query attends to its request's slots read in place through
the slot table (no gather into a padded copy). cpu_attention_tasks.c makes a pass's tasks and calls these.

Work comes as tiles: `m` consecutive tokens of one request whose first token sees `len0` keys and each
next one key more (a decode is a tile of one token; an extend's tokens come in tiles). A task is one
tile, one KV head and up to MAX_Q of the query heads that share it: every K and V row it loads serves
all of its m x G query vectors. Softmax is online over blocks of 16 keys (flash attention's
recurrence), so a query's keys are read once whatever the context length.

A sliding window (`window` > 0) limits each query to its last `window` keys, its own included: a task
starts at its first query's first key, in the block of 16 that holds it (blocks start at multiples of 16,
so that a query's sums are in the same order whatever its tile), and each query masks the keys before its
own first.

A prompt's tokens come in tiles of their own (the tile's fifth field), whose tasks run another body:
the task's query vectors are the 16 lanes of a register, so that a block's scores are 16 registers (one
a key, each lane a query's score: D fused multiply-adds of a key's broadcast value by the queries'
values, no sum across lanes), the online softmax is lane-wise, and the output accumulates 16 queries
a dimension per FMA. A written token's attention (decodes, drafts, forced runs) stays in the first
body whatever its pass: its numbers do not depend on what else the pass holds. Each query's sums are
in the same order in either body whatever its tile's other queries. */

#include "cpu_attention.h"

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
    for (int64_t b0 = first_block(t); b0 < n; b0 += BLOCK) {
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
        __m512 inv = _mm512_set1_ps(1.f / (l[i] + sink_term(t, i, mx[i])));
        for (int c = 0; c < NV; c++) store16(op + c * 16 * es, _mm512_mul_ps(acc[i][c], inv), bf);
    }
}

/* A prompt tile's task, its query vectors as lanes (see the top). A lane past the task's queries sees
   no key; a key outside a query's window or past its position is masked in its lane. */
INLINE void attend_prompt_avx512(const Task *t, const int NV, const int bf, const int kbf) {
    const int D = NV * 16, nq = (int)t->m * t->ng, es = bf ? 2 : 4, kes = kbf ? 2 : 4;
    float qt[MAX_D][16] __attribute__((aligned(64))), acc[MAX_D][16] __attribute__((aligned(64)));
    float kb[BLOCK][MAX_D], vb[BLOCK][MAX_D];
    int32_t lim[16], lo[16];  /* relative to the first block's first key, a0 */
    const int64_t a0 = first_block(t);
    for (int i = 0; i < 16; i++) {
        const int64_t end = i < nq ? t->len0 + i / t->ng : 0;
        lim[i] = (int32_t)(end - a0), lo[i] = i < nq ? (int32_t)(first_key(t, end) - a0) : 0;
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
    for (int64_t b0 = first_block(t); b0 < n; b0 += BLOCK) {
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
            const __m512i at = _mm512_set1_epi32((int32_t)(b0 - a0) + j);
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
    for (int64_t b0 = first_block(t); b0 < n; b0 += BLOCK) {
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

/* the specializations a task picks from at run time (each flag a constant inside) */
void agentkv_attend_task(const Task *t, int bf, int kbf, int generic) {
    if (bf && kbf) attend(t, 1, 1, generic);
    else if (bf) attend(t, 1, 0, generic);
    else if (kbf) attend(t, 0, 1, generic);
    else attend(t, 0, 0, generic);
}

