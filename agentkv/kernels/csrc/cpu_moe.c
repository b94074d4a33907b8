/* A mixture of experts' routing, each token's k experts and their weights from its router's logits: by a
softmax (gpt-oss, Qwen3-MoE, Mixtral), or by DeepSeek-V3's sigmoid scores chosen within groups (GLM-4.5),
for the Python path (engine/mlp.py's MoE.route with the native kernels) and the native decode step
(cpu_step_moe.h) alike, so the two choose the same experts and weigh them with the same bits. */

#include <math.h>
#include <stdlib.h>

#include "cpu_kernels.h"

/* idx [k]: the k largest of v [E] (-INFINITY: not a candidate), in descending order, ties to the lower index */
static void top_k(const float *v, int64_t E, int64_t k, int64_t *idx) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = idx[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[j] = best;
    }
}

/* logits [E] -> idx [k]: the k largest, in descending order (ties to the lower index), and w [k]: their
   softmax over all E (norm 0), or over the k alone (norm 1: the softmax's top k renormalized, which is
   the same weights), each times `scaling` where it is not 1 */
void agentkv_moe_route_row(const float *logits, int64_t E, int64_t k, int norm, float scaling, int64_t *idx,
                           float *w) {
    top_k(logits, E, k, idx);
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

/* DeepSeek-V3's routing (GLM-4.5's): scores sigmoid(logits); the experts chosen by scores + bias among those
of the `chosen` best of `groups` groups (a group's worth: its two best), each weighed by its score, the k
renormalized where norm (their sum + 1e-20), times scaling. `scratch` [2 E]. */
void agentkv_moe_route_groups_row(const float *logits, const float *bias, int64_t E, int64_t k, int64_t groups,
                                  int64_t chosen, int norm, float scaling, int64_t *idx, float *w, float *scratch) {
    float *scores = scratch, *choice = scratch + E;
    for (int64_t e = 0; e < E; e++) {
        scores[e] = 1.f / (1.f + expf(-logits[e]));
        choice[e] = scores[e] + bias[e];
    }
    if (groups > 1) {
        const int64_t per = E / groups;
        float worth[256];
        int64_t two[2], best[256];
        for (int64_t g = 0; g < groups; g++) {
            top_k(choice + g * per, per, 2, two);
            worth[g] = choice[g * per + two[0]] + choice[g * per + two[1]];
        }
        top_k(worth, groups, chosen, best);
        for (int64_t g = 0; g < groups; g++) {
            int keep = 0;
            for (int64_t i = 0; i < chosen && !keep; i++) keep = best[i] == g;
            for (int64_t e = 0; !keep && e < per; e++) choice[g * per + e] = -INFINITY;
        }
    }
    top_k(choice, E, k, idx);
    float sum = 0.f;
    for (int64_t j = 0; j < k; j++) {
        w[j] = scores[idx[j]];
        sum += w[j];
    }
    for (int64_t j = 0; j < k; j++) {
        if (norm) w[j] /= sum + 1e-20f;
        if (scaling != 1.f) w[j] *= scaling;
    }
}

/* logits [T, E] -> idx [T, k], w [T, k] (agentkv_moe_route_groups_row per token); 0, or 1 where groups do not
   divide E, more than 256 groups, or fewer than 2 experts in a group, or no memory */
int agentkv_moe_route_groups(const float *logits, const float *bias, int64_t T, int64_t E, int64_t k, int64_t groups,
                             int64_t chosen, int norm, float scaling, int64_t *idx, float *w) {
    if (groups < 1 || groups > 256 || E % groups || (groups > 1 && E / groups < 2) || chosen < 1 || chosen > groups)
        return 1;
    float *scratch = malloc((size_t)(2 * E) * sizeof(float));
    if (!scratch) return 1;
    for (int64_t t = 0; t < T; t++)
        agentkv_moe_route_groups_row(logits + t * E, bias, E, k, groups, chosen, norm, scaling, idx + t * k, w + t * k,
                                     scratch);
    free(scratch);
    return 0;
}
