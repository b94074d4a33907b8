/* Minimization of a DFA over byte classes, and the result handed to Python (csrc/dfa.h).
 *
 * Valmari and Lehtinen's partition refinement ("Efficient minimization of DFAs with partial
 * transition functions", 2008): O(m log n) over the transitions that exist, no sink state, and it
 * drops states that no input reaches or that cannot reach acceptance. Calls are symbols like byte
 * classes. The result is numbered breadth first from the start (byte classes in byte order, then
 * calls by rule), so equal languages give equal tables. minimize.py is the Python twin.
 */
#include "dfa.h"

typedef struct { int32_t z; int32_t *E, *L, *S, *F, *P; } Part;

static int part_init(Part *p, int32_t n) {
    size_t m = (size_t)(n > 0 ? n : 1);
    p->E = malloc(m * 4); p->L = malloc(m * 4); p->S = malloc(m * 4); p->F = malloc(m * 4); p->P = malloc(m * 4);
    if (!p->E || !p->L || !p->S || !p->F || !p->P) return -1;
    p->z = n > 0;
    for (int32_t i = 0; i < n; i++) { p->E[i] = p->L[i] = i; p->S[i] = 0; }
    if (n) { p->F[0] = 0; p->P[0] = n; }
    return 0;
}

static void part_free(Part *p) { free(p->E); free(p->L); free(p->S); free(p->F); free(p->P); }

typedef struct { int32_t *M, *W, w; } Marks;

static void part_mark(Part *p, Marks *k, int32_t e) {
    int32_t s = p->S[e], i = p->L[e], j = p->F[s] + k->M[s];
    p->E[i] = p->E[j]; p->L[p->E[i]] = i;
    p->E[j] = e; p->L[e] = j;
    if (!k->M[s]++) k->W[k->w++] = s;
}

static void part_split(Part *p, Marks *k) {
    while (k->w) {
        int32_t s = k->W[--k->w], j = p->F[s] + k->M[s];
        if (j == p->P[s]) { k->M[s] = 0; continue; }
        if (k->M[s] <= p->P[s] - j) { p->F[p->z] = p->F[s]; p->P[p->z] = p->F[s] = j; }
        else { p->P[p->z] = p->P[s]; p->F[p->z] = p->P[s] = j; }
        for (int32_t i = p->F[p->z]; i < p->P[p->z]; i++) p->S[p->E[i]] = p->z;
        k->M[s] = k->M[p->z++] = 0;
    }
}

typedef struct {
    int32_t nn, mm, rr;
    int32_t *T, *Lb, *H, *A, *F; /* transitions: tail, label, head; adjacency */
    Part B;
} Mini;

static void make_adjacent(Mini *m, const int32_t *K) {
    for (int32_t q = 0; q <= m->nn; q++) m->F[q] = 0;
    for (int32_t t = 0; t < m->mm; t++) m->F[K[t]]++;
    for (int32_t q = 0; q < m->nn; q++) m->F[q + 1] += m->F[q];
    for (int32_t t = m->mm; t--;) m->A[--m->F[K[t]]] = t;
}

static void reach(Mini *m, int32_t q) {
    int32_t i = m->B.L[q];
    if (i >= m->rr) {
        m->B.E[i] = m->B.E[m->rr]; m->B.L[m->B.E[i]] = i;
        m->B.E[m->rr] = q; m->B.L[q] = m->rr++;
    }
}

/* Keep the states reached from those reached so far along K1 -> K2, and the transitions among them. */
static void rem_unreachable(Mini *m, int32_t *K1, int32_t *K2) {
    make_adjacent(m, K1);
    for (int32_t i = 0; i < m->rr; i++)
        for (int32_t j = m->F[m->B.E[i]]; j < m->F[m->B.E[i] + 1]; j++) reach(m, K2[m->A[j]]);
    int32_t j = 0;
    for (int32_t t = 0; t < m->mm; t++)
        if (m->B.L[K1[t]] < m->rr) { K2[j] = K2[t]; m->Lb[j] = m->Lb[t]; K1[j] = K1[t]; j++; }
    m->mm = j;
    m->B.P[0] = m->rr;
    m->rr = 0;
}

