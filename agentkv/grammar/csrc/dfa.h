/* Shared by nfa_build.c, dfa_build.c and dfa_minimize.c: the result handed to Python, a DFA over byte classes,
 * growable int vectors and a deadline clock. */
#ifndef AGENTKV_DFA_H
#define AGENTKV_DFA_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int32_t n, n_calls, error;
    int32_t *table;  /* n * 256, -1: no transition */
    uint8_t *accept; /* n */
    int32_t *calls;  /* n_calls * 3: state, rule, target (by state, then rule) */
    int32_t k;       /* byte classes: `table` is `ctab` (n * k) read through `class_of` */
    int32_t *ctab;
    uint8_t class_of[256];
} agentkv_dfa;

enum { DFA_OK = 0, DFA_TOO_MANY = 1, DFA_NO_MEMORY = 2, DFA_TIMEOUT = 3, DFA_TOO_MANY_NFA = 4 };

/* A DFA over byte classes: what the three constructions produce and minimization takes. */
typedef struct {
    int32_t n, k, nc;
    int32_t *tab; /* n * k */
    uint8_t *acc;
    int32_t *calls; /* nc * 3 */
    uint8_t class_of[256];
} Cdfa;

static inline void cdfa_free(Cdfa *d) { free(d->tab); free(d->acc); free(d->calls); }

typedef struct { int32_t *v; int64_t n, cap; } Vec;

static inline int vpush(Vec *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *p = realloc(a->v, (size_t)cap * sizeof *p);
        if (!p) return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static inline int vreserve(Vec *a, int64_t need) {
    if (need <= a->cap) return 0;
    int64_t cap = a->cap ? a->cap : 256;
    while (cap < need) cap *= 2;
    int32_t *p = realloc(a->v, (size_t)cap * sizeof *p);
    if (!p) return -1;
    a->v = p;
    a->cap = cap;
    return 0;
}

typedef struct { struct timespec start; double seconds; } Clock;

static inline void clock_start(Clock *c, double seconds) { clock_gettime(CLOCK_MONOTONIC, &c->start); c->seconds = seconds; }

static inline int clock_over(const Clock *c) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - c->start.tv_sec) + 1e-9 * (double)(now.tv_nsec - c->start.tv_nsec) > c->seconds;
}

/* The minimal DFA of d (which it frees) as the result for Python; err: d could not be built. */
agentkv_dfa *dfa_minimized(Cdfa *d, int err);

/* The minimal DFA of an NFA given as edge rows (bytes: source, lo, hi, target; eps: source, target;
 * calls: source, rule, return state), from `start`, accepting at `final`. */
agentkv_dfa *dfa_subsets(int32_t n, int32_t start, int32_t final, int32_t mb, const int32_t *bytes, int32_t me,
                         const int32_t *eps, int32_t mc, const int32_t *calls, int32_t max_states, Clock clk);

/* Byte classes of call-free tables t[i] (n[i] rows of 256): bytes whose columns agree in all. */
int32_t dfa_table_classes(int count, const int32_t *const *t, const int32_t *n, uint8_t class_of[256], int rep[256]);

#endif
