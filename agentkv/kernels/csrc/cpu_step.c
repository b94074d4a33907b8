/* A pass of a model in one native call (Llama-family, Gemma 2 / 3 / 4, GLM-4, mixtures of experts: the
families' parts in cpu_step_moe.h and cpu_step_gemma4.h, the scratch in cpu_step_scratch.h): embedding,
every layer, the final norm and the vocabulary projection, for up to 16 tokens (decodes, and short extends:
jump-forward, drafts being checked), as one parallel job (cpu_pool.c) with a barrier between ops (ggml's graph-compute
structure). The Python path makes ~270 kernel calls a decode step, each its own parallel region
woken from Python; here the team is woken once and each op is split into per-thread shares (tiles
of a matrix, tokens x heads, blocks of an activation).

Every op is the Python path's own body (cpu_rows.h, the tiled linear of cpu_tiles.c, the attention
task of cpu_attention_tasks.c, a token's keys in the same fixed parts merged in the same order), called in
the same order on the same values, so the logits are the same bits.

Activations are fp32; each normed input is quantized to int8 blocks once, and every linear that reads
it uses those blocks. The model is described once at load (StepModel, mirrored by ctypes in
engine/native_step.py): pointers to the tiled weights, norms, KV caches and rotation tables.

A pass may carry LoRA adapters (StepLora: each token's adapter, or none), whose updates are cpu_lora.h's
row bodies, as the Python path's: a token's input shrunk by the thread that made it (in the phase that
finishes it, so no barrier is added but for the MLP's down projection), and the product with B added to
the columns each thread's tiles wrote. */

#include <stdlib.h>

#include "cpu_step.h"
#include "cpu_step_gemma4.h"
#include "cpu_step_lora.h"
#include "cpu_step_moe.h"
#include "cpu_step_scratch.h"

/* cpu_attention_tasks.c: one decoding token's attention for some query heads of a KV head, whole or a part of
   its keys at a time, and the parts merged */
int64_t agentkv_attend_parts(int64_t len, int64_t window);
void agentkv_attend_one(const float *q, const void *kc, const void *vc, const int64_t *slots, int64_t len, int h,
                        int g0, int ng, int G, int KVH, int H, int D, float scale, float *out, int64_t window,
                        float softcap, const float *sinks, int kvbf, int generic, int64_t part, float *partial);
void agentkv_attend_merge(const float *partials, int64_t parts, int64_t part_stride, int g0, int ng, int G, int h,
                          int H, int D, const float *sinks, float *out);

/* 0 when every index the step follows is in bounds, else which kind is not (nothing done) */
static int check(const StepModel *md, int64_t M, const int64_t *ids, const int64_t *pos, const int64_t *out_loc,
                 const int64_t *table, int64_t table_rows, int64_t table_ld, const int64_t *rows, const int64_t *sel,
                 int64_t S) {
    for (int64_t i = 0; i < S; i++)
        if (sel[i] < 0 || sel[i] >= M) return 6;
    for (int64_t m = 0; m < M; m++) {
        if (ids[m] < 0 || ids[m] >= md->vocab || (md->pl_width && ids[m] >= md->pl_vocab)) return 1;
        if (pos[m] < 0 || pos[m] >= md->positions || pos[m] >= table_ld) return 2;
        if (out_loc[m] < 0 || out_loc[m] >= md->num_slots) return 3;
        if (rows[m] < 0 || rows[m] >= table_rows) return 4;
        for (int64_t j = 0; j <= pos[m]; j++) {
            const int64_t slot = table[rows[m] * table_ld + j];
            if (slot < 0 || slot >= md->num_slots) return 5;
        }
    }
    return 0;
}

/* row m of x normed into `h` and quantized into `q` */
INLINE void norm_quant(const float *x, const float *w, int64_t n, float eps, float *h, const QRows *q, int64_t m,
                       int generic) {
    rms_row(x, w, n, eps, h, 0, generic);
    quantize_blocks(h, q, m, 0, n / QK);
}

