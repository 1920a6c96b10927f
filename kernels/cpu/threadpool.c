/* Thread pool behind tsr_parallel_for (see threadpool.h): workers sleep on a condition variable between jobs;
 * a job is (fn, ctx, n) and each worker takes the chunk matching its index. */
#include "kernels/cpu/threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define TSR_MAX_THREADS 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int requested_threads;
static int n_threads = 1;
static unsigned long generation;
static int pending;
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
    pthread_mutex_lock(&lock);
    for (;;) {
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        pthread_mutex_unlock(&lock);
        run_chunk(idx);
        pthread_mutex_lock(&lock);
        if (--pending == 0) pthread_cond_signal(&done);
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
    pending = n_threads - 1;
    generation++;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);

    inside_job = 1;
    run_chunk(0);
    inside_job = 0;

    pthread_mutex_lock(&lock);
    while (pending > 0) pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&caller);
}
