/* The scheduler test driver (see sched_drive.h). */
#include "tests/sched/sched_drive.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(driver *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(driver *d, const char *fmt, ...)
{
    if (d->error[0]) return -1; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->error, sizeof d->error, fmt, ap);
    va_end(ap);
    return -1;
}

tsr_seq_params drv_params(uint64_t seed, int max_tokens)
{
    tsr_seq_params p;
    memset(&p, 0, sizeof p);
    p.sampling = tsr_sampling_default();
    p.seed = seed;
    p.max_tokens = max_tokens;
    p.n_logprobs = -1;
    return p;
}

int drv_init(driver *d, const tsr_sched_opts *o, int vocab)
{
    memset(d, 0, sizeof *d);
    d->opts = *o;
    d->vocab = vocab;
    d->check = 1;
    if (tsr_sched_new(o, &d->s) != TSR_OK) return fail(d, "tsr_sched_new: %s", tsr_last_error());
    if (fake_init(&d->f, d->s, o->n_pages, o->page_size, vocab) != 0) return fail(d, "fake_init");
    return 0;
}

void drv_free(driver *d)
{
    tsr_sched_free(d->s);
    fake_free(&d->f);
    tsr_step_free(&d->step);
    for (int i = 0; i < d->n_older; i++)
        tsr_step_free(&d->older[i]);
    free(d->res);
    for (int i = 0; i < d->n_req; i++) free(d->req[i].hist);
    free(d->req);
    memset(d, 0, sizeof *d);
}

int drv_check(driver *d)
{
    if (!d->check) return 0;
    if (tsr_sched_check(d->s) != TSR_OK) return fail(d, "tsr_sched_check: %s", tsr_last_error());
    return 0;
}

uint64_t drv_submit(driver *d, const int32_t *prompt, int n, const tsr_seq_params *p, tsr_status *st)
{
    uint64_t id = 0;
    tsr_status r = tsr_sched_submit(d->s, prompt, n, p, d->now, &id);
    if (st) *st = r;
    if (r != TSR_OK) return 0;
    if ((int)id != d->n_req + 1) {
        fail(d, "submit gave id %llu, expected %d", (unsigned long long)id, d->n_req + 1);
        return 0;
    }
    if (d->n_req == d->cap_req) {
        d->cap_req = d->cap_req ? d->cap_req * 2 : 64;
        d->req = realloc(d->req, (size_t)d->cap_req * sizeof *d->req);
    }
    drv_req *q = &d->req[d->n_req++];
    memset(q, 0, sizeof *q);
    q->cap = n + p->max_tokens;
    q->hist = malloc((size_t)q->cap * sizeof *q->hist);
    memcpy(q->hist, prompt, (size_t)n * sizeof *prompt);
    q->n_hist = q->n_prompt = n;
    q->p = *p;
    q->p.n_stop_ids = p->n_stop_ids < DRV_MAX_STOP ? p->n_stop_ids : DRV_MAX_STOP;
    if (q->p.n_stop_ids) memcpy(q->stop, p->stop_ids, (size_t)q->p.n_stop_ids * sizeof *q->stop);
    q->p.stop_ids = q->stop;
    q->p.bias = NULL;
    q->p.n_bias = 0;
    drv_check(d);
    return id;
}

static int is_stop(const drv_req *q, int32_t t)
{
    for (int k = 0; k < q->p.n_stop_ids; k++)
        if (q->stop[k] == t) return 1;
    return 0;
}

int drv_drain(driver *d)
{
    const tsr_sched_event *ev;
    int n = tsr_sched_drain_events(d->s, &ev);
    for (int i = 0; i < n; i++) {
        const tsr_sched_event *e = &ev[i];
        if (e->id < 1 || e->id > (uint64_t)d->n_req) return fail(d, "event for unknown id %llu",
                                                               (unsigned long long)e->id);
        drv_req *q = &d->req[e->id - 1];
        unsigned long long id = (unsigned long long)e->id;
        if (q->finals) return fail(d, "event for %llu after its final event", id);
        q->p.stop_ids = q->stop; /* (the request array may have moved since submit) */
        if (e->token >= 0) {
            int32_t want = fake_expect(q->hist, q->n_hist, q->n_prompt, &q->p, d->vocab);
            if (e->token != want)
                return fail(d, "request %llu token %d is %d, expected %d", id, q->n_hist - q->n_prompt, e->token,
                            want);
            if (q->n_hist >= q->cap) return fail(d, "request %llu got more than max_tokens tokens", id);
            q->hist[q->n_hist++] = e->token;
            if (!e->result || e->result->token != e->token)
                return fail(d, "request %llu token event without its result", id);
        }
        if (e->n_prompt != q->n_prompt || e->n_generated != q->n_hist - q->n_prompt)
            return fail(d, "request %llu event says %d prompt, %d generated; seen %d, %d", id, e->n_prompt,
                        e->n_generated, q->n_prompt, q->n_hist - q->n_prompt);
        q->n_cached = e->n_cached;
        if (e->finish == TSR_FINISH_NONE) continue;
        q->finals++;
        q->finish = e->finish;
        int gen = q->n_hist - q->n_prompt;
        int32_t last = gen > 0 ? q->hist[q->n_hist - 1] : -1;
        switch (e->finish) {
        case TSR_FINISH_STOP:
            if (e->token >= 0 && (q->p.ignore_eos || !is_stop(q, last) || gen - 1 < q->p.min_tokens))
                return fail(d, "request %llu stopped on token %d (generated %d, min %d)", id, last, gen,
                            q->p.min_tokens);
            break;
        case TSR_FINISH_LENGTH:
            if (e->token >= 0 && gen != q->p.max_tokens && q->n_hist < d->opts.max_context)
                return fail(d, "request %llu ended for length after %d of %d tokens", id, gen, q->p.max_tokens);
            break;
        default: break;
        }
        /* no stop token that counted may come before the end, nor be the last token of an end by other means */
        int upto = e->finish == TSR_FINISH_STOP && e->token >= 0 ? q->n_hist - 1 : q->n_hist;
        for (int k = q->n_prompt + q->p.min_tokens; k < upto && !q->p.ignore_eos; k++)
            if (is_stop(q, q->hist[k])) return fail(d, "request %llu went on past stop token at %d", id, k);
        if (tsr_sched_tokens(d->s, e->id, NULL, NULL) == NULL)
            return fail(d, "request %llu's tokens unreadable at its final event", id);
    }
    return n;
}

