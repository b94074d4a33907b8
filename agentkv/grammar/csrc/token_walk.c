/* The token walk: which tokens a parser stack can read next, over the tokenizer's byte trie.

A depth-first walk of the trie (token_trie.py builds it: nodes in pre-order, each a byte, the index
past its subtree, the sorted tokens below it) against the linked byte automaton (automaton.py). At
each trie depth the walk keeps the set of parser stacks the path so far can have left; a byte no
stack reads skips the node's whole subtree, and a prefix shared by many tokens is stepped once.

A stack is a pair (top state, frame below): frames are interned (state, parent) nodes, so a byte
step changes only the top and two stacks are equal when their pairs are. Where a top can call a
rule or return from one, the stack is expanded (calls pushed, tail calls replacing the frame,
returns popped) once per walk and the expansion kept. A return from the bottom frame "ends": in a
relative walk (the frames below the top state unknown, token_walk.py's top-state walk) the node and
its depth are recorded, for the real stack below to decide the longer tokens there; in a walk of a
real stack it is the grammar's end, and longer tokens die.

Two shortcuts allow a whole subtree without stepping it: where a stack's top survives any plain text
of k characters (k unbounded for a text loop: a string body, an open object's names; the room left
on a string with a maximum length) and every token below the node reads plain text of at most k
characters from there on (llguidance's slicer, in the trie); and where every byte read below the
node is of a class the top carries that far (a loop over a class; a counted repetition with room).

The plain Python walk in token_walk.py is the same algorithm and gives the same masks.
Called through ctypes, which releases the GIL: a mask worker thread runs beside the forward pass.
*/

#include <stdlib.h>
#include <string.h>

#include "token_walk.h"

typedef struct { int32_t top, parent; } Pair;
typedef struct { Pair *v; int64_t n, cap; } Pairs;

typedef struct {      /* open addressing, key 0 = empty */
    uint64_t *keys;
    int32_t *vals;
    int64_t cap, n;
} Map;

typedef struct {
    const Grammar *g;
    const Trie *t;
    int rel;
    int32_t *fs, *fp, *fl;  /* frames: state, parent (-1: none), length */
    int64_t nf, capf;
    Map frames, memo;
    int32_t *me_start, *me_count;
    uint8_t *me_end;
    int64_t nme, capme;
    Pairs memo_pairs, work, seen, levels;
    int64_t *level_at;      /* level_at[d]: where depth d's set starts in `levels` */
    int32_t depth;
    int32_t reach0;         /* a relative walk's start state's plain-text reach (-1: no such walk) */
    uint32_t *allowed;
    int32_t *below;
    int64_t n_below;
    int variable;           /* the walk expanded a call of g->variable_rule */
    int32_t pending;        /* a called rule not linked yet (its start < 0): the walk stops; -1: none */
    int oom;                /* (set with `pending` too: every loop stops on it) */
} Walk;

static int grow(void **p, int64_t *cap, int64_t need, size_t size) {  /* room for `need` items */
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* Three arrays of one length, doubled together (each kept where its realloc fails). */
static int grow3(void **a, void **b, void **c, size_t sa, size_t sb, size_t sc, int64_t *cap) {
    int64_t n = *cap ? *cap * 2 : 64;
    void *x = realloc(*a, (size_t)n * sa);
    if (!x) return 0;
    *a = x;
    if (!(x = realloc(*b, (size_t)n * sb))) return 0;
    *b = x;
    if (!(x = realloc(*c, (size_t)n * sc))) return 0;
    *c = x;
    *cap = n;
    return 1;
}

static int push(Walk *w, Pairs *a, Pair p) {
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof(Pair))) { w->oom = 1; return 0; }
    a->v[a->n++] = p;
    return 1;
}

static uint64_t key_of(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)(b + 1)) + 1;  /* never 0 for a >= 0 */
}

static uint64_t hash64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return k;
}

static int32_t map_get(const Map *m, uint64_t key) {
    if (!m->cap) return -1;
    for (uint64_t i = hash64(key) & (uint64_t)(m->cap - 1);; i = (i + 1) & (uint64_t)(m->cap - 1)) {
        if (m->keys[i] == key) return m->vals[i];
        if (!m->keys[i]) return -1;
    }
}

static int map_put(Map *m, uint64_t key, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        int64_t cap = m->cap ? m->cap * 2 : 64;
        uint64_t *keys = calloc((size_t)cap, sizeof(uint64_t));
        int32_t *vals = malloc((size_t)cap * sizeof(int32_t));
        if (!keys || !vals) { free(keys); free(vals); return 0; }
        for (int64_t j = 0; j < m->cap; j++) {
            if (!m->keys[j]) continue;
            uint64_t i = hash64(m->keys[j]) & (uint64_t)(cap - 1);
            while (keys[i]) i = (i + 1) & (uint64_t)(cap - 1);
            keys[i] = m->keys[j];
            vals[i] = m->vals[j];
        }
        free(m->keys); free(m->vals);
        m->keys = keys; m->vals = vals; m->cap = cap;
    }
    uint64_t i = hash64(key) & (uint64_t)(m->cap - 1);
    while (m->keys[i]) i = (i + 1) & (uint64_t)(m->cap - 1);
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return 1;
}

