/* Whole parallel jobs with barriers inside, like the native decode step (cpu_pool.c): one at a time per
process, whichever engine calls, each on the calling thread's OpenMP team with a spin barrier. */

#ifndef AGENTKV_CPU_POOL_H
#define AGENTKV_CPU_POOL_H

typedef void (*agentkv_job)(void *arg, int me, int nt);

/* fn(arg, me, nt) on up to nt threads (fewer where the team comes smaller; 1 built without OpenMP), the
   caller as thread 0; returns when all are done. Jobs of different callers run one after another. */
void agentkv_pool_run(agentkv_job fn, void *arg, int nt);

/* inside a job: wait until all nt threads of the job reach it */
void agentkv_pool_barrier(int nt);

/* the threads a job asking for nt runs on now: fewer while the machine is busy (cpu_pool.c) */
int agentkv_pool_threads(int nt);

/* tests: a job of nt threads, 4 rounds of work_us of sleep on each and late_us more on all but the first,
   a barrier after each; returns agentkv_pool_threads(nt) after it. And the adaptation's state reset. */
int agentkv_pool_test_job(int nt, int work_us, int late_us);
void agentkv_pool_reset(void);

#define AGENTKV_POOL_MAX 256

#endif