/* The minimal DFA of d (start 0) into *out; d's classes are kept. 0, or an error. */
static int minimize_cdfa(const Cdfa *d, Cdfa *out) {
    Mini m = {0};
    Marks mk = {0};
    Part C = {0};
    int err = DFA_NO_MEMORY;
    int32_t k = d->k, n_labels = k;
    int64_t mm = d->nc;
    for (int64_t i = 0; i < (int64_t)d->n * k; i++) mm += d->tab[i] >= 0;
    for (int32_t i = 0; i < d->nc; i++) if (k + d->calls[3 * i + 1] + 1 > n_labels) n_labels = k + d->calls[3 * i + 1] + 1;
    if (mm > INT32_MAX / 2) return DFA_TOO_MANY;
    m.nn = d->n;
    m.mm = (int32_t)mm;
    size_t tm = (size_t)(mm > 0 ? mm : 1);
    m.T = malloc(tm * 4); m.Lb = malloc(tm * 4); m.H = malloc(tm * 4); m.A = malloc(tm * 4);
    m.F = malloc((size_t)(m.nn + 1) * 4);
    int32_t marks = (int32_t)(mm > m.nn ? mm : m.nn) + 1;
    mk.M = calloc((size_t)marks, 4); mk.W = malloc((size_t)marks * 4);
    int32_t *newid = NULL, *order = NULL, *count = NULL;
    memset(out, 0, sizeof *out);
    if (!m.T || !m.Lb || !m.H || !m.A || !m.F || !mk.M || !mk.W || part_init(&m.B, m.nn)) goto done;
    /* Transitions in (state, label) order: adjacency lists keep that order. */
    int32_t t = 0, ci = 0;
    for (int32_t s = 0; s < d->n; s++) {
        for (int32_t c = 0; c < k; c++)
            if (d->tab[(int64_t)s * k + c] >= 0) { m.T[t] = s; m.Lb[t] = c; m.H[t] = d->tab[(int64_t)s * k + c]; t++; }
        for (; ci < d->nc && d->calls[3 * ci] == s; ci++) { m.T[t] = s; m.Lb[t] = k + d->calls[3 * ci + 1]; m.H[t] = d->calls[3 * ci + 2]; t++; }
    }
    reach(&m, 0);
    rem_unreachable(&m, m.T, m.H);
    for (int32_t q = 0; q < m.nn; q++) if (d->acc[q] && m.B.L[q] < m.B.P[0]) reach(&m, q);
    int32_t ff = m.rr;
    rem_unreachable(&m, m.H, m.T);
    memcpy(out->class_of, d->class_of, 256);
    out->k = k;
    if (m.B.L[0] >= m.B.P[0]) { /* the language is empty: one state, no way out */
        out->n = 1;
        out->tab = malloc((size_t)k * 4); out->acc = calloc(1, 1); out->calls = malloc(4);
        if (!out->tab || !out->acc || !out->calls) goto done;
        for (int32_t c = 0; c < k; c++) out->tab[c] = -1;
        err = DFA_OK;
        goto done;
    }
    mk.M[0] = ff;
    if (ff) { mk.W[mk.w++] = 0; part_split(&m.B, &mk); }
    if (part_init(&C, m.mm)) goto done;
    if (m.mm) { /* cords: the transitions by label (a counting sort) */
        count = calloc((size_t)n_labels + 1, 4);
        if (!count) goto done;
        for (int32_t i = 0; i < m.mm; i++) count[m.Lb[i] + 1]++;
        for (int32_t l = 0; l < n_labels; l++) count[l + 1] += count[l];
        for (int32_t i = 0; i < m.mm; i++) C.E[count[m.Lb[i]]++] = i;
        C.z = mk.M[0] = 0;
        int32_t a = m.Lb[C.E[0]];
        for (int32_t i = 0; i < m.mm; i++) {
            int32_t tr = C.E[i];
            if (m.Lb[tr] != a) { a = m.Lb[tr]; C.P[C.z++] = i; C.F[C.z] = i; mk.M[C.z] = 0; }
            C.S[tr] = C.z; C.L[tr] = i;
        }
        C.P[C.z++] = m.mm;
    }
    make_adjacent(&m, m.H);
    int32_t b = 1, c = 0;
    while (c < C.z) {
        for (int32_t i = C.F[c]; i < C.P[c]; i++) part_mark(&m.B, &mk, m.T[C.E[i]]);
        part_split(&m.B, &mk);
        c++;
        for (; b < m.B.z; b++) {
            for (int32_t i = m.B.F[b]; i < m.B.P[b]; i++)
                for (int32_t j = m.F[m.B.E[i]]; j < m.F[m.B.E[i] + 1]; j++) part_mark(&C, &mk, m.A[j]);
            part_split(&C, &mk);
        }
    }
    /* Number the blocks breadth first from the start's, reading one member's transitions. */
    int32_t nb = m.B.z;
    newid = malloc((size_t)nb * 4); order = malloc((size_t)nb * 4);
    out->tab = malloc((size_t)nb * k * 4); out->acc = malloc((size_t)nb);
    int32_t n_out_calls = 0;
    if (!newid || !order || !out->tab || !out->acc) goto done;
    make_adjacent(&m, m.T);
    for (int32_t i = 0; i < nb; i++) newid[i] = -1;
    int32_t head = 0, tail = 0;
    newid[m.B.S[0]] = tail;
    order[tail++] = m.B.S[0];
    for (; head < tail; head++) {
        int32_t rep = m.B.E[m.B.F[order[head]]];
        for (int32_t j = m.F[rep]; j < m.F[rep + 1]; j++) {
            int32_t hb = m.B.S[m.H[m.A[j]]];
            if (newid[hb] < 0) { newid[hb] = tail; order[tail++] = hb; }
            n_out_calls += m.Lb[m.A[j]] >= k;
        }
    }
    out->n = tail;
    out->nc = n_out_calls;
    out->calls = malloc((size_t)(n_out_calls > 0 ? n_out_calls : 1) * 12);
    if (!out->calls) goto done;
    for (int64_t i = 0; i < (int64_t)tail * k; i++) out->tab[i] = -1;
    int32_t oc = 0;
    for (int32_t s = 0; s < tail; s++) {
        int32_t rep = m.B.E[m.B.F[order[s]]];
        out->acc[s] = d->acc[rep];
        for (int32_t j = m.F[rep]; j < m.F[rep + 1]; j++) {
            int32_t tr = m.A[j], to = newid[m.B.S[m.H[tr]]];
            if (m.Lb[tr] < k) out->tab[(int64_t)s * k + m.Lb[tr]] = to;
            else { out->calls[3 * oc] = s; out->calls[3 * oc + 1] = m.Lb[tr] - k; out->calls[3 * oc + 2] = to; oc++; }
        }
    }
    err = DFA_OK;
done:
    free(m.T); free(m.Lb); free(m.H); free(m.A); free(m.F); free(mk.M); free(mk.W);
    part_free(&m.B); part_free(&C);
    free(newid); free(order); free(count);
    if (err) cdfa_free(out);
    return err;
}

