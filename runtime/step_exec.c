/* Running step plans in this process: tsr_engine_run_step() and the local executor (see executor.h).
 *
 * A plan names, for each sequence, its tokens, positions and page table; this file turns it into forward-pass
 * calls of at most the engine's max_tokens (a sequence whose chunk is longer is split over calls, only the last
 * piece asking for its logits), copies the logits rows the plan asks for, and samples the sequences that sample.
 * A call whose rows only feed greedy choices keeps them on the device and reads back each row's pick instead; a
 * call whose rows only feed draws without log-probabilities, penalties or biases reads back each row's candidates
 * (tsr_forward_top) and fetches a whole row only when they cannot decide its draw.
 * The engine's own page free list is not used: pages come from the plan, already validated against the pool. */
#include "runtime/engine.h"
#include "runtime/executor.h"
#include "runtime/proc_mem.h"

#include <stdlib.h>
#include <string.h>

void tsr_step_scratch_free(tsr_step_scratch *s)
{
    free(s->logits);
    free(s->in);
    free(s->owner);
    free(s->pick_ids);
    free(s->pick_vals);
    tsr_top_bufs_free(&s->top);
    free(s->progress);
    memset(s, 0, sizeof *s);
}

tsr_status tsr_top_bufs_reserve(tsr_top_bufs *b, int n)
{
    if (n <= b->cap) return TSR_OK;
    int32_t *ids = realloc(b->ids, (size_t)n * TSR_TOP_MAX * sizeof *ids);
    if (ids) b->ids = ids;
    float *vals = realloc(b->vals, (size_t)n * TSR_TOP_MAX * sizeof *vals);
    if (vals) b->vals = vals;
    float *z = realloc(b->z, (size_t)n * sizeof *z);
    if (z) b->z = z;
    float *inv = realloc(b->inv, (size_t)n * sizeof *inv);
    if (inv) b->inv = inv;
    int *und = realloc(b->undecided, (size_t)n * 2 * sizeof *und);
    if (und) b->undecided = und;
    if (!ids || !vals || !z || !inv || !und) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory for candidates");
    b->cap = n;
    return TSR_OK;
}

void tsr_top_bufs_free(tsr_top_bufs *b)
{
    free(b->ids);
    free(b->vals);
    free(b->z);
    free(b->inv);
    free(b->undecided);
    memset(b, 0, sizeof *b);
}

static tsr_status scratch_reserve(tsr_step_scratch *s, int n_in, size_t rows, int vocab)
{
    if (n_in > s->cap_in) {
        tsr_seq_input *in = realloc(s->in, (size_t)n_in * sizeof *in);
        if (in) s->in = in;
        int *owner = realloc(s->owner, (size_t)n_in * sizeof *owner);
        if (owner) s->owner = owner;
        int32_t *ids = realloc(s->pick_ids, (size_t)n_in * sizeof *ids);
        if (ids) s->pick_ids = ids;
        float *vals = realloc(s->pick_vals, (size_t)n_in * sizeof *vals);
        if (vals) s->pick_vals = vals;
        if (!in || !owner || !ids || !vals) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory");
        TSR_TRY(tsr_top_bufs_reserve(&s->top, n_in));
        s->cap_in = n_in;
    }
    if (rows > s->cap_rows) {
        float *l = realloc(s->logits, rows * (size_t)vocab * sizeof *l);
        if (!l) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory for %zu rows of logits", rows);
        s->logits = l;
        s->cap_rows = rows;
    }
    return TSR_OK;
}

/* Whether every row of the call is a last row that only feeds a draw accepted by ok(). */
static int rows_feed_only(const tsr_step *step, const tsr_seq_input *in, const int *owner, int nb, size_t rows,
                          int max_rows, int (*ok)(const tsr_step_seq *))
{
    if (rows == 0 || rows > (size_t)max_rows) return 0;
    for (int b = 0; b < nb; b++) {
        const tsr_step_seq *q = &step->seqs[owner[b]];
        if (in[b].logits == TSR_LOGITS_ALL || (in[b].logits == TSR_LOGITS_LAST && (q->logits || !ok(q)))) return 0;
    }
    return 1;
}

int tsr_step_call_picks(const tsr_step *step, const tsr_seq_input *in, const int *owner, int nb, size_t rows,
                        int pick_rows)
{
    return rows_feed_only(step, in, owner, nb, rows, pick_rows, tsr_step_pick_ok);
}

int tsr_step_call_top(const tsr_step *step, const tsr_seq_input *in, const int *owner, int nb, size_t rows,
                      int top_rows)
{
    return rows_feed_only(step, in, owner, nb, rows, top_rows, tsr_step_top_ok);
}

