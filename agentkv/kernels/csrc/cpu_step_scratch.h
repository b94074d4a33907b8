/* The native step's scratch (cpu_step.c): what a pass of M tokens needs, sized for the model's widest layer
(Gemma 4's full layers have wider heads, its shared-KV layers a wider MLP), its experts and per-layer inputs,
its LoRA adapters and its logits' re-score; allocated before the team starts and freed after. */

#ifndef AGENTKV_CPU_STEP_SCRATCH_H
#define AGENTKV_CPU_STEP_SCRATCH_H

#include <stdlib.h>

#include "cpu_step.h"

typedef struct {
    int64_t HD, qkv_n, inter;       /* the widest attention output, q with k and v, and MLP */
    int64_t part_stride, part_items; /* floats a part of a token's keys takes, and parts' (KV head, chunk) items */
} StepShapes;

/* the widest of the model's layers, for `threads` threads and tokens whose keys are in `all_parts` parts */
static StepShapes widest(const StepModel *md, int threads, int64_t all_parts) {
    StepShapes w = {0, 0, 0, 0, 0};
    const int64_t H = md->heads;
    for (int64_t l = 0; l < md->layers; l++) {
        const StepLayer *L = md->layer + l;
        int64_t ng;
        const int64_t chunks = head_chunks(threads, all_parts, L->kv_heads, H / L->kv_heads, &ng);
        const int64_t qkv = (H + 2 * L->kv_heads) * L->head_dim, stride = ng * (L->head_dim + 2);
        w.HD = H * L->head_dim > w.HD ? H * L->head_dim : w.HD, w.qkv_n = qkv > w.qkv_n ? qkv : w.qkv_n;
        w.inter = L->inter > w.inter ? L->inter : w.inter;
        w.part_stride = stride > w.part_stride ? stride : w.part_stride;
        w.part_items = L->kv_heads * chunks > w.part_items ? L->kv_heads * chunks : w.part_items;
    }
    return w;
}

static void free_scratch(Scratch *s) {
    free(s->x), free(s->h), free(s->qkv), free(s->gu), free(s->parts), free(s->top_idx), free(s->top_val);
    free(s->lt), free(s->act), free(s->hn);
    free(s->top_n);
    free(s->rl), free(s->pw), free(s->egu), free(s->ey), free(s->pick), free(s->pair_tok), free(s->pair_of);
    free(s->grp);
    free(s->rs), free(s->sgu), free(s->sy);
    free(s->pl), free(s->plt), free(s->plg), free(s->dn), free(s->mo);
    agentkv_qrows_free(&s->qa), agentkv_qrows_free(&s->qo), agentkv_qrows_free(&s->qd), agentkv_qrows_free(&s->qp);
    agentkv_qrows_free(&s->qm);
    agentkv_qrows_free(&s->qe), agentkv_qrows_free(&s->qe2), agentkv_qrows_free(&s->qs2);
}

/* a mixture of experts' scratch: the most experts, chosen, widths (an expert's, a shared expert's) of any layer;
   Gemma 4's experts beside an MLP also keep both outputs and their own input. 0, or nonzero where memory ran out */
