/* A fixed pool of worker threads for the CPU kernels.
 *
 * tsr_parallel_for(n, fn, ctx) splits [0, n) into contiguous chunks, runs fn(ctx, begin, end) on every thread of
 * the pool (the caller's thread included) and returns when all are done. The pool starts on first use with one
 * thread per online core, or TSR_THREADS from the environment, or the count given to tsr_threads_set() before
 * first use. Calls from inside a running fn run serially (no nesting). The pool serves one caller at a time: a call
 * made while another thread's job is running runs serially on the calling thread (in-process tensor-parallel tests
 * drive two model shards from two threads). */
#ifndef TSR_THREADPOOL_H
#define TSR_THREADPOOL_H

typedef void (*tsr_range_fn)(void *ctx, int begin, int end);

void tsr_parallel_for(int n, tsr_range_fn fn, void *ctx);

/* Sets the number of threads (call before the first parallel_for; later calls are ignored). */
void tsr_threads_set(int n);
/* Number of threads the pool uses (starting it if needed). */
int tsr_threads_count(void);

#endif
