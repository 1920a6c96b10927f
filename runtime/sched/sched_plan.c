/* Planning and committing steps (see scheduler.h): continuous batching within a token budget.
 *
 * A plan takes, in order: one decode token for every running sequence whose only unprocessed token is its latest
 * one (oldest first); then prefill chunks of running sequences that have more to process, oldest first, each as
 * much as the budget leaves (so a long prompt is prefilled over several steps, between decode steps of the
 * others; with opts.max_prefill_decoding, a plan with decode tokens takes at most that many prompt tokens besides,
 * so that a long prompt delays the running streams by a short step at a time); then new admissions from the head
 * of the queue (FCFS) while the budget, the max_running ceiling and the pages allow. Admission starts from the
 * longest chain of cached full pages of the sequence's known tokens, never including the page of its last known
 * token (that token must be computed to give logits), and takes pages for all its known tokens at once, keeping a
 * small reserve of pages for the running sequences' decode growth. When a running sequence needs a page and none is
 * free or evictable, the newest running sequence is preempted (pages released, back to the queue with all its
 * tokens); if that is the sequence itself, it waits for its turn.
 *
 * A sequence samples only in the step that reaches its last known token, with sample_index = tokens generated so
 * far: a sequence re-prefilled after preemption draws exactly the token it would have drawn. Until min_tokens
 * tokens are generated, its stop ids get a -1e30 logit bias so they cannot be drawn (a finite value keeps every
 * sampler filter free of inf - inf).
 *
 * Commit advances each planned sequence by its chunk, registers newly full pages in the prefix index (prompt and
 * generated pages alike), appends sampled tokens and decides stop / length; sequences ended while their step was
 * in flight are only released here, so a page being written is never reused before the step is done.
 *
 * Several plans may await commit (opts.max_plans): they sit in a ring, oldest first, and commits take them in
 * that order. A sequence is in at most one of them (q->planned names the slot); planning skips, never preempts
 * and never ends (deadlines, pending ends) a sequence in flight in another plan: commit does that. */
#include "runtime/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

#define MASK_BIAS (-1e30f)

static int penalties_active(const tsr_sampling *p)
{
    return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

/* In a plan other than the one being built: its step is in flight. */
static int in_flight(const tsr_sched *s, const sched_seq *q) { return q->planned && q->planned != s->building + 1; }

static void plan_add(tsr_sched *s, sched_seq *q, int n)
{
    seq_list *l = &s->plans[s->building];
    q->planned = s->building + 1;
    q->plan_pos0 = q->n_computed;
    q->plan_n = n;
    l->v[l->n++] = q; /* room reserved */
    s->budget -= n;
}

static void plan_drop(tsr_sched *s, sched_seq *q)
{
    if (q->planned != s->building + 1) return;
    q->planned = 0;
    s->budget += q->plan_n;
    sched_list_remove(&s->plans[s->building], q);
}

static int grow_table(sched_seq *q, int need)
{
    if (need <= q->cap_table) return 1;
    int cap = q->cap_table ? q->cap_table : 8;
    while (cap < need) cap *= 2;
    int32_t *t = realloc(q->table, (size_t)cap * sizeof *t);
    if (!t) return 0;
    q->table = t;
    q->cap_table = cap;
    return 1;
}

/* Gives q pages covering its first `upto` tokens, preempting the newest running sequences when the pool is
 * exhausted. Returns 1, or 0 when q itself was preempted or ended, or must wait because the newest running
 * sequence is in flight (it can be preempted once its step is committed). */
static int ensure_pages(tsr_sched *s, sched_seq *q, int upto)
{
    int need = sched_pages_for(upto, s->o.page_size);
    if (!grow_table(q, need)) {
        tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for the page table of sequence %llu",
                 (unsigned long long)q->id);
        plan_drop(s, q);
        sched_end(s, q, -1, NULL, TSR_FINISH_ERROR);
        return 0;
    }
    while (q->n_table < need) {
        int32_t page = tsr_prefix_alloc(&s->prefix);
        if (page >= 0) {
            q->table[q->n_table++] = page;
            continue;
        }
        sched_seq *victim = s->running.v[s->running.n - 1];
        if (in_flight(s, victim)) {
            s->preempted_now = 1; /* the pool is short: admit nothing either */
            return 0;
        }
        if (victim == q && s->running.n == 1) {
            /* alone and still short of pages: it can never fit (submit refuses such requests; kept as a guard) */
            tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu needs %d KV pages, more than the pool's %d",
                     (unsigned long long)q->id, need, s->o.n_pages);
            sched_end(s, q, -1, NULL, TSR_FINISH_ERROR);
            return 0;
        }
        plan_drop(s, victim);
        sched_preempt(s, victim);
        s->preempted_now = 1;
        if (victim == q) return 0;
    }
    return 1;
}