static void embed_row(const StepModel *md, int64_t id, float *out) {
    if (md->embed_tiled) agentkv_qtile_row((int)md->embed_qtype, md->embed, md->hidden, id, out);
    else table_row(md->embed_qtype, md->embed, md->hidden, id, out);
}

/* one decoding token's q head or k head (hh: q's, then k's) normed (Qwen3) and rotated, and a k head and its v
   head (normed where the layer norms values; Gemma 4's full layers': the k head's projection) into the caches */
INLINE void place_heads(const StepModel *md, const StepLayer *L, float *qkv, int64_t pos, int64_t slot, int64_t hh,
                        int generic) {
    const int64_t H = md->heads, KVH = L->kv_heads, D = L->head_dim;
    float *head = qkv + hh * D, vn[MAX_D];
    const float *v = hh < H ? NULL : L->k_eq_v ? head : qkv + (H + KVH + hh - H) * D;
    if (v && L->v_norm) {  /* (before k's own norm: k_eq_v's values are the projection) */
        rms_row(v, L->v_norm, D, md->eps, vn, 0, generic);
        v = vn;
    }
    const float *norm = hh < H ? L->q_norm : L->k_norm;
    if (norm) rms_row(head, norm, D, md->eps, head, 0, generic);
    if (L->cos) rope_head(head, L->rot, L->cos + pos * D, L->sin + pos * D, 0, generic);
    if (v) {  /* a k head: it and its v head go to the token's slot */
        const int64_t kv = hh - H, at = (slot * KVH + kv) * D;
        if (md->kv_bf16) {
            for (int64_t d = 0; d < D; d++) {
                store1(L->k_cache, at + d, head[d], 1);
                store1(L->v_cache, at + d, v[d], 1);
            }
        } else {
            memcpy((float *)L->k_cache + at, head, (size_t)D * sizeof(float));
            memcpy((float *)L->v_cache + at, v, (size_t)D * sizeof(float));
        }
    }
}

/* x += W q (the residual added in the tiles' stores), or for Gemma's sandwich x += norm(W q), or for
   Granite x += (W q) * scale: the product into h first, then each row normed or scaled in place and
   added (the Python path's ops, each rounded as it rounds them: the scale in a pass of its own, so no
   multiply-add joins it to the sum) */
static void residual_out(const StepModel *md, const StepMat *w, const QRows *q, const float *post_norm,
                         const StepRun *run, int64_t l, int target, int me, int nt) {
    const Scratch *s = &run->s;
    const int64_t M = run->M, hid = md->hidden, width = run->width;
    const float scale = md->residual_scale;
    if (!post_norm && scale == 0.f) {
        mat_share(w, q, M, me, nt, s->x, hid, s->x, hid, run->generic);
        if (target >= 0) lora_out(run, l, target, w, s->x, hid, me, nt);
        agentkv_pool_barrier(nt);
        return;
    }
    mat_share(w, q, M, me, nt, NULL, 0, s->h, width, run->generic);
    if (target >= 0) lora_out(run, l, target, w, s->h, width, me, nt);
    agentkv_pool_barrier(nt);
    for (int64_t m = me; m < M; m += nt) {
        float *h = s->h + m * width, *x = s->x + m * hid;
        if (post_norm) rms_row(h, post_norm, hid, md->eps, h, 0, run->generic);
        if (scale != 0.f) scaled(h, h, scale, hid);
        for (int64_t i = 0; i < hid; i++) x[i] += h[i];
    }
    agentkv_pool_barrier(nt);
}

