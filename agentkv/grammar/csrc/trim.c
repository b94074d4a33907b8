/* The linked automaton's live states (automaton.py's _trim, whose Python code is the twin): one
 * backward search from the accepting states. A state is live if a byte leads to a live state, or a
 * call to a productive rule returns to a live state; a rule turns productive when its start turns
 * live. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* trans: n * 256 (-1: none); calls by state (call_off[n + 1], call_rule, call_ret); starts[n_rules].
 * Fills live[n] and productive[n_rules] (0/1), cuts every edge into or out of a dead state from
 * trans, and fills has_bytes[n] (a byte leads on from the state after the cut). Returns 0, or -1
 * when out of memory. */
int agentkv_trim(int32_t n, int32_t *trans, const uint8_t *accept, int32_t n_rules, const int32_t *starts,
                 const int32_t *call_off, const int32_t *call_rule, const int32_t *call_ret,
                 uint8_t *live, uint8_t *productive, uint8_t *has_bytes) {
    int rc = -1;
    int64_t m = 0;
    int32_t n_calls = call_off[n];
    int32_t *rev_off = calloc((size_t)n + 1, 4), *rev = NULL, *queue = malloc((size_t)(n > 0 ? n : 1) * 4);
    int32_t *start_of = malloc((size_t)(n > 0 ? n : 1) * 4), *by_rule_off = calloc((size_t)n_rules + 1, 4);
    int32_t *by_rule = malloc((size_t)(n_calls > 0 ? n_calls : 1) * 4), *caller = malloc((size_t)(n_calls > 0 ? n_calls : 1) * 4);
    /* waiting[t]: callers of productive rules that return to t, as linked lists over call indices */
    int32_t *wait_head = malloc((size_t)(n > 0 ? n : 1) * 4), *wait_next = malloc((size_t)(n_calls > 0 ? n_calls : 1) * 4);
    if (!rev_off || !queue || !start_of || !by_rule_off || !by_rule || !caller || !wait_head || !wait_next) goto done;
    /* Predecessors by bytes: one entry per run of equal targets in a row (a row's repeats add nothing). */
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        has_bytes[s] = 0;
        for (int b = 0; b < 256; b++)
            if (row[b] >= 0 && (b == 0 || row[b] != row[b - 1])) { rev_off[row[b] + 1]++; m++; has_bytes[s] = 1; }
    }
    for (int32_t s = 0; s < n; s++) rev_off[s + 1] += rev_off[s];
    rev = malloc((size_t)(m > 0 ? m : 1) * 4);
    int32_t *fill = malloc((size_t)(n > 0 ? n : 1) * 4);
    if (!rev || !fill) { free(fill); goto done; }
    memcpy(fill, rev_off, (size_t)n * 4);
    for (int32_t s = 0; s < n; s++) {
        const int32_t *row = trans + (int64_t)s * 256;
        for (int b = 0; b < 256; b++)
            if (row[b] >= 0 && (b == 0 || row[b] != row[b - 1])) rev[fill[row[b]]++] = s;
    }
    free(fill);
    for (int32_t s = 0; s < n; s++) { start_of[s] = -1; wait_head[s] = -1; }
    for (int32_t r = 0; r < n_rules; r++) start_of[starts[r]] = r;
    for (int32_t s = 0; s < n; s++)
        for (int32_t j = call_off[s]; j < call_off[s + 1]; j++) { by_rule_off[call_rule[j] + 1]++; caller[j] = s; }
    for (int32_t r = 0; r < n_rules; r++) by_rule_off[r + 1] += by_rule_off[r];
    int32_t *rfill = malloc((size_t)(n_rules > 0 ? n_rules : 1) * 4);
    if (!rfill) goto done;
    memcpy(rfill, by_rule_off, (size_t)n_rules * 4);
    for (int32_t j = 0; j < n_calls; j++) by_rule[rfill[call_rule[j]]++] = j;
    free(rfill);
    memset(productive, 0, (size_t)n_rules);
    int32_t qn = 0;
    for (int32_t s = 0; s < n; s++) { live[s] = accept[s] != 0; if (live[s]) queue[qn++] = s; }
#define MARK(p) do { int32_t p_ = (p); if (!live[p_]) { live[p_] = 1; queue[qn++] = p_; } } while (0)
    while (qn) {
        int32_t u = queue[--qn];
        for (int32_t j = rev_off[u]; j < rev_off[u + 1]; j++) MARK(rev[j]);
        for (int32_t j = wait_head[u]; j >= 0; j = wait_next[j]) MARK(caller[j]);
        wait_head[u] = -1;
        int32_t r = start_of[u];
        if (r >= 0 && !productive[r]) {
            productive[r] = 1;
            for (int32_t i = by_rule_off[r]; i < by_rule_off[r + 1]; i++) {
                int32_t j = by_rule[i];
                if (live[call_ret[j]]) MARK(caller[j]);
                else { wait_next[j] = wait_head[call_ret[j]]; wait_head[call_ret[j]] = j; }
            }
        }
    }
#undef MARK
    int any_dead = 0;
    for (int32_t s = 0; s < n && !any_dead; s++) any_dead = !live[s];
    for (int32_t s = 0; s < n && any_dead; s++) { /* (all live, the usual case: nothing to cut) */
        int32_t *row = trans + (int64_t)s * 256;
        uint8_t any = 0;
        for (int b = 0; b < 256; b++) {
            if (row[b] < 0) continue;
            if (!live[s] || !live[row[b]]) row[b] = -1;
            else any = 1;
        }
        has_bytes[s] = any;
    }
    rc = 0;
done:
    free(rev_off); free(rev); free(queue); free(start_of); free(by_rule_off); free(by_rule); free(caller);
    free(wait_head); free(wait_next);
    return rc;
}
