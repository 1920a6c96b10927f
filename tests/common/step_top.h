/* A check shared by the CPU and GPU suites: sampled decoding through the step path (tsr_engine_run_step) on two
 * engines of one model, one whose backend reduces rows to their candidates on the device (ops->top_rows) and one
 * whose backend copies whole rows. Every sequence (eight sampling configurations: plain temperature, top-k, top-p,
 * min-p, typical-p, their mixes, and greedy rows beside sampled ones) must draw the same tokens on both, step after
 * step; a token drawn from the candidates and one drawn from the row can differ only when a uniform falls within
 * about 1e-6 of a boundary, which the fixed seeds here never do. */
#ifndef TSR_TESTS_STEP_TOP_H
#define TSR_TESTS_STEP_TOP_H

#include "kernels/ops.h"

#include <stddef.h>

typedef struct tsr_step_top_stats {
    int tokens;    /* tokens compared */
    int top_calls; /* forward calls that reduced their rows to candidates */
} tsr_step_top_stats;

/* Runs `steps` decode steps after the prompts' prefill on model_dir with each backend. Returns 0, or -1 with the
 * first difference (or failure) described in err. with_top must have top_rows; whole must not. */
int tsr_check_step_top(const char *model_dir, const tsr_ops *with_top, const tsr_ops *whole, int steps,
                       tsr_step_top_stats *stats, char *err, size_t cap);

#endif