tsr_status tsr_step_sample_undecided(tsr_forward_ctx *fwd, const tsr_step *step, const int *seq, const int *row,
                                     int n, int vocab, float *buf, tsr_step_result *results)
{
    if (n == 0) return TSR_OK;
    int lo = row[0], hi = row[0];
    for (int k = 1; k < n; k++) {
        lo = row[k] < lo ? row[k] : lo;
        hi = row[k] > hi ? row[k] : hi;
    }
    TSR_TRY(tsr_forward_fetch_rows(fwd, lo, hi - lo + 1, buf));
    for (int k = 0; k < n; k++)
        TSR_TRY(tsr_step_sample(buf + (size_t)(row[k] - lo) * vocab, vocab, step, &step->seqs[seq[k]],
                                &results[seq[k]]));
    return TSR_OK;
}

void tsr_step_top_backoff(int *backoff, int undecided, int sampled)
{
    if (2 * undecided > sampled) *backoff = TSR_TOP_BACKOFF;
}

/* Fills the inverse temperature of each of the call's rows (tsr_forward_top). */
void tsr_step_call_inv_temps(const tsr_step *step, const tsr_seq_input *in, const int *owner, int nb, float *inv)
{
    for (int b = 0, row = 0; b < nb; b++)
        if (in[b].logits == TSR_LOGITS_LAST) inv[row++] = tsr_step_inv_temp(&step->seqs[owner[b]]);
}

tsr_status tsr_engine_run_step(tsr_engine *e, tsr_step_scratch *scratch, const tsr_step *step,
                               tsr_step_result *results, float *logits)
{
    const int vocab = e->model->cfg.vocab_size;
    const int max_tokens = tsr_forward_max_tokens(e->fwd);
    TSR_TRY(tsr_step_validate(step, vocab, e->kv.n_pages, e->kv.page_size));
    const int n = step->n_seqs;
    if (n == 0) return TSR_OK;
    /* per sequence: tokens done so far and its first row in `logits` (kept in the scratch: no allocation per step
     * once the largest step has been seen) */
    if (n > scratch->cap_seqs) {
        int *grown = realloc(scratch->progress, (size_t)n * 2 * sizeof *grown);
        if (!grown) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory");
        scratch->progress = grown;
        scratch->cap_seqs = n;
    }
    int *done = scratch->progress, *out_row = done + n;
    memset(done, 0, (size_t)n * sizeof *done);
    for (int i = 0, row = 0; i < n; i++) {
        out_row[i] = row;
        row += step->seqs[i].logits == 2 ? step->seqs[i].n_tokens : step->seqs[i].logits == 1;
        results[i] = (tsr_step_result){.token = -1};
    }
    tsr_status st = TSR_OK;
    for (;;) {
        /* gather one forward call's worth of work */
        int nb = 0, budget = max_tokens;
        size_t rows = 0;
        if ((st = scratch_reserve(scratch, n, 0, vocab)) != TSR_OK) break;
        for (int i = 0; i < n && budget > 0; i++) {
            const tsr_step_seq *q = &step->seqs[i];
            int left = q->n_tokens - done[i];
            if (left <= 0) continue;
            int take = left < budget ? left : budget;
            int last = done[i] + take == q->n_tokens;
            tsr_logits_mode mode = q->logits == 2                    ? TSR_LOGITS_ALL
                                   : last && (q->sample || q->logits) ? TSR_LOGITS_LAST
                                                                      : TSR_LOGITS_NONE;
            scratch->in[nb] = (tsr_seq_input){step->tokens + q->token0 + done[i], take, q->pos0 + done[i],
                                              step->pages + q->page0, q->n_pages, mode};
            scratch->owner[nb++] = i;
            rows += mode == TSR_LOGITS_ALL ? (size_t)take : mode == TSR_LOGITS_LAST;
            budget -= take;
        }
        if (nb == 0) break;
        /* when every row only feeds a greedy choice, the rows stay on the device and only their picks come back */
        const int pick =
            tsr_step_call_picks(step, scratch->in, scratch->owner, nb, rows, tsr_forward_pick_rows(e->fwd));
        int top = !pick && tsr_step_call_top(step, scratch->in, scratch->owner, nb, rows, tsr_forward_top_rows(e->fwd));
        if (top && scratch->top.backoff > 0) {
            scratch->top.backoff--;
            top = 0;
        }
        if ((st = scratch_reserve(scratch, n, pick || top ? 0 : rows, vocab)) != TSR_OK) break;
        if (pick) {
            st = tsr_forward_argmax(e->fwd, scratch->in, nb, scratch->pick_ids, scratch->pick_vals);
        } else if (top) {
            tsr_step_call_inv_temps(step, scratch->in, scratch->owner, nb, scratch->top.inv);
            st = tsr_forward_top(e->fwd, scratch->in, nb, scratch->top.inv, scratch->top.ids, scratch->top.vals,
                                 scratch->top.z);
        } else {
            st = tsr_forward(e->fwd, scratch->in, nb, rows ? scratch->logits : NULL);
        }
        if (st != TSR_OK) break;
        size_t row = 0;
        int n_undecided = 0;
        for (int b = 0; b < nb && st == TSR_OK; b++) {
            int i = scratch->owner[b];
            const tsr_step_seq *q = &step->seqs[i];
            const tsr_seq_input *in = &scratch->in[b];
            int nrows = in->logits == TSR_LOGITS_ALL ? in->n_tokens : in->logits == TSR_LOGITS_LAST;
            done[i] += in->n_tokens;
            if (pick) {
                if (nrows && q->sample && done[i] == q->n_tokens)
                    st = tsr_step_sample_pick(scratch->pick_ids[row], scratch->pick_vals[row], vocab, step, q,
                                              &results[i]);
                row += (size_t)nrows;
                continue;
            }
            if (top) {
                int decided = 1;
                if (nrows && q->sample && done[i] == q->n_tokens)
                    st = tsr_step_sample_top(scratch->top.ids + row * TSR_TOP_MAX,
                                             scratch->top.vals + row * TSR_TOP_MAX, scratch->top.z[row], vocab, step,
                                             q, &results[i], &decided);
                if (st == TSR_OK && !decided) {
                    scratch->top.undecided[n_undecided] = i;
                    scratch->top.undecided[n + n_undecided++] = (int)row;
                }
                row += (size_t)nrows;
                continue;
            }
            float *src = scratch->logits + row * (size_t)vocab;
            if (logits && q->logits && nrows) {
                int dst_row = out_row[i] + (q->logits == 2 ? done[i] - in->n_tokens : 0);
                memcpy(logits + (size_t)dst_row * vocab, src, (size_t)nrows * vocab * sizeof(float));
            }
            if (q->sample && done[i] == q->n_tokens)
                st = tsr_step_sample(src + (size_t)(nrows - 1) * vocab, vocab, step, q, &results[i]);
            row += (size_t)nrows;
        }
        if (top) tsr_step_top_backoff(&scratch->top.backoff, n_undecided, (int)rows);
        if (st == TSR_OK && n_undecided) st = scratch_reserve(scratch, n, rows, vocab);
        if (st == TSR_OK && n_undecided)
            st = tsr_step_sample_undecided(e->fwd, step, scratch->top.undecided, scratch->top.undecided + n,
                                           n_undecided, vocab, scratch->logits, results);
        if (st != TSR_OK) break;
    }
    return st;
}

