/* Whole parallel jobs with barriers inside (the native decode step): one job at a time per process,
each one OpenMP region whose barriers are this file's spin barrier.

Why not libgomp's barriers: libgomp gives each calling thread a team of its own and, once the process
holds more OpenMP threads than cores (a second engine that has run once, idle since), its workers
spin only briefly before they sleep, so each of a step's ~270 barriers became a futex sleep and wake:
4.6 -> 13 ms a decode step of the embedded model here. This barrier only spins, and the jobs of all
engines are serialized by a lock, so a job's threads are never more than the cores it asked for.

Why not a pool of our own threads (tried): torch runs its ops on the same OpenMP team, whose worker
spins on after each op (the sampler's, between steps); a separate pool's worker then shared the two
cores with it, 24.4 ms a batch-16 step against 20.2 on the OpenMP team (19.7 with libgomp's spin
cut short by GOMP_SPINCOUNT). Taking the calling thread's team, the step wakes it once a step. */

#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "cpu_kernels.h"

/* A spin's step. Not x86's PAUSE: in a virtual machine a loop of PAUSEs lets the hypervisor take the
   core away (pause-loop exiting); with it in these loops a decode step took 5.4 ms against 4.5. */
#define RELAX() __asm__ volatile("" ::: "memory")

static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static _Atomic int bar_count;
static _Atomic unsigned bar_gen;

void agentkv_pool_barrier(int nt) {
    if (nt <= 1) return;
    const unsigned g = atomic_load_explicit(&bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&bar_count, 1, memory_order_acq_rel) == nt - 1) {
        atomic_store_explicit(&bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&bar_gen, 1, memory_order_release);
        return;
    }
    for (int spin = 1; atomic_load_explicit(&bar_gen, memory_order_acquire) == g; spin++) {
        RELAX();
        if (spin % 65536 == 0) sched_yield();  /* a thread of the job lost its core: let it run */
    }
}

void agentkv_pool_run(agentkv_job fn, void *arg, int nt) {
    nt = nt < 1 ? 1 : nt > AGENTKV_POOL_MAX ? AGENTKV_POOL_MAX : nt;
    pthread_mutex_lock(&job_lock);
#pragma omp parallel num_threads(nt)
    {
        /* (the team may come smaller than asked: its size is the job's) */
        fn(arg, omp_me(), omp_threads());
    }
    pthread_mutex_unlock(&job_lock);
}
