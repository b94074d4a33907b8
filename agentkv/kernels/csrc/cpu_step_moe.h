/* The native step's mixture of experts (cpu_step.c), as the Python path computes it (engine/mlp.py's MoE with
the native kernels): the router's fp32 product (cpu_linear.c's body), each token's experts by cpu_moe.c's
routing, the (token, expert) pairs grouped by expert and each expert's gate_up and down products over its
tokens' quantized rows (a row's result never depends on the others'), the activation per row, and each
token's expert outputs times their weights summed in the experts' order before the residual joins them. */

#ifndef AGENTKV_CPU_STEP_MOE_H
#define AGENTKV_CPU_STEP_MOE_H

#include "cpu_step.h"

/* rows [first, first + n) of q as rows of their own */
INLINE QRows qrows_from(const QRows *q, int64_t first) {
    const int64_t nb = q->K / QK;
    QRows v = {q->q + first * q->K, q->d + first * nb, q->s + first * nb, q->ds + first * nb, q->s16 + first * nb,
               q->K};
    return v;
}

/* row m of src into row p of dst (the same K) */
INLINE void qrow_copy(const QRows *src, int64_t m, const QRows *dst, int64_t p) {
    const int64_t K = src->K, nb = K / QK;
    memcpy(dst->q + p * K, src->q + m * K, (size_t)K);
    memcpy(dst->d + p * nb, src->d + m * nb, (size_t)nb * sizeof(float));
    memcpy(dst->s + p * nb, src->s + m * nb, (size_t)nb * sizeof(int32_t));
    memcpy(dst->ds + p * nb, src->ds + m * nb, (size_t)nb * sizeof(float));
    memcpy(dst->s16 + p * nb, src->s16 + m * nb, (size_t)nb * sizeof(int32_t));
}

/* the grouped products of every used expert: tiles dealt out over the threads as one run */
INLINE void experts_share(const StepMat *mats, const StepRun *run, const QRows *x, float *out, int64_t out_ld, int me,
                          int nt) {
    const Scratch *s = &run->s;
    const int64_t *grp = s->grp;  /* [groups][3]: expert, first pair, pairs */
    const int64_t per = mat_tiles(mats), total = s->groups * per;
    const int64_t t0 = share(total, me, nt), t1 = share(total, me + 1, nt);
    for (int64_t g = t0 / per; g < s->groups && g * per < t1; g++) {
        const int64_t a = t0 > g * per ? t0 - g * per : 0, b = t1 < (g + 1) * per ? t1 - g * per : per;
        const QRows rows = qrows_from(x, grp[3 * g + 1]);
        mat_range(mats + grp[3 * g], &rows, grp[3 * g + 2], a, b, NULL, 0, out + grp[3 * g + 1] * out_ld, out_ld,
                  run->generic);
    }
}