/* The interned frame (state over parent). */
static int32_t frame(Walk *w, int32_t state, int32_t parent) {
    uint64_t key = key_of(state, parent);
    int32_t f = map_get(&w->frames, key);
    if (f >= 0) return f;
    if (w->nf == w->capf && !grow3((void **)&w->fs, (void **)&w->fp, (void **)&w->fl, sizeof(int32_t),
                                   sizeof(int32_t), sizeof(int32_t), &w->capf)) {
        w->oom = 1;
        return -1;
    }
    f = (int32_t)w->nf++;
    w->fs[f] = state;
    w->fp[f] = parent;
    w->fl[f] = 1 + (parent >= 0 ? w->fl[parent] : 0);
    if (!map_put(&w->frames, key, f)) { w->oom = 1; return -1; }
    return f;
}

static int32_t length_of(const Walk *w, Pair p) {
    return 1 + (p.parent >= 0 ? w->fl[p.parent] : 0) + w->rel;
}

static int has_pair(const Pairs *a, int64_t from, Pair p) {
    for (int64_t i = from; i < a->n; i++)
        if (a->v[i].top == p.top && a->v[i].parent == p.parent) return 1;
    return 0;
}

/* The stacks `p` leads to by calls and returns alone whose tops read bytes, and whether it can end:
   an entry of the memo (its pairs are memo_pairs[me_start : me_start + me_count]). */
static int32_t expansion(Walk *w, Pair p) {
    uint64_t key = key_of(p.top, p.parent);
    int32_t e = map_get(&w->memo, key);
    if (e >= 0) return e;
    const Grammar *g = w->g;
    int64_t start = w->memo_pairs.n;
    int can_end = 0;
    w->work.n = w->seen.n = 0;
    push(w, &w->work, p);
    while (w->work.n && !w->oom) {
        Pair s = w->work.v[--w->work.n];
        if (has_pair(&w->seen, 0, s)) continue;
        push(w, &w->seen, s);
        int32_t len = length_of(w, s);
        if (len > w->depth) w->depth = len;
        if (g->has_bytes[s.top]) push(w, &w->memo_pairs, s);
        if (len < g->max_depth) {
            for (int32_t c = g->call_off[s.top]; c < g->call_off[s.top + 1]; c++) {
                int32_t ret = g->call_ret[c];
                if (g->call_rule[c] == g->variable_rule) w->variable = 1;
                if (g->starts[g->call_rule[c]] < 0) {  /* a composed grammar's part not linked yet */
                    w->pending = g->call_rule[c];
                    w->oom = 1;
                    return -1;
                }
                int32_t parent = g->tail[ret] ? s.parent : frame(w, ret, s.parent);
                push(w, &w->work, (Pair){g->starts[g->call_rule[c]], parent});
            }
        }
        if (g->accept[s.top]) {
            if (s.parent < 0) can_end = 1;
            else push(w, &w->work, (Pair){w->fs[s.parent], w->fp[s.parent]});
        }
    }
    if (w->oom) return -1;
    if (w->nme == w->capme && !grow3((void **)&w->me_start, (void **)&w->me_count, (void **)&w->me_end,
                                     sizeof(int32_t), sizeof(int32_t), 1, &w->capme)) {
        w->oom = 1;
        return -1;
    }
    e = (int32_t)w->nme++;
    w->me_start[e] = (int32_t)start;
    w->me_count[e] = (int32_t)(w->memo_pairs.n - start);
    w->me_end[e] = (uint8_t)can_end;
    if (!map_put(&w->memo, key, e)) { w->oom = 1; return -1; }
    return e;
}

static void allow_range(Walk *w, int32_t lo, int32_t hi) {
    const int32_t *ids = w->t->sorted_ids;
    for (int32_t k = lo; k < hi; k++) w->allowed[ids[k] >> 5] |= 1u << (ids[k] & 31);
}

/* Add expansion `e`'s stacks to the set being built at levels[from:]; returns its can-end flag. */
static int add_expansion(Walk *w, int32_t e, int64_t from) {
    for (int32_t k = 0; k < w->me_count[e]; k++) {
        Pair s = w->memo_pairs.v[w->me_start[e] + k];
        if (!has_pair(&w->levels, from, s)) push(w, &w->levels, s);
    }
    return w->me_end[e];
}

