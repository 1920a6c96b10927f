/* Property test of the scheduler: hundreds of random configurations (page size, pool, budget, ceiling, context,
 * prefix cache on/off), each driven through a long random interleaving of submit / plan / run+commit / failed
 * commit / cancel / finish / forced preemption / drain / clock jumps (a third of them with up to 2-3 planned steps
 * outstanding, committed oldest first), with prompts drawn from a few shared
 * prefixes so the cache and the pool are under pressure.
 *
 * After every operation tsr_sched_check must pass; the fake executor checks that each written page has count 1
 * (held by its writer only), that no two sequences write a page in one step and that every position read holds
 * the sequence's token; the driver checks every token against the fake model (so preemption, re-prefill and
 * cache hits never change a stream) and that each request gets exactly one final event. At the end no page leaks:
 * every page is free or cached-unreferenced, and after flushing the cache all are free. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/sched/sched_debug.h"
#include "tests/sched/sched_drive.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCENARIOS 400
#define OPS 1500

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return n ? (uint32_t)((rng_state >> 33) % n) : 0;
}

typedef struct counts {
    uint64_t ops, steps, preempted, forced, hits, submitted, refused, cancels, failed_steps, plans_in_flight;
    uint64_t finish[6];
} counts;

static void check_or_die(driver *d, int rc, int scenario, int op, const char *what)
{
    if (rc >= 0 && !d->error[0]) return;
    fail_msg("scenario %d op %d (%s): %s", scenario, op, what, d->error[0] ? d->error : tsr_last_error());
}

static void run_scenario(int sc, counts *c)
{
    rng_state = 0x5EED0000ull + (uint64_t)sc * 7919;
    static const int sizes[] = {1, 2, 3, 4, 8, 16};
    tsr_sched_opts o;
    memset(&o, 0, sizeof o);
    o.page_size = sizes[rnd(6)];
    o.n_pages = 4 + (int)rnd(60);
    o.max_step_tokens = 1 + (int)rnd(48);
    o.max_running = 1 + (int)rnd(10);
    o.max_prefill_decoding = rnd(3) == 0 ? 1 + (int)rnd(8) : 0; /* short prompt chunks beside decode tokens */
    o.prefix_cache = rnd(3) == 0 ? -1 : 1;
    o.max_context = rnd(4) == 0 ? 20 + (int)rnd(60) : 100000;
    int vocab = 6 + (int)rnd(40);
    o.max_plans = rnd(3) == 0 ? 2 + (int)rnd(2) : 1; /* several steps in flight, as over layer stages */
    driver d;
    if (drv_init(&d, &o, vocab) != 0) fail_msg("init: %s", d.error);
    int32_t base[3][64];
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 64; i++) base[b][i] = (int32_t)rnd((uint32_t)vocab);
    for (int op = 0; op < OPS; op++) {
        uint32_t r = rnd(100);
        const char *what = "?";
        int rc = 0;
        c->ops++;
        if (r < 20) {
            what = "submit";
            int32_t p[48];
            int b = (int)rnd(3), n_base = 1 + (int)rnd(40), n_suffix = (int)rnd(8);
            memcpy(p, base[b], (size_t)n_base * sizeof *p);
            for (int i = 0; i < n_suffix; i++) p[n_base + i] = (int32_t)rnd((uint32_t)vocab);
            int n = n_base + n_suffix;
            tsr_seq_params q = drv_params(rnd(1000), 1 + (int)rnd(30));
            int32_t stop[2] = {0, 1};
            if (rnd(2)) {
                q.stop_ids = stop;
                q.n_stop_ids = 1 + (int)rnd(2);
                q.min_tokens = (int)rnd(5);
            }
            q.ignore_eos = rnd(20) == 0;
            if (rnd(10) == 0) q.deadline = d.now + rnd(50);
            if (rnd(10) == 0) q.sampling.presence_penalty = 0.5f;
            tsr_status st;
            uint64_t id = drv_submit(&d, p, n, &q, &st);
            c->submitted++;
            if (!id) {
                int64_t total = (int64_t)n + q.max_tokens;
                int64_t pages = (total - 1 + o.page_size - 1) / o.page_size;
                if (st != TSR_ERR_ARG || (total <= o.max_context && pages <= o.n_pages))
                    fail_msg("scenario %d op %d: submit refused (%s): %s", sc, op, tsr_status_str(st),
                             tsr_last_error());
                c->refused++;
            }
        } else if (r < 55) {
            what = "step";
            while (rc >= 0 && drv_outstanding(&d) > 0)
                rc = drv_run_commit(&d, 0);
            if (rc >= 0) rc = drv_step(&d);
            c->steps++;
        } else if (r < 65) {
            what = "plan or commit";
            if (drv_outstanding(&d) < o.max_plans && (drv_outstanding(&d) == 0 || rnd(2))) {
                rc = drv_plan(&d);
                c->plans_in_flight += drv_outstanding(&d) > 1;
            } else {
                rc = drv_run_commit(&d, 0);
            }
        } else if (r < 68) {
            what = "failed step";
            if (drv_outstanding(&d) > 0) {
                rc = drv_run_commit(&d, 1);
                c->failed_steps++;
            }
        } else if (r < 78) {
            what = "cancel";
            tsr_sched_cancel(d.s, 1 + rnd((uint32_t)d.n_req + 2));
            c->cancels++;
            rc = drv_check(&d);
        } else if (r < 82) {
            what = "finish";
            tsr_sched_finish(d.s, 1 + rnd((uint32_t)d.n_req + 2), rnd(2) ? TSR_FINISH_STOP : TSR_FINISH_LENGTH);
            rc = drv_check(&d);
        } else if (r < 88) {
            what = "preempt";
            /* may refuse: not running, or in flight */
            if (tsr_sched_preempt(d.s, 1 + rnd((uint32_t)d.n_req + 2)) == TSR_OK) c->forced++;
            rc = drv_check(&d);
        } else if (r < 95) {
            what = "drain";
            rc = drv_drain(&d);
        } else {
            what = "clock";
            d.now += rnd(5);
        }
        check_or_die(&d, rc, sc, op, what);
    }
    while (drv_outstanding(&d) > 0)
        check_or_die(&d, drv_run_commit(&d, 0), sc, OPS, "last commits");
    check_or_die(&d, drv_drain(&d), sc, OPS, "drain");
    check_or_die(&d, drv_run_all(&d, 100000), sc, OPS, "run to the end");
    check_or_die(&d, drv_all_final(&d), sc, OPS, "one final event each");
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    if (st.pages_free + st.pages_cached != st.pages_total || st.running || st.waiting)
        fail_msg("scenario %d: %d free + %d cached of %d pages at the end (%d running, %d waiting)", sc, st.pages_free,
                 st.pages_cached, st.pages_total, st.running, st.waiting);
    tsr_sched_flush_cache(d.s);
    tsr_sched_get_stats(d.s, &st);
    if (st.pages_free != st.pages_total) fail_msg("scenario %d: %d of %d pages free after flush", sc, st.pages_free,
                                                  st.pages_total);
    if (tsr_sched_check(d.s) != TSR_OK) fail_msg("scenario %d: %s", sc, tsr_last_error());
    c->preempted += (uint64_t)st.preempted_total;
    for (int i = 0; i < d.n_req; i++) c->finish[d.req[i].finish]++;
    c->hits += st.prefix_hits;
    drv_free(&d);
}

