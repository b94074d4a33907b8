/* One rule's automaton in C: subset construction over byte classes (of the NFA nfa_build.c makes),
 * and products of call-free DFAs; each result minimized (dfa_minimize.c). dfa_python.py and
 * minimize.py are the Python twin where no compiler is present (the same languages; the numbering
 * may differ, which nothing depends on).
 */
#include "dfa.h"

/* ---- sets of ints (subset construction's states, product pairs), interned ---- */

typedef struct {
    Vec pool;        /* the sets' members, one after another */
    Vec off, len;    /* per set */
    uint64_t *hash;  /* per set */
    int32_t *slots;  /* open addressing: set index + 1, 0 = empty */
    int64_t nslots;
} SetTab;

/* A sequence's hash (product pairs: order matters). */
static uint64_t hash_seq(const int32_t *a, int64_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) { h ^= (uint32_t)a[i]; h *= 1099511628211ULL; }
    return h ^ (h >> 29);
}

/* One member's share of a set's hash (subset construction's sets: a sum, so order does not matter). */
static uint64_t mix(uint32_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int settab_grow(SetTab *t) {
    int64_t ns = t->nslots ? 2 * t->nslots : 1024;
    int32_t *s = calloc((size_t)ns, sizeof *s);
    if (!s) return -1;
    for (int64_t i = 0; i < t->off.n; i++) {
        uint64_t h = t->hash[i] & (uint64_t)(ns - 1);
        while (s[h]) h = (h + 1) & (uint64_t)(ns - 1);
        s[h] = (int32_t)i + 1;
    }
    free(t->slots);
    t->slots = s;
    t->nslots = ns;
    return 0;
}

/* The index of the set a[0..n) with hash h (a not pointing into the pool), added if new. Members
 * compare in order, or (marks) as a set: equal when every member of the stored set is marked. */
static int32_t settab_find(SetTab *t, const int32_t *a, int64_t n, uint64_t h, const int32_t *mark, int32_t stamp) {
    if (2 * (t->off.n + 1) > t->nslots && settab_grow(t)) return -1;
    uint64_t at = h & (uint64_t)(t->nslots - 1);
    for (;;) {
        int32_t e = t->slots[at];
        if (!e) break;
        e -= 1;
        if (t->hash[e] == h && t->len.v[e] == n) {
            const int32_t *p = t->pool.v + t->off.v[e];
            int same = 1;
            if (mark) { for (int64_t i = 0; i < n && same; i++) same = mark[p[i]] == stamp; }
            else same = !memcmp(p, a, (size_t)n * sizeof *a);
            if (same) return e;
        }
        at = (at + 1) & (uint64_t)(t->nslots - 1);
    }
    int32_t id = (int32_t)t->off.n;
    if ((id & (id - 1)) == 0) { /* a power of two: grow the hashes */
        uint64_t *hs = realloc(t->hash, (size_t)(id ? 2 * id : 1) * sizeof *hs);
        if (!hs) return -1;
        t->hash = hs;
    }
    if (vreserve(&t->pool, t->pool.n + n) || vpush(&t->off, (int32_t)t->pool.n) || vpush(&t->len, (int32_t)n)) return -1;
    memcpy(t->pool.v + t->pool.n, a, (size_t)n * sizeof *a);
    t->pool.n += n;
    t->hash[id] = h;
    t->slots[at] = id + 1;
    return id;
}

static void settab_free(SetTab *t) { free(t->pool.v); free(t->off.v); free(t->len.v); free(t->hash); free(t->slots); }

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ---- subset construction ---- */

typedef struct {
    int32_t n;
    int32_t *b_off, *b_lo, *b_hi, *b_dst; /* byte edges by source */
    int32_t *e_off, *e_dst;               /* epsilon edges */
    int32_t *c_off, *c_rule, *c_dst;      /* call edges */
    int32_t *mark, stamp;
    Vec stack;
} Nfa;

/* CSR of `m` edges given as rows of `width` ints whose first is the source. */
static int csr(int32_t n, int32_t m, const int32_t *rows, int width, int32_t **off, int32_t **cols) {
    *off = calloc((size_t)n + 1, 4);
    for (int c = 0; c < width - 1; c++) cols[c] = malloc((size_t)(m > 0 ? m : 1) * 4);
    if (!*off) return -1;
    for (int c = 0; c < width - 1; c++) if (!cols[c]) return -1;
    for (int32_t i = 0; i < m; i++) (*off)[rows[i * width] + 1]++;
    for (int32_t s = 0; s < n; s++) (*off)[s + 1] += (*off)[s];
    int32_t *fill = malloc((size_t)(n > 0 ? n : 1) * 4);
    if (!fill) return -1;
    memcpy(fill, *off, (size_t)n * 4);
    for (int32_t i = 0; i < m; i++) {
        int32_t at = fill[rows[i * width]]++;
        for (int c = 0; c < width - 1; c++) cols[c][at] = rows[i * width + 1 + c];
    }
    free(fill);
    return 0;
}

/* The epsilon closure of a[0..n) into out, its members marked with the new f->stamp and their
 * hash (mix summed) in *h; returns its size, -1: no memory. */
static int64_t closure(Nfa *f, const int32_t *a, int64_t n, Vec *out, uint64_t *h) {
    uint64_t sum = 0;
    f->stamp++;
    out->n = 0;
    f->stack.n = 0;
    for (int64_t i = 0; i < n; i++)
        if (f->mark[a[i]] != f->stamp) {
            f->mark[a[i]] = f->stamp;
            sum += mix((uint32_t)a[i]);
            if (vpush(&f->stack, a[i]) || vpush(out, a[i])) return -1;
        }
    while (f->stack.n) {
        int32_t s = f->stack.v[--f->stack.n];
        for (int32_t j = f->e_off[s]; j < f->e_off[s + 1]; j++) {
            int32_t t = f->e_dst[j];
            if (f->mark[t] != f->stamp) {
                f->mark[t] = f->stamp;
                sum += mix((uint32_t)t);
                if (vpush(&f->stack, t) || vpush(out, t)) return -1;
            }
        }
    }
    *h = sum ^ (uint64_t)out->n;
    return out->n;
}

/* The index of the closure of a[0..n) among the sets (-1: no memory). */
static int32_t closure_id(Nfa *f, SetTab *sets, const int32_t *a, int64_t n, Vec *closed) {
    uint64_t h;
    if (closure(f, a, n, closed, &h) < 0) return -1;
    return settab_find(sets, closed->v, closed->n, h, f->mark, f->stamp);
}

/* The minimal DFA of an NFA given as edge rows (bytes: source, lo, hi, target; eps: source, target;
 * calls: source, rule, return state). */
agentkv_dfa *dfa_subsets(int32_t n, int32_t start, int32_t final, int32_t mb, const int32_t *bytes, int32_t me,
                            const int32_t *eps, int32_t mc, const int32_t *calls, int32_t max_states, Clock clk) {
    Nfa f = {0};
    Cdfa d = {0};
    SetTab sets = {0};
    Vec cur = {0}, targets = {0}, closed = {0}, c_calls = {0};
    int64_t *pairs = NULL;
    int64_t pairs_cap = 0;
    int64_t tab_cap = 0;
    int err = DFA_NO_MEMORY;
    int32_t *cols_b[3], *cols_e[1], *cols_c[2];
    f.n = n;
    if (csr(n, mb, bytes, 4, &f.b_off, cols_b) || csr(n, me, eps, 2, &f.e_off, cols_e) || csr(n, mc, calls, 3, &f.c_off, cols_c))
        goto done;
    f.b_lo = cols_b[0]; f.b_hi = cols_b[1]; f.b_dst = cols_b[2];
    f.e_dst = cols_e[0];
    f.c_rule = cols_c[0]; f.c_dst = cols_c[1];
    f.mark = calloc((size_t)(n > 0 ? n : 1), 4);
    if (!f.mark) goto done;
    /* Byte classes: the bytes no edge tells apart are one symbol. */
    uint8_t cut[257] = {0};
    for (int32_t i = 0; i < mb; i++) { cut[bytes[4 * i + 1]] = 1; cut[bytes[4 * i + 2] + 1] = 1; }
    int32_t k = 0;
    for (int b = 0; b < 256; b++) { if (b && cut[b]) k++; d.class_of[b] = (uint8_t)k; }
    d.k = ++k;
    int32_t *count = calloc((size_t)k + 1, 4);
    if (!count || closure_id(&f, &sets, &start, 1, &closed) < 0) { free(count); goto done; }
    for (int32_t i = 0; i < sets.off.n; i++) {
        if ((i & 63) == 0 && clock_over(&clk)) { err = DFA_TIMEOUT; free(count); goto done; }
        if (sets.off.n > max_states) { err = DFA_TOO_MANY; free(count); goto done; }
        cur.n = 0;
        if (vreserve(&cur, sets.len.v[i])) { free(count); goto done; }
        memcpy(cur.v, sets.pool.v + sets.off.v[i], (size_t)sets.len.v[i] * 4);
        cur.n = sets.len.v[i];
        if (i >= tab_cap) {
            tab_cap = tab_cap ? 2 * tab_cap : 64;
            int32_t *t = realloc(d.tab, (size_t)tab_cap * k * 4);
            uint8_t *acc = t ? realloc(d.acc, (size_t)tab_cap) : NULL;
            if (t) d.tab = t;
            if (!acc) { free(count); goto done; }
            d.acc = acc;
        }
        for (int32_t c = 0; c < k; c++) d.tab[(int64_t)i * k + c] = -1;
        /* Every byte edge's target under each class it covers, bucketed by class (a counting sort). */
        memset(count, 0, (size_t)(k + 1) * 4);
        int64_t np = 0;
        for (int64_t x = 0; x < cur.n; x++) {
            int32_t s = cur.v[x];
            for (int32_t j = f.b_off[s]; j < f.b_off[s + 1]; j++)
                for (int32_t c = d.class_of[f.b_lo[j]]; c <= d.class_of[f.b_hi[j]]; c++) { count[c + 1]++; np++; }
        }
        if (vreserve(&targets, np)) { free(count); goto done; }
        for (int32_t c = 0; c < k; c++) count[c + 1] += count[c];
        for (int64_t x = 0; x < cur.n; x++) {
            int32_t s = cur.v[x];
            for (int32_t j = f.b_off[s]; j < f.b_off[s + 1]; j++)
                for (int32_t c = d.class_of[f.b_lo[j]]; c <= d.class_of[f.b_hi[j]]; c++) targets.v[count[c]++] = f.b_dst[j];
        }
        int32_t prev_from = 0, prev_n = -1, prev_id = -1;
        for (int32_t c = 0, from = 0; c < k; from = count[c++]) { /* count[c] is now where class c ends */
            int32_t nt = count[c] - from, id;
            if (!nt) continue;
            /* Neighbouring classes often lead to the same targets (filled in the same order). */
            if (nt == prev_n && !memcmp(targets.v + from, targets.v + prev_from, (size_t)nt * 4)) id = prev_id;
            else id = closure_id(&f, &sets, targets.v + from, nt, &closed);
            if (id < 0) { free(count); goto done; }
            d.tab[(int64_t)i * k + c] = id;
            prev_from = from; prev_n = nt; prev_id = id;
        }
        /* Calls, by rule: each rule's return states together. */
        np = 0;
        for (int64_t x = 0; x < cur.n; x++) {
            int32_t s = cur.v[x];
            for (int32_t j = f.c_off[s]; j < f.c_off[s + 1]; j++) {
                if (np + 1 > pairs_cap) {
                    int64_t cap = pairs_cap ? 2 * pairs_cap : 1024;
                    int64_t *p = realloc(pairs, (size_t)cap * 8);
                    if (!p) { free(count); goto done; }
                    pairs = p;
                    pairs_cap = cap;
                }
                pairs[np++] = ((int64_t)f.c_rule[j] << 32) | (uint32_t)f.c_dst[j];
            }
        }
        if (np > 1) qsort(pairs, (size_t)np, 8, cmp_i64);
        for (int64_t x = 0; x < np;) {
            int32_t r = (int32_t)(pairs[x] >> 32);
            int64_t y = x;
            targets.n = 0;
            for (; y < np && (int32_t)(pairs[y] >> 32) == r; y++) if (vpush(&targets, (int32_t)(pairs[y] & 0xffffffff))) { free(count); goto done; }
            x = y;
            int32_t id = closure_id(&f, &sets, targets.v, targets.n, &closed);
            if (id < 0 || vpush(&c_calls, i) || vpush(&c_calls, r) || vpush(&c_calls, id)) { free(count); goto done; }
        }
        d.acc[i] = 0;
        for (int64_t x = 0; x < cur.n; x++) if (cur.v[x] == final) d.acc[i] = 1;
    }
    free(count);
    d.n = (int32_t)sets.off.n;
    d.nc = (int32_t)(c_calls.n / 3);
    d.calls = c_calls.v;
    c_calls.v = NULL;
    err = DFA_OK;
done:
    free(f.b_off); free(f.b_lo); free(f.b_hi); free(f.b_dst); free(f.e_off); free(f.e_dst);
    free(f.c_off); free(f.c_rule); free(f.c_dst); free(f.mark); free(f.stack.v);
    settab_free(&sets);
    free(cur.v); free(targets.v); free(closed.v); free(c_calls.v); free(pairs);
    return dfa_minimized(&d, err);
}

/* The intersection (keep_right) or difference t1 - t2 of two call-free DFAs, minimized. */
agentkv_dfa *agentkv_dfa_product(int32_t n1, const int32_t *t1, const uint8_t *a1, int32_t n2, const int32_t *t2,
                                 const uint8_t *a2, int32_t keep_right, int32_t max_states, double seconds) {
    Cdfa d = {0};
    SetTab pairs = {0};
    int rep[256];
    const int32_t *ts[2] = {t1, t2};
    int32_t ns[2] = {n1, n2};
    int64_t cap = 0;
    int err = DFA_NO_MEMORY;
    Clock clk;
    clock_start(&clk, seconds);
    int32_t k = d.k = dfa_table_classes(2, ts, ns, d.class_of, rep);
    d.calls = malloc(12);
    int32_t start[2] = {0, n2 > 0 ? 0 : -1};
    if (!d.calls || settab_find(&pairs, start, 2, hash_seq(start, 2), NULL, 0) < 0) goto done;
    for (int32_t i = 0; i < pairs.off.n; i++) {
        if ((i & 255) == 0 && clock_over(&clk)) { err = DFA_TIMEOUT; goto done; }
        if (pairs.off.n > max_states) { err = DFA_TOO_MANY; goto done; }
        if (i >= cap) {
            cap = cap ? 2 * cap : 64;
            int32_t *t = realloc(d.tab, (size_t)cap * k * 4);
            uint8_t *a = t ? realloc(d.acc, (size_t)cap) : NULL;
            if (t) d.tab = t;
            if (!a) goto done;
            d.acc = a;
        }
        int32_t a = pairs.pool.v[pairs.off.v[i]], b = pairs.pool.v[pairs.off.v[i] + 1];
        d.acc[i] = a1[a] && (b >= 0 && a2[b]) == (keep_right != 0);
        int32_t last_x = -2, last_y = -2, last_id = -1; /* (most classes of a row lead to the pair the one before did) */
        for (int32_t c = 0; c < k; c++) {
            int32_t x = t1[(int64_t)a * 256 + rep[c]], y = b >= 0 ? t2[(int64_t)b * 256 + rep[c]] : -1;
            int32_t id = -1;
            if (x >= 0 && (y >= 0 || !keep_right)) {
                if (x == last_x && y == last_y) id = last_id;
                else {
                    int32_t key[2] = {x, y};
                    id = settab_find(&pairs, key, 2, hash_seq(key, 2), NULL, 0);
                    if (id < 0) goto done;
                    last_x = x; last_y = y; last_id = id;
                }
            }
            d.tab[(int64_t)i * k + c] = id;
        }
    }
    d.n = (int32_t)pairs.off.n;
    err = DFA_OK;
done:
    settab_free(&pairs);
    return dfa_minimized(&d, err);
}
