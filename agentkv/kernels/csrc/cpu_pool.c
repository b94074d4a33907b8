/* The process's pool of worker threads for whole parallel jobs (the native decode step).

OpenMP gives each calling thread a team of its own, and libgomp shortens how long its workers spin
before sleeping once the process holds more OpenMP threads than there are cores: a second engine
that has run once (an idle one) made each barrier of the first a futex sleep and wake, 4.6 -> 13 ms a
decode step of the embedded model here. This pool is the process's one set of workers: any number
of engines share it, one job at a time (a lock), and its barrier only spins, since every thread of
a job is working between barriers.

Between jobs a worker spins for up to SPIN_NS (the next step comes after the Python side samples
and schedules, ~0.5 ms), then sleeps on a condition variable until the next job. */

#define _GNU_SOURCE
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
/* A spin's step. Not x86's PAUSE: in a virtual machine a loop of PAUSEs lets the hypervisor take the
   core away (pause-loop exiting); with it in these loops a decode step took 5.4 ms against 4.5. */
#define RELAX() __asm__ volatile("" ::: "memory")

#define SPIN_NS 3000000L  /* a worker's spin between jobs before it sleeps */

static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;  /* workers' sleep */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static _Atomic unsigned job_gen;  /* bumped for each job */
static _Atomic int sleepers, done;
static agentkv_job job_fn;
static void *job_arg;
static int job_nt, started;  /* workers 1..started exist */
static unsigned spawn_gen;  /* the generation a worker made now has seen (set under job_lock) */
static _Atomic int bar_count;
static _Atomic unsigned bar_gen;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* the generation after `seen`: spin a while, then sleep until it comes */
static unsigned next_job(unsigned seen) {
    const int64_t until = now_ns() + SPIN_NS;
    for (int spin = 1;; spin++) {
        const unsigned g = atomic_load_explicit(&job_gen, memory_order_acquire);
        if (g != seen) return g;
        RELAX();
        if (spin % 256 == 0 && now_ns() > until) break;
    }
    pthread_mutex_lock(&wake_lock);
    atomic_fetch_add(&sleepers, 1);  /* before the generation is read again: see agentkv_pool_run */
    unsigned g;
    while ((g = atomic_load(&job_gen)) == seen) pthread_cond_wait(&wake, &wake_lock);
    atomic_fetch_sub(&sleepers, 1);
    pthread_mutex_unlock(&wake_lock);
    return g;
}

/* Every worker answers every job, the ones it is not part of too: a worker that lagged a job behind
   would read the next job's parameters as the one it missed. */
static void *worker(void *p) {
    const int me = (int)(intptr_t)p;
    unsigned seen = spawn_gen;
    for (;;) {
        seen = next_job(seen);
        if (me < job_nt) job_fn(job_arg, me, job_nt);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
    return NULL;
}

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
    spawn_gen = atomic_load(&job_gen);
    while (started < nt - 1) {  /* workers are made as the first job that needs them comes */
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)(started + 1))) break;
        pthread_detach(t);
        started++;
    }
    nt = nt < started + 1 ? nt : started + 1;
    job_fn = fn, job_arg = arg, job_nt = nt;
    atomic_store(&done, 0);
    atomic_fetch_add(&job_gen, 1);  /* (seq_cst: a worker that read the old generation counted itself a sleeper) */
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&wake_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&wake_lock);
    }
    fn(arg, 0, nt);
    for (int spin = 1; atomic_load_explicit(&done, memory_order_acquire) < started; spin++) {
        RELAX();
        if (spin % 65536 == 0) sched_yield();
    }
    pthread_mutex_unlock(&job_lock);
}