typedef struct local_impl {
    tsr_engine *engine;
    tsr_step_scratch scratch;
    int64_t steps; /* steps run */
} local_impl;

static tsr_status local_run(tsr_executor *x, const tsr_step *step, tsr_step_result *results, float *logits)
{
    local_impl *l = x->impl;
    l->steps++;
    return tsr_engine_run_step(l->engine, &l->scratch, step, results, logits);
}

tsr_rank_usage tsr_rank_usage_of(int rank, const tsr_engine *e, uint64_t capacity, long steps)
{
    const tsr_ops *ops = e->ops;
    return (tsr_rank_usage){rank, 0, ops->memory_peak ? ops->memory_peak() : 0, tsr_peak_rss(), capacity, steps};
}

/* This process as rank 0, with the cap its engine was opened with. */
static tsr_status local_usage(tsr_executor *x, tsr_rank_usage *out, int max, int *n)
{
    local_impl *l = x->impl;
    *n = 1;
    if (max < 1) return tsr_fail(TSR_ERR_ARG, "executor: no room for the usage of one rank");
    out[0] = tsr_rank_usage_of(0, l->engine, l->engine->memory_cap, l->steps);
    return TSR_OK;
}

static void local_close(tsr_executor *x)
{
    if (!x) return;
    local_impl *l = x->impl;
    tsr_step_scratch_free(&l->scratch);
    free(l);
    free(x);
}

tsr_status tsr_executor_local(tsr_engine *e, tsr_executor **out)
{
    tsr_executor *x = calloc(1, sizeof *x);
    local_impl *l = calloc(1, sizeof *l);
    if (!x || !l) {
        free(x);
        free(l);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    l->engine = e;
    x->impl = l;
    x->vocab = e->model->cfg.vocab_size;
    x->page_size = e->kv.page_size;
    x->n_pages = e->kv.n_pages;
    x->max_step_tokens = tsr_forward_max_tokens(e->fwd);
    x->max_context = e->max_context;
    x->depth = 1;
    x->run = local_run;
    x->usage = local_usage;
    x->close = local_close;
    *out = x;
    return TSR_OK;
}
