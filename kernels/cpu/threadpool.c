/* Thread pool behind tsr_parallel_for (see threadpool.h): a job is (fn, ctx, n) and each worker takes the chunk
 * matching its index. Between jobs a worker first watches the job counter for up to SPIN_NS, since a decode step
 * hands out its products back to back (a 1B model's step: about 130 jobs), and only then sleeps on a condition
 * variable; the caller likewise watches for the workers' end before it sleeps. Waking sleeping threads had cost
 * some tens of microseconds per job on a 2-core VM (BENCHMARKS.md, CPU decode, stop 45). Past the spin everything
 * is as before: an idle pool sleeps, and an oversubscribed machine (several CPU ranks under mpirun) loses at most
 * the spin per job. */
#include "kernels/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 50000 /* how long a thread watches before it sleeps */

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Round i of a watch that ends at `end` (ns): a pause, and every 64th round a look at the clock and a yield (on an
 * oversubscribed machine, CPU ranks under mpirun, someone else runs meanwhile). 0 once the time is up. */
static int spin_round(int i, long long end)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if ((i & 63) != 63) return 1;
    if (now_ns() > end) return 0;
    sched_yield();
    return 1;
}

#define TSR_MAX_THREADS 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int requested_threads;
static int n_threads = 1;
static atomic_ulong generation; /* changed under lock, read without it while spinning */
static atomic_int pending;
static tsr_range_fn job_fn;
static void *job_ctx;
static int job_n;
static _Thread_local int inside_job;
static pthread_mutex_t caller = PTHREAD_MUTEX_INITIALIZER; /* held by the thread whose job the pool runs */

static void run_chunk(int idx)
{
    long n = job_n, t = n_threads;
    int begin = (int)(n * idx / t), end = (int)(n * (idx + 1) / t);
    if (begin < end) job_fn(job_ctx, begin, end);
}

static void *worker(void *arg)
{
    int idx = (int)(long)arg;
    unsigned long seen = 0;
    inside_job = 1;
    for (;;) {
        const long long end = now_ns() + SPIN_NS;
        for (int i = 0; atomic_load_explicit(&generation, memory_order_acquire) == seen && spin_round(i, end); i++) {
        }
        if (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
            pthread_mutex_lock(&lock);
            while (atomic_load_explicit(&generation, memory_order_relaxed) == seen) pthread_cond_wait(&wake, &lock);
            pthread_mutex_unlock(&lock);
        }
        seen = atomic_load_explicit(&generation, memory_order_acquire); /* the job's fn, ctx and n with it */
        run_chunk(idx);
        if (atomic_fetch_sub_explicit(&pending, 1, memory_order_acq_rel) == 1) { /* the last: the caller may sleep */
            pthread_mutex_lock(&lock);
            pthread_cond_signal(&done);
            pthread_mutex_unlock(&lock);
        }
    }
    return NULL;
}

static void start_pool(void)
{
    int n = requested_threads;
    if (n <= 0) {
        const char *env = getenv("TSR_THREADS");
        n = env ? atoi(env) : 0;
    }
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
    if (n > TSR_MAX_THREADS) n = TSR_MAX_THREADS;
    n_threads = 1;
    for (int i = 1; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(long)i) != 0) break; /* fewer threads, still correct */
        pthread_detach(t);
        n_threads++;
    }
}

void tsr_threads_set(int n) { requested_threads = n; }

int tsr_threads_count(void)
{
    pthread_once(&once, start_pool);
    return n_threads;
}

void tsr_parallel_for(int n, tsr_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    pthread_once(&once, start_pool);
    if (inside_job || n_threads == 1 || n == 1 || pthread_mutex_trylock(&caller) != 0) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&lock);
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    atomic_store_explicit(&pending, n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release); /* publishes the job to spinning workers */
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);

    inside_job = 1;
    run_chunk(0);
    inside_job = 0;

    const long long end = now_ns() + SPIN_NS;
    for (int i = 0; atomic_load_explicit(&pending, memory_order_acquire) > 0 && spin_round(i, end); i++) {
    }
    if (atomic_load_explicit(&pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&lock);
        while (atomic_load_explicit(&pending, memory_order_acquire) > 0) pthread_cond_wait(&done, &lock);
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_unlock(&caller);
}
