/* The scheduler against a fake executor (tests/sched/sched_fake.h), one behaviour per test: chunked prefill
 * interleaved with decode, the token budget, the admission ceiling, preemption and resume giving exactly the
 * unpressured token streams, cancellation at every stage, deadlines, stop ids / min_tokens / max_tokens /
 * max_context, submit refusals, prefix-cache hits (a shared 600-token system prompt), eviction, and misuse of
 * plan/commit. The driver checks every event against the fake model and runs tsr_sched_check after every call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/sched/sched_debug.h"
#include "tests/sched/sched_drive.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DRV_OK(d, expr)                                                                                            \
    do {                                                                                                           \
        if ((expr) < 0) fail_msg("%s: %s", #expr, (d)->error);                                                     \
    } while (0)

static tsr_sched_opts mkopts(int page_size, int n_pages, int budget, int max_running)
{
    tsr_sched_opts o;
    memset(&o, 0, sizeof o);
    o.page_size = page_size;
    o.n_pages = n_pages;
    o.max_step_tokens = budget;
    o.max_running = max_running;
    o.max_context = 100000;
    return o;
}

static void prompt_of(int32_t *t, int n, uint32_t seed, int vocab)
{
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((r >> 33) % (uint64_t)vocab);
    }
}

static void setup(driver *d, const tsr_sched_opts *o, int vocab)
{
    if (drv_init(d, o, vocab) != 0) fail_msg("drv_init: %s", d->error);
}

static void finish_clean(driver *d)
{
    if (drv_all_final(d)) fail_msg("%s", d->error);
    tsr_sched_stats st;
    tsr_sched_get_stats(d->s, &st);
    assert_int_equal(st.pages_free + st.pages_cached, st.pages_total);
    tsr_sched_flush_cache(d->s);
    tsr_sched_get_stats(d->s, &st);
    assert_int_equal(st.pages_free, st.pages_total);
    assert_int_equal(tsr_sched_check(d->s), TSR_OK);
    drv_free(d);
}

/* A long prompt is prefilled over several steps, each after the decode token of the running sequence. */
static void test_chunked_prefill(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(16, 64, 32, 8);
    setup(&d, &o, 1000);
    int32_t a[10], b[100];
    prompt_of(a, 10, 1, 1000);
    prompt_of(b, 100, 2, 1000);
    tsr_seq_params pa = drv_params(11, 30), pb = drv_params(12, 5);
    uint64_t ida = drv_submit(&d, a, 10, &pa, NULL);
    assert_int_equal(drv_plan(&d), 1);
    assert_int_equal(d.step.seqs[0].n_tokens, 10);
    assert_int_equal(d.step.seqs[0].sample, 1);
    assert_int_equal(d.step.seqs[0].sample_index, 0);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    DRV_OK(&d, drv_step(&d));
    uint64_t idb = drv_submit(&d, b, 100, &pb, NULL);
    int chunks[] = {31, 31, 31, 7};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(drv_plan(&d), 2);
        const tsr_step_seq *q0 = &d.step.seqs[0], *q1 = &d.step.seqs[1];
        assert_true(q0->id == ida && q0->n_tokens == 1 && q0->sample == 1);
        assert_int_equal(q0->sample_index, 2 + k);
        assert_true(q1->id == idb && q1->pos0 == 31 * k && q1->n_tokens == chunks[k]);
        assert_int_equal(q1->sample, k == 3);
        assert_int_equal(q1->n_pages, (q1->pos0 + q1->n_tokens + 15) / 16);
        assert_int_equal(q1->sample_index, 0);
        DRV_OK(&d, drv_run_commit(&d, 0));
        assert_int_equal(drv_drain(&d), k == 3 ? 2 : 1);
    }
    assert_int_equal(drv_plan(&d), 2); /* both decoding now */
    assert_true(d.step.seqs[1].n_tokens == 1 && d.step.seqs[1].pos0 == 100 && d.step.seqs[1].sample_index == 1);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    DRV_OK(&d, drv_run_all(&d, 100));
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.prefill_tokens, 110);
    assert_int_equal(st.decode_tokens, 29 + 4);
    assert_int_equal(d.req[0].finish, TSR_FINISH_LENGTH);
    assert_int_equal(d.req[1].n_hist, 105);
    finish_clean(&d);
}

/* With max_prefill_decoding, a step that carries a decode token carries at most that many prompt tokens besides;
 * once no sequence decodes, the prompt takes the whole budget again. */