/* Moves the head of the queue to the running list with its pages (cached prefix first). 0 when it does not fit
 * now (nothing changed). */
static int admit(tsr_sched *s, sched_seq *q)
{
    int ps = s->o.page_size;
    int need = sched_pages_for(q->n_total, ps);
    if (!grow_table(q, need)) return 0;
    int hits = 0;
    tsr_prefix_link link = tsr_prefix_root();
    if (s->o.prefix_cache > 0) hits = tsr_prefix_match(&s->prefix, q->tokens, (q->n_total - 1) / ps, q->table, &link);
    for (int i = 0; i < hits; i++) tsr_prefix_acquire(&s->prefix, q->table[i]);
    int reserve = 0;
    if (s->running.n > 0) reserve = s->o.n_pages / 100 > 1 ? s->o.n_pages / 100 : 1;
    if (need - hits + reserve > tsr_prefix_available(&s->prefix)) {
        for (int i = hits - 1; i >= 0; i--) tsr_prefix_release(&s->prefix, q->table[i]);
        return 0;
    }
    q->n_table = hits;
    while (q->n_table < need) q->table[q->n_table++] = tsr_prefix_alloc(&s->prefix); /* available checked */
    q->n_computed = hits * ps;
    q->n_reg = hits;
    q->link = link;
    if (s->o.prefix_cache > 0) tsr_prefix_record(&s->prefix, hits);
    if (!q->admitted) {
        q->admitted = 1;
        q->n_cached = hits * ps < q->n_prompt ? hits * ps : q->n_prompt;
    }
    sched_list_remove(&s->waiting, q);
    q->state = SEQ_RUNNING;
    sched_list_insert(&s->running, q);
    return 1;
}

/* Ends sequences whose end was requested without room for the event, and those past their deadline (not those in
 * flight: their commit or a later plan does). */
static void end_expired(tsr_sched *s, double now)
{
    seq_list *lists[2] = {&s->running, &s->waiting};
    for (int k = 0; k < 2; k++)
        for (int i = lists[k]->n - 1; i >= 0; i--) {
            sched_seq *q = lists[k]->v[i];
            if (q->planned) continue;
            if (q->pending != TSR_FINISH_NONE) sched_end(s, q, -1, NULL, q->pending);
            else if (q->deadline > 0 && now >= q->deadline) sched_end(s, q, -1, NULL, TSR_FINISH_DEADLINE);
        }
}

static tsr_status add_to_step(tsr_sched *s, sched_seq *q, tsr_step *step)
{
    tsr_step_seq ss;
    memset(&ss, 0, sizeof ss);
    int sample = q->plan_pos0 + q->plan_n == q->n_total;
    ss.id = q->id;
    ss.pos0 = q->plan_pos0;
    ss.n_tokens = q->plan_n;
    ss.n_pages = sched_pages_for(q->plan_pos0 + q->plan_n, s->o.page_size);
    ss.sample = sample;
    ss.n_logprobs = sample ? q->n_logprobs : -1;
    ss.logits = 0;
    ss.seed = q->seed;
    ss.sample_index = (uint32_t)seq_generated(q);
    ss.sampling = q->sampling;
    const int32_t *hist = NULL;
    if (sample && penalties_active(&q->sampling)) {
        hist = q->tokens;
        ss.n_hist = q->n_total;
        ss.n_hist_prompt = q->n_prompt;
    }
    if (sample) {
        int nb = q->n_bias;
        if (!q->ignore_eos && seq_generated(q) < q->min_tokens)
            for (int k = 0; k < q->n_stop; k++) {
                q->bias[nb].token = q->stop_ids[k];
                q->bias[nb++].bias = MASK_BIAS;
            }
        ss.n_bias = nb;
    }
    return tsr_step_add(step, &ss, q->tokens + q->plan_pos0, q->table, hist, ss.n_bias ? q->bias : NULL);
}