/* ---- results ---- */

static agentkv_dfa *result(const Cdfa *d, int err) {
    agentkv_dfa *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->error = err;
    if (err) return r;
    r->n = d->n;
    r->n_calls = d->nc;
    r->table = malloc((size_t)d->n * 256 * 4);
    r->accept = malloc((size_t)d->n);
    r->calls = malloc((size_t)(d->nc > 0 ? d->nc : 1) * 12);
    r->k = d->k;
    r->ctab = malloc((size_t)(d->n > 0 ? d->n : 1) * d->k * 4);
    if (!r->table || !r->accept || !r->calls || !r->ctab) { r->error = DFA_NO_MEMORY; return r; }
    memcpy(r->ctab, d->tab, (size_t)d->n * d->k * 4);
    memcpy(r->class_of, d->class_of, 256);
    for (int32_t s = 0; s < d->n; s++)
        for (int b = 0; b < 256; b++) r->table[(int64_t)s * 256 + b] = d->tab[(int64_t)s * d->k + d->class_of[b]];
    memcpy(r->accept, d->acc, (size_t)d->n);
    memcpy(r->calls, d->calls, (size_t)d->nc * 12);
    return r;
}

agentkv_dfa *dfa_minimized(Cdfa *d, int err) {
    Cdfa m = {0};
    if (!err) err = minimize_cdfa(d, &m);
    agentkv_dfa *r = result(&m, err);
    cdfa_free(d);
    cdfa_free(&m);
    return r;
}