/* thread `me` of `nt`: its share of every op, a barrier between ops */
static void step_job(void *arg, int me, int nt) {
    StepRun *run = arg;
    const StepModel *md = run->md;
    Scratch *s = &run->s;
    const int64_t M = run->M, S = run->S, H = md->heads, hid = md->hidden, V = md->vocab, width = run->width;
    const int64_t table_ld = run->table_ld;
    const int64_t *pos = run->pos, *rows = run->rows;
    const int R = run->R, generic = run->generic;
    float *logits = run->logits;
    for (int64_t m = me; m < M; m += nt) {
        embed_row(md, run->ids[m], s->x + m * hid);
        if (md->embed_scale != 0.f)
            for (int64_t i = 0; i < hid; i++) s->x[m * hid + i] *= md->embed_scale;
    }
    agentkv_pool_barrier(nt);
    if (md->pl_width) per_layer_inputs(run, me, nt);
    for (int64_t l = 0; l < md->layers; l++) {
        const StepLayer *L = md->layer + l;
        const int64_t KVH = L->kv_heads, D = L->head_dim, inter = L->inter, G = H / KVH;
        const int64_t kv_n = L->reads_kv ? 0 : (L->k_eq_v ? 1 : 2) * KVH * D, qkv_n = H * D + kv_n;
        const int64_t placed = H + (L->reads_kv ? 0 : KVH);  /* q heads, then the k heads the layer writes */
        int64_t ng;
        const int64_t chunks = head_chunks(run->threads, run->all_parts, KVH, G, &ng);
        const QRows qo = qrows_view(&s->qo, H * D), qd = qrows_view(&s->qd, inter);
        for (int64_t m = me; m < M; m += nt)
            norm_quant(s->x + m * hid, L->attn_norm, hid, md->eps, s->h + m * width, &s->qa, m, generic);
        lora_in_normed(run, l, L_QKV, L->attn_norm, me, nt);
        agentkv_pool_barrier(nt);
        mat_share(&L->qkv, &s->qa, M, me, nt, NULL, 0, s->qkv, qkv_n, generic);
        lora_out(run, l, L_QKV, &L->qkv, s->qkv, qkv_n, me, nt);
        agentkv_pool_barrier(nt);
        for (int64_t item = me; item < M * placed; item += nt) {
            const int64_t m = item / placed;
            place_heads(md, L, s->qkv + m * qkv_n, pos[m], run->out_loc[m], item % placed, generic);
        }
        agentkv_pool_barrier(nt);
        /* tasks (token, KV head, query heads, part of its keys): a token's parts at its own place in
           s->parts, merged once all are done */
        const int64_t P = run->max_parts, heads = KVH * chunks;  /* (this layer's) */
        for (int64_t task = me; task < M * heads * P; task += nt) {
            const int64_t m = task / (heads * P), h = task / P / chunks % KVH, g0 = task / P % chunks * ng;
            const int64_t part = task % P, parts = agentkv_attend_parts(pos[m] + 1, L->window);
            if (part >= parts) continue;
            agentkv_attend_one(s->qkv + m * qkv_n, L->k_cache, L->v_cache, run->table + rows[m] * table_ld, pos[m] + 1,
                               (int)h, (int)g0, (int)(G - g0 < ng ? G - g0 : ng), (int)G, (int)KVH, (int)H, (int)D,
                               md->scale, s->h + m * width, L->window, md->attn_softcap, L->sinks, (int)md->kv_bf16,
                               generic, part, parts > 1 ? s->parts + task * run->part_stride : NULL);
        }
        agentkv_pool_barrier(nt);
        if (P > 1) {
            for (int64_t item = me; item < M * heads; item += nt) {
                const int64_t m = item / heads, h = item / chunks % KVH, g0 = item % chunks * ng;
                const int64_t parts = agentkv_attend_parts(pos[m] + 1, L->window);
                if (parts > 1)
                    agentkv_attend_merge(s->parts + item * P * run->part_stride, parts, run->part_stride, (int)g0,
                                         (int)(G - g0 < ng ? G - g0 : ng), (int)G, (int)h, (int)H, (int)D,
                                         L->sinks, s->h + m * width);
            }
            agentkv_pool_barrier(nt);
        }
        for (int64_t item = me; item < M * (H * D / QK); item += nt) {
            const int64_t m = item / (H * D / QK), b = item % (H * D / QK);
            quantize_blocks(s->h + m * width, &qo, m, b, b + 1);
        }
        lora_in_rows(run, l, L_O, s->h, width, H * D, me, nt);
        agentkv_pool_barrier(nt);
        residual_out(md, &L->o, &qo, L->post_attn_norm, run, l, L_O, me, nt);
        for (int64_t m = me; m < M; m += nt)
            norm_quant(s->x + m * hid, L->mlp_norm, hid, md->eps, s->h + m * width, &s->qa, m, generic);
        lora_in_normed(run, l, L_GATE_UP, L->mlp_norm, me, nt);
        agentkv_pool_barrier(nt);
        if (L->experts && L->moe_norm) {  /* Gemma 4's: the experts beside the MLP */
            experts_beside_mlp(run, L, me, nt);
            per_layer_out(run, L, l, me, nt);
            continue;
        }
        if (L->experts) {  /* (adapters do not target experts: the step is given none for such a model) */
            moe_out(run, L, &s->qa, NULL, me, nt);
            continue;
        }
        mat_share(&L->gate_up, &s->qa, M, me, nt, NULL, 0, s->gu, 2 * inter, generic);
        lora_out(run, l, L_GATE_UP, &L->gate_up, s->gu, 2 * inter, me, nt);
        agentkv_pool_barrier(nt);
        glu_blocks(run, inter, &qd, me, nt);
        agentkv_pool_barrier(nt);
        if (run->lora_down) {  /* a row's activations are whole only now: their shrink is a phase of its own */
            lora_in_rows(run, l, L_DOWN, s->act, inter, inter, me, nt);
            agentkv_pool_barrier(nt);
        }
        residual_out(md, &L->down, &qd, L->post_mlp_norm, run, l, L_DOWN, me, nt);
        per_layer_out(run, L, l, me, nt);
    }
    for (int64_t i = me; i < S; i += nt)  /* the selected tokens only, in their order */
        norm_quant(s->x + run->sel[i] * hid, md->final_norm, hid, md->eps, s->h + i * width, &s->qa, i, generic);
    agentkv_pool_barrier(nt);
    for (int64_t i = me; i < S && run->hidden; i += nt)  /* what a re-score after the grammar's mask reads */
        memcpy(run->hidden + i * hid, s->h + i * width, (size_t)hid * sizeof(float));
    mat_share(&md->lm_head, &s->qa, S, me, nt, NULL, 0, logits, V, generic);
    if (R > 0) {  /* this thread's best logits of its own tiles, while they are in cache */
        const int64_t ntiles = (V + TILE_ROWS - 1) / TILE_ROWS;
        const int64_t n0 = share(ntiles, me, nt) * TILE_ROWS, n1e = share(ntiles, me + 1, nt) * TILE_ROWS;
        const int64_t n1 = n1e < V ? n1e : V;
        for (int64_t m = 0; m < S; m++) {
            const int64_t at = ((int64_t)me * S + m) * (R + 1);
            agentkv_top_merge(logits + m * V, n0, n1, R, s->top_idx + at, s->top_val + at, s->top_n + me * S + m);
        }
    }
    agentkv_pool_barrier(nt);
    for (int64_t m = me; m < S && R > 0; m += nt) {  /* the row's R best of all threads', re-scored */
        int64_t idx[MAX_RESCORE];
        float val[MAX_RESCORE];
        int count = 0;
        for (int t = 0; t < nt; t++) {
            const int64_t at = ((int64_t)t * S + m) * (R + 1);
            for (int c = 0; c < s->top_n[t * S + m]; c++) {
                /* one candidate at a time through the same insertion (v holds it at its own index) */
                const int64_t n = s->top_idx[at + c];
                agentkv_top_merge(logits + m * V, n, n + 1, R, idx, val, &count);
            }
        }
        float w[4096];
        float *row = hid <= 4096 ? w : malloc((size_t)hid * sizeof(float));
        const StepPart *head = md->lm_head.part;  /* (one part) */
        for (int c = 0; row && c < count; c++)
            logits[m * V + idx[c]] =
                agentkv_exact_logit((int)head->qtype, head->tiles, hid, s->h + m * width, idx[c], row);
        if (row != w) free(row);
    }
}

