/* A grammar's per-state tables for the token walk (tokens/state_tables.py, whose numpy code is the
 * twin and says what each table means): text_reach (with its text loop search) and the byte
 * classes (class_bytes, class_reach, class_wide). One pass of C over the table replaces some thirty
 * numpy passes over all states, each of which cost as much as the whole pass here. Every fixpoint
 * runs in rounds as the twin's does (each round reads the last one's values), so that the rounds
 * it gives up after are the same rounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BOUNDARY = 0 };

/* A UTF-8 phase table (trie.py's TEXT_PHASES, WIDE_PHASES): phase p's ranges are r[3 * i ..] for
 * off[p] <= i < off[p + 1], each (lo, hi, phase after). */
typedef struct { int32_t n; const int32_t *off, *r; } Phases;

/* The one state every character of `t` begun in `phase` at s ends at; -1 where they die or end
 * apart. past_ascii: only the characters past ASCII. */
static int32_t char_end(const int32_t *trans, int32_t s, int32_t phase, const Phases *t, int past_ascii) {
    if (s < 0) return -1;
    const int32_t *row = trans + (int64_t)s * 256;
    int32_t out = -2; /* no range read yet */
    for (int32_t i = t->off[phase]; i < t->off[phase + 1]; i++) {
        int32_t lo = t->r[3 * i], hi = t->r[3 * i + 1], after = t->r[3 * i + 2];
        if (past_ascii && hi < 0x80) continue;
        int32_t to = row[lo];
        for (int32_t b = lo + 1; b <= hi && to >= 0; b++) if (row[b] != to) to = -1;
        if (to >= 0 && after != BOUNDARY) to = char_end(trans, to, after, t, 0);
        if (out != -2 && out != to) return -1;
        out = to;
    }
    return out == -2 ? -1 : out;
}

static int all_read(const int32_t *row, int32_t lo, int32_t hi) {
    for (int32_t b = lo; b <= hi; b++) if (row[b] < 0) return 0;
    return 1;
}

/* The pairs (state, phase) of the text loop search, as ids phase * n + state. */
typedef struct { int32_t *v; int64_t len, cap; } Ids;

static int ids_push(Ids *a, int32_t x) {
    if (a->len == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *p = realloc(a->v, (size_t)cap * 4);
        if (!p) return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->len++] = x;
    return 0;
}

/* state_tables.py's _text_loops: of the cand[nc] states, those from which no plain text dies, marked
 * in loops[] (which holds the loops found so far, read at a character's end). 0, or -1 (memory). */
static int text_loops(int32_t n, const int32_t *trans, const Phases *t, const int32_t *cand, int32_t nc,
                      uint8_t *loops, int32_t max_rounds) {
    if (!nc) return 0;
    int64_t total = (int64_t)t->n * n;
    uint8_t *seen = calloc((size_t)total, 1), *alive = calloc((size_t)total, 1);
    Ids ids = {0}, todo = {0};
    uint8_t *now = NULL;
    int rc = -1;
    if (!seen || !alive) goto done;
    for (int32_t s = 0; s < n; s++) alive[s] = loops[s]; /* (a character's end: a loop stays) */
    for (int32_t i = 0; i < nc; i++) {
        seen[cand[i]] = 1;
        if (ids_push(&todo, cand[i])) goto done;
    }
    /* The pairs the candidates' characters pass through; those reading every byte of their phase
     * start alive (the others stay as they are: out, or a loop at a character's end). */
    while (todo.len) {
        int32_t id = todo.v[--todo.len], p = id / n, s = id % n;
        const int32_t *row = trans + (int64_t)s * 256;
        int full = 1;
        for (int32_t i = t->off[p]; i < t->off[p + 1]; i++) {
            int32_t lo = t->r[3 * i], hi = t->r[3 * i + 1], after = t->r[3 * i + 2];
            if (!all_read(row, lo, hi)) full = 0;
            if (after == BOUNDARY) continue;
            for (int32_t b = lo; b <= hi; b++) {
                if (row[b] < 0) continue;
                int64_t nid = (int64_t)after * n + row[b];
                if (!seen[nid]) { seen[nid] = 1; if (ids_push(&todo, (int32_t)nid)) goto done; }
            }
        }
        if (full) { alive[id] = 1; if (ids_push(&ids, id)) goto done; }
    }
    now = malloc((size_t)(ids.len > 0 ? ids.len : 1));
    if (!now) goto done;
    int settled = 0;
    for (int32_t round = 0; round < max_rounds && !settled; round++) {
        int changed = 0;
        for (int64_t k = 0; k < ids.len; k++) {
            int32_t id = ids.v[k], p = id / n, s = id % n;
            const int32_t *row = trans + (int64_t)s * 256;
            uint8_t stay = alive[id];
            for (int32_t i = t->off[p]; i < t->off[p + 1] && stay; i++) {
                int32_t lo = t->r[3 * i], hi = t->r[3 * i + 1], after = t->r[3 * i + 2];
                for (int32_t b = lo; b <= hi && stay; b++) stay = alive[(int64_t)after * n + row[b]];
            }
            now[k] = stay;
            changed |= stay != alive[id];
        }
        if (!changed) { settled = 1; break; }
        for (int64_t k = 0; k < ids.len; k++) alive[ids.v[k]] = now[k];
        int any = 0;
        for (int32_t i = 0; i < nc && !any; i++) any = alive[cand[i]];
        if (!any) break;
    }
    if (settled)
        for (int32_t i = 0; i < nc; i++) if (alive[cand[i]]) loops[cand[i]] = 1;
    rc = 0;
done:
    free(seen); free(alive); free(ids.v); free(todo.v); free(now);
    return rc;
}