static void test_prefill_while_decoding(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(16, 64, 32, 8);
    o.max_prefill_decoding = 8;
    setup(&d, &o, 1000);
    int32_t a[10], b[100];
    prompt_of(a, 10, 3, 1000);
    prompt_of(b, 100, 4, 1000);
    tsr_seq_params pa = drv_params(21, 4), pb = drv_params(22, 3);
    uint64_t ida = drv_submit(&d, a, 10, &pa, NULL);
    assert_int_equal(drv_plan(&d), 1);
    assert_int_equal(d.step.seqs[0].n_tokens, 10); /* no decode token yet: the whole prompt */
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    uint64_t idb = drv_submit(&d, b, 100, &pb, NULL);
    for (int k = 0; k < 3; k++) { /* a decodes its tokens 2-4 */
        assert_int_equal(drv_plan(&d), 2);
        const tsr_step_seq *q0 = &d.step.seqs[0], *q1 = &d.step.seqs[1];
        assert_true(q0->id == ida && q0->n_tokens == 1);
        assert_true(q1->id == idb && q1->pos0 == 8 * k && q1->n_tokens == 8);
        DRV_OK(&d, drv_run_commit(&d, 0));
        DRV_OK(&d, drv_drain(&d));
    }
    assert_int_equal(d.req[0].finish, TSR_FINISH_LENGTH);
    int chunks[] = {32, 32, 12};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(drv_plan(&d), 1);
        assert_true(d.step.seqs[0].id == idb && d.step.seqs[0].pos0 == 24 + 32 * k);
        assert_int_equal(d.step.seqs[0].n_tokens, chunks[k]);
        DRV_OK(&d, drv_run_commit(&d, 0));
        DRV_OK(&d, drv_drain(&d));
    }
    DRV_OK(&d, drv_run_all(&d, 100));
    assert_int_equal(d.req[1].finish, TSR_FINISH_LENGTH);
    finish_clean(&d);
}

/* Tight budget, many requests: no plan exceeds the budget (the driver checks), running decoders come first, and
 * every request completes. */
static void test_budget(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 256, 8, 64);
    setup(&d, &o, 500);
    for (int i = 0; i < 12; i++) {
        int32_t p[23];
        prompt_of(p, 5 + i, (uint32_t)i, 500);
        tsr_seq_params q = drv_params((uint64_t)i, 6 + i % 4);
        assert_true(drv_submit(&d, p, 5 + i, &q, NULL) > 0);
    }
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    int steps = 0;
    while (!tsr_sched_idle(d.s)) {
        int n = drv_plan(&d);
        if (n < 0) fail_msg("%s", d.error);
        int total = 0, seen_chunk = 0;
        for (int i = 0; i < n; i++) {
            const tsr_step_seq *q = &d.step.seqs[i];
            total += q->n_tokens;
            int decode = q->n_tokens == 1 && q->sample_index > 0 && q->sample;
            if (!decode) seen_chunk = 1;
            else assert_false(seen_chunk); /* decode tokens first */
        }
        assert_true(total <= 8);
        assert_true(n <= 8); /* max_running is clamped to the budget */
        if (n) DRV_OK(&d, drv_run_commit(&d, 0));
        DRV_OK(&d, drv_drain(&d));
        assert_true(++steps < 1000);
    }
    finish_clean(&d);
}

static void test_admission_ceiling(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(8, 128, 64, 3);
    setup(&d, &o, 500);
    for (int i = 0; i < 7; i++) {
        int32_t p[6];
        prompt_of(p, 6, (uint32_t)i + 50, 500);
        tsr_seq_params q = drv_params((uint64_t)i, 5);
        drv_submit(&d, p, 6, &q, NULL);
    }
    assert_int_equal(drv_step(&d), 3);
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.waiting, 4);
    while (!tsr_sched_idle(d.s)) {
        DRV_OK(&d, drv_step(&d));
        tsr_sched_get_stats(d.s, &st);
        assert_true(st.running <= 3);
    }
    finish_clean(&d);
}

/* Runs one workload and returns the driver (caller frees) after checking it completed. */
static void run_workload(driver *d, int n_pages, int prefix_cache, int *preempted)
{
    tsr_sched_opts o = mkopts(4, n_pages, 16, 8);
    o.prefix_cache = prefix_cache;
    setup(d, &o, 300);
    for (int i = 0; i < 6; i++) {
        int32_t p[16];
        int n = 5 + (i * 7) % 11;
        prompt_of(p, n, (uint32_t)(i % 3), 300); /* some share a first page */
        tsr_seq_params q = drv_params(100 + (uint64_t)i, 20);
        if (i % 2) q.sampling.temperature = 0.7f;
        tsr_status stt;
        if (!drv_submit(d, p, n, &q, &stt)) fail_msg("submit: %s", tsr_last_error());
    }
    DRV_OK(d, drv_run_all(d, 2000));
    tsr_sched_stats st;
    tsr_sched_get_stats(d->s, &st);
    *preempted = st.preempted_total;
}

