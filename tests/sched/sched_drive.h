/* A driver for scheduler tests: one scheduler, the fake executor and a record of every request's events.
 *
 * drv_step() plans, runs the step on the fake executor and commits; drv_drain() takes the events and checks each
 * against what the request must see: every token equal to the fake model's next token for the request's own
 * history (so preemption, re-prefill and the prefix cache can never change a stream), n_generated counting up
 * by one, nothing after the final event, and a final reason consistent with the tokens (stop ids, min_tokens,
 * max_tokens). Any violation is recorded in error[] and reported as -1.
 *
 * With opts.max_plans > 1 several planned steps may be outstanding: drv_plan keeps the newest in `step` and the
 * older ones in `older` (oldest first), drv_run_commit runs and commits the oldest, and drv_plan checks that a new
 * plan references no page that an outstanding step writes (they would run at the same time). */
#ifndef TSR_TESTS_SCHED_DRIVE_H
#define TSR_TESTS_SCHED_DRIVE_H

#include "tests/sched/sched_fake.h"

#define DRV_MAX_STOP 8

typedef struct drv_req {
    int32_t *hist;             /* prompt then the tokens received in events */
    int n_hist, cap, n_prompt;
    tsr_seq_params p;
    int32_t stop[DRV_MAX_STOP];
    int finals;                /* final events received (must end at exactly 1) */
    tsr_finish_reason finish;
    int n_cached;              /* from the last event */
} drv_req;

typedef struct driver {
    tsr_sched *s;
    tsr_sched_opts opts;
    fake_exec f;
    tsr_step step;             /* the newest plan */
    int step_out;              /* `step` awaits its commit */
    tsr_step older[TSR_SCHED_MAX_PLANS]; /* outstanding plans older than `step`, oldest first */
    int n_older;
    tsr_step_result *res;
    int cap_res;
    drv_req *req;              /* by id - 1 */
    int n_req, cap_req;
    int vocab;
    int check;                 /* run tsr_sched_check after every call */
    double now;
    char error[512];
} driver;

int drv_init(driver *d, const tsr_sched_opts *o, int vocab);
void drv_free(driver *d);
/* Submits; returns the id, 0 when refused (*st says why when st is not NULL). */
uint64_t drv_submit(driver *d, const int32_t *prompt, int n, const tsr_seq_params *p, tsr_status *st);
/* Plans into d->step (no run, no commit). Returns the number of sequences planned or -1. */
int drv_plan(driver *d);
/* Runs the oldest outstanding plan on the fake executor and commits it (fail: commit NULL results instead).
 * 0 or -1. */
int drv_run_commit(driver *d, int fail);
/* drv_plan + drv_run_commit + drv_drain. Returns sequences planned or -1. */
/* Plans outstanding (0 .. max_plans). */
int drv_outstanding(const driver *d);
int drv_step(driver *d);
/* Takes and checks the pending events; returns how many or -1. */
int drv_drain(driver *d);
/* Steps until the scheduler is idle (or max_steps). Returns steps taken or -1. */
int drv_run_all(driver *d, int max_steps);
/* tsr_sched_check; on failure records it and returns -1. */
int drv_check(driver *d);
/* Every submitted request has its one final event. */
int drv_all_final(driver *d);
/* Default request parameters: greedy-free sampling, seed, max_tokens, no stop ids. */
tsr_seq_params drv_params(uint64_t seed, int max_tokens);

#endif