tsr_status tsr_sched_plan(tsr_sched *s, double now, tsr_step *step)
{
    sched_settle(s);
    tsr_step_clear(step);
    if (s->n_plans >= s->o.max_plans)
        return tsr_fail(TSR_ERR_ARG, "scheduler: %d planned step%s not committed (commit the oldest, with NULL "
                        "results if it failed)", s->n_plans, s->n_plans == 1 ? " was" : "s were");
    TSR_TRY(sched_reserve(s, 0));
    s->building = (s->plan_head + s->n_plans) % s->o.max_plans;
    end_expired(s, now);
    seq_list *plan = &s->plans[s->building];
    plan->n = 0;
    s->budget = s->o.max_step_tokens;
    s->preempted_now = 0;

    /* decode tokens first (with plans in flight, this plan's share of the running sequences); a sequence failing
     * to get its page is the last one, or waits for a plan in flight, so the loop goes on */
    int decode_cap = (s->running.n + s->o.max_plans - 1) / s->o.max_plans, decodes = 0;
    for (int i = 0; i < s->running.n && s->budget > 0 && decodes < decode_cap; i++) {
        sched_seq *q = s->running.v[i];
        if (q->planned || q->n_total - q->n_computed != 1) continue;
        if (ensure_pages(s, q, q->n_total)) {
            plan_add(s, q, 1);
            decodes++;
        }
    }
    if (decodes > 0 && s->o.max_prefill_decoding > 0 && s->budget > s->o.max_prefill_decoding)
        s->budget = s->o.max_prefill_decoding;
    /* then prefill chunks of running sequences, oldest first */
    for (int i = 0; i < s->running.n && s->budget > 0; i++) {
        sched_seq *q = s->running.v[i];
        int left = q->n_total - q->n_computed;
        if (q->planned || left <= 1) continue;
        int n = left < s->budget ? left : s->budget;
        if (ensure_pages(s, q, q->n_computed + n)) plan_add(s, q, n);
    }
    /* then admissions, FCFS (none after a preemption: the pool is short) */
    while (!s->preempted_now && s->budget > 0 && s->waiting.n > 0 && s->running.n < s->o.max_running) {
        sched_seq *q = s->waiting.v[0];
        if (!admit(s, q)) break;
        int left = q->n_total - q->n_computed;
        plan_add(s, q, left < s->budget ? left : s->budget);
    }

    for (int i = 0; i < plan->n; i++) {
        tsr_status st = add_to_step(s, plan->v[i], step);
        if (st != TSR_OK) {
            for (int j = 0; j < plan->n; j++) plan->v[j]->planned = 0;
            plan->n = 0;
            tsr_step_clear(step);
            return st;
        }
    }
    for (int i = 0; i < plan->n; i++) {
        const sched_seq *q = plan->v[i];
        if (q->plan_n == 1 && q->plan_pos0 + 1 == q->n_total && seq_generated(q) > 0) s->decode_tokens++;
        else s->prefill_tokens += (uint64_t)q->plan_n;
    }
    if (plan->n > 0) {
        s->steps++;
        s->n_plans++;
    }
    return TSR_OK;
}

/* ---- commit ---- */

static void register_pages(tsr_sched *s, sched_seq *q)
{
    if (s->o.prefix_cache < 0) return;
    int ps = s->o.page_size, full = q->n_computed / ps;
    if (full > q->n_table) full = q->n_table;
    for (int k = q->n_reg; k < full; k++)
        tsr_prefix_register(&s->prefix, &q->link, q->tokens + (size_t)k * (size_t)ps, q->table[k]);
    if (full > q->n_reg) q->n_reg = full;
}

