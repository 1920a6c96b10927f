/* The scheduler's lifecycle, request queue, cancellation, events and queries (see scheduler.h); planning and
 * committing steps are in sched_plan.c, the invariant check in sched_check.c.
 *
 * Every public call first reserves the memory it may need (list slots, one event per live sequence), so once it
 * starts changing state it cannot fail half-way: a sequence never loses its final event to an allocation
 * failure. Finished sequences stay readable (tsr_sched_tokens) until the caller has drained their final events
 * and calls in again. */
#include "runtime/sched/sched_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *tsr_finish_reason_str(tsr_finish_reason r)
{
    switch (r) {
    case TSR_FINISH_NONE: return "none";
    case TSR_FINISH_STOP: return "stop";
    case TSR_FINISH_LENGTH: return "length";
    case TSR_FINISH_CANCELLED: return "cancelled";
    case TSR_FINISH_DEADLINE: return "deadline";
    case TSR_FINISH_ERROR: return "error";
    }
    return "unknown";
}

/* ---- lists ---- */

static int list_grow(seq_list *l, int need)
{
    if (need <= l->cap) return 1;
    int cap = l->cap ? l->cap : 16;
    while (cap < need) cap *= 2;
    sched_seq **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return 0;
    l->v = v;
    l->cap = cap;
    return 1;
}

void sched_list_insert(seq_list *l, sched_seq *q)
{
    if (!list_grow(l, l->n + 1)) return; /* unreachable after sched_reserve */
    int i = l->n;
    while (i > 0 && l->v[i - 1]->id > q->id) {
        l->v[i] = l->v[i - 1];
        i--;
    }
    l->v[i] = q;
    l->n++;
}

void sched_list_remove(seq_list *l, const sched_seq *q)
{
    for (int i = l->n - 1; i >= 0; i--)
        if (l->v[i] == q) {
            memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof *l->v);
            l->n--;
            return;
        }
}

tsr_status sched_reserve(tsr_sched *s, int extra_seqs)
{
    int live = s->waiting.n + s->running.n + extra_seqs;
    int ev = s->n_events + live + 1;
    if (ev > s->cap_events) {
        int cap = s->cap_events ? s->cap_events : 64;
        while (cap < ev) cap *= 2;
        tsr_sched_event *e = realloc(s->events, (size_t)cap * sizeof *e);
        if (e) s->events = e;
        tsr_step_result *r = realloc(s->ev_res, (size_t)cap * sizeof *r);
        if (r) s->ev_res = r;
        uint8_t *h = realloc(s->has_res, (size_t)cap);
        if (h) s->has_res = h;
        if (!e || !r || !h) return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for events");
        s->cap_events = cap;
    }
    if (!list_grow(&s->waiting, live + 1) || !list_grow(&s->running, live + 1) ||
        !list_grow(&s->dead, s->dead.n + live + 1))
        return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for %d sequences", live);
    for (int k = 0; k < s->o.max_plans; k++)
        if (!list_grow(&s->plans[k], live + 1))
            return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for %d sequences", live);
    return TSR_OK;
}

/* ---- sequences ---- */

static void seq_free(sched_seq *q)
{
    if (!q) return;
    free(q->tokens);
    free(q->table);
    free(q->stop_ids);
    free(q->bias);
    free(q);
}

sched_seq *sched_find(const tsr_sched *s, uint64_t id)
{
    const seq_list *lists[3] = {&s->running, &s->waiting, &s->dead};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < lists[k]->n; i++)
            if (lists[k]->v[i]->id == id) return lists[k]->v[i];
    return NULL;
}

void sched_settle(tsr_sched *s)
{
    if (!s->drained) return;
    s->drained = 0;
    s->n_events = 0;
    for (int i = 0; i < s->dead.n; i++) seq_free(s->dead.v[i]);
    s->dead.n = 0;
}