/* A pass of M tokens (ids, positions, their new slots out_loc, their requests' rows of the slot table:
   decodes, and the tokens of short extends, a request's in order) through the model: logits [S, vocab]
   fp32 of the tokens `sel`, and their final normed states into `hidden` [S, hidden] (where not NULL: an
   exact re-score after a grammar's mask reads them), on up to `nthreads` threads (cpu_pool.c). A token attends to its
   request's first pos + 1 slots, its own and the pass's earlier ones included; `lora` (or NULL) gives each token's
   adapter. Returns 0, an index check's code (1-6: nothing done), 6 also for M or S out of range, 7 when memory ran
   out, 8 for an adapter index or rank out of range. */
int agentkv_decode_step(const StepModel *md, int64_t M, const int64_t *ids, const int64_t *pos, const int64_t *out_loc,
                        const int64_t *table, int64_t table_rows, int64_t table_ld, const int64_t *rows,
                        const int64_t *sel, int64_t S, float *logits, float *hidden, int nthreads, int generic,
                        const StepLora *lora) {
    if (M < 1 || M > MAX_M || S < 0 || S > MAX_M) return 6;
    const int bad = check(md, M, ids, pos, out_loc, table, table_rows, table_ld, rows, sel, S);
    if (bad) return bad;
    int lora_down = 0;
    for (int64_t m = 0; lora && m < M; m++) {
        const int64_t a = lora->row_adapter[m];
        if (a >= lora->count) return 8;
        if (a < 0) continue;
        for (int64_t l = 0; l < md->layers; l++)
            for (int t = 0; t < LORA_TARGETS; t++) {
                const LoraMat *mat = &lora->adapters[a].layer[l].mat[t];
                if (mat->rank > LORA_MAX_RANK) return 8;
                lora_down |= t == L_DOWN && mat->pieces > 0;
            }
    }
    const int64_t hid = md->hidden;
    const int R = md->rescore < MAX_RESCORE ? (int)md->rescore : MAX_RESCORE;
    nthreads = nthreads < 1 ? 1 : nthreads > AGENTKV_POOL_MAX ? AGENTKV_POOL_MAX : nthreads;
    /* a token's keys in parts (cpu_attention_tasks.c's fixed ones: the most any layer's window leaves) */
    int64_t max_parts = 1, all_parts = 0;
    for (int64_t m = 0; m < M; m++) {
        int64_t most = 1;
        for (int64_t l = 0; l < md->layers; l++) {
            const int64_t p = agentkv_attend_parts(pos[m] + 1, md->layer[l].window);
            most = p > most ? p : most;
        }
        max_parts = most > max_parts ? most : max_parts;
        all_parts += most;
    }
    const StepShapes shapes = widest(md, nthreads, all_parts);
    StepRun run = {md, M, S, nthreads, all_parts, hid > shapes.HD ? hid : shapes.HD, max_parts, shapes.part_stride,
                   ids, pos, out_loc, table, rows, sel, table_ld, logits, hidden, R, generic, lora, lora_down,
                   lora != NULL && M < nthreads, {0}};
    if (alloc_scratch(&run, &shapes)) {
        free_scratch(&run.s);
        return 7;
    }
    agentkv_pool_run(step_job, &run, nthreads);
    free_scratch(&run.s);
    return 0;
}
