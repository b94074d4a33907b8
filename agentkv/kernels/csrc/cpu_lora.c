/* LoRA updates of a linear's output rows, each row by its own adapter (SGMV: a pass mixes requests of
several adapters and of none), for the Python path's linears (engine/lora/apply.py). The native decode
step calls the same row bodies (cpu_lora.h) inside its job. */

#include "cpu_lora.h"

/* y [M, ldy] += the update of linear `target` of layer `layer` of each row's adapter
   (adapters[row_adapter[m]]; a row whose index is negative has none) from x [M, ldx] (K columns).
   Returns 0, or 1 where an index or a rank is out of range (nothing done). */
int agentkv_lora_apply(const float *x, int64_t ldx, int64_t K, int64_t M, float *y, int64_t ldy, int64_t N,
                       const int64_t *row_adapter, const LoraAdapter *adapters, int64_t nadapters, int64_t layer,
                       int target, int nthreads, int generic) {
    if (target < 0 || target >= LORA_TARGETS) return 1;
    for (int64_t m = 0; m < M; m++) {
        const int64_t a = row_adapter[m];
        if (a >= nadapters) return 1;
        if (a < 0) continue;
        const LoraMat *mat = &adapters[a].layer[layer].mat[target];
        if (mat->rank > LORA_MAX_RANK) return 1;
        for (int64_t p = 0; p < mat->pieces; p++)
            if (mat->piece[p].n0 < 0 || mat->piece[p].n0 + mat->piece[p].n > N) return 1;
    }
    /* blocks of 4 rows, each run of one adapter's rows in a block together: its A and B read once for them */
#pragma omp parallel for num_threads(nthreads) if (M * K >= 65536)
    for (int64_t b0 = 0; b0 < M; b0 += 4) {
        const int64_t b1 = b0 + 4 < M ? b0 + 4 : M;
        float t[4 * LORA_MAX_RANK];
        for (int64_t m = b0; m < b1;) {
            const int64_t a = row_adapter[m];
            int64_t e = m + 1;
            while (e < b1 && row_adapter[e] == a) e++;
            const LoraMat *mat = a < 0 ? NULL : &adapters[a].layer[layer].mat[target];
            if (mat && mat->pieces) {
                const int rows = (int)(e - m);
                lora_shrink_rows(mat, x + m * ldx, ldx, rows, K, t, LORA_MAX_RANK, generic);
                lora_expand_rows(mat, t, LORA_MAX_RANK, rows, 0, N, y + m * ldy, ldy, generic);
            }
            m = e;
        }
    }
    return 0;
}