/* Under page pressure sequences are preempted and re-prefilled; the streams equal those of a roomy pool. */
static void test_preemption_same_streams(void **state)
{
    (void)state;
    for (int cache = -1; cache <= 1; cache += 2) {
        driver ref, tight;
        int pre_ref, pre_tight;
        run_workload(&ref, 1024, cache, &pre_ref);
        run_workload(&tight, 12, cache, &pre_tight);
        assert_int_equal(pre_ref, 0);
        assert_true(pre_tight > 0);
        for (int i = 0; i < 6; i++) {
            assert_int_equal(ref.req[i].n_hist, tight.req[i].n_hist);
            assert_memory_equal(ref.req[i].hist, tight.req[i].hist, (size_t)ref.req[i].n_hist * sizeof(int32_t));
            assert_int_equal(ref.req[i].finish, tight.req[i].finish);
        }
        finish_clean(&ref);
        finish_clean(&tight);
    }
}

/* A forced preemption mid-prefill and mid-decode resumes without losing or repeating a token. */
static void test_forced_preemption(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 8, 4);
    setup(&d, &o, 300);
    int32_t p[30];
    prompt_of(p, 30, 9, 300);
    tsr_seq_params q = drv_params(5, 12);
    uint64_t id = drv_submit(&d, p, 30, &q, NULL);
    DRV_OK(&d, drv_step(&d)); /* 8 of 30 prefilled */
    assert_int_equal(tsr_sched_preempt(d.s, id), TSR_OK);
    DRV_OK(&d, drv_check(&d));
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(st.running, 0);
    for (int i = 0; i < 6; i++) DRV_OK(&d, drv_step(&d)); /* prefill done (4 steps), 2 more tokens */
    int n_total = 0;
    tsr_sched_tokens(d.s, id, NULL, &n_total);
    assert_true(n_total > 30);
    assert_int_equal(tsr_sched_preempt(d.s, id), TSR_OK);
    assert_int_equal(drv_plan(&d), 1);
    /* resumes from its cached full pages (prompt + generated) and recomputes the rest, sampling index kept */
    assert_int_equal(d.step.seqs[0].pos0, ((n_total - 1) / 4) * 4);
    assert_int_equal(d.step.seqs[0].sample_index, n_total - 30);
    assert_int_equal(tsr_sched_preempt(d.s, id), TSR_ERR_ARG); /* in flight */
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    DRV_OK(&d, drv_run_all(&d, 100));
    assert_int_equal(d.req[0].n_hist, 42);
    assert_int_equal(d.req[0].n_cached, 0); /* usage counts the first admission */
    finish_clean(&d);
}

static int last_event_is(driver *d, uint64_t id, tsr_finish_reason why, int generated)
{
    const drv_req *r = &d->req[id - 1];
    return r->finals == 1 && r->finish == why && r->n_hist - r->n_prompt == generated;
}

