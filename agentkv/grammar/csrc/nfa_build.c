/* The Thompson NFA of an expression encoded by dfa_native.py (nodes in post-order, each distinct
 * node once), built as dfa.py's NFA.build builds it in Python, then determinized and minimized
 * (dfa_build.c, dfa_minimize.c).
 */
#include "dfa.h"

enum { X_LIT = 0, X_RANGES = 1, X_SEQ = 2, X_ALT = 3, X_REPEAT = 4, X_REF = 5, X_DFA = 6 };

typedef struct {
    const int32_t *code;
    const int32_t *dfa_off, *tables; /* embedded DFAs: rows dfa_off[i]..dfa_off[i + 1] of tables */
    const uint8_t *accepts;
    Vec bytes, eps, calls;
    int32_t n, max_n;
    int err, depth;
    Clock clk;
} Builder;

static int32_t new_state(Builder *b) {
    if (b->n >= b->max_n) { b->err = DFA_TOO_MANY_NFA; return -1; }
    return b->n++;
}

static int edge(Builder *b, int32_t s, int32_t lo, int32_t hi, int32_t t) {
    if (vpush(&b->bytes, s) || vpush(&b->bytes, lo) || vpush(&b->bytes, hi) || vpush(&b->bytes, t)) { b->err = DFA_NO_MEMORY; return -1; }
    return 0;
}

static int eps_edge(Builder *b, int32_t s, int32_t t) {
    if (vpush(&b->eps, s) || vpush(&b->eps, t)) { b->err = DFA_NO_MEMORY; return -1; }
    return 0;
}

#define TRY(x) do { if ((x) < 0) return -1; } while (0)

/* Add node `at` starting at state s; return its end state (-1: b->err says why). As NFA.build. */
static int32_t build(Builder *b, int32_t at, int32_t s) {
    const int32_t *c = b->code + at;
    int32_t t, end;
    if (++b->depth > 10000) { b->err = DFA_TOO_MANY_NFA; return -1; }
    switch (c[0]) {
    case X_LIT:
        for (int32_t i = 0; i < c[1]; i++) { TRY(t = new_state(b)); TRY(edge(b, s, c[2 + i], c[2 + i], t)); s = t; }
        break;
    case X_RANGES: {
        TRY(end = new_state(b));
        const int32_t *p = c + 2;
        for (int32_t q = 0; q < c[1]; q++) {
            int32_t len = p[0], cur = s;
            for (int32_t k = 0; k < len; k++) {
                if (k == len - 1) t = end;
                else TRY(t = new_state(b));
                TRY(edge(b, cur, p[1 + 2 * k], p[2 + 2 * k], t));
                cur = t;
            }
            p += 1 + 2 * len;
        }
        s = end;
        break;
    }
    case X_SEQ:
        for (int32_t i = 0; i < c[1]; i++) TRY(s = build(b, c[2 + i], s));
        break;
    case X_ALT: {
        TRY(end = new_state(b));
        for (int32_t i = 0; i < c[1]; i++) {
            int32_t start;
            TRY(start = new_state(b));
            TRY(eps_edge(b, s, start));
            TRY(t = build(b, c[2 + i], start));
            TRY(eps_edge(b, t, end));
        }
        s = end;
        break;
    }
    case X_REPEAT: {
        int32_t lo = c[1], hi = c[2], item = c[3];
        if (clock_over(&b->clk)) { b->err = DFA_TIMEOUT; return -1; }
        for (int32_t i = 0; i < lo; i++) TRY(s = build(b, item, s));
        if (hi < 0) {
            int32_t loop;
            TRY(loop = new_state(b));
            TRY(eps_edge(b, s, loop));
            TRY(t = build(b, item, loop));
            TRY(eps_edge(b, t, loop));
            s = loop;
        } else {
            TRY(end = new_state(b));
            TRY(eps_edge(b, s, end));
            for (int32_t i = 0; i < hi - lo; i++) { TRY(s = build(b, item, s)); TRY(eps_edge(b, s, end)); }
            s = end;
        }
        break;
    }
    case X_REF:
        TRY(t = new_state(b));
        if (vpush(&b->calls, s) || vpush(&b->calls, c[1]) || vpush(&b->calls, t)) { b->err = DFA_NO_MEMORY; return -1; }
        s = t;
        break;
    case X_DFA: {
        int32_t lo = b->dfa_off[c[1]], nd = b->dfa_off[c[1] + 1] - lo, base = b->n;
        if (b->n + nd + 1 > b->max_n) { b->err = DFA_TOO_MANY_NFA; return -1; }
        b->n += nd + 1;
        end = base + nd;
        TRY(eps_edge(b, s, base));
        for (int32_t k = 0; k < nd; k++) { /* each row's runs of one target as one edge */
            const int32_t *row = b->tables + (int64_t)(lo + k) * 256;
            for (int x = 0; x < 256;) {
                int y = x;
                while (y + 1 < 256 && row[y + 1] == row[x]) y++;
                if (row[x] >= 0) TRY(edge(b, base + k, x, y, base + row[x]));
                x = y + 1;
            }
            if (b->accepts[lo + k]) TRY(eps_edge(b, base + k, end));
        }
        s = end;
        break;
    }
    default:
        b->err = DFA_NO_MEMORY;
        return -1;
    }
    b->depth--;
    return s;
}

/* The minimal DFA of the expression at code[root] (see dfa.py's encode). */
agentkv_dfa *agentkv_expr_to_dfa(const int32_t *code, int32_t root, const int32_t *dfa_off, const int32_t *tables,
                                 const uint8_t *accepts, int32_t max_nfa_states, int32_t max_states, double seconds) {
    Builder b = {0};
    b.code = code;
    b.dfa_off = dfa_off;
    b.tables = tables;
    b.accepts = accepts;
    b.max_n = max_nfa_states;
    clock_start(&b.clk, seconds);
    int32_t start = new_state(&b), final = build(&b, root, start);
    agentkv_dfa *r;
    if (final < 0) {
        Cdfa none = {0};
        r = dfa_minimized(&none, b.err);
    } else {
        r = dfa_subsets(b.n, start, final, (int32_t)(b.bytes.n / 4), b.bytes.v, (int32_t)(b.eps.n / 2), b.eps.v,
                    (int32_t)(b.calls.n / 3), b.calls.v, max_states, b.clk);
    }
    free(b.bytes.v); free(b.eps.v); free(b.calls.v);
    return r;
}