/* Are the bytes below node i all of state q's class, and no deeper than it carries such text? Past
   ASCII, bytes outside the class pass where the class takes every wide character and the tokens below
   read wide text (a byte count bounds the characters, so the reach in characters holds). */
static int loops_below(const Grammar *g, const Trie *t, int32_t q, int32_t i) {
    if (g->class_reach[q] < t->depth_below[i]) return 0;
    const uint64_t *below = t->below_bytes + (int64_t)i * 4, *cls = g->class_bytes + (int64_t)q * 4;
    if ((below[0] & ~cls[0]) | (below[1] & ~cls[1])) return 0;
    return !((below[2] & ~cls[2]) | (below[3] & ~cls[3])) || (g->class_wide[q] && t->wide_below[i]);
}

/* Walk the nodes [lo, hi) (all deeper than `base`), the expanded set at depth `base` being levels[0:]. */
static void walk_range(Walk *w, int32_t lo, int32_t hi, int32_t base) {
    const Grammar *g = w->g;
    const Trie *t = w->t;
    Pair raw[64];
    int32_t i = lo;
    while (i < hi && !w->oom) {
        if (t->root_chars[i] >= 0 && t->root_chars[i] <= w->reach0) {  /* taken whole with plain_masks */
            i = t->next[i];
            continue;
        }
        int32_t d = t->depth[i] - 1 - base;  /* the level this node steps from */
        int64_t from = w->level_at[d], to = w->level_at[d + 1];
        int32_t b = t->byte[i], n_raw = 0, reach = -1, overflow = 0, loops = 0;
        if (to - from == 1) {  /* one stack (most of a walk): no set to build unless it forks */
            Pair s = w->levels.v[from];
            int32_t nt = g->trans[(int64_t)s.top * 256 + b];
            if (nt < 0) { i = t->next[i]; continue; }
            int32_t first = t->tok[i], after = t->next[i];
            if (t->n_end[i]) allow_range(w, first, first + t->n_end[i]);
            if (after == i + 1) { i = after; continue; }
            if ((t->text_chars[i] >= 0 && g->text_reach[nt] >= t->text_chars[i]) || loops_below(g, t, nt, i)) {
                allow_range(w, first + t->n_end[i], t->tok[after]);
                i = after;
                continue;
            }
            if (!g->fork[nt]) {
                w->levels.n = to;
                if (!push(w, &w->levels, (Pair){nt, s.parent})) return;
                w->level_at[d + 2] = to + 1;
                i++;
                continue;
            }
        }
        for (int64_t k = from; k < to; k++) {
            Pair s = w->levels.v[k];
            int32_t nt = g->trans[(int64_t)s.top * 256 + b];
            if (nt < 0) continue;
            if (n_raw < 64) raw[n_raw++] = (Pair){nt, s.parent};
            else overflow = 1;
            if (g->text_reach[nt] > reach) reach = g->text_reach[nt];
        }
        if (!n_raw) { i = t->next[i]; continue; }
        int32_t first = t->tok[i];
        allow_range(w, first, first + t->n_end[i]);
        int32_t after = t->next[i];
        if (after == i + 1) { i = after; continue; }  /* a leaf: nothing longer to decide */
        for (int32_t k = 0; k < n_raw && !loops; k++) loops = loops_below(g, t, raw[k].top, i);  /* (past leaves only) */
        if ((t->text_chars[i] >= 0 && reach >= t->text_chars[i]) || loops) {  /* plain text within the room, or a loop */
            allow_range(w, first + t->n_end[i], t->tok[after]);
            i = after;
            continue;
        }
        /* the set at depth d + 1: each stepped stack expanded */
        w->levels.n = to;
        int can_end = 0;
        if (overflow) {  /* (more than 64 stacks: step them again straight into the set) */
            for (int64_t k = from; k < to && !w->oom; k++) {
                Pair s = w->levels.v[k];
                int32_t nt = g->trans[(int64_t)s.top * 256 + b];
                if (nt < 0) continue;
                int32_t e = expansion(w, (Pair){nt, s.parent});
                if (e < 0) return;
                can_end |= add_expansion(w, e, to);
            }
        } else {
            for (int32_t k = 0; k < n_raw && !w->oom; k++) {
                if (!g->fork[raw[k].top]) {
                    if (!has_pair(&w->levels, to, raw[k])) push(w, &w->levels, raw[k]);
                    continue;
                }
                int32_t e = expansion(w, raw[k]);
                if (e < 0) return;
                can_end |= add_expansion(w, e, to);
            }
        }
        if (w->oom) return;
        w->level_at[d + 2] = w->levels.n;
        if (can_end && w->rel) {
            w->below[2 * w->n_below] = i;
            w->below[2 * w->n_below + 1] = t->depth[i];
            w->n_below++;
        }
        i = w->levels.n > to ? i + 1 : after;
    }
}