static void test_cancel_every_stage(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 8, 2);
    setup(&d, &o, 300);
    int32_t p[40];
    prompt_of(p, 40, 3, 300);
    tsr_seq_params q = drv_params(1, 50);
    uint64_t a = drv_submit(&d, p, 6, &q, NULL);   /* decodes */
    uint64_t b = drv_submit(&d, p, 40, &q, NULL);  /* long prefill */
    uint64_t c = drv_submit(&d, p, 5, &q, NULL);   /* waits (ceiling 2) */
    DRV_OK(&d, drv_step(&d));
    tsr_sched_cancel(d.s, c); /* queued */
    DRV_OK(&d, drv_check(&d));
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, c, TSR_FINISH_CANCELLED, 0));
    DRV_OK(&d, drv_step(&d));
    tsr_sched_cancel(d.s, b); /* mid-prefill, between steps */
    DRV_OK(&d, drv_check(&d));
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, b, TSR_FINISH_CANCELLED, 0));
    uint64_t e = drv_submit(&d, p, 30, &q, NULL);
    assert_int_equal(drv_plan(&d), 2);
    tsr_sched_cancel(d.s, e); /* in flight: ends at commit, its step's work dropped */
    tsr_sched_cancel(d.s, e); /* twice: still one final event */
    DRV_OK(&d, drv_check(&d));
    const tsr_sched_event *ev;
    assert_int_equal(tsr_sched_drain_events(d.s, &ev), 0);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, e, TSR_FINISH_CANCELLED, 0));
    for (int i = 0; i < 3; i++) DRV_OK(&d, drv_step(&d));
    int gen = d.req[a - 1].n_hist - 6;
    assert_true(gen >= 4);
    tsr_sched_cancel(d.s, a); /* decoding */
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, a, TSR_FINISH_CANCELLED, gen));
    tsr_sched_cancel(d.s, a);      /* already finished: ignored */
    tsr_sched_cancel(d.s, 999999); /* unknown: ignored */
    assert_int_equal(tsr_sched_drain_events(d.s, &ev), 0);

    /* tsr_sched_finish between steps and in flight */
    uint64_t f = drv_submit(&d, p, 7, &q, NULL), g = drv_submit(&d, p, 8, &q, NULL);
    for (int i = 0; i < 3; i++) DRV_OK(&d, drv_step(&d));
    tsr_sched_finish(d.s, f, TSR_FINISH_STOP); /* the caller matched a stop string */
    assert_int_equal(drv_plan(&d), 1);
    tsr_sched_finish(d.s, g, TSR_FINISH_LENGTH);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, f, TSR_FINISH_STOP, 3));
    assert_true(last_event_is(&d, g, TSR_FINISH_LENGTH, 3));
    assert_true(tsr_sched_idle(d.s));
    finish_clean(&d);
}

static void test_deadlines(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 16, 1);
    setup(&d, &o, 300);
    int32_t p[5];
    prompt_of(p, 5, 4, 300);
    tsr_seq_params qa = drv_params(1, 100), qb = drv_params(2, 3), qc = drv_params(3, 4);
    qa.deadline = 5.0;
    qb.deadline = 2.0;
    uint64_t a = drv_submit(&d, p, 5, &qa, NULL), b = drv_submit(&d, p, 5, &qb, NULL);
    uint64_t c = drv_submit(&d, p, 5, &qc, NULL); /* no deadline */
    for (int t = 0; t < 5; t++) {
        d.now = t;
        DRV_OK(&d, drv_step(&d));
        if (t == 2) assert_true(last_event_is(&d, b, TSR_FINISH_DEADLINE, 0)); /* expired while queued */
    }
    assert_true(last_event_is(&d, a, TSR_FINISH_NONE, 5) || d.req[a - 1].finals == 0);
    d.now = 5.0;
    DRV_OK(&d, drv_step(&d));
    assert_true(last_event_is(&d, a, TSR_FINISH_DEADLINE, 5));
    d.now = 1000;
    DRV_OK(&d, drv_run_all(&d, 100));
    assert_true(last_event_is(&d, c, TSR_FINISH_LENGTH, 4));
    finish_clean(&d);
}

