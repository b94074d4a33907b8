/* The native step's Gemma 4 parts (cpu_step.c): each token's per-layer inputs, computed once a pass from its
embedding, the experts beside a layer's MLP (the 26B-A4B's), and the per-layer input each layer adds after its
MLP, then the layer's scalar. Each op is the
Python path's (engine/gemma4.py) on the same kernels, in its order: the scales each in a pass of their own
(scaled), so that no multiply-add joins one to the sum after it. */

#ifndef AGENTKV_CPU_STEP_GEMMA4_H
#define AGENTKV_CPU_STEP_GEMMA4_H

#include "cpu_step.h"
#include "cpu_step_moe.h"

/* row `id` of a table of K columns, fp32 (qtype < 0) or in a quantized type's blocks (not tiled) */
INLINE void table_row(int64_t qtype, const void *table, int64_t K, int64_t id, float *out) {
    if (qtype < 0) {
        memcpy(out, (const float *)table + id * K, (size_t)K * sizeof(float));
        return;
    }
    const int qt = (int)qtype;
    const int64_t bw = BLOCK_WEIGHTS[qt], nb = K / bw;
    const uint8_t *row = (const uint8_t *)table + id * nb * BLOCK_BYTES[qt];
    for (int64_t b = 0; b < nb; b++) dequant_any(qt, row, b, out + b * bw);
}

/* every token's per-layer inputs into s->pl [M][layers x width], from the scaled embeddings in s->x: the
   projection's tiles shared by the threads, then a (token, layer) each: the projection scaled and normed, the
   table's row (in s->plt) scaled, their sum scaled */
static void per_layer_inputs(const StepRun *run, int me, int nt) {
    const StepModel *md = run->md;
    const Scratch *s = &run->s;
    const int64_t M = run->M, hid = md->hidden, w = md->pl_width, all = md->layers * w;
    for (int64_t m = me; m < M; m += nt) quantize_blocks(s->x + m * hid, &s->qa, m, 0, hid / QK);
    agentkv_pool_barrier(nt);
    mat_share(&md->pl_proj, &s->qa, M, me, nt, NULL, 0, s->pl, all, run->generic);
    agentkv_pool_barrier(nt);
    for (int64_t m = me; m < M; m += nt) table_row(md->pl_qtype, md->pl_table, all, run->ids[m], s->plt + m * all);
    agentkv_pool_barrier(nt);
    for (int64_t item = me; item < M * md->layers; item += nt) {
        const int64_t m = item / md->layers, l = item % md->layers;
        float *p = s->pl + m * all + l * w, *t = s->plt + m * all + l * w;
        scaled(p, p, md->pl_proj_scale, w);
        rms_row(p, md->pl_norm, w, md->eps, p, 0, run->generic);
        scaled(t, t, md->pl_table_scale, w);
        for (int64_t i = 0; i < w; i++) p[i] += t[i];
        scaled(p, p, md->pl_sum_scale, w);
    }
    agentkv_pool_barrier(nt);
}

static void residual_out(const StepModel *md, const StepMat *w, const QRows *q, const float *post_norm,
                         const StepRun *run, int64_t l, int target, int me, int nt);

/* layer l's per-layer input added after its MLP (x += norm(out(gelu(gate(x)) * its input))), then x times the
   layer's scalar */
static void per_layer_out(const StepRun *run, const StepLayer *L, int64_t l, int me, int nt) {
    const StepModel *md = run->md;
    const Scratch *s = &run->s;
    const int64_t M = run->M, hid = md->hidden, w = md->pl_width;
    if (L->pl_gate.N) {
        for (int64_t m = me; m < M; m += nt) quantize_blocks(s->x + m * hid, &s->qa, m, 0, hid / QK);
        agentkv_pool_barrier(nt);
        mat_share(&L->pl_gate, &s->qa, M, me, nt, NULL, 0, s->plg, w, run->generic);
        agentkv_pool_barrier(nt);
        for (int64_t item = me; item < M * (w / QK); item += nt) {
            const int64_t m = item / (w / QK), b = item % (w / QK);
            float act[QK];
            glu_row(s->plg + m * w + b * QK, s->pl + (m * md->layers + l) * w + b * QK, QK, act, 0, 1, 0.f, 0.f,
                    run->generic);
            quantize_into(act, &s->qp, m, b);
        }
        agentkv_pool_barrier(nt);
        residual_out(md, &L->pl_out, &s->qp, L->pl_norm, run, l, -1, me, nt);
    }
    if (L->scaled) {
        for (int64_t m = me; m < M; m += nt) scaled(s->x + m * hid, s->x + m * hid, L->scalar, hid);
        agentkv_pool_barrier(nt);
    }
}

/* x += norm(mlp_out_norm(mlp(h)) + moe_out_norm(experts(moe_norm(x)))), the experts routed from router_norm(x):
   Gemma 4's layer with experts, after norm_quant put the MLP's input (mlp_norm(x)) in s->qa */
static void experts_beside_mlp(StepRun *run, const StepLayer *L, int me, int nt) {
    const StepModel *md = run->md;
    Scratch *s = &run->s;
    const int64_t M = run->M, hid = md->hidden, inter = L->inter, width = run->width;
    const QRows qd = qrows_view(&s->qd, inter);
    for (int64_t m = me; m < M; m += nt) {  /* (s->h: the router's input, as moe_out reads it) */
        float *h = s->h + m * width;
        rms_row(s->x + m * hid, L->moe_norm, hid, md->eps, h, 0, run->generic);
        quantize_blocks(h, &s->qm, m, 0, hid / QK);
        rms_row(s->x + m * hid, L->router_norm, hid, md->eps, h, 0, run->generic);
    }
    mat_share(&L->gate_up, &s->qa, M, me, nt, NULL, 0, s->gu, 2 * inter, run->generic);
    agentkv_pool_barrier(nt);
    glu_blocks(run, inter, &qd, me, nt);  /* (no adapter: Gemma 4 takes none) */
    agentkv_pool_barrier(nt);
    mat_share(&L->down, &qd, M, me, nt, NULL, 0, s->dn, hid, run->generic);
    moe_out(run, L, &s->qm, s->mo, me, nt);  /* (its first barrier also ends the MLP's products) */
    for (int64_t m = me; m < M; m += nt) {
        float *d = s->dn + m * hid, *e = s->mo + m * hid, *x = s->x + m * hid;
        rms_row(d, L->mlp_out_norm, hid, md->eps, d, 0, run->generic);
        rms_row(e, L->moe_out_norm, hid, md->eps, e, 0, run->generic);
        for (int64_t i = 0; i < hid; i++) d[i] += e[i];
        rms_row(d, L->post_mlp_norm, hid, md->eps, d, 0, run->generic);
        for (int64_t i = 0; i < hid; i++) x[i] += d[i];
    }
    agentkv_pool_barrier(nt);
}

#endif