void sched_emit(tsr_sched *s, const sched_seq *q, int32_t token, const tsr_step_result *result,
                tsr_finish_reason finish)
{
    if (s->n_events >= s->cap_events) return; /* unreachable after sched_reserve */
    tsr_sched_event *e = &s->events[s->n_events];
    e->id = q->id;
    e->token = token;
    e->result = NULL;
    e->finish = finish;
    e->n_prompt = q->n_prompt;
    e->n_generated = seq_generated(q);
    e->n_cached = q->n_cached;
    s->has_res[s->n_events] = result != NULL;
    if (result) s->ev_res[s->n_events] = *result;
    s->n_events++;
}

void sched_release_pages(tsr_sched *s, sched_seq *q)
{
    for (int i = q->n_table - 1; i >= 0; i--) tsr_prefix_release(&s->prefix, q->table[i]);
    q->n_table = 0;
    q->n_computed = 0;
    q->n_reg = 0;
    q->link = tsr_prefix_root();
}

void sched_end(tsr_sched *s, sched_seq *q, int32_t token, const tsr_step_result *result, tsr_finish_reason why)
{
    sched_emit(s, q, token, result, why);
    sched_release_pages(s, q);
    sched_list_remove(q->state == SEQ_RUNNING ? &s->running : &s->waiting, q);
    q->state = SEQ_DEAD;
    q->planned = 0;
    s->dead.v[s->dead.n++] = q; /* room reserved */
}

void sched_preempt(tsr_sched *s, sched_seq *q)
{
    sched_release_pages(s, q);
    sched_list_remove(&s->running, q);
    q->state = SEQ_WAITING;
    sched_list_insert(&s->waiting, q);
    s->preempted_total++;
}

/* ---- lifecycle ---- */

tsr_status tsr_sched_new(const tsr_sched_opts *opts, tsr_sched **out)
{
    *out = NULL;
    tsr_sched_opts o = *opts;
    if (o.page_size < 1 || o.n_pages < 1 || o.max_step_tokens < 1)
        return tsr_fail(TSR_ERR_ARG, "scheduler: page_size %d, n_pages %d and max_step_tokens %d must be >= 1",
                        o.page_size, o.n_pages, o.max_step_tokens);
    if (o.max_running < 0 || o.max_waiting < 0 || o.max_context < 0 || o.vocab < 0 || o.prefix_cache < -1 ||
        o.prefix_cache > 1 || o.max_plans < 0 || o.max_plans > TSR_SCHED_MAX_PLANS || o.max_prefill_decoding < 0)
        return tsr_fail(TSR_ERR_ARG, "scheduler: invalid max_running %d, max_waiting %d, max_context %d, vocab %d, "
                        "prefix_cache %d, max_plans %d or max_prefill_decoding %d", o.max_running, o.max_waiting,
                        o.max_context, o.vocab, o.prefix_cache, o.max_plans, o.max_prefill_decoding);
    if (o.max_running == 0) o.max_running = TSR_SCHED_RUNNING_DEFAULT;
    /* every running sequence must be able to take its decode token in every step, or some would starve */
    if (o.max_running > o.max_step_tokens) o.max_running = o.max_step_tokens;
    if (o.max_waiting == 0) o.max_waiting = TSR_SCHED_WAITING_DEFAULT;
    if (o.prefix_cache == 0) o.prefix_cache = 1;
    if (o.max_context == 0) o.max_context = INT_MAX / 2;
    if (o.max_plans == 0) o.max_plans = 1;
    tsr_sched *s = calloc(1, sizeof *s);
    if (!s) return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory");
    s->o = o;
    s->next_id = 1;
    tsr_status st = tsr_pages_init(&s->pages, o.n_pages, o.page_size);
    if (st == TSR_OK) st = tsr_prefix_init(&s->prefix, &s->pages);
    if (st == TSR_OK) st = sched_reserve(s, o.max_running);
    if (st != TSR_OK) {
        tsr_sched_free(s);
        return st;
    }
    *out = s;
    return TSR_OK;
}

