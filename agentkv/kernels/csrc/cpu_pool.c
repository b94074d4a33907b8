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
cut short by GOMP_SPINCOUNT). Taking the calling thread's team, the step wakes it once a step.

On a busy machine (a test run, a build, another model beside the engine) a job's thread can lose its
core to another process for a scheduler slice at a time, and every barrier then waits for it: beside
one spinning process a decode step of the embedded model on 2 threads of 2 cores took 2.6x its quiet
time, on 1 thread 1.2x. So each job times the barriers' waits: after BUSY_JOBS jobs in a row whose
threads spent more than BUSY_WAIT of their time waiting for one another, jobs run on a thread fewer;
every PROBE_EVERY jobs one runs on all the threads asked for again, and if its threads hardly waited
(a quiet machine again) all of them are taken back. */

#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "cpu_kernels.h"

/* A spin's step. Not x86's PAUSE: in a virtual machine a loop of PAUSEs lets the hypervisor take the
   core away (pause-loop exiting); with it in these loops a decode step took 5.4 ms against 4.5. */
#define RELAX() __asm__ volatile("" ::: "memory")

#define BUSY_WAIT 0.35 /* the share of a job's thread time spent in barriers that says a core was taken */
#define BUSY_JOBS 3     /* jobs in a row that must say so before a thread is dropped */
#define QUIET_WAIT 0.2  /* a probe on all the threads below this: the cores are free again */
#define PROBE_EVERY 64  /* jobs between probes of all the threads while running on fewer */

static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time, and the state below */
static _Atomic int bar_count;
static _Atomic unsigned bar_gen;
static _Atomic int64_t wait_ns;  /* the current job's threads' time in barriers, summed */
static int use_threads;          /* the threads jobs run on now; 0: all they ask for */
static int busy_jobs, since_probe;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void agentkv_pool_barrier(int nt) {
    if (nt <= 1) return;
    const unsigned g = atomic_load_explicit(&bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&bar_count, 1, memory_order_acq_rel) == nt - 1) {
        atomic_store_explicit(&bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&bar_gen, 1, memory_order_release);
        return;
    }
    const int64_t start = now_ns();
    for (int spin = 1; atomic_load_explicit(&bar_gen, memory_order_acquire) == g; spin++) {
        RELAX();
        if (spin % 65536 == 0) sched_yield();  /* a thread of the job lost its core: let it run */
    }
    atomic_fetch_add_explicit(&wait_ns, now_ns() - start, memory_order_relaxed);
}

/* the threads the next job of `nt` asked runs on (job_lock held) */
static int threads_for(int nt, int *probe) {
    *probe = 0;
    if (!use_threads || use_threads >= nt) return nt;
    if (++since_probe >= PROBE_EVERY) {
        since_probe = 0, *probe = 1;
        return nt;
    }
    return use_threads;
}

/* what a job on n threads that waited `waited` of its n x `elapsed` says (job_lock held) */
static void learn(int n, int probe, int64_t waited, int64_t elapsed) {
    if (n <= 1 || elapsed <= 0) return;
    const double share = (double)waited / ((double)n * (double)elapsed);
    if (probe) {
        if (share < QUIET_WAIT) use_threads = 0, busy_jobs = 0;
        return;
    }
    if (share <= BUSY_WAIT) {
        busy_jobs = 0;
        return;
    }
    if (++busy_jobs >= BUSY_JOBS) use_threads = n - 1, busy_jobs = 0, since_probe = 0;
}

void agentkv_pool_run(agentkv_job fn, void *arg, int nt) {
    nt = nt < 1 ? 1 : nt > AGENTKV_POOL_MAX ? AGENTKV_POOL_MAX : nt;
    pthread_mutex_lock(&job_lock);
    int probe, team = 1;
    const int use = threads_for(nt, &probe);
    atomic_store_explicit(&wait_ns, 0, memory_order_relaxed);
    const int64_t start = now_ns();
#pragma omp parallel num_threads(use)
    {
        /* (the team may come smaller than asked: its size is the job's) */
        if (omp_me() == 0) team = omp_threads();
        fn(arg, omp_me(), omp_threads());
    }
    learn(team, probe, atomic_load_explicit(&wait_ns, memory_order_relaxed), now_ns() - start);
    pthread_mutex_unlock(&job_lock);
}

int agentkv_pool_threads(int nt) {
    pthread_mutex_lock(&job_lock);
    const int n = use_threads && use_threads < nt ? use_threads : nt;
    pthread_mutex_unlock(&job_lock);
    return n;
}

/* a job of 4 rounds, each `work_us` of sleep on every thread (work) and `late_us` more on every thread
but the first (a core another process holds), then a barrier: the tests of the adaptation */
typedef struct { int work_us, late_us; } SleepyJob;

static void sleep_us(int us) {
    const struct timespec t = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

static void sleepy_job(void *arg, int me, int nt) {
    const SleepyJob *job = arg;
    for (int i = 0; i < 4; i++) {
        sleep_us(job->work_us + (me > 0 ? job->late_us : 0));
        agentkv_pool_barrier(nt);
    }
}

int agentkv_pool_test_job(int nt, int work_us, int late_us) {
    SleepyJob job = {work_us, late_us};
    agentkv_pool_run(sleepy_job, &job, nt);
    return agentkv_pool_threads(nt);
}

void agentkv_pool_reset(void) {
    pthread_mutex_lock(&job_lock);
    use_threads = 0, busy_jobs = 0, since_probe = 0;
    pthread_mutex_unlock(&job_lock);
}
