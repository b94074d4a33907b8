/* One pool of worker threads per process (cpu_pool.c) for work that is a whole parallel job with barriers
inside, like the native decode step: every engine of the process shares it, one job at a time. */

#ifndef AGENTKV_CPU_POOL_H
#define AGENTKV_CPU_POOL_H

typedef void (*agentkv_job)(void *arg, int me, int nt);

/* fn(arg, me, nt) on nt threads, the caller as thread 0; returns when all are done. nt is clamped to
   [1, AGENTKV_POOL_MAX]. Jobs of different callers run one after another. */
void agentkv_pool_run(agentkv_job fn, void *arg, int nt);

/* inside a job: wait until all nt threads of the job reach it */
void agentkv_pool_barrier(int nt);

#define AGENTKV_POOL_MAX 256

#endif
