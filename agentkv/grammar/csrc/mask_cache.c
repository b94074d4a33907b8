/* A grammar's masks in one call: its walks per top state kept under a byte budget, and a
   configuration's stacks composed into one mask (compiled.py's `mask` on the native path).

A top state's walk with the frames below unknown (token_walk.c, relative) is kept per state: the
tokens it allows and the trie nodes where tokens return below its frame. A stack's mask is that set
plus those tokens walked on through the stack's real frames; a stack so deep that the nesting limit
could cut a token short is walked whole. The walks are kept least recently used first out once their
bytes pass the budget (evictions counted). The caller serializes calls on one cache (compiled.py
holds the grammar's lock); the GIL is released throughout.

Grammars composed in one state pool (grammar/pool.py) differ only in where their variable rule (the
rule of parts) starts, so a walk that never expanded a call of that rule is the same in each of
them. Such walks are also kept in the pool's `Store` (its own budget, least recently used out;
a spin lock, since the grammars' mask threads share it), and a grammar that misses a state takes
the store's copy before walking: a step whose tools changed reuses the walks of the text around
its calls, such as the first mask's walk of free text over the whole vocabulary.
*/

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "token_walk.h"

typedef struct {
    uint32_t *allowed;   /* the tokens: [words] bits where n_set < 0, else n_set (word, bits) pairs */
    int32_t n_set;       /* (most walks allow few tokens: pairs keep them small, and a first mask's walks
                            do not fault in a fresh 19 KB page run each at a 151k vocabulary) */
    int32_t *below;      /* [2 * n_below]: (node, bytes read) */
    int64_t n_below;
    int32_t depth;
    int32_t prev, next;  /* the LRU list (states), -1 at its ends */
    int64_t bytes;
} StateWalk;

typedef struct {
    StateWalk *walks;    /* [n_states]: a pool's grammar-independent walks, by state */
    int32_t n_states, words;
    int64_t budget, used, shared, evictions;
    int32_t head, tail;
    atomic_flag lock;
} Store;

typedef struct {
    Grammar g;           /* copies of the structs; the arrays stay the caller's */
    Trie t;
    int32_t words;
    int64_t budget, used, evictions, computed, shared;
    StateWalk *walks;    /* [n_states]; allowed == NULL: none kept */
    Store *store;        /* the pool's, or NULL */
    int32_t head, tail;  /* most and least recently used */
    int32_t *scratch;    /* [2 * (n_nodes + 1)]: a relative walk's returns, before they are kept */
    uint32_t *dense;     /* [words], zero between walks: a relative walk's tokens, before they are kept */
} Walks;

Walks *agentkv_walks_new(const Grammar *g, const Trie *t, int32_t words, int64_t budget, Store *store) {
    Walks *ws = calloc(1, sizeof(Walks));
    if (!ws) return NULL;
    ws->store = store;
    ws->g = *g;
    ws->t = *t;
    ws->words = words;
    ws->budget = budget;
    ws->head = ws->tail = -1;
    ws->walks = calloc((size_t)g->n_states, sizeof(StateWalk));
    ws->scratch = malloc((size_t)(t->n_nodes + 1) * 2 * sizeof(int32_t));
    ws->dense = calloc((size_t)words, sizeof(uint32_t));
    if (!ws->walks || !ws->scratch || !ws->dense) {
        free(ws->walks); free(ws->scratch); free(ws->dense); free(ws);
        return NULL;
    }
    return ws;
}

static void unlink_walk(StateWalk *walks, int32_t *head, int32_t *tail, int32_t q) {
    StateWalk *w = &walks[q];
    if (w->prev >= 0) walks[w->prev].next = w->next; else *head = w->next;
    if (w->next >= 0) walks[w->next].prev = w->prev; else *tail = w->prev;
}

static void push_front(StateWalk *walks, int32_t *head, int32_t *tail, int32_t q) {
    StateWalk *w = &walks[q];
    w->prev = -1;
    w->next = *head;
    if (*head >= 0) walks[*head].prev = q;
    *head = q;
    if (*tail < 0) *tail = q;
}

/* How many walks the list from `head` holds. */
static int64_t count_kept(const StateWalk *walks, int32_t head) {
    int64_t kept = 0;
    for (int32_t q = head; q >= 0; q = walks[q].next) kept++;
    return kept;
}

/* Forget q's walk; its bytes. */
static int64_t forget(StateWalk *walks, int32_t *head, int32_t *tail, int32_t q) {
    StateWalk *w = &walks[q];
    int64_t bytes = w->bytes;
    unlink_walk(walks, head, tail, q);
    free(w->allowed); free(w->below);
    memset(w, 0, sizeof *w);
    return bytes;
}

static void drop(Walks *ws, int32_t q) {
    ws->used -= forget(ws->walks, &ws->head, &ws->tail, q);
    ws->evictions++;
}