void tsr_sched_free(tsr_sched *s)
{
    if (!s) return;
    seq_list *lists[3] = {&s->running, &s->waiting, &s->dead};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < lists[k]->n; i++) seq_free(lists[k]->v[i]);
        free(lists[k]->v);
    }
    for (int k = 0; k < TSR_SCHED_MAX_PLANS; k++)
        free(s->plans[k].v);
    free(s->events);
    free(s->ev_res);
    free(s->has_res);
    tsr_prefix_destroy(&s->prefix);
    tsr_pages_destroy(&s->pages);
    free(s);
}

/* ---- requests ---- */

static tsr_status check_params(const tsr_sched *s, const int32_t *prompt, int n_prompt, const tsr_seq_params *p)
{
    if (!prompt || n_prompt < 1) return tsr_fail(TSR_ERR_ARG, "request: empty prompt");
    if (!p) return tsr_fail(TSR_ERR_ARG, "request: no parameters");
    int32_t vocab = s->o.vocab > 0 ? s->o.vocab : INT32_MAX;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= vocab)
            return tsr_fail(TSR_ERR_ARG, "request: prompt token %d is %d (outside the vocabulary)", i, prompt[i]);
    if (p->max_tokens < 1) return tsr_fail(TSR_ERR_ARG, "request: max_tokens %d (must be >= 1)", p->max_tokens);
    if (p->min_tokens < 0) return tsr_fail(TSR_ERR_ARG, "request: min_tokens %d (must be >= 0)", p->min_tokens);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return tsr_fail(TSR_ERR_ARG, "request: %d stop ids without an array", p->n_stop_ids);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return tsr_fail(TSR_ERR_ARG, "request: %d logit biases without an array", p->n_bias);
    /* the sampler refuses a step with a bad bias entry, and stop ids become bias entries (min_tokens) */
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab)
            return tsr_fail(TSR_ERR_ARG, "request: stop id %d is outside the vocabulary", p->stop_ids[i]);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].token < 0 || p->bias[i].token >= vocab || !isfinite(p->bias[i].bias))
            return tsr_fail(TSR_ERR_ARG, "request: logit bias %g for token %d (token outside the vocabulary or "
                            "bias not finite)", (double)p->bias[i].bias, p->bias[i].token);
    if (p->n_logprobs < -1 || p->n_logprobs > TSR_MAX_LOGPROBS)
        return tsr_fail(TSR_ERR_ARG, "request: logprobs %d (must be -1..%d)", p->n_logprobs, TSR_MAX_LOGPROBS);
    int64_t total = (int64_t)n_prompt + p->max_tokens;
    if (total > s->o.max_context)
        return tsr_fail(TSR_ERR_ARG, "request: prompt of %d tokens + max_tokens %d = %lld exceeds the context of %d "
                        "tokens", n_prompt, p->max_tokens, (long long)total, s->o.max_context);
    /* the last generated token is never fed back, so it needs no KV slot */
    int64_t pages = (total - 1 + s->o.page_size - 1) / s->o.page_size;
    if (pages > s->o.n_pages)
        return tsr_fail(TSR_ERR_ARG, "request: prompt of %d tokens + max_tokens %d needs %lld KV pages of %d tokens "
                        "but the whole pool has %d", n_prompt, p->max_tokens, (long long)pages, s->o.page_size,
                        s->o.n_pages);
    return TSR_OK;
}