static void test_random_interleavings(void **state)
{
    (void)state;
    counts c;
    memset(&c, 0, sizeof c);
    /* a sanitizer build (TSR_SANITIZED, set by tests/CMakeLists.txt) runs the first quarter of the scenarios */
    const int scenarios = getenv("TSR_SANITIZED") ? SCENARIOS / 4 : SCENARIOS;
    for (int sc = 0; sc < scenarios; sc++) run_scenario(sc, &c);
    printf("random scheduler test: %d scenarios, %llu operations, %llu steps, %llu submits (%llu refused), "
           "%llu preemptions by page pressure + %llu forced, %llu prefix hits, %llu cancel calls, %llu failed "
           "steps, %llu plans made with another in flight\n", scenarios, (unsigned long long)c.ops,
           (unsigned long long)c.steps, (unsigned long long)c.submitted, (unsigned long long)c.refused,
           (unsigned long long)(c.preempted - c.forced), (unsigned long long)c.forced, (unsigned long long)c.hits,
           (unsigned long long)c.cancels, (unsigned long long)c.failed_steps, (unsigned long long)c.plans_in_flight);
    printf("final events: stop %llu, length %llu, cancelled %llu, deadline %llu, error %llu\n",
           (unsigned long long)c.finish[TSR_FINISH_STOP], (unsigned long long)c.finish[TSR_FINISH_LENGTH],
           (unsigned long long)c.finish[TSR_FINISH_CANCELLED], (unsigned long long)c.finish[TSR_FINISH_DEADLINE],
           (unsigned long long)c.finish[TSR_FINISH_ERROR]);
    /* the workload must actually exercise the hard paths (100 of each over all the scenarios) */
    const uint64_t least = 100u * (uint64_t)scenarios / SCENARIOS;
    assert_true(c.preempted - c.forced > least);
    assert_true(c.finish[TSR_FINISH_STOP] > least && c.finish[TSR_FINISH_LENGTH] > least);
    assert_true(c.hits > least && c.plans_in_flight > least);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_random_interleavings)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