static void test_stop_rules(void **state)
{
    (void)state;
    const int vocab = 8;
    int32_t p[6];
    prompt_of(p, 6, 5, vocab);
    /* the first token the model would draw ends the request when it is a stop id */
    {
        driver d;
        tsr_sched_opts o = mkopts(4, 64, 32, 4);
        setup(&d, &o, vocab);
        tsr_seq_params q = drv_params(77, 10);
        int32_t t0 = fake_expect(p, 6, 6, &q, vocab);
        int32_t stop[1] = {t0};
        q.stop_ids = stop;
        q.n_stop_ids = 1;
        uint64_t a = drv_submit(&d, p, 6, &q, NULL);
        q.min_tokens = 3; /* with min_tokens the stop id cannot be drawn for the first 3 tokens */
        uint64_t b = drv_submit(&d, p, 6, &q, NULL);
        q.min_tokens = 0;
        q.ignore_eos = 1;
        uint64_t c = drv_submit(&d, p, 6, &q, NULL);
        q.ignore_eos = 0;
        q.n_stop_ids = 0;
        q.max_tokens = 1;
        uint64_t e = drv_submit(&d, p, 6, &q, NULL);
        DRV_OK(&d, drv_run_all(&d, 100));
        assert_true(last_event_is(&d, a, TSR_FINISH_STOP, 1));
        assert_int_equal(d.req[a - 1].hist[6], t0);
        for (int k = 0; k < 3 && k < d.req[b - 1].n_hist - 6; k++) assert_int_not_equal(d.req[b - 1].hist[6 + k], t0);
        assert_true(d.req[b - 1].n_hist - 6 >= 4 || d.req[b - 1].finish == TSR_FINISH_LENGTH);
        assert_true(last_event_is(&d, c, TSR_FINISH_LENGTH, 10));
        assert_int_equal(d.req[c - 1].hist[6], t0);
        assert_true(last_event_is(&d, e, TSR_FINISH_LENGTH, 1));
        finish_clean(&d);
    }
    /* many random combinations; the driver checks each stream and final reason */
    driver d;
    tsr_sched_opts o = mkopts(2, 512, 24, 8);
    setup(&d, &o, vocab);
    int32_t stop[2] = {0, 1};
    for (int i = 0; i < 300; i++) {
        tsr_seq_params q = drv_params((uint64_t)i, 1 + i % 20);
        q.stop_ids = stop;
        q.n_stop_ids = 1 + i % 2;
        q.min_tokens = (i / 3) % 6;
        q.ignore_eos = i % 7 == 0;
        prompt_of(p, 6, (uint32_t)i, vocab);
        drv_submit(&d, p, 1 + i % 6, &q, NULL);
        if (i % 16 == 15) DRV_OK(&d, drv_run_all(&d, 1000));
    }
    DRV_OK(&d, drv_run_all(&d, 1000));
    int stops = 0;
    for (int i = 0; i < 300; i++) {
        const drv_req *r = &d.req[i];
        int gen = r->n_hist - r->n_prompt;
        if (r->p.ignore_eos) assert_int_equal(gen, r->p.max_tokens);
        if (r->finish == TSR_FINISH_STOP) {
            stops++;
            assert_true(gen > r->p.min_tokens);
        } else {
            assert_int_equal(r->finish, TSR_FINISH_LENGTH);
        }
    }
    assert_true(stops > 50);
    finish_clean(&d);
}

static void test_submit_refusals(void **state)
{
    (void)state;
    tsr_sched_opts o = mkopts(4, 4, 16, 4);
    o.max_context = 40;
    o.max_waiting = 2;
    tsr_sched *s;
    assert_int_equal(tsr_sched_new(&o, &s), TSR_OK);
    int32_t p[40] = {0};
    tsr_seq_params q = drv_params(1, 10);
    uint64_t id;
    assert_int_equal(tsr_sched_submit(s, p, 0, &q, 0, &id), TSR_ERR_ARG);
    assert_int_equal(tsr_sched_submit(s, NULL, 3, &q, 0, &id), TSR_ERR_ARG);
    q.max_tokens = 35;
    assert_int_equal(tsr_sched_submit(s, p, 10, &q, 0, &id), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "10 tokens + max_tokens 35"));
    assert_non_null(strstr(tsr_last_error(), "context of 40"));
    q.max_tokens = 10;
    assert_int_equal(tsr_sched_submit(s, p, 10, &q, 0, &id), TSR_ERR_ARG); /* 19 KV slots > 4 pages x 4 */
    assert_non_null(strstr(tsr_last_error(), "whole pool has 4"));
    q.max_tokens = 7;
    assert_int_equal(tsr_sched_submit(s, p, 10, &q, 0, &id), TSR_OK); /* 16 KV slots: fits exactly */
    q.max_tokens = 0;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    q.max_tokens = 3;
    q.n_logprobs = 21;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    q.n_logprobs = -1;
    p[1] = -5;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    p[1] = 0;
    int32_t bad_stop[2] = {2, -1};
    q.stop_ids = bad_stop;
    q.n_stop_ids = 2;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG); /* would poison its step's sampling */
    q.n_stop_ids = 0;
    tsr_logit_bias bad_bias[1] = {{3, INFINITY}};
    q.bias = bad_bias;
    q.n_bias = 1;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    q.n_bias = 0;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_OK);
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_BUSY);
    assert_int_equal(tsr_sched_check(s), TSR_OK);
    tsr_sched_free(s);
    o.vocab = 100; /* with the vocabulary known, ids beyond it are refused too */
    o.max_waiting = 0;
    assert_int_equal(tsr_sched_new(&o, &s), TSR_OK);
    p[2] = 100;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    p[2] = 99;
    int32_t big_stop[1] = {100};
    q.stop_ids = big_stop;
    q.n_stop_ids = 1;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_ERR_ARG);
    big_stop[0] = 99;
    assert_int_equal(tsr_sched_submit(s, p, 3, &q, 0, &id), TSR_OK);
    tsr_sched_free(s);
    o.page_size = 0;
    assert_int_equal(tsr_sched_new(&o, &s), TSR_ERR_ARG);
}

