/* The native decode step's types (cpu_step.c): the model as engine/native_step.py describes it, a pass's
LoRA adapters, a call's scratch and inputs, and how a matrix's tiles are shared among the threads. */

#ifndef AGENTKV_CPU_STEP_H
#define AGENTKV_CPU_STEP_H

#include "cpu_attention.h"
#include "cpu_lora.h"
#include "cpu_pool.h"
#include "cpu_rows.h"
#include "cpu_tiles.h"

#define MAX_PARTS 3

typedef struct {
    int64_t qtype, N;      /* a tiled type (cpu_blocks.h), and the part's rows */
    const uint8_t *tiles;
} StepPart;

/* a linear: its parts stacked along N, each in tiles of its own type (a Q4_K_M file's q and k in Q4_K
   beside a v in Q6_K; most linears are one part) */
typedef struct {
    int64_t N, K;
    const float *bias;     /* [N] or NULL */
    int64_t parts;
    StepPart part[MAX_PARTS];
} StepMat;

typedef struct {
    const float *attn_norm, *mlp_norm;  /* [hidden] */
    const float *q_norm, *k_norm;       /* [head_dim] (Qwen3's per-head norms) or NULL */
    StepMat qkv, o, gate_up, down;      /* qkv: q, k, v side by side; gate_up: gate, up */
    void *k_cache, *v_cache;            /* [num_slots, kv_heads, head_dim], fp32 or bf16 (StepModel.kv_bf16) */
    const float *cos, *sin;             /* [positions, head_dim] (Gemma 3's windowed layers: their own base);
                                           NULL: the layer does not rotate (SmolLM3's every 4th) */
    int64_t window;                     /* keys a query sees, its own included; 0: all */
    /* Gemma's sandwich: attention's and the MLP's outputs normed before they join the residual (mlp_norm
       then the norm before the MLP); NULL for the other families */
    const float *post_attn_norm, *post_mlp_norm;
    const float *sinks;                 /* [heads] or NULL: a learned logit per query head in its softmax (gpt-oss) */
    /* a mixture of experts in the MLP's place where experts > 0: the router (fp32, packed for cpu_linear.c:
       [experts / 16][hidden][16]) and its bias; each token's top_k experts by a softmax, or where score_bias
       is set by DeepSeek-V3's sigmoid scores within groups (cpu_moe.c); each expert's gate_up and down
       ([experts] each, one shape and type); an ungated shared expert where shared_gate_up.N > 0 */
    int64_t experts, top_k, norm_topk;
    float routed_scaling;
    const float *router, *router_bias;
    const StepMat *expert_gate_up, *expert_down;
    const float *score_bias;            /* [experts] or NULL: a softmax router */
    int64_t groups, groups_chosen;
    StepMat shared_gate_up, shared_down;
    /* the layer's own shapes (Gemma 4's full layers: wider heads and other KV heads; its layers that read
       others' KV: a wider MLP); every other family's are the model's in every layer */
    int64_t kv_heads, head_dim, rot, inter;
    int64_t reads_kv;      /* qkv is q alone: the layer attends over an earlier layer's K/V, written in this pass
                              (k_cache and v_cache are that layer's) */
    int64_t k_eq_v;        /* qkv is q and k: the values are the keys' projection, taken before k's norm */
    const float *v_norm;   /* [head_dim] or NULL: the values RMS-normed (Gemma 4's: a weight of ones) */
    /* Gemma 4's per-layer input (pl_gate.N > 0), after the MLP: x += pl_norm(pl_out(gelu(pl_gate(x)) * input));
       then, where `scaled`, x *= scalar */
    StepMat pl_gate, pl_out;
    const float *pl_norm;
    int64_t scaled;
    float scalar;
    /* Gemma 4's experts beside the MLP (experts > 0 and dense gate_up): the experts read the residual normed by
       moe_norm, the router by router_norm; each chosen expert's weight times its expert_scale; the MLP's output
       and the experts' normed by mlp_out_norm and moe_out_norm, summed, then normed by post_mlp_norm */
    const float *moe_norm, *router_norm, *mlp_out_norm, *moe_out_norm, *expert_scale;
} StepLayer;

