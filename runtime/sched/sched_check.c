/* The scheduler's invariant check (tsr_sched_check) and its test hooks (sched_debug.h).
 *
 * The check recomputes every page's expected reference count from scratch (one per page-table entry of a running
 * sequence, one per prefix-cache entry) and compares it with the pool's, after the pool's and the index's own
 * checks; it then checks each sequence's bookkeeping, and that every page a sequence will still write (at or
 * after its first uncomputed position) is held by that sequence alone, which is what rules out two sequences
 * writing one page. It allocates two scratch arrays and is meant for tests, not the token path. */
#include "runtime/sched/sched_debug.h"
#include "runtime/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

static tsr_status check_list(const seq_list *l, seq_state state, const char *name)
{
    for (int i = 0; i < l->n; i++) {
        const sched_seq *q = l->v[i];
        if (q->state != state)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu on the %s list has state %d",
                            (unsigned long long)q->id, name, (int)q->state);
        if (state != SEQ_DEAD && i > 0 && l->v[i - 1]->id >= q->id)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: %s list not sorted by id at %llu", name,
                            (unsigned long long)q->id);
        if (state != SEQ_RUNNING && (q->n_table != 0 || q->n_computed != 0 || q->planned))
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: %s sequence %llu holds %d pages (%d computed, planned %d)",
                            name, (unsigned long long)q->id, q->n_table, q->n_computed, q->planned);
    }
    return TSR_OK;
}

static tsr_status check_running(const tsr_sched *s, const sched_seq *q, int idx, int32_t *expect, int32_t *seen)
{
    int ps = s->o.page_size, done = q->n_computed / ps;
    unsigned long long id = (unsigned long long)q->id;
    if (q->n_computed < 0 || q->n_computed >= q->n_total)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu has %d of %d tokens computed", id, q->n_computed,
                        q->n_total);
    if (q->n_table < sched_pages_for(q->n_computed, ps) || q->n_table > sched_pages_for(q->n_total, ps))
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu has %d pages for %d computed of %d tokens", id,
                        q->n_table, q->n_computed, q->n_total);
    if (q->n_reg > done)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu registered %d pages but %d are full", id,
                        q->n_reg, done);
    if (q->n_total - q->n_prompt > q->max_tokens || q->n_total > s->o.max_context)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu has %d tokens (prompt %d, max_tokens %d)", id,
                        q->n_total, q->n_prompt, q->max_tokens);
    for (int k = 0; k < q->n_table; k++) {
        int32_t page = q->table[k];
        if (page < 0 || page >= s->o.n_pages)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu page %d is %d", id, k, page);
        if (seen[page] == idx)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu holds page %d twice", id, page);
        seen[page] = idx;
        expect[page]++;
        if (s->prefix.cached[page]) {
            if (k >= done)
                return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu's page %d (table %d) is cached but not "
                                "full (%d computed)", id, page, k, q->n_computed);
            if (memcmp(s->prefix.tokens + (size_t)page * (size_t)ps, q->tokens + (size_t)k * (size_t)ps,
                       (size_t)ps * sizeof(int32_t)) != 0)
                return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu's page %d (table %d) is cached with "
                                "other tokens", id, page, k);
        }
        if (k >= done && tsr_pages_refcount(&s->pages, page) != 1)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu will write page %d (table %d) but it has "
                            "count %d", id, page, k, tsr_pages_refcount(&s->pages, page));
    }
    if (q->planned) {
        int slot = q->planned - 1, age = (slot - s->plan_head + s->o.max_plans) % s->o.max_plans;
        if (slot >= s->o.max_plans || age >= s->n_plans || q->plan_pos0 != q->n_computed || q->plan_n < 1 ||
            q->plan_pos0 + q->plan_n > q->n_total || q->n_table < sched_pages_for(q->plan_pos0 + q->plan_n, ps))
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: sequence %llu planned at %d for %d tokens (%d computed, %d "
                            "known, %d pages)", id, q->plan_pos0, q->plan_n, q->n_computed, q->n_total, q->n_table);
    }
    return TSR_OK;
}