int drv_outstanding(const driver *d) { return d->n_older + d->step_out; }

/* Whether page `page` is written by step t (a position in [pos0, pos0 + n_tokens) of one of its sequences). */
static int step_writes(const tsr_step *t, int page_size, int32_t page)
{
    for (int i = 0; i < t->n_seqs; i++) {
        const tsr_step_seq *q = &t->seqs[i];
        for (int k = q->pos0 / page_size; k <= (q->pos0 + q->n_tokens - 1) / page_size; k++)
            if (t->pages[q->page0 + k] == page) return 1;
    }
    return 0;
}

/* The new plan `t` may not touch a page that an outstanding step writes. */
static int check_disjoint(driver *d, const tsr_step *t)
{
    for (int i = 0; i < t->n_seqs; i++) {
        const tsr_step_seq *q = &t->seqs[i];
        for (int k = 0; k < q->n_pages; k++) {
            int32_t page = t->pages[q->page0 + k];
            for (int o = 0; o < d->n_older; o++)
                if (step_writes(&d->older[o], d->opts.page_size, page))
                    return fail(d, "plan: sequence %llu uses page %d, which a step in flight writes",
                                (unsigned long long)q->id, page);
        }
    }
    return 0;
}

int drv_plan(driver *d)
{
    if (d->step_out) {
        if (d->n_older == TSR_SCHED_MAX_PLANS) return fail(d, "plan: too many outstanding plans in the driver");
        d->older[d->n_older++] = d->step; /* moved: `step` starts empty */
        memset(&d->step, 0, sizeof d->step);
        d->step_out = 0;
    }
    tsr_status st = tsr_sched_plan(d->s, d->now, &d->step);
    if (st != TSR_OK) {
        if (d->n_older > 0) { /* refused (no slot free): the newest outstanding plan goes back to `step` */
            tsr_step_free(&d->step);
            d->step = d->older[--d->n_older];
            d->step_out = 1;
        }
        return fail(d, "plan: %s", tsr_last_error());
    }
    d->step_out = d->step.n_seqs > 0;
    if (drv_check(d) || check_disjoint(d, &d->step)) return -1;
    int tokens = 0;
    for (int i = 0; i < d->step.n_seqs; i++) {
        tokens += d->step.seqs[i].n_tokens;
        if (d->step.seqs[i].logits != 0) return fail(d, "plan asks for logits");
    }
    if (tokens > d->opts.max_step_tokens)
        return fail(d, "plan of %d tokens over the budget %d", tokens, d->opts.max_step_tokens);
    return d->step.n_seqs;
}

int drv_run_commit(driver *d, int failed)
{
    tsr_step *t = d->n_older > 0 ? &d->older[0] : &d->step;
    if (t->n_seqs > d->cap_res) {
        d->cap_res = t->n_seqs * 2;
        d->res = realloc(d->res, (size_t)d->cap_res * sizeof *d->res);
    }
    if (!failed && fake_run(&d->f, t, d->res) != 0) return fail(d, "executor: %s", d->f.error);
    if (tsr_sched_commit(d->s, t, failed ? NULL : d->res, d->now) != TSR_OK)
        return fail(d, "commit: %s", tsr_last_error());
    if (d->n_older > 0) {
        tsr_step_free(&d->older[0]);
        memmove(&d->older[0], &d->older[1], (size_t)(d->n_older - 1) * sizeof d->older[0]);
        d->n_older--;
    } else {
        d->step_out = 0;
    }
    return drv_check(d);
}

int drv_step(driver *d)
{
    int n = drv_plan(d);
    if (n < 0) return -1;
    if (drv_outstanding(d) > 0 && drv_run_commit(d, 0)) return -1;
    if (drv_drain(d) < 0) return -1;
    return n;
}

int drv_run_all(driver *d, int max_steps)
{
    const int depth = d->opts.max_plans > 1 ? d->opts.max_plans : 1;
    int steps = 0;
    while (drv_outstanding(d) > 0 || !tsr_sched_idle(d->s)) {
        if (steps >= max_steps) return fail(d, "not idle after %d steps", steps);
        /* keep up to `depth` plans in flight, then commit the oldest */
        int planned = 0;
        while (drv_outstanding(d) < depth) {
            int n = drv_plan(d);
            if (n < 0) return -1;
            if (n == 0) break;
            planned += n;
        }
        int had = drv_outstanding(d);
        if (had > 0 && drv_run_commit(d, 0)) return -1;
        int events = drv_drain(d);
        if (events < 0) return -1;
        if (planned == 0 && had == 0 && events == 0 && !tsr_sched_idle(d->s)) {
            tsr_sched_stats st;
            tsr_sched_get_stats(d->s, &st);
            return fail(d, "stuck: nothing planned with %d waiting, %d running", st.waiting, st.running);
        }
        steps++;
    }
    return steps;
}

int drv_all_final(driver *d)
{
    for (int i = 0; i < d->n_req; i++)
        if (d->req[i].finals != 1) return fail(d, "request %d has %d final events", i + 1, d->req[i].finals);
    return 0;
}
