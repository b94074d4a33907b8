/* Paged attention's calls on the CPU: the new tokens' K/V written to their slots, then the tiles of a
pass made into tasks (cpu_attention.h) for the bodies of cpu_attention.c, with every index checked first.

A written token's keys are attended in parts of PART_KEYS keys at fixed positions ([0, 512), [512,
1024), ...), each part a task of its own leaving (max, sum, unnormalized output) per query, merged in
part order (flash-decoding): a lone decoding token's long context is shared among the threads, and since
the parts do not depend on the pass, the batch or the threads, neither do its numbers (the native step
and this call give the same bits). A token whose keys fit one part is attended whole. A prompt's tiles,
of which a pass has many, are split only when there are fewer tasks than twice the threads (their keys
in as many parts as that takes). */

#include <stdlib.h>

#include "cpu_attention.h"

#define SPLIT_MIN_KEYS 512  /* keys a part of a prompt's task has at least when its keys are split */

/* n K or V values from x (bf16 where bf, else fp32) into a cache row (bf16 where kbf, else fp32),
   rounded to nearest even as torch's conversion rounds */
INLINE void store_row(void *cache, const void *x, int64_t n, const int bf, const int kbf) {
    if (bf == kbf) memcpy(cache, x, (size_t)n * (bf ? 2 : 4));
    else for (int64_t d = 0; d < n; d++) store1(cache, d, load1(x, d, bf), kbf);
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
    const float *sinks;
} Call;

/* task n of a call: its tile, KV head and first query head; all of the tile's keys (from the
   first query's window on) */
static Task task_of(const Call *c, int64_t n) {
    const int64_t *tile = c->tiles + (n / (c->KVH * c->chunks)) * TILE_FIELDS;
    const int h = (int)(n / c->chunks % c->KVH), g0 = (int)(n % c->chunks) * c->ng;
    const int64_t k0 = c->window && tile[3] > c->window ? tile[3] - c->window : 0;
    Task t = {c->q, c->q_ld, c->kc, c->vc, c->table + tile[2] * c->table_ld, tile[0], tile[1], tile[3],
              g0, c->G - g0 < c->ng ? c->G - g0 : c->ng, c->G, c->KVH, h, c->H, c->D, c->scale, c->out,
              k0, tile_keys(tile), c->window, c->softcap, NULL, (int)tile[4], c->sinks};
    return t;
}

/* q [T, H, D], k and v [T, KVH, D] (token strides q_ld, k_ld, v_ld; heads contiguous), out [T, H, D];
   caches [num_slots, KVH, D]; table [table_rows, table_ld].
   tiles [ntiles, 5]: (first token, tokens m, slot-table row, keys of the first token, 1 for a prompt's
   tokens); tokens of no tile are left to the caller (their K/V are still stored). `window` > 0: sliding-window attention.
   `sinks` [H] (or NULL): each query head's learned logit, a term of its softmax's sum that no value follows (gpt-oss).
   `generic` forces the plain-C path (tests). `bf`: q, k, v and out are bf16 (else fp32); `kvbf`: the
   caches are (else fp32), so fp32 activations can keep 16-bit KV.
   Returns check_indices' verdict: 0, or nonzero with nothing done; 4 when memory for the parts ran out. */
int agentkv_attention(int bf, int kvbf, const void *q, int64_t q_ld, const void *k, int64_t k_ld, const void *v,
                      int64_t v_ld, void *k_cache, void *v_cache, int64_t num_slots, const int64_t *out_loc, int64_t T,
                      const int64_t *table, int64_t table_rows, int64_t table_ld, const int64_t *tiles,
                      int64_t ntiles, int H, int KVH, int D, float scale, void *out, int64_t window, float softcap,
                      const float *sinks, int nthreads, int generic) {
    const int bad = check_indices(out_loc, T, num_slots, table, table_rows, table_ld, tiles, ntiles);
    if (bad) return bad;
    const int64_t es = bf ? 2 : 4, kes = kvbf ? 2 : 4, row = (int64_t)KVH * D;
    for (int64_t i = 0; i < T; i++) {
        store_row((char *)k_cache + out_loc[i] * row * kes, (const char *)k + i * k_ld * es, row, bf, kvbf);
        store_row((char *)v_cache + out_loc[i] * row * kes, (const char *)v + i * v_ld * es, row, bf, kvbf);
    }
    const int G = H / KVH, ng = agentkv_attention_heads_per_task(G), chunks = (G + ng - 1) / ng;
    const Call call = {q, q_ld, k_cache, v_cache, table, tiles, table_ld, G, ng, chunks, KVH, H, D, scale, out, window,
                       softcap, sinks};
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
        agentkv_attend_task(&t, bf, kvbf, generic);
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
   part's keys, its results for the merge into `partial` [ng][D + 2]. `sinks` [H] or NULL: gpt-oss's. */
void agentkv_attend_one(const float *q, const void *kc, const void *vc, const int64_t *slots, int64_t len, int h,
                        int g0, int ng, int G, int KVH, int H, int D, float scale, float *out, int64_t window,
                        float softcap, const float *sinks, int kvbf, int generic, int64_t part, float *partial) {
    const int64_t k0 = window && len > window ? len - window : 0;
    Task t = {q, (int64_t)H * D, kc, vc, slots, 0, 1, len, g0, ng, G, KVH, h, H, D, scale, out, k0, len, window,
              softcap, NULL, 0, sinks};
    if (partial) {
        to_part(&t, part);
        t.partial = partial;
    }
    agentkv_attend_task(&t, 0, kvbf, generic);
}

/* agentkv_attend_one's parts (`parts` results [ng][D + 2], part_stride floats apart) merged into out. */
void agentkv_attend_merge(const float *partials, int64_t parts, int64_t part_stride, int g0, int ng, int G, int h,
                          int H, int D, const float *sinks, float *out) {
    const Task t = {NULL, 0, NULL, NULL, NULL, 0, 1, 0, g0, ng, G, 0, h, H, D, 0.f, out, 0, 0, 0, 0.f, NULL, 0, sinks};
    for (int i = 0; i < ng; i++) merge_query(&t, i, partials, parts, part_stride, 0);
}
