/* fault_sweep(): the counting run, the failing runs and their checks (see fault_sweep.h). */
#include "tests/fault/fault_sweep.h"

#include "tests/fault/fail_alloc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

static char current[160] = "no run";
static uint64_t fingerprint, reference;

void fault_result(const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) fingerprint = (fingerprint ^ p[i]) * 0x100000001b3ULL;
    fingerprint = (fingerprint ^ len) * 0x100000001b3ULL;
}

const char *fault_current_run(void) { return current; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* TSR_FAULT_VERBOSE=1 lists the call sites whose failure an operation tolerated. */
static int verbose(void)
{
    const char *env = getenv("TSR_FAULT_VERBOSE");
    return env && atoi(env) > 0;
}

/* A clean run: must succeed and (unless it is the warm-up, which may fill per-thread caches) leave nothing
 * behind. */
static void run_clean(const char *name, fault_op_fn op, void *ctx, const char *which, int check_live)
{
    snprintf(current, sizeof current, "%s run", which);
    uint64_t mark = fa_mark();
    tsr_clear_error();
    fingerprint = 0xcbf29ce484222325ULL;
    tsr_status st = op(ctx);
    if (st != TSR_OK) fail_msg("%s: %s run failed: %s: %s", name, which, tsr_status_str(st), tsr_last_error());
    if (!check_live) reference = fingerprint;
    else if (fingerprint != reference) fail_msg("%s: %s run produced another result than the warm-up", name, which);
    size_t live = check_live ? fa_live_since(mark, 8) : 0;
    if (live) fail_msg("%s: %s run left %zu blocks allocated", name, which, live);
}

/* One run with a failure armed (fa_fail_*() already called). */
static void run_failing(const char *name, fault_op_fn op, void *ctx, const char *what, fault_report *rep)
{
    snprintf(current, sizeof current, "failing %s", what);
    uint64_t mark = fa_mark();
    tsr_clear_error();
    fingerprint = 0xcbf29ce484222325ULL;
    tsr_status st = op(ctx);
    fa_stop();
    if (st == TSR_OK && fingerprint != reference) {
        char where[200];
        fail_msg("%s: failing %s (site %s) was tolerated with another result", name, what,
                 fa_site_str(fa_injected_site(), where, sizeof where));
    }
    rep->runs++;
    if (fa_injected()) {
        rep->injected++;
        if (st == TSR_OK) rep->tolerated++;
        else rep->failed++;
        if (st == TSR_OK && verbose()) {
            char where[200];
            printf("  %s: tolerated %s (site %s)\n", name, what, fa_site_str(fa_injected_site(), where, sizeof where));
        }
    }
    if (st != TSR_OK && !tsr_last_error()[0])
        fail_msg("%s: failing %s: %s without a message", name, what, tsr_status_str(st));
    size_t live = fa_live_since(mark, 8);
    if (live) fail_msg("%s: failing %s (%s): %zu blocks leaked", name, what, tsr_status_str(st), live);
}

void fault_sweep(const char *name, fault_op_fn op, void *ctx, long max_runs, fault_report *out)
{
    fault_report rep = {0};
    double t0 = now_s();
    fa_stop(); /* a previous sweep may have been cut short by a failed assertion */
    fa_suspend(0);
    run_clean(name, op, ctx, "warm-up", 0);
    fa_count_start();
    run_clean(name, op, ctx, "counting", 1);
    rep.allocs = fa_stop();
    const void *const *sites; /* stays valid: only a counting run rewrites the list */
    rep.sites = (long)fa_sites(&sites);
    rep.stride = rep.allocs <= max_runs ? 1 : (rep.allocs + max_runs - 1) / max_runs;
    char what[256];
    const char *only = getenv("TSR_FAULT_NTH"); /* debugging: run only the failing run of that allocation */
    for (long i = only ? atol(only) : 1; i <= rep.allocs; i += only ? rep.allocs : rep.stride) {
        snprintf(what, sizeof what, "allocation %ld of %ld", i, rep.allocs);
        fa_fail_nth(i);
        run_failing(name, op, ctx, what, &rep);
    }
    if (rep.stride > 1 && !only)
        for (long k = 0; k < rep.sites; k++) {
            char where[200];
            snprintf(what, sizeof what, "site %s", fa_site_str(sites[k], where, sizeof where));
            fa_fail_site(sites[k]);
            run_failing(name, op, ctx, what, &rep);
        }
    run_clean(name, op, ctx, "final", 1);
    rep.seconds = now_s() - t0;
    printf("fault %-36s %6ld allocations, %3ld call sites, stride %ld: %ld runs, %ld injected, %ld failed cleanly, "
           "%ld tolerated (%.1f s)\n",
           name, rep.allocs, rep.sites, rep.stride, rep.runs, rep.injected, rep.failed, rep.tolerated, rep.seconds);
    fflush(stdout);
    if (out) *out = rep;
}