/* state_tables.py's text_reach into reach[n]. 0, or -1 (memory). */
static int text_reach(int32_t n, const int32_t *trans, int32_t cap, const Phases *t, int32_t max_rounds,
                      int32_t *reach) {
    int32_t *nxt = malloc((size_t)(n > 0 ? n : 1) * 4), *cand = malloc((size_t)(n > 0 ? n : 1) * 4);
    int32_t *grown = malloc((size_t)(n > 0 ? n : 1) * 4);
    uint8_t *loops = calloc((size_t)(n > 0 ? n : 1), 1), *multi = calloc((size_t)(n > 0 ? n : 1), 1);
    uint8_t *keep = calloc((size_t)(n > 0 ? n : 1), 1), *settled = calloc((size_t)(n > 0 ? n : 1), 1);
    int rc = -1;
    if (!nxt || !cand || !grown || !loops || !multi || !keep || !settled) goto done;
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        int32_t ta = row['a'];
        nxt[s] = ta >= 0 && ta == row[' '] && ta == row['~'] && ta == row['0'] ? char_end(trans, s, BOUNDARY, t, 0) : -1;
        loops[s] = nxt[s] == s;
    }
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        if (loops[s] || row['a'] < 0 || row[' '] < 0 || row['0'] < 0 || !all_read(row, 0xC2, 0xF4)) continue;
        int ok = 1;
        for (int32_t i = t->off[BOUNDARY]; i < t->off[BOUNDARY + 1] && ok; i++)
            if (t->r[3 * i + 2] == BOUNDARY) ok = all_read(row, t->r[3 * i], t->r[3 * i + 1]);
        keep[s] = (uint8_t)ok;
        if (ok && nxt[s] < 0) multi[s] = 1;
    }
    /* A chain of states whose characters all lead one way ends (past 1,024 steps, the twin's pointer
     * doubling) where it stops leading one way: a loop settles its chain; a multi state makes it searched. */
    int32_t nc = 0;
    for (int32_t s = 0; s < n; s++) {
        int32_t e = s;
        for (int k = 0; k < 1024 && nxt[e] >= 0 && !loops[e]; k++) e = nxt[e];
        settled[s] = loops[s] || (nxt[s] >= 0 && loops[e]);
        if (keep[s] && (multi[s] || multi[e])) cand[nc++] = s;
    }
    if (text_loops(n, trans, t, cand, nc, settled, max_rounds)) goto done;
    for (int32_t i = 0; i < nc; i++) if (settled[cand[i]]) loops[cand[i]] = 1;
    for (int32_t s = 0; s < n; s++) reach[s] = loops[s] ? cap : 0;
    for (int32_t round = 0; round < cap; round++) { /* a chain of k states before a loop or a dead end: k more */
        int more = 0;
        for (int32_t s = 0; s < n; s++)
            if (nxt[s] >= 0 && !loops[s]) {
                int32_t g = 1 + reach[nxt[s]];
                grown[s] = g < cap ? g : cap;
                more |= grown[s] > reach[s];
            }
        if (!more) break;
        for (int32_t s = 0; s < n; s++)
            if (nxt[s] >= 0 && !loops[s] && grown[s] > reach[s]) reach[s] = grown[s];
    }
    rc = 0;
