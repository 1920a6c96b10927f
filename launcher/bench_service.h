/* tessera bench --concurrency: serving throughput through the service loop (see bench_service.c). */
#ifndef TSR_LAUNCHER_BENCH_SERVICE_H
#define TSR_LAUNCHER_BENCH_SERVICE_H

#include "runtime/dtype.h"

#include <stdint.h>

typedef struct bench_service_args {
    const char *model, *device;
    const int32_t *levels; /* concurrency levels */
    int n_levels;
    int prompt_len, gen, shared_prefix, requests, step_tokens, prefill_chunk, page_size;
    long kv_tokens;
    long seed;
    tsr_dtype kv_dtype;
} bench_service_args;

/* Runs every level and prints a table; returns the exit code (0 ok, 1 failure). */
int tsr_bench_service(const bench_service_args *a);

#endif