/* How many uint32 a walk's tokens take. */
static int64_t allowed_len(const StateWalk *w, int32_t words) {
    return w->n_set < 0 ? words : (w->n_set ? 2 * (int64_t)w->n_set : 1);
}

/* OR a walk's tokens into `out`. */
static void or_walk(const StateWalk *w, uint32_t *out, int32_t words) {
    if (w->n_set < 0) {
        for (int32_t i = 0; i < words; i++) out[i] |= w->allowed[i];
    } else {
        for (int32_t k = 0; k < w->n_set; k++) out[w->allowed[2 * k]] |= w->allowed[2 * k + 1];
    }
}

/* A copy of `from` into `to` (unlinked); 0 where memory ran out. */
static int copy_walk(StateWalk *to, const StateWalk *from, int32_t words) {
    uint32_t *allowed = malloc((size_t)allowed_len(from, words) * sizeof(uint32_t));
    int32_t *below = from->n_below ? malloc((size_t)from->n_below * 2 * sizeof(int32_t)) : NULL;
    if (!allowed || (from->n_below && !below)) {
        free(allowed); free(below);
        return 0;
    }
    memcpy(allowed, from->allowed, (size_t)allowed_len(from, words) * sizeof(uint32_t));
    if (below) memcpy(below, from->below, (size_t)from->n_below * 2 * sizeof(int32_t));
    *to = *from;
    to->allowed = allowed;
    to->below = below;
    return 1;
}

/* ---- the pool's store ------------------------------------------------------------------------------ */

Store *agentkv_store_new(int32_t n_states, int32_t words, int64_t budget) {
    Store *st = calloc(1, sizeof(Store));
    if (!st) return NULL;
    st->walks = calloc((size_t)n_states, sizeof(StateWalk));
    if (!st->walks) { free(st); return NULL; }
    st->n_states = n_states;
    st->words = words;
    st->budget = budget;
    st->head = st->tail = -1;
    atomic_flag_clear(&st->lock);
    return st;
}

void agentkv_store_free(Store *st) {
    if (!st) return;
    for (int32_t q = 0; q < st->n_states; q++) {
        free(st->walks[q].allowed);
        free(st->walks[q].below);
    }
    free(st->walks); free(st);
}

static void lock(Store *st) { while (atomic_flag_test_and_set_explicit(&st->lock, memory_order_acquire)) {} }
static void unlock(Store *st) { atomic_flag_clear_explicit(&st->lock, memory_order_release); }

/* Copy the store's walk of q into `to`; 0 where it has none (or memory ran out). */
static int store_get(Store *st, int32_t q, StateWalk *to) {
    if (!st || q >= st->n_states) return 0;
    lock(st);
    int got = 0;
    if (st->walks[q].allowed && copy_walk(to, &st->walks[q], st->words)) {
        unlink_walk(st->walks, &st->head, &st->tail, q);
        push_front(st->walks, &st->head, &st->tail, q);
        st->shared++;
        got = 1;
    }
    unlock(st);
    return got;
}

/* Keep a copy of `w` as q's walk in the store (where it has none and memory allows). */
static void store_put(Store *st, int32_t q, const StateWalk *w) {
    if (!st || q >= st->n_states) return;
    lock(st);
    if (!st->walks[q].allowed && copy_walk(&st->walks[q], w, st->words)) {
        st->used += w->bytes;
        push_front(st->walks, &st->head, &st->tail, q);
        while (st->used > st->budget && st->tail >= 0 && st->tail != q) {
            st->used -= forget(st->walks, &st->head, &st->tail, st->tail);
            st->evictions++;
        }
    }
    unlock(st);
}

/* walks kept, their bytes, walks handed to grammars, walks evicted */
void agentkv_store_stats(Store *st, int64_t *out) {
    lock(st);
    out[0] = count_kept(st->walks, st->head);
    out[1] = st->used;
    out[2] = st->shared;
    out[3] = st->evictions;
    unlock(st);
}

/* ---- a grammar's walks ----------------------------------------------------------------------------- */

void agentkv_walks_free(Walks *ws) {
    if (!ws) return;
    for (int32_t q = 0; q < ws->g.n_states; q++) {
        free(ws->walks[q].allowed);
        free(ws->walks[q].below);
    }
    free(ws->walks); free(ws->scratch); free(ws->dense); free(ws);
}

/* State q's walk, kept, taken from the store or computed now (and made the most recently used); NULL
   where the walk failed, with its code in *rc (token_walk.c: -1 no memory, -2 - r rule r not linked:
   nothing is kept of it). */