typedef struct {
    int64_t layers, hidden, heads, vocab, num_slots, positions;  /* (each layer's other shapes: StepLayer) */
    float eps, scale, attn_softcap, embed_scale;  /* embed_scale: Gemma's sqrt(hidden) (fp32), else 0 */
    int64_t embed_qtype;   /* -1: an fp32 table [vocab, hidden]; else a quantized one */
    int64_t embed_tiled;   /* its blocks in tiles (a tied vocabulary projection's) */
    const void *embed;
    const float *final_norm;
    StepMat lm_head;
    int64_t rescore;       /* each token's this many top logits re-scored exactly */
    const StepLayer *layer;
    int64_t kv_bf16;       /* the KV caches hold bf16 (rounded to nearest even), else fp32 */
    int64_t gelu;          /* the MLP's activation GELU's tanh form (Gemma), else silu */
    float residual_scale;  /* Granite's: each attention and MLP output times it before the residual; 0: none */
    float swiglu_limit, swiglu_alpha;  /* gpt-oss's clamped SwiGLU where the limit > 0 (glu_row) */
    /* Gemma 4's per-layer inputs (pl_width 0: none), each token's [layers][pl_width]: its row of pl_table (fp32
       [pl_vocab, layers x pl_width] where pl_qtype < 0, else that type's blocks) times pl_table_scale, plus
       pl_proj of the scaled embedding times pl_proj_scale and normed by pl_norm, the sum times pl_sum_scale */
    int64_t pl_width, pl_qtype, pl_vocab;
    const void *pl_table;
    StepMat pl_proj;
    const float *pl_norm;
    float pl_table_scale, pl_proj_scale, pl_sum_scale;
} StepModel;

#define MAX_RESCORE 64

/* cpu_moe.c: a token's experts from its router logits (the Python path's routing too) */
void agentkv_moe_route_row(const float *logits, int64_t E, int64_t k, int norm, float scaling, int64_t *idx,
                           float *w);
void agentkv_moe_route_groups_row(const float *logits, const float *bias, int64_t E, int64_t k, int64_t groups,
                                  int64_t chosen, int norm, float scaling, int64_t *idx, float *w, float *scratch);
/* cpu_linear.c: agentkv_linear's column blocks [nb0, nb1), fp32, on the calling thread */
void agentkv_linear_blocks(const float *x, int64_t x_ld, int64_t M, int64_t K, const float *wp, int64_t N,
                           const float *bias, int64_t nb0, int64_t nb1, float *out, int64_t out_ld);

typedef struct {
    const int64_t *row_adapter; /* [M]: each token's index into adapters, -1: none */
    const LoraAdapter *adapters;
    int64_t count;
} StepLora;

enum { L_QKV, L_O, L_GATE_UP, L_DOWN }; /* cpu_lora.h's targets' order */

typedef struct {
    float *x, *h, *qkv, *gu;
    float *lt;         /* [M][LORA_TARGETS][LORA_MAX_RANK]: each token's shrunk inputs of its adapter's updates */
    float *act;        /* [M][inter]: the MLP's activations, where an adapter updates the down projection */
    float *hn;         /* [threads][width]: a thread's own copy of a normed row whose shrink it shares */
    float *parts;      /* [M][KVH x chunks][max_parts][part_stride]: attention's parts, before their merge */
    QRows qa, qo, qd;  /* quantized inputs of qkv and gate_up (hidden), o (heads x head_dim), down (inter): sized
                          for the widest layer, a narrower one's read through a view (qrows_view) */
    float *pl, *plt;   /* Gemma 4: each token's per-layer inputs and its table rows [M][layers x width] */
    float *plg;        /* a layer's per-layer gate [M][width] */
    QRows qp;          /* the gated per-layer input quantized (width) */
    float *dn, *mo;    /* Gemma 4's experts beside the MLP: the MLP's output and the experts' [M][hidden] */
    QRows qm;          /* the experts' input quantized (hidden) */
    /* a mixture of experts' layer: router logits [M][experts]; each token's experts (ascending) and weights
       [M][top_k]; the (token, expert) pairs grouped by expert: each pair's token, each group's expert, first pair
       and count; the pairs' inputs (hidden) and activations (expert width) quantized, their gate_up and outputs */
    float *rl, *pw, *egu, *ey, *rs;    /* rs [M][2 experts]: a sigmoid router's scratch */
    float *sgu, *sy;                   /* a shared expert's gate_up [M][2 width] and output [M][hidden] */
    QRows qs2;                         /* its activations quantized */
    int64_t *pick, *pair_tok, *pair_of, *grp;  /* (pair_of [M][top_k]: each choice's pair) */
    int64_t groups;
    QRows qe, qe2;
    int64_t *top_idx;  /* [threads][M][R]: each thread's best logits of its tiles */
    float *top_val;
    int *top_n;
} Scratch;

typedef struct {  /* one call's inputs and scratch, what every thread of its job reads */
    const StepModel *md;
    int64_t M, S, threads, all_parts, width;  /* (threads, all_parts: what head_chunks reads) */
    int64_t max_parts, part_stride;  /* the most parts a token's keys are attended in (any layer), floats a part */
    const int64_t *ids, *pos, *out_loc, *table, *rows, *sel;
    int64_t table_ld;
    float *logits, *hidden;
    int R, generic;
    const StepLora *lora;  /* NULL: no token has an adapter */
    int lora_down;         /* some token's adapter updates the down projection */
    int lora_split;        /* fewer tokens than threads: every thread takes a share of each token's shrink */
    Scratch s;
} StepRun;

