/* Several products of one tiled type and shape in one parallel region: y_g = x_g @ W_g^T (+ bias_g) for
g < count, each x_g [M_g, K] quantized to int8 as agentkv_qtile_linear quantizes it, then every product's
tiles shared among the threads as one run. A mixture of experts' chosen experts, each a call of its own,
paid a region's start and a tail per call (a token's 4 experts x 2 products a layer) and left the threads
cold between them; as one run they stream one expert's tiles into the next's. Each row's result is the
one agentkv_qtile_linear gives it (a tile's results never depend on which thread computes it). */

#include <stdlib.h>

#include "cpu_tiles.h"

/* x[g]: [M[g], K] (row stride x_ld, bf16 where bf else fp32); tiles[g]: W_g tiled [N, K]; bias[g]: [N] or
   NULL; out[g]: [M[g], N] (row stride out_ld). Returns 0, 1 for a type not tiled or K not whole blocks, 2 for
   an M below 1 or memory short. */
int agentkv_qtile_grouped(int qtype, int bf, int64_t count, const void *const *x, const int64_t *M, int64_t x_ld,
                          int64_t K, const uint8_t *const *tiles, int64_t N, const void *const *bias, void *const *out,
                          int64_t out_ld, int nthreads, int generic) {
    if (!tiled_shape(qtype, K)) return 1;
    QRows *q = calloc((size_t)(count > 0 ? count : 1), sizeof(QRows));
    int64_t rows = 0, bad = !q;
    for (int64_t g = 0; !bad && g < count; g++) {
        bad = M[g] < 1 || agentkv_qrows_alloc(q + g, M[g], K);
        rows += M[g];
    }
    if (bad) {
        for (int64_t g = 0; q && g < count; g++) agentkv_qrows_free(q + g);
        free(q);
        return 2;
    }
    const int64_t ntiles = (N + 15) / 16, total = count * ntiles;
#pragma omp parallel num_threads(nthreads) if (total * K * rows > 65536)
    {
        const int64_t nt = omp_threads(), me = omp_me();
        for (int64_t g = 0, first = 0; g < count; first += M[g], g++)  /* every row of every product, dealt out */
            for (int64_t m = 0; m < M[g]; m++)
                if ((first + m) % nt == me) agentkv_quantize_row(x[g], x_ld, m, bf, q + g);
#pragma omp barrier
        const int64_t t0 = total * me / nt, t1 = total * (me + 1) / nt;
        for (int64_t g = t0 / ntiles; g < count && g * ntiles < t1; g++) {
            const int64_t a = t0 > g * ntiles ? t0 - g * ntiles : 0;
            const int64_t b = t1 < (g + 1) * ntiles ? t1 - g * ntiles : ntiles;
            agentkv_qtile_range(qtype, tiles[g], N, K, q + g, M[g], a, b, bias[g], NULL, 0, out[g], out_ld, bf,
                                generic);
        }
    }
    for (int64_t g = 0; g < count; g++) agentkv_qrows_free(q + g);
    free(q);
    return 0;
}