/* A request that fills the whole pool alone runs to the end (its neighbours wait or are preempted). */
static void test_whole_pool_request(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 8, 8, 4);
    setup(&d, &o, 300);
    int32_t p[20];
    prompt_of(p, 20, 8, 300);
    tsr_seq_params q = drv_params(3, 13); /* 20 + 13 - 1 = 32 slots = the whole pool */
    tsr_seq_params small = drv_params(4, 6);
    drv_submit(&d, p, 3, &small, NULL);
    drv_submit(&d, p, 20, &q, NULL);
    drv_submit(&d, p + 5, 4, &small, NULL);
    DRV_OK(&d, drv_run_all(&d, 500));
    assert_true(last_event_is(&d, 2, TSR_FINISH_LENGTH, 13));
    finish_clean(&d);
}

/* A shared 600-token system prompt: later requests reuse its 37 full pages and prefill only their own part. */
static void run_system_prompt(driver *d, int prefix_cache)
{
    const int ps = 16, sys = 600, suffix = 20, vocab = 1000;
    tsr_sched_opts o = mkopts(ps, 512, 256, 8);
    o.prefix_cache = prefix_cache;
    setup(d, &o, vocab);
    int32_t p[620];
    prompt_of(p, sys, 600, vocab);
    for (int i = 0; i < 4; i++) {
        prompt_of(p + sys, suffix, 700 + (uint32_t)i, vocab);
        tsr_seq_params q = drv_params((uint64_t)i, 8);
        drv_submit(d, p, sys + suffix, &q, NULL);
        if (i == 0) DRV_OK(d, drv_run_all(d, 100)); /* the first one warms the cache */
    }
    DRV_OK(d, drv_run_all(d, 100));
}

static void test_prefix_hits(void **state)
{
    (void)state;
    driver on, off;
    run_system_prompt(&on, 1);
    run_system_prompt(&off, -1);
    tsr_sched_stats a, b;
    tsr_sched_get_stats(on.s, &a);
    tsr_sched_get_stats(off.s, &b);
    assert_int_equal(a.prefix_lookups, 4);
    assert_int_equal(a.prefix_hits, 3);
    assert_int_equal(a.prefix_hit_tokens, 3 * 592);
    assert_int_equal(a.prefill_tokens, 620 + 3 * (620 - 592));
    assert_int_equal(b.prefill_tokens, 4 * 620);
    assert_int_equal(b.prefix_hits, 0);
    assert_int_equal(on.req[0].n_cached, 0);
    for (int i = 1; i < 4; i++) assert_int_equal(on.req[i].n_cached, 592);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(on.req[i].n_hist, off.req[i].n_hist);
        assert_memory_equal(on.req[i].hist, off.req[i].hist, (size_t)on.req[i].n_hist * sizeof(int32_t));
    }
    assert_true(a.pages_cached > 37); /* the system prompt and each request's own full pages stay cached */
    finish_clean(&on);
    finish_clean(&off);
}

/* Never the page of the last prompt token; generated pages are cached too; a running sequence's pages are
 * shared with a new one while it runs. */
static void test_prefix_edges(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(8, 128, 64, 8);
    setup(&d, &o, 400);
    int32_t p[100];
    prompt_of(p, 16, 10, 400);
    tsr_seq_params q = drv_params(1, 40);
    drv_submit(&d, p, 16, &q, NULL); /* exactly two pages */
    DRV_OK(&d, drv_run_all(&d, 100));
    drv_submit(&d, p, 16, &q, NULL); /* same prompt: only the first page can be reused */
    DRV_OK(&d, drv_run_all(&d, 100));
    assert_int_equal(d.req[1].n_cached, 8);
    assert_memory_equal(d.req[0].hist, d.req[1].hist, 56 * sizeof(int32_t));
    /* prompt = an earlier request's prompt and generated tokens, plus more: generated pages are hits */
    memcpy(p, d.req[0].hist, 56 * sizeof(int32_t));
    prompt_of(p + 56, 3, 11, 400);
    tsr_seq_params r = drv_params(2, 5);
    drv_submit(&d, p, 59, &r, NULL);
    DRV_OK(&d, drv_run_all(&d, 100));
    assert_int_equal(d.req[2].n_cached, 48); /* 55 tokens were computed: 6 full pages */
    /* sharing with a sequence that is still running */
    prompt_of(p, 40, 12, 400);
    tsr_seq_params longq = drv_params(3, 60);
    drv_submit(&d, p, 40, &longq, NULL);
    for (int i = 0; i < 3; i++) DRV_OK(&d, drv_step(&d));
    drv_submit(&d, p, 40, &longq, NULL);
    DRV_OK(&d, drv_step(&d));
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(d.req[4].n_cached, 32);
    DRV_OK(&d, drv_run_all(&d, 200));
    assert_memory_equal(d.req[3].hist, d.req[4].hist, 100 * sizeof(int32_t));
    finish_clean(&d);
}