static StateWalk *state_walk(Walks *ws, int32_t q, int *rc) {
    StateWalk *w = &ws->walks[q];
    if (w->allowed) {
        unlink_walk(ws->walks, &ws->head, &ws->tail, q);
        push_front(ws->walks, &ws->head, &ws->tail, q);
        return w;
    }
    if (store_get(ws->store, q, w)) {
        ws->shared++;
    } else {
        int64_t n_below = 0;
        int32_t depth = 0, variable = 0, root[2] = {-1, 0}, words = ws->words, n_set = 0;
        uint32_t *dense = ws->dense;
        *rc = agentkv_token_walk(&ws->g, &ws->t, &q, 1, 1, root, 1, dense, ws->scratch, &n_below, &depth,
                                 &variable);
        if (*rc != 0) {
            memset(dense, 0, (size_t)words * sizeof(uint32_t));
            return NULL;
        }
        for (int32_t i = 0; i < words; i++) n_set += dense[i] != 0;
        w->n_set = 2 * (int64_t)n_set < words ? n_set : -1;  /* pairs where they take less room */
        uint32_t *allowed = malloc((size_t)allowed_len(w, words) * sizeof(uint32_t));
        if (allowed && w->n_set >= 0) {
            for (int32_t i = 0, k = 0; i < words; i++)
                if (dense[i]) { allowed[2 * k] = (uint32_t)i; allowed[2 * k + 1] = dense[i]; k++; }
        } else if (allowed) {
            memcpy(allowed, dense, (size_t)words * sizeof(uint32_t));
        }
        memset(dense, 0, (size_t)words * sizeof(uint32_t));
        *rc = -1;
        if (!allowed) return NULL;
        int32_t *below = NULL;
        if (n_below) {
            below = malloc((size_t)n_below * 2 * sizeof(int32_t));
            if (!below) { free(allowed); return NULL; }
            memcpy(below, ws->scratch, (size_t)n_below * 2 * sizeof(int32_t));
        }
        w->allowed = allowed;
        w->below = below;
        w->n_below = n_below;
        w->depth = depth;
        w->bytes = allowed_len(w, words) * 4 + n_below * 8 + (int64_t)sizeof(StateWalk);
        ws->computed++;
        if (!variable) store_put(ws->store, q, w);
    }
    ws->used += w->bytes;
    push_front(ws->walks, &ws->head, &ws->tail, q);
    while (ws->used > ws->budget && ws->tail >= 0 && ws->tail != q) drop(ws, ws->tail);
    return w;
}

/* OR into `out` the tokens each stack can read in full: stack k is flat[offsets[k]:offsets[k+1]],
   bottom first. Returns 0, or a walk's failure (token_walk.c's codes: `out` is then partial). */
int agentkv_walks_mask(Walks *ws, const int32_t *flat, const int32_t *offsets, int32_t n_stacks, uint32_t *out) {
    int32_t root[2] = {-1, 0};
    for (int32_t k = 0; k < n_stacks; k++) {
        const int32_t *stack = flat + offsets[k];
        int32_t len = offsets[k + 1] - offsets[k];
        int rc = 0;
        StateWalk *w = state_walk(ws, stack[len - 1], &rc);
        if (!w) return rc;
        rc = 0;
        int64_t n_below = 0;
        int32_t depth = 0;
        if (w->depth + (len > 2 ? len - 2 : 0) < ws->g.max_depth) {
            or_walk(w, out, ws->words);
            if (len > 1 && w->n_below)  /* the tokens returning below, walked on through the real frames */
                rc = agentkv_token_walk(&ws->g, &ws->t, stack, len - 1, 0, w->below, (int32_t)w->n_below, out,
                                        ws->scratch, &n_below, &depth, NULL);
        } else {  /* (so deep that the nesting limit may cut a token short: walked whole) */
            rc = agentkv_token_walk(&ws->g, &ws->t, stack, len, 0, root, 1, out, ws->scratch, &n_below, &depth, NULL);
        }
        if (rc != 0) return rc;
    }
    return 0;
}

/* OR into `out` the tokens under trie `node` (those longer than its `base` bytes, which the stacks
   have read) that the stacks can read on (jump-forward's question: can a token run past the forced
   text?). Returns 0, or a walk's failure (token_walk.c's codes). */
int agentkv_walks_past(Walks *ws, const int32_t *flat, const int32_t *offsets, int32_t n_stacks, int32_t node,
                       int32_t base, uint32_t *out) {
    int32_t start[2] = {node, base};
    for (int32_t k = 0; k < n_stacks; k++) {
        int64_t n_below = 0;
        int32_t depth = 0;
        int rc = agentkv_token_walk(&ws->g, &ws->t, flat + offsets[k], offsets[k + 1] - offsets[k], 0, start, 1,
                                    out, ws->scratch, &n_below, &depth, NULL);
        if (rc != 0) return rc;
    }
    return 0;
}

/* Forget every walk kept (not counted as evictions). */
void agentkv_walks_clear(Walks *ws) {
    while (ws->head >= 0) {
        drop(ws, ws->head);
        ws->evictions--;
    }
}

/* walks kept, their bytes, walks computed, walks evicted, walks taken from the store */
void agentkv_walks_stats(const Walks *ws, int64_t *out) {
    out[0] = count_kept(ws->walks, ws->head);
    out[1] = ws->used;
    out[2] = ws->computed;
    out[3] = ws->evictions;
    out[4] = ws->shared;
}