done:
    free(nxt); free(cand); free(grown); free(loops); free(multi); free(keep); free(settled);
    return rc;
}

/* state_tables.py's byte_classes into sets[n * 4], reach[n], wide[n]; texts[n]: the text loops. */
static int byte_classes(int32_t n, const int32_t *trans, int32_t cap, const Phases *wide_t, const int32_t *text,
                        uint64_t *sets, int32_t *reach, uint8_t *wide) {
    int32_t *to = malloc((size_t)(n > 0 ? n : 1) * 4), *grown = malloc((size_t)(n > 0 ? n : 1) * 4);
    uint8_t *held = calloc((size_t)(n > 0 ? n : 1), 1), *kept = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!to || !grown || !held || !kept) { free(to); free(grown); free(held); free(kept); return -1; }
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        int loop = 0;
        for (int b = 0; b < 256 && !loop; b++) loop = row[b] == s;
        to[s] = loop ? s : row['a'] >= 0 ? row['a'] : row['0'];
        uint64_t *set = sets + (int64_t)s * 4;
        set[0] = set[1] = set[2] = set[3] = 0;
        if (to[s] >= 0)
            for (int b = 0; b < 256; b++) if (row[b] == to[s]) set[b >> 6] |= 1ULL << (b & 63);
        reach[s] = to[s] == s ? cap : to[s] >= 0 ? 1 : 0;
    }
    for (int32_t s = 0; s < n; s++) {
        if (to[s] < 0 || to[s] == s) continue;
        const uint64_t *a = sets + (int64_t)s * 4, *b = sets + (int64_t)to[s] * 4;
        held[s] = !((a[0] & ~b[0]) | (a[1] & ~b[1]) | (a[2] & ~b[2]) | (a[3] & ~b[3])); /* the next class holds it */
    }
    for (int32_t round = 0; round < cap; round++) {
        int more = 0;
        for (int32_t s = 0; s < n; s++)
            if (held[s]) {
                int32_t g = 1 + reach[to[s]];
                grown[s] = g < cap ? g : cap;
                more |= grown[s] > reach[s];
            }
        if (!more) break;
        for (int32_t s = 0; s < n; s++) if (held[s] && grown[s] > reach[s]) reach[s] = grown[s];
    }
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        wide[s] = to[s] >= 0 && text[s] < cap && all_read(row, 0xC2, 0xF4) &&
                  char_end(trans, s, BOUNDARY, wide_t, 1) == to[s];
    }
    for (int32_t round = 0; round < cap; round++) { /* a counted repetition: each later step takes them too */
        int changed = 0;
        for (int32_t s = 0; s < n; s++)
            if (held[s] && reach[s] > 1) { kept[s] = wide[s] && wide[to[s]]; changed |= kept[s] != wide[s]; }
        if (!changed) break;
        for (int32_t s = 0; s < n; s++) if (held[s] && reach[s] > 1) wide[s] = kept[s];
    }
    free(to); free(grown); free(held); free(kept);
    return 0;
}

/* Every table at once. text_*: TEXT_PHASES, wide_*: WIDE_PHASES (see Phases). 0, or -1 (memory). */
int agentkv_state_tables(int32_t n, const int32_t *trans, int32_t cap, int32_t text_n, const int32_t *text_off,
                        const int32_t *text_r, int32_t wide_n, const int32_t *wide_off, const int32_t *wide_r,
                        int32_t max_rounds, int32_t *text, uint64_t *class_bytes, int32_t *class_reach,
                        uint8_t *class_wide) {
    Phases t = {text_n, text_off, text_r}, w = {wide_n, wide_off, wide_r};
    if (text_reach(n, trans, cap, &t, max_rounds, text)) return -1;
    return byte_classes(n, trans, cap, &w, text, class_bytes, class_reach, class_wide);
}