void agentkv_dfa_free(agentkv_dfa *r) {
    if (!r) return;
    free(r->table); free(r->accept); free(r->calls); free(r->ctab); free(r);
}

/* Byte classes of tables t[i] (n[i] rows each): bytes whose columns agree in all of them. The
 * columns are hashed and then checked row by row (reading a column at a time strides a whole row
 * per entry: for a names trie of ~800 states that was most of a product's time); only where two
 * columns share a hash but differ somewhere are they compared column by column. */
int32_t dfa_table_classes(int count, const int32_t *const *t, const int32_t *n, uint8_t class_of[256], int rep[256]) {
    uint64_t h[256];
    for (int b = 0; b < 256; b++) h[b] = 1469598103934665603ULL;
    for (int i = 0; i < count; i++)
        for (int32_t s = 0; s < n[i]; s++) {
            const int32_t *row = t[i] + (int64_t)s * 256;
            for (int b = 0; b < 256; b++) { h[b] ^= (uint32_t)row[b]; h[b] *= 1099511628211ULL; }
        }
    int32_t k = 0;
    for (int b = 0; b < 256; b++) {
        int found = -1;
        for (int32_t c = 0; c < k && found < 0; c++) if (h[rep[c]] == h[b]) found = c;
        if (found < 0) { rep[k] = b; found = k++; }
        class_of[b] = (uint8_t)found;
    }
    int same = 1;
    for (int i = 0; i < count && same; i++)
        for (int32_t s = 0; s < n[i] && same; s++) {
            const int32_t *row = t[i] + (int64_t)s * 256;
            for (int b = 0; b < 256 && same; b++) same = row[b] == row[rep[class_of[b]]];
        }
    if (same) return k;
    /* (a hash collision: classes column by column, exactly) */
    k = 0;
    for (int b = 0; b < 256; b++) {
        int found = -1;
        for (int32_t c = 0; c < k && found < 0; c++) {
            if (h[rep[c]] != h[b]) continue;
            int eq = 1;
            for (int i = 0; i < count && eq; i++)
                for (int32_t s = 0; s < n[i] && eq; s++) eq = t[i][(int64_t)s * 256 + b] == t[i][(int64_t)s * 256 + rep[c]];
            if (eq) found = c;
        }
        if (found < 0) { rep[k] = b; found = k++; }
        class_of[b] = (uint8_t)found;
    }
    return k;
}

agentkv_dfa *agentkv_dfa_minimize(int32_t n, const int32_t *table, const uint8_t *accept) {
    Cdfa d = {0};
    int rep[256];
    const int32_t *ts[1] = {table};
    d.k = dfa_table_classes(1, ts, &n, d.class_of, rep);
    d.n = n;
    d.tab = malloc((size_t)(n > 0 ? n : 1) * d.k * 4);
    d.acc = malloc((size_t)(n > 0 ? n : 1));
    d.calls = malloc(12);
    if (!d.tab || !d.acc || !d.calls) return dfa_minimized(&d, DFA_NO_MEMORY);
    for (int32_t s = 0; s < n; s++)
        for (int32_t c = 0; c < d.k; c++) d.tab[(int64_t)s * d.k + c] = table[(int64_t)s * 256 + rep[c]];
    memcpy(d.acc, accept, (size_t)n);
    return dfa_minimized(&d, DFA_OK);
}