/* Cached pages are evicted (least recently used first) when the pool needs them, never while in use. */
static void test_eviction(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 12, 32, 4);
    setup(&d, &o, 300);
    int32_t p[40];
    prompt_of(p, 20, 13, 300);
    tsr_seq_params q = drv_params(1, 4);
    drv_submit(&d, p, 20, &q, NULL);
    DRV_OK(&d, drv_run_all(&d, 50));
    tsr_sched_stats st;
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.pages_cached, 5); /* 23 computed tokens: 5 full pages */
    prompt_of(p, 40, 14, 300);
    tsr_seq_params big = drv_params(2, 6);
    drv_submit(&d, p, 40, &big, NULL); /* 10 pages: 7 free + 3 evicted */
    DRV_OK(&d, drv_step(&d));
    tsr_sched_get_stats(d.s, &st);
    assert_int_equal(st.prefix_evictions, 3);
    assert_int_equal(st.pages_cached, 2);
    DRV_OK(&d, drv_run_all(&d, 50));
    finish_clean(&d);
}

static void test_plan_commit_misuse(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 16, 4);
    setup(&d, &o, 300);
    tsr_step empty;
    memset(&empty, 0, sizeof empty);
    assert_int_equal(tsr_sched_commit(d.s, &empty, NULL, 0), TSR_OK); /* nothing planned, nothing to commit */
    int32_t p[8];
    prompt_of(p, 8, 15, 300);
    tsr_seq_params q = drv_params(1, 10);
    uint64_t a = drv_submit(&d, p, 8, &q, NULL), b = drv_submit(&d, p, 5, &q, NULL);
    assert_int_equal(drv_plan(&d), 2);
    tsr_step other;
    memset(&other, 0, sizeof other);
    assert_int_equal(tsr_sched_plan(d.s, 0, &other), TSR_ERR_ARG); /* the planned step is outstanding */
    tsr_step_free(&other);
    assert_int_equal(tsr_sched_commit(d.s, &empty, NULL, 0), TSR_ERR_ARG); /* not the planned step */
    d.step.seqs[1].id = 77;
    assert_int_equal(tsr_sched_commit(d.s, &d.step, NULL, 0), TSR_ERR_ARG);
    d.step.seqs[1].id = b;
    DRV_OK(&d, drv_check(&d));
    DRV_OK(&d, drv_run_commit(&d, 0)); /* the right one still commits */
    DRV_OK(&d, drv_drain(&d));
    assert_int_equal(drv_plan(&d), 2);
    DRV_OK(&d, drv_run_commit(&d, 1)); /* the executor failed the step */
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, a, TSR_FINISH_ERROR, 1));
    assert_true(last_event_is(&d, b, TSR_FINISH_ERROR, 1));
    uint64_t c = drv_submit(&d, p, 8, &q, NULL);
    assert_int_equal(drv_plan(&d), 1);
    tsr_step_result bad;
    memset(&bad, 0, sizeof bad);
    bad.token = -1; /* a sampling sequence without a token */
    assert_int_equal(tsr_sched_commit(d.s, &d.step, &bad, 0), TSR_OK);
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, c, TSR_FINISH_ERROR, 0));
    assert_int_equal(tsr_sched_commit(d.s, &d.step, &bad, 0), TSR_ERR_ARG); /* committed already */
    finish_clean(&d);
}

/* Two plans in flight (max_plans 2, as over two layer stages): each takes half of the decoding sequences and none
 * of the other's, a third plan waits for a commit, commits go oldest first, and the streams are the fake model's. */