tsr_status tsr_sched_submit(tsr_sched *s, const int32_t *prompt, int n_prompt, const tsr_seq_params *p, double now,
                            uint64_t *id)
{
    (void)now;
    sched_settle(s);
    if (id) *id = 0;
    TSR_TRY(check_params(s, prompt, n_prompt, p));
    if (s->waiting.n >= s->o.max_waiting)
        return tsr_fail(TSR_ERR_BUSY, "scheduler: %d requests already waiting", s->waiting.n);
    TSR_TRY(sched_reserve(s, 1));
    sched_seq *q = calloc(1, sizeof *q);
    if (!q) return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for a request");
    int extra = p->max_tokens < 16 ? p->max_tokens : 16;
    q->cap_tokens = n_prompt + extra;
    q->tokens = malloc((size_t)q->cap_tokens * sizeof *q->tokens);
    q->stop_ids = malloc((size_t)(p->n_stop_ids + 1) * sizeof *q->stop_ids);
    q->bias = malloc((size_t)(p->n_bias + p->n_stop_ids + 1) * sizeof *q->bias);
    if (!q->tokens || !q->stop_ids || !q->bias) {
        seq_free(q);
        return tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for a request of %d tokens", n_prompt);
    }
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    if (p->n_stop_ids) memcpy(q->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *q->stop_ids);
    if (p->n_bias) memcpy(q->bias, p->bias, (size_t)p->n_bias * sizeof *q->bias);
    q->n_prompt = q->n_total = n_prompt;
    q->n_stop = p->n_stop_ids;
    q->n_bias = p->n_bias;
    q->sampling = p->sampling;
    q->seed = p->seed;
    q->max_tokens = p->max_tokens;
    q->min_tokens = p->min_tokens;
    q->ignore_eos = p->ignore_eos;
    q->n_logprobs = p->n_logprobs;
    q->deadline = p->deadline;
    q->link = tsr_prefix_root();
    q->id = s->next_id++;
    q->state = SEQ_WAITING;
    sched_list_insert(&s->waiting, q);
    if (id) *id = q->id;
    return TSR_OK;
}

static void end_by_caller(tsr_sched *s, uint64_t id, tsr_finish_reason why)
{
    sched_settle(s);
    sched_seq *q = sched_find(s, id);
    if (!q || q->state == SEQ_DEAD || q->pending != TSR_FINISH_NONE) return;
    if (sched_reserve(s, 0) != TSR_OK) {
        q->pending = why; /* no room for the event now: the next plan or commit ends it */
        return;
    }
    if (q->planned) q->pending = why; /* its step is in flight: tsr_sched_commit ends it */
    else sched_end(s, q, -1, NULL, why);
}

void tsr_sched_cancel(tsr_sched *s, uint64_t id) { end_by_caller(s, id, TSR_FINISH_CANCELLED); }

void tsr_sched_finish(tsr_sched *s, uint64_t id, tsr_finish_reason reason)
{
    end_by_caller(s, id, reason == TSR_FINISH_NONE ? TSR_FINISH_STOP : reason);
}

/* ---- queries ---- */

int tsr_sched_drain_events(tsr_sched *s, const tsr_sched_event **events)
{
    sched_settle(s);
    for (int i = 0; i < s->n_events; i++) s->events[i].result = s->has_res[i] ? &s->ev_res[i] : NULL;
    *events = s->events;
    s->drained = s->n_events > 0;
    return s->n_events;
}

const int32_t *tsr_sched_tokens(const tsr_sched *s, uint64_t id, int *n_prompt, int *n_total)
{
    const sched_seq *q = sched_find(s, id);
    if (!q) return NULL;
    if (n_prompt) *n_prompt = q->n_prompt;
    if (n_total) *n_total = q->n_total;
    return q->tokens;
}

int tsr_sched_idle(const tsr_sched *s)
{
    return s->waiting.n == 0 && s->running.n == 0 && (s->drained || s->n_events == 0);
}

void tsr_sched_get_stats(const tsr_sched *s, tsr_sched_stats *out)
{
    memset(out, 0, sizeof *out);
    out->waiting = s->waiting.n;
    out->running = s->running.n;
    out->preempted_total = s->preempted_total;
    out->pages_total = s->pages.n_pages;
    out->pages_free = s->pages.n_free;
    out->pages_cached = s->prefix.n_lru;
    out->prefix_lookups = s->prefix.lookups;
    out->prefix_hits = s->prefix.hits;
    out->prefix_hit_tokens = s->prefix.hit_tokens;
    out->prefix_evictions = s->prefix.evictions;
    out->prefill_tokens = s->prefill_tokens;
    out->decode_tokens = s->decode_tokens;
    out->steps = s->steps;
}
