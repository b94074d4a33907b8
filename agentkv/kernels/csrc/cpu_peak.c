/* The cores' fp32 fused multiply-add peak, measured: what benchmarks print beside a product's FLOPs a
second, so each figure reads as a fraction of the bound. Each thread runs independent chains of FMAs on
registers (more chains than any core here needs to hide the FMA latency behind its throughput), with
nothing loaded, for `iters` rounds. */

#include "cpu_kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define CHAINS 24
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CHAINS 12
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#endif

/* Returns the FLOPs the team did (2 a lane of each FMA); out[0] a value the compiler cannot drop. */
double agentkv_fma_peak(int nthreads, int64_t iters, float *out) {
    double flops = 0.0;
#pragma omp parallel num_threads(nthreads) reduction(+ : flops)
    {
#ifdef CHAINS
        vec a[CHAINS];
        const vec x = SET1(0.999999f), y = SET1(1e-7f);
        for (int c = 0; c < CHAINS; c++) a[c] = SET1((float)c);
        for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 24
            for (int c = 0; c < CHAINS; c++) a[c] = FMA(a[c], x, y);
        for (int c = 1; c < CHAINS; c++) a[0] = ADD(a[0], a[c]);
        float lanes[LANES];
        STORE(lanes, a[0]);
        if (omp_me() == 0) out[0] = lanes[0];
        flops += 2.0 * LANES * CHAINS * (double)iters;
#else
        float a[8] = {0.f};
        for (int64_t it = 0; it < iters; it++)
            for (int c = 0; c < 8; c++) a[c] = fmaf(a[c], 0.999999f, 1e-7f);
        if (omp_me() == 0) out[0] = a[0] + a[7];
        flops += 2.0 * 8 * (double)iters;
#endif
    }
    return flops;
}