static void test_plans_in_flight(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 32, 8);
    o.max_plans = 2;
    setup(&d, &o, 300);
    int32_t p[6];
    uint64_t id[4];
    for (int k = 0; k < 4; k++) {
        prompt_of(p, 6, 20 + k, 300);
        tsr_seq_params q = drv_params(30 + (uint64_t)k, 12);
        id[k] = drv_submit(&d, p, 6, &q, NULL);
    }
    assert_int_equal(drv_plan(&d), 4); /* the prefills: nothing is decoding yet */
    assert_int_equal(drv_plan(&d), 0); /* all four are in flight */
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_int_equal(drv_plan(&d), 2); /* half of the four decoding sequences each */
    assert_true(d.step.seqs[0].id == id[0] && d.step.seqs[1].id == id[1]);
    assert_int_equal(drv_plan(&d), 2);
    assert_true(d.step.seqs[0].id == id[2] && d.step.seqs[1].id == id[3]);
    assert_int_equal(drv_outstanding(&d), 2);
    tsr_step other;
    memset(&other, 0, sizeof other);
    assert_int_equal(tsr_sched_plan(d.s, 0, &other), TSR_ERR_ARG); /* both slots taken */
    tsr_step_free(&other);
    assert_int_equal(tsr_sched_commit(d.s, &d.step, NULL, 0), TSR_ERR_ARG); /* the newer one, not the oldest */
    tsr_sched_cancel(d.s, id[3]); /* in flight: ended at its commit */
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_int_equal(drv_plan(&d), 2); /* the first two again, while the other plan is in flight */
    assert_true(d.step.seqs[0].id == id[0] && d.step.seqs[1].id == id[1]);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_true(last_event_is(&d, id[3], TSR_FINISH_CANCELLED, 1));
    DRV_OK(&d, drv_run_all(&d, 200));
    assert_true(last_event_is(&d, id[0], TSR_FINISH_LENGTH, 12));
    finish_clean(&d);
}

/* Step contents: penalty history only with penalties, biases and logprobs only where sampling. */
static void test_step_fields(void **state)
{
    (void)state;
    driver d;
    tsr_sched_opts o = mkopts(4, 64, 4, 4);
    setup(&d, &o, 300);
    int32_t p[6];
    prompt_of(p, 6, 16, 300);
    tsr_logit_bias bias[2] = {{3, 1.5f}, {4, -2.0f}};
    int32_t stop[1] = {7};
    tsr_seq_params q = drv_params(9, 5);
    q.sampling.repetition_penalty = 1.2f;
    q.bias = bias;
    q.n_bias = 2;
    q.n_logprobs = 3;
    q.stop_ids = stop;
    q.n_stop_ids = 1;
    q.min_tokens = 1;
    drv_submit(&d, p, 6, &q, NULL);
    assert_int_equal(drv_plan(&d), 1); /* 4 of 6 prompt tokens: no sampling */
    const tsr_step_seq *s0 = &d.step.seqs[0];
    assert_true(s0->sample == 0 && s0->n_hist == 0 && s0->n_bias == 0 && s0->n_logprobs == -1 && s0->logits == 0);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_int_equal(drv_plan(&d), 1);
    s0 = &d.step.seqs[0];
    assert_true(s0->sample == 1 && s0->n_logprobs == 3 && s0->seed == 9);
    assert_true(s0->n_hist == 6 && s0->n_hist_prompt == 6);
    assert_memory_equal(d.step.hist + s0->hist0, p, 6 * sizeof(int32_t));
    assert_int_equal(s0->n_bias, 3); /* the request's two, and the stop id masked before min_tokens */
    assert_int_equal(d.step.bias[s0->bias0 + 2].token, 7);
    assert_true(d.step.bias[s0->bias0 + 2].bias < -1e29f);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_drain(&d));
    assert_int_equal(drv_plan(&d), 1);
    s0 = &d.step.seqs[0];
    assert_true(s0->n_hist == 7 && s0->n_hist_prompt == 6 && s0->n_bias == 2 && s0->sample_index == 1);
    DRV_OK(&d, drv_run_commit(&d, 0));
    DRV_OK(&d, drv_run_all(&d, 50));
    finish_clean(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_prefill),     cmocka_unit_test(test_prefill_while_decoding),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_admission_ceiling),   cmocka_unit_test(test_preemption_same_streams),
        cmocka_unit_test(test_forced_preemption),   cmocka_unit_test(test_cancel_every_stage),
        cmocka_unit_test(test_deadlines),           cmocka_unit_test(test_stop_rules),
        cmocka_unit_test(test_submit_refusals),     cmocka_unit_test(test_whole_pool_request),
        cmocka_unit_test(test_prefix_hits),         cmocka_unit_test(test_prefix_edges),
        cmocka_unit_test(test_eviction),            cmocka_unit_test(test_plan_commit_misuse),
        cmocka_unit_test(test_step_fields),         cmocka_unit_test(test_plans_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
