/* tessera bench under mpirun: the executor benchmark of parallel/bench.h over the ranks' split model. */
#ifndef TSR_LAUNCHER_BENCH_RANKS_H
#define TSR_LAUNCHER_BENCH_RANKS_H

#include "parallel/options.h"
#include "runtime/dtype.h"

#include <stdint.h>

typedef struct bench_ranks_args {
    const char *model, *device, *json;
    const int32_t *batches;
    int n_batches;
    int prompt_len, gen, threads, max_tokens;
    uint64_t seed;
    tsr_dtype kv_dtype;
} bench_ranks_args;

/* Runs on every rank of the job: rank 0 coordinates and prints, the workers serve their part. Returns the exit
 * code (0 ok, 1 failure, 2 usage error, the same on every rank where the arguments are at fault). */
int tsr_bench_ranks(const bench_ranks_args *a, const tsr_par_opts *po);

#endif