/* The whole trie: the root's children whose byte some stack of level 0 reads, each with its subtree.
   (A state that reads a few bytes, a name's first letter, touches those children alone, not the
   hundreds spread across the trie's arrays: each a cache miss in a first mask.) */
static void walk_roots(Walk *w) {
    const Grammar *g = w->g;
    const Trie *t = w->t;
    uint8_t read[256] = {0};
    for (int64_t k = 0; k < w->level_at[1]; k++) {
        const int32_t *row = g->trans + (int64_t)w->levels.v[k].top * 256;
        for (int b = 0; b < 256; b++) read[b] |= row[b] >= 0;
    }
    for (int b = 0; b < 256 && !w->oom; b++) {
        int32_t i = t->root_child[b];
        if (read[b] && i >= 0) walk_range(w, i, t->next[i], 0);
    }
}

static void walk_free(Walk *w) {
    free(w->fs); free(w->fp); free(w->fl);
    free(w->frames.keys); free(w->frames.vals); free(w->memo.keys); free(w->memo.vals);
    free(w->me_start); free(w->me_count); free(w->me_end);
    free(w->memo_pairs.v); free(w->work.v); free(w->seen.v); free(w->levels.v);
    free(w->level_at);
}

/* Walk the tokens from a stack (bottom first; `relative`: the frames below it unknown).
   `starts` are (node, bytes read) pairs: the tokens below that node, past that many bytes (node -1:
   every token, from its first byte). Sets `allowed` bits; a relative walk writes (node, depth) pairs
   to `below` (room for n_nodes + 1 pairs). `variable` (may be NULL) is set to whether the walk
   expanded a call of the grammar's variable rule: a walk that did not gives the same result in every
   grammar sharing the states. Returns 0, -1 where memory ran out, or -2 - r where the walk reached a
   call of rule r whose start is negative (a composed grammar's part not linked yet: the caller links
   it and walks again). */
int agentkv_token_walk(const Grammar *g, const Trie *t, const int32_t *stack, int32_t stack_len, int32_t relative,
                       const int32_t *starts, int32_t n_starts, uint32_t *allowed, int32_t *below,
                       int64_t *n_below, int32_t *depth, int32_t *variable) {
    Walk w;
    memset(&w, 0, sizeof w);
    w.g = g; w.t = t; w.rel = relative; w.allowed = allowed; w.below = below; w.pending = -1;
    w.level_at = malloc((size_t)(t->max_len + 3) * sizeof(int64_t));
    if (!w.level_at) return -1;
    int32_t parent = -1;
    for (int32_t k = 0; k + 1 < stack_len && !w.oom; k++) parent = frame(&w, stack[k], parent);
    Pair top = {stack[stack_len - 1], parent};
    w.depth = length_of(&w, top);
    w.reach0 = -1;
    if (relative && stack_len == 1 && g->text_reach[top.top] > 0) {
        /* plain text within the start state's reach: every such token at once, its subtrees skipped */
        w.reach0 = g->text_reach[top.top] < t->max_len ? g->text_reach[top.top] : t->max_len;
        const uint32_t *plain = t->plain_masks + (int64_t)w.reach0 * t->words;
        for (int32_t k = 0; k < t->words; k++) allowed[k] |= plain[k];
    }
    /* the stacks every start walks from: the top's expansion, level 0 (walk_range writes past it) */
    int32_t e = expansion(&w, top);
    int can_end = e >= 0 ? add_expansion(&w, e, 0) : 0;
    w.level_at[0] = 0;
    w.level_at[1] = w.levels.n;
    int32_t reach = -1;  /* the most plain text some stack of level 0 surely reads */
    for (int64_t k = 0; k < w.levels.n; k++)
        if (g->text_reach[w.levels.v[k].top] > reach) reach = g->text_reach[w.levels.v[k].top];
    for (int32_t s = 0; s < n_starts && !w.oom; s++) {
        int32_t node = starts[2 * s], base = starts[2 * s + 1];
        w.levels.n = w.level_at[1];
        if (can_end && relative && node < 0) {
            below[2 * w.n_below] = -1;
            below[2 * w.n_below + 1] = 0;
            w.n_below++;
        }
        if (!w.level_at[1]) {
            continue;
        } else if (node < 0) {
            walk_roots(&w);
        } else if (t->text_chars[node] >= 0 && reach >= t->text_chars[node]) {
            /* every token below reads plain text within the reach (a string's tokens returning below a
               block of its characters, say): all of them, without a step */
            allow_range(&w, t->tok[node] + t->n_end[node], t->tok[t->next[node]]);
        } else {
            walk_range(&w, node + 1, t->next[node], base);
        }
    }
    *n_below = w.n_below;
    *depth = w.depth;
    if (variable) *variable = w.variable;
    int rc = w.pending >= 0 ? -2 - w.pending : w.oom ? -1 : 0;
    walk_free(&w);
    return rc;
}
