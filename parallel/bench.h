/* Throughput of any executor, one process or many ranks: `tessera generate --bench`, and `tessera bench` under
 * mpirun (launcher/bench_ranks.c).
 *
 * For each batch size B: B random prompts of prompt_len tokens (ids from a fixed seed) are prefilled in step plans of
 * up to the executor's max_step_tokens tokens (prompts' chunks side by side, each prompt's last chunk sampling its
 * first token), then gen decode steps run B sequences of one token each (drawn with o->sampling; with an executor that
 * keeps several steps in flight, B is cut into that many groups whose steps alternate, as the scheduler does).
 * Sequence b uses pages [b·P, (b+1)·P). One warm-up step runs first so that page faults of mapped weights and one-time
 * set-up (NCCL connections, CUDA graph capture of the first decode shape) are not timed. Reported: prefill tokens/s
 * and milliseconds, decode tokens/s and milliseconds per step, per batch; optionally as JSON. The executor's results
 * are what the coordinator sees, so under mpirun the numbers include the step round trip. With the run's plan
 * (o->plan), each worker's share is listed first, and each batch adds the weight bytes the busiest worker streams per
 * second of decoding (its weights once per step and group). The usage of each rank holding the model closes the
 * report (this process, or each worker): steps, peak device memory (against its usable capacity where limited) and
 * peak host memory. */
#ifndef TSR_PARALLEL_BENCH_H
#define TSR_PARALLEL_BENCH_H

#include "parallel/plan.h"
#include "runtime/executor.h"
#include "runtime/sampler.h"

#include <stdio.h>

#define TSR_BENCH_MAX_BATCHES 16

typedef struct tsr_bench_opts {
    int batches[TSR_BENCH_MAX_BATCHES];
    int n_batches;
    int prompt_len, gen;
    const char *json;  /* write results here too (NULL: no) */
    const char *label; /* what is measured (model, split), echoed in the output */
    tsr_sampling sampling; /* how every token is drawn (greedy when temperature is 0, the zero value) */
    const tsr_plan *plan;  /* the workers' shares (NULL: not shown) */
    uint64_t prompt_seed;  /* mixed into the prompts' ids (0: the fixed prompts of earlier versions) */
} tsr_bench_opts;

/* KV tokens the benchmark needs (the largest batch). */
long tsr_bench_kv_tokens(const tsr_bench_opts *o, int page_size);

/* Runs the benchmark, printing one line per batch to out. */
tsr_status tsr_bench_run(tsr_executor *x, const tsr_bench_opts *o, FILE *out);

#endif