tsr_status tsr_sched_check(const tsr_sched *s)
{
    TSR_TRY(tsr_pages_check(&s->pages));
    TSR_TRY(tsr_prefix_check(&s->prefix));
    TSR_TRY(check_list(&s->waiting, SEQ_WAITING, "waiting"));
    TSR_TRY(check_list(&s->running, SEQ_RUNNING, "running"));
    TSR_TRY(check_list(&s->dead, SEQ_DEAD, "dead"));
    if (s->running.n > s->o.max_running)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: %d running, ceiling %d", s->running.n, s->o.max_running);
    if (s->n_events > s->cap_events)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: %d events in %d slots", s->n_events, s->cap_events);
    if (s->n_plans < 0 || s->n_plans > s->o.max_plans)
        return tsr_fail(TSR_ERR_INTERNAL, "scheduler: %d plans outstanding, at most %d", s->n_plans, s->o.max_plans);
    int planned_seqs = 0;
    for (int k = 0; k < s->n_plans; k++) {
        const int slot = (s->plan_head + k) % s->o.max_plans;
        const seq_list *plan = &s->plans[slot];
        int planned_tokens = 0;
        for (int i = 0; i < plan->n; i++) {
            const sched_seq *q = plan->v[i];
            if (q->state != SEQ_RUNNING || q->planned != slot + 1)
                return tsr_fail(TSR_ERR_INTERNAL, "scheduler: planned sequence %llu is not a running one in flight "
                                "in plan slot %d", (unsigned long long)q->id, slot);
            planned_tokens += q->plan_n;
        }
        if (planned_tokens > s->o.max_step_tokens || plan->n == 0)
            return tsr_fail(TSR_ERR_INTERNAL, "scheduler: plan of %d sequences, %d tokens (budget %d)", plan->n,
                            planned_tokens, s->o.max_step_tokens);
        planned_seqs += plan->n;
    }

    int n = s->o.n_pages;
    int32_t *expect = calloc((size_t)n, sizeof *expect), *seen = malloc((size_t)n * sizeof *seen);
    if (!expect || !seen) {
        free(expect);
        free(seen);
        return tsr_fail(TSR_ERR_NOMEM, "scheduler check: out of memory");
    }
    for (int i = 0; i < n; i++) seen[i] = -1;
    tsr_status st = TSR_OK;
    int in_flight = 0;
    for (int i = 0; i < s->running.n && st == TSR_OK; i++) {
        st = check_running(s, s->running.v[i], i, expect, seen);
        in_flight += s->running.v[i]->planned != 0;
    }
    if (st == TSR_OK && in_flight != planned_seqs)
        st = tsr_fail(TSR_ERR_INTERNAL, "scheduler: %d running sequences in flight, %d planned", in_flight,
                      planned_seqs);
    for (int p = 0; p < n && st == TSR_OK; p++) {
        int want = expect[p] + (s->prefix.cached[p] ? 1 : 0);
        if (tsr_pages_refcount(&s->pages, p) != want)
            st = tsr_fail(TSR_ERR_INTERNAL, "scheduler: page %d has count %d but %d holders (%d page tables%s)", p,
                          tsr_pages_refcount(&s->pages, p), want, expect[p], s->prefix.cached[p] ? " + cache" : "");
    }
    free(expect);
    free(seen);
    return st;
}

tsr_status tsr_sched_preempt(tsr_sched *s, uint64_t id)
{
    sched_settle(s);
    sched_seq *q = sched_find(s, id);
    if (!q || q->state != SEQ_RUNNING || q->planned)
        return tsr_fail(TSR_ERR_ARG, "scheduler: sequence %llu is not running between steps", (unsigned long long)id);
    TSR_TRY(sched_reserve(s, 0));
    sched_preempt(s, q);
    return TSR_OK;
}

void tsr_sched_flush_cache(tsr_sched *s) { tsr_prefix_flush(&s->prefix); }

int tsr_sched_page_refcount(const tsr_sched *s, int32_t page) { return tsr_pages_refcount(&s->pages, page); }