static int alloc_experts(const StepModel *md, int64_t M, Scratch *s) {
    const int64_t hid = md->hidden;
    int64_t E = 0, k = 0, einter = 0, sinter = 0;
    int beside = 0;
    for (int64_t l = 0; l < md->layers; l++)
        if (md->layer[l].experts) {
            const StepLayer *L = md->layer + l;
            E = L->experts > E ? L->experts : E, k = L->top_k > k ? L->top_k : k;
            einter = L->expert_gate_up[0].N / 2 > einter ? L->expert_gate_up[0].N / 2 : einter;
            sinter = L->shared_gate_up.N / 2 > sinter ? L->shared_gate_up.N / 2 : sinter;
            beside |= L->moe_norm != NULL;
        }
    if (!E) return 0;
    s->rl = malloc((size_t)(M * E) * sizeof(float));
    s->pw = malloc((size_t)(M * k) * sizeof(float));
    s->pick = malloc((size_t)(M * k) * sizeof(int64_t));
    s->pair_tok = malloc((size_t)(M * k) * sizeof(int64_t));
    s->pair_of = malloc((size_t)(M * k) * sizeof(int64_t));
    s->grp = malloc((size_t)(3 * M * k) * sizeof(int64_t));
    s->egu = malloc((size_t)(M * k * 2 * einter) * sizeof(float));
    s->ey = malloc((size_t)(M * k * hid) * sizeof(float));
    s->rs = malloc((size_t)(M * 2 * E) * sizeof(float));
    s->sgu = malloc((size_t)(M * 2 * (sinter ? sinter : 1)) * sizeof(float));
    s->sy = malloc((size_t)(M * hid) * sizeof(float));
    if (beside) {
        s->dn = malloc((size_t)(M * hid) * sizeof(float));
        s->mo = malloc((size_t)(M * hid) * sizeof(float));
    }
    return !s->rl || !s->pw || !s->pick || !s->pair_tok || !s->pair_of || !s->grp || !s->egu || !s->ey || !s->rs ||
           !s->sgu || !s->sy || (beside && (!s->dn || !s->mo || agentkv_qrows_alloc(&s->qm, M, hid))) ||
           agentkv_qrows_alloc(&s->qe, M * k, hid) || agentkv_qrows_alloc(&s->qe2, M * k, einter) ||
           (sinter && agentkv_qrows_alloc(&s->qs2, M, sinter));
}

/* room for run's pass (free_scratch frees it, also after a failure): 0, or nonzero where memory ran out */
static int alloc_scratch(StepRun *run, const StepShapes *w) {
    const StepModel *md = run->md;
    Scratch *s = &run->s;
    const int64_t M = run->M, S = run->S, hid = md->hidden, nthreads = run->threads, R = run->R;
    if (run->max_parts > 1) {
        s->parts = malloc((size_t)(M * w->part_items * run->max_parts * w->part_stride) * sizeof(float));
        if (!s->parts) return 1;
    }
    if (md->pl_width) {
        const int64_t all = md->layers * md->pl_width;
        s->pl = malloc((size_t)(M * all) * sizeof(float));
        s->plt = malloc((size_t)(M * all) * sizeof(float));
        s->plg = malloc((size_t)(M * md->pl_width) * sizeof(float));
        if (!s->pl || !s->plt || !s->plg || agentkv_qrows_alloc(&s->qp, M, md->pl_width)) return 1;
    }
    s->x = malloc((size_t)(M * hid) * sizeof(float));
    s->h = malloc((size_t)(M * run->width) * sizeof(float));
    s->qkv = malloc((size_t)(M * w->qkv_n) * sizeof(float));
    s->gu = malloc((size_t)(M * 2 * w->inter) * sizeof(float));
    s->top_idx = malloc((size_t)(nthreads * (S + 1) * (R + 1)) * sizeof(int64_t));
    s->top_val = malloc((size_t)(nthreads * (S + 1) * (R + 1)) * sizeof(float));
    s->top_n = calloc((size_t)(nthreads * (S + 1)), sizeof(int));
    if (run->lora) {
        s->lt = malloc((size_t)(M * LORA_TARGETS * LORA_MAX_RANK) * sizeof(float));
        s->act = run->lora_down ? malloc((size_t)(M * w->inter) * sizeof(float)) : NULL;
        s->hn = malloc((size_t)(nthreads * run->width) * sizeof(float));
        if (!s->lt || (run->lora_down && !s->act) || !s->hn) return 1;
    }
    return alloc_experts(md, M, s) || !s->x || !s->h || !s->qkv || !s->gu || !s->top_idx || !s->top_val ||
           !s->top_n || agentkv_qrows_alloc(&s->qa, M, hid) || agentkv_qrows_alloc(&s->qo, M, w->HD) ||
           agentkv_qrows_alloc(&s->qd, M, w->inter);
}

#endif
