/* Command-line options of multi-rank runs, shared by every command that runs a model (generate, logits, ...).
 *
 *   --split none|layers|layers:R1,R2,...|tensor   how the workers split the model (default: layers with several
 *                                                 workers)
 *   --tp N                      tensor groups of N workers inside each layer stage (hybrid; with --split layers)
 *   --gpu-memory SIZE[,SIZE..]  usable memory per GPU (one value for all, or one per worker), e.g. 24GiB
 *   --comm-timeout S            longest wait for a peer in one operation, seconds (default 120; 0 = none)
 *   --load-timeout S            longest wait for the workers to load (default 1800)
 *   --micro-batches N           pipelining over layer stages: min(N, stages) steps in flight, N calls per
 *                               prefill step (default 2; 1 = off)
 *   --bind auto|none            hwloc binding of ranks (default auto)
 *   --quiet-ranks               no per-rank start-up lines on stderr
 * Values are kept as given and checked when the run starts (parallel/session.h). */
#ifndef TSR_PARALLEL_OPTIONS_H
#define TSR_PARALLEL_OPTIONS_H

#include <stdio.h>

typedef struct tsr_par_opts {
    const char *split;
    int tp;
    const char *gpu_memory;
    double comm_timeout, load_timeout;
    int micro_batches;
    int bind; /* 1 auto, 0 none */
    int quiet;
} tsr_par_opts;

void tsr_par_opts_init(tsr_par_opts *o);

/* If argv[*i] is one of the options above, consumes it and its value and returns 1; returns 0 when it is not one,
 * -1 (with a message on stderr naming cmd) when its value is invalid or missing. */
int tsr_par_opts_take(const char *cmd, tsr_par_opts *o, int argc, char **argv, int *i);

/* Prints the options' help lines. */
void tsr_par_opts_help(FILE *f);

#endif
