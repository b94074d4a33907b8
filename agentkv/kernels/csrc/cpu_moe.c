/* A mixture of experts' routing by a softmax over the router's logits: each token's k experts and their
weights, for the Python path (engine/mlp.py's MoE.route with the native kernels) and the native decode step
(cpu_step_moe.h) alike, so the two choose the same experts and weigh them with the same bits. */

#include <math.h>

#include "cpu_kernels.h"

/* logits [E] -> idx [k]: the k largest, in descending order (ties to the lower index), and w [k]: their
   softmax over all E (norm 0), or over the k alone (norm 1: the softmax's top k renormalized, which is
   the same weights), each times `scaling` where it is not 1 */
void agentkv_moe_route_row(const float *logits, int64_t E, int64_t k, int norm, float scaling, int64_t *idx,
                           float *w) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = idx[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        idx[j] = best;
    }
    const float top = logits[idx[0]];
    float sum = 0.f;
    for (int64_t j = 0; j < k; j++) {
        w[j] = expf(logits[idx[j]] - top);
        if (norm) sum += w[j];
    }
    for (int64_t e = 0; !norm && e < E; e++) sum += expf(logits[e] - top);
    for (int64_t j = 0; j < k; j++) {
        w[j] /= sum;
        if (scaling != 1.f) w[j] *= scaling;
    }
}

/* logits [T, E] -> idx [T, k], w [T, k] (agentkv_moe_route_row per token) */
void agentkv_moe_route(const float *logits, int64_t T, int64_t E, int64_t k, int norm, float scaling, int64_t *idx,
                       float *w) {
    for (int64_t t = 0; t < T; t++) agentkv_moe_route_row(logits + t * E, E, k, norm, scaling, idx + t * k, w + t * k);
}