static int append_token(sched_seq *q, int32_t token)
{
    if (q->n_total == q->cap_tokens) {
        int cap = q->cap_tokens * 2, limit = q->n_prompt + q->max_tokens;
        if (cap > limit) cap = limit;
        if (cap <= q->n_total) return 0;
        int32_t *t = realloc(q->tokens, (size_t)cap * sizeof *t);
        if (!t) return 0;
        q->tokens = t;
        q->cap_tokens = cap;
    }
    q->tokens[q->n_total++] = token;
    return 1;
}

static tsr_finish_reason finish_check(const tsr_sched *s, const sched_seq *q, int32_t token)
{
    int generated = seq_generated(q);
    if (!q->ignore_eos && generated - 1 >= q->min_tokens)
        for (int k = 0; k < q->n_stop; k++)
            if (q->stop_ids[k] == token) return TSR_FINISH_STOP;
    if (generated >= q->max_tokens || q->n_total >= s->o.max_context) return TSR_FINISH_LENGTH;
    return TSR_FINISH_NONE;
}

tsr_status tsr_sched_commit(tsr_sched *s, const tsr_step *step, const tsr_step_result *results, double now)
{
    (void)now;
    sched_settle(s);
    if (s->n_plans == 0) {
        if (step->n_seqs == 0) return TSR_OK;
        return tsr_fail(TSR_ERR_ARG, "scheduler: commit of a %d-sequence step but none is outstanding", step->n_seqs);
    }
    seq_list *plan = &s->plans[s->plan_head];
    if (step->n_seqs != plan->n)
        return tsr_fail(TSR_ERR_ARG, "scheduler: committed step has %d sequences, the oldest plan %d", step->n_seqs,
                        plan->n);
    for (int i = 0; i < step->n_seqs; i++) {
        const tsr_step_seq *ss = &step->seqs[i];
        const sched_seq *q = plan->v[i];
        if (ss->id != q->id || ss->pos0 != q->plan_pos0 || ss->n_tokens != q->plan_n)
            return tsr_fail(TSR_ERR_ARG, "scheduler: committed step's sequence %d (id %llu, pos0 %d, %d tokens) is "
                            "not the one planned (id %llu, pos0 %d, %d tokens)", i, (unsigned long long)ss->id,
                            ss->pos0, ss->n_tokens, (unsigned long long)q->id, q->plan_pos0, q->plan_n);
    }
    TSR_TRY(sched_reserve(s, 0));
    s->plan_head = (s->plan_head + 1) % s->o.max_plans;
    s->n_plans--;
    for (int i = 0; i < plan->n; i++) {
        sched_seq *q = plan->v[i];
        q->planned = 0;
        if (q->pending != TSR_FINISH_NONE) {
            sched_end(s, q, -1, NULL, q->pending);
            continue;
        }
        if (!results) {
            sched_end(s, q, -1, NULL, TSR_FINISH_ERROR);
            continue;
        }
        q->n_computed += q->plan_n;
        register_pages(s, q);
        if (q->n_computed < q->n_total) continue; /* a prefill chunk: nothing sampled */
        const tsr_step_result *r = &results[i];
        if (r->token < 0 || !append_token(q, r->token)) {
            if (r->token < 0)
                tsr_fail(TSR_ERR_INTERNAL, "scheduler: the executor returned no token for sequence %llu",
                         (unsigned long long)q->id);
            else
                tsr_fail(TSR_ERR_NOMEM, "scheduler: out of memory for the tokens of sequence %llu",
                         (unsigned long long)q->id);
            sched_end(s, q, -1, NULL, TSR_FINISH_ERROR);
            continue;
        }
        tsr_finish_reason why = finish_check(s, q, r->token);
        if (why != TSR_FINISH_NONE) sched_end(s, q, r->token, r, why);
        else sched_emit(s, q, r->token, r, TSR_FINISH_NONE);
    }
    plan->n = 0;
    return TSR_OK;
}