/* x += moe(h), or where `out` is set out = moe(h): layer L's experts over the M tokens' quantized rows `in`,
routed from the fp32 rows in s->h (the same rows normed, but for Gemma 4's, normed for the router alone) */
INLINE void moe_out(StepRun *run, const StepLayer *L, const QRows *in, float *out, int me, int nt) {
    const StepModel *md = run->md;
    Scratch *s = &run->s;
    const int64_t M = run->M, E = L->experts, k = L->top_k, hid = md->hidden, width = run->width;
    const int64_t inter = L->expert_gate_up[0].N / 2, P = M * k, NB = (E + 15) / 16;
    agentkv_linear_blocks(s->h, width, M, hid, L->router, E, L->router_bias, share(NB, me, nt), share(NB, me + 1, nt),
                          s->rl, E);
    agentkv_pool_barrier(nt);
    for (int64_t m = me; m < M; m += nt) {  /* each token's experts, then in ascending order with their weights */
        int64_t *idx = s->pick + m * k;
        float *w = s->pw + m * k;
        if (L->score_bias)
            agentkv_moe_route_groups_row(s->rl + m * E, L->score_bias, E, k, L->groups, L->groups_chosen,
                                         (int)L->norm_topk, L->routed_scaling, idx, w, s->rs + m * 2 * E);
        else
            agentkv_moe_route_row(s->rl + m * E, E, k, (int)L->norm_topk, L->routed_scaling, idx, w);
        if (L->expert_scale)  /* (Gemma 4's, after the renormalization) */
            for (int64_t j = 0; j < k; j++) w[j] *= L->expert_scale[idx[j]];
        for (int64_t i = 1; i < k; i++)
            for (int64_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
                const int64_t e = idx[j];
                const float v = w[j];
                idx[j] = idx[j - 1], w[j] = w[j - 1];
                idx[j - 1] = e, w[j - 1] = v;
            }
    }
    agentkv_pool_barrier(nt);
    if (me == 0) {  /* the pairs by expert, a token's in token order; each (token, choice)'s pair */
        int64_t p = 0, g = 0;
        for (int64_t e = 0; e < E; e++) {
            const int64_t first = p;
            for (int64_t m = 0; m < M; m++)
                for (int64_t j = 0; j < k; j++)
                    if (s->pick[m * k + j] == e) s->pair_of[m * k + j] = p, s->pair_tok[p++] = m;
            if (p > first) s->grp[3 * g] = e, s->grp[3 * g + 1] = first, s->grp[3 * g + 2] = p - first, g++;
        }
        s->groups = g;
    }
    agentkv_pool_barrier(nt);
    for (int64_t p = me; p < P; p += nt) qrow_copy(in, s->pair_tok[p], &s->qe, p);
    agentkv_pool_barrier(nt);
    const int64_t sinter = L->shared_gate_up.N / 2;  /* (the shared expert's products beside the experts') */
    experts_share(L->expert_gate_up, run, &s->qe, s->egu, 2 * inter, me, nt);
    if (sinter) mat_share(&L->shared_gate_up, in, M, me, nt, NULL, 0, s->sgu, 2 * sinter, run->generic);
    agentkv_pool_barrier(nt);
    for (int64_t item = me; item < P * (inter / QK) + M * (sinter / QK); item += nt) {
        const int shared = item >= P * (inter / QK);  /* (a row p of the pairs', or of the shared expert's) */
        const int64_t at = shared ? item - P * (inter / QK) : item, n = shared ? sinter : inter;
        const int64_t p = at / (n / QK), b = at % (n / QK);
        float act[QK];
        const float *gate = (shared ? s->sgu : s->egu) + p * 2 * n + b * QK;
        glu_row(gate, gate + n, QK, act, 0, (int)md->gelu, md->swiglu_limit, md->swiglu_alpha, run->generic);
        quantize_into(act, shared ? &s->qs2 : &s->qe2, p, b);
    }
    agentkv_pool_barrier(nt);
    experts_share(L->expert_down, run, &s->qe2, s->ey, hid, me, nt);
    if (sinter) mat_share(&L->shared_down, &s->qs2, M, me, nt, NULL, 0, s->sy, hid, run->generic);
    agentkv_pool_barrier(nt);
    /* blocks of a token's hidden: its experts' outputs (its choices' pairs, in ascending expert order) weighed and
       summed from zero, the shared expert's added, scaled (Granite's residual multiplier), then added to the
       residual (or written to `out`) */
    const int64_t blocks = hid / QK;
    for (int64_t item = me; item < M * blocks; item += nt) {
        const int64_t m = item / blocks, i0 = item % blocks * QK;
        float acc[QK] = {0}, t[QK];
        for (int64_t j = 0; j < k; j++) {
            scaled(t, s->ey + s->pair_of[m * k + j] * hid + i0, s->pw[m * k + j], QK);
            for (int i = 0; i < QK; i++) acc[i] += t[i];
        }
        if (sinter)
            for (int i = 0; i < QK; i++) acc[i] += s->sy[m * hid + i0 + i];
        if (md->residual_scale != 0.f) scaled(acc, acc, md->residual_scale, QK);
        if (out) {
            memcpy(out + m * hid + i0, acc, sizeof acc);
            continue;
        }
        float *x = s->x + m * hid + i0;
        for (int i = 0; i < QK; i++) x[i] += acc[i];
    }
    agentkv_pool_barrier(nt);
}

#endif