INLINE int64_t share(int64_t n, int me, int nt) { return n * me / nt; }

/* dst = y * w, stored (noinline: the sum that reads it cannot fuse the product into a multiply-add, as the
   Python path rounds the product before it adds) */
static __attribute__((noinline)) void scaled(float *dst, const float *y, float w, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = y[i] * w;
}

/* every token's MLP activations (act(gate) * up of s->gu's rows, `inter` wide) quantized into qd, blocks of
   them shared by the threads; kept in s->act too where an adapter updates the down projection */
INLINE void glu_blocks(const StepRun *run, int64_t inter, const QRows *qd, int me, int nt) {
    const StepModel *md = run->md;
    const Scratch *s = &run->s;
    for (int64_t item = me; item < run->M * (inter / QK); item += nt) {
        const int64_t m = item / (inter / QK), b = item % (inter / QK);
        float act[QK];
        const float *gate = s->gu + m * 2 * inter + b * QK;
        glu_row(gate, gate + inter, QK, act, 0, (int)md->gelu, md->swiglu_limit, md->swiglu_alpha, run->generic);
        quantize_into(act, qd, m, b);
        if (run->lora_down) memcpy(s->act + m * inter + b * QK, act, sizeof act);
    }
}

/* q's buffers read as rows of K <= q->K (row m's blocks where quantize_into puts them for a q of K) */
INLINE QRows qrows_view(const QRows *q, int64_t K) {
    QRows v = *q;
    v.K = K;
    return v;
}

/* how many tasks a KV head's G query heads are split into, and the heads a task takes (ng): all G (the KV head's
   keys and values read once) unless that leaves threads idle; `parts`: all tokens' most parts of their keys */
INLINE int64_t head_chunks(int64_t threads, int64_t parts, int64_t KVH, int64_t G, int64_t *ng) {
    int64_t chunks = (2 * threads + parts * KVH - 1) / (parts * KVH);
    chunks = chunks < 1 ? 1 : chunks > G ? G : chunks;
    *ng = (G + chunks - 1) / chunks;
    return (G + *ng - 1) / *ng;
}

INLINE int64_t tiles_of(int64_t rows) { return (rows + TILE_ROWS - 1) / TILE_ROWS; }

INLINE int64_t mat_tiles(const StepMat *w) {
    int64_t total = 0;
    for (int64_t p = 0; p < w->parts; p++) total += tiles_of(w->part[p].N);
    return total;
}

/* tiles [t0, t1) of W (over all its parts, in order) times x's M rows */
INLINE void mat_range(const StepMat *w, const QRows *x, int64_t M, int64_t t0, int64_t t1, const float *res,
                      int64_t r_ld, float *out, int64_t out_ld, int generic) {
    for (int64_t p = 0, first = 0, row = 0; p < w->parts; p++) {
        const StepPart *part = w->part + p;
        const int64_t n = tiles_of(part->N), a = t0 > first ? t0 - first : 0, b = t1 - first < n ? t1 - first : n;
        if (a < b)
            agentkv_qtile_range((int)part->qtype, part->tiles, part->N, w->K, x, M, a, b,
                                w->bias ? w->bias + row : NULL, res ? res + row : NULL, r_ld, out + row, out_ld, 0,
                                generic);
        first += n, row += part->N;
    }
}

/* the tiles of W that thread `me` of `nt` multiplies: its share of all parts' tiles in order */
INLINE void mat_share(const StepMat *w, const QRows *x, int64_t M, int me, int nt, const float *res, int64_t r_ld,
                      float *out, int64_t out_ld, int generic) {
    const int64_t total = mat_tiles(w);
    mat_range(w, x, M, share(total, me, nt), share(total, me + 1, nt), res, r_ld, out, out_ld, generic);
}

/* the output columns [c0, c1) that thread `me` of `nt` writes in mat_share (its tiles, in order over the parts) */
INLINE void mat_cols(const StepMat *w, int me, int nt, int64_t *c0, int64_t *c1) {
    const int64_t total = mat_tiles(w);
    const int64_t t0 = share(total, me, nt), t1 = share(total, me + 1, nt);
    int64_t first = 0, row = 0;
    *c0 = *c1 = 0;
    for (int64_t p = 0; p < w->parts; p++) {  /* a tile index to its first column: its part's row + its place */
        const int64_t n = tiles_of(w->part[p].N), N = w->part[p].N;
        if (t0 >= first && t0 <= first + n) *c0 = row + ((t0 - first) * TILE_ROWS < N ? (t0 - first) * TILE_ROWS : N);
        if (t1 >= first && t1 <= first + n) *c1 = row + ((t1 - first) * TILE_ROWS < N ? (t1 - first) * TILE_ROWS : N);
        first += n, row += N;
    }
}

#endif
