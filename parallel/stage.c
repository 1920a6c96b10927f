/* A worker's part of one step (see stage.h): cutting the plan into forward calls, stage-to-stage hand-over,
 * the logits gather of a tensor group, copying and sampling on the leader. A call whose rows only feed greedy
 * choices gathers each member's pick of its vocabulary columns instead of the columns. */
#include "parallel/stage.h"

#include "parallel/shard.h"
#include "runtime/executor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tsr_stage_depth(const tsr_plan *p, int micro_batches)
{
    const int micro = micro_batches > 0 ? micro_batches : 2;
    int depth = p->n_stages < micro ? p->n_stages : micro;
    if (depth > TSR_EXECUTOR_MAX_DEPTH) depth = TSR_EXECUTOR_MAX_DEPTH;
    return depth > 1 ? depth : 1;
}

int tsr_stage_is_leader(const tsr_plan *p, int w)
{
    return p->w[w].stage == p->n_stages - 1 && p->w[w].tp_rank == 0;
}

static tsr_status sum_hook(void *ctx, float *buf, size_t n)
{
    tsr_stage *s = ctx;
    return tsr_comm_allreduce_backend(s->tp, s->engine->ops, buf, n, &s->sum_buf, &s->sum_cap);
}

tsr_status tsr_stage_attach(tsr_stage *s)
{
    if (s->plan->tp <= 1) return TSR_OK;
    tsr_forward_comm fc = {s, sum_hook, s->tp->mem == TSR_COMM_DEVICE && s->tp->capturable};
    tsr_forward_set_comm(s->engine->fwd, &fc);
    if (s->tp->mem != TSR_COMM_DEVICE) return TSR_OK;
    /* connect now (the hidden buffer's first float is scratch until the first step) */
    TSR_TRY(s->tp->allreduce_sum(s->tp, tsr_forward_hidden(s->engine->fwd), 1));
    return s->tp->sync(s->tp);
}

void tsr_stage_free(tsr_stage *s)
{
    free(s->stage_buf);
    free(s->sum_buf);
    free(s->shard_logits);
    free(s->gathered);
    free(s->full);
    free(s->in);
    free(s->owner);
    free(s->picks);
    tsr_top_bufs_free(&s->top);
    free(s->top_all);
    s->top_all = NULL;
    s->picks = NULL;
    s->stage_buf = s->sum_buf = NULL;
    s->shard_logits = s->gathered = s->full = NULL;
    s->in = NULL;
    s->owner = NULL;
    s->cap_rows = 0;
    s->cap_in = 0;
}

static tsr_status reserve(tsr_stage *s, int n_in, size_t rows, int vocab, int local_vocab, int tp)
{
    if (n_in > s->cap_in) {
        tsr_seq_input *in = realloc(s->in, (size_t)n_in * sizeof *in);
        if (in) s->in = in;
        int *owner = realloc(s->owner, (size_t)n_in * sizeof *owner);
        if (owner) s->owner = owner;
        int32_t *picks = realloc(s->picks, (size_t)n_in * (2 + 2 * (size_t)tp) * sizeof *picks);
        if (picks) s->picks = picks;
        int32_t *all = realloc(s->top_all, (size_t)n_in * (2 * TSR_TOP_MAX + 1) * (1 + (size_t)tp) * sizeof *all);
        if (all) s->top_all = all;
        if (!in || !owner || !picks || !all) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory");
        TSR_TRY(tsr_top_bufs_reserve(&s->top, n_in));
        s->cap_in = n_in;
    }
    if (rows > s->cap_rows) {
        float *a = realloc(s->shard_logits, rows * (size_t)local_vocab * sizeof(float));
        if (a) s->shard_logits = a;
        float *b = tp > 1 ? realloc(s->gathered, rows * (size_t)vocab * sizeof(float) + 64) : s->gathered;
        if (b) s->gathered = b;
        float *c = tp > 1 ? realloc(s->full, rows * (size_t)vocab * sizeof(float)) : s->full;
        if (c) s->full = c;
        if (!a || (tp > 1 && (!b || !c)))
            return tsr_fail(TSR_ERR_NOMEM, "step: out of memory for %zu rows of logits", rows);
        s->cap_rows = rows;
    }
    return TSR_OK;
}

/* The last stage's logits rows for the call, whole-vocabulary wide, on the leader (NULL elsewhere). */
static tsr_status gather_logits(tsr_stage *s, size_t rows, float **full)
{
    const tsr_plan *p = s->plan;
    const tsr_model *m = s->engine->model;
    const int vocab = m->cfg.vocab_size;
    if (p->tp == 1) {
        *full = s->shard_logits;
        return TSR_OK;
    }
    /* member r holds columns [v0_r, v0_r + n_r): gather the [rows][n_r] blocks, then interleave them per row */
    size_t counts[TSR_PLAN_MAX], displs[TSR_PLAN_MAX], off = 0;
    int v0[TSR_PLAN_MAX], nv[TSR_PLAN_MAX];
    for (int r = 0; r < p->tp; r++) {
        tsr_shard_range range;
        tsr_shard_range_of(&m->cfg, r, p->tp, &range);
        v0[r] = range.v0;
        nv[r] = range.v1 - range.v0;
        counts[r] = rows * (size_t)nv[r] * sizeof(float);
        displs[r] = off;
        off += counts[r];
    }
    if (v0[p->w[s->worker].tp_rank] != m->local.vocab0 || nv[p->w[s->worker].tp_rank] != m->local.vocab)
        return tsr_fail(TSR_ERR_INTERNAL, "step: this worker's vocabulary shard is not the planned one");
    const int me = p->w[s->worker].tp_rank;
    TSR_TRY(s->tp_host->gatherv(s->tp_host, s->shard_logits, counts[me], s->gathered, counts, displs, 0));
    if (me != 0) {
        *full = NULL;
        return TSR_OK;
    }
    for (int r = 0; r < p->tp; r++) {
        const float *blk = (const float *)((const char *)s->gathered + displs[r]);
        for (size_t i = 0; i < rows; i++)
            memcpy(s->full + i * vocab + v0[r], blk + i * (size_t)nv[r], (size_t)nv[r] * sizeof(float));
    }
    *full = s->full;
    return TSR_OK;
}

/* The call's greedy picks over the whole vocabulary, on the leader: each member picked within its columns
 * (tsr_forward_argmax, ids local) into s->picks [ids][value bits]; the leader keeps, per row, the largest value
 * (the lowest id on ties, as the members' columns ascend; NaN means the member had none). Leaves the result in
 * s->picks on the leader. */
static tsr_status gather_picks(tsr_stage *s, size_t rows)
{
    const tsr_plan *p = s->plan;
    const tsr_model *m = s->engine->model;
    int32_t *ids = s->picks;
    float *vals = (float *)(s->picks + rows);
    for (size_t i = 0; i < rows; i++) ids[i] += m->local.vocab0;
    if (p->tp == 1) return TSR_OK;
    const size_t bytes = rows * 2 * sizeof(int32_t);
    size_t counts[TSR_PLAN_MAX], displs[TSR_PLAN_MAX];
    for (int r = 0; r < p->tp; r++) {
        counts[r] = bytes;
        displs[r] = (size_t)r * bytes;
    }
    int32_t *all = s->picks + 2 * (size_t)s->cap_in;
    TSR_TRY(s->tp_host->gatherv(s->tp_host, s->picks, bytes, all, counts, displs, 0));
    if (p->w[s->worker].tp_rank != 0) return TSR_OK;
    for (size_t i = 0; i < rows; i++) {
        int32_t best = 0;
        float v = NAN;
        for (int r = 0; r < p->tp; r++) {
            const int32_t *blk = all + (size_t)r * 2 * rows;
            float rv;
            memcpy(&rv, blk + rows + i, sizeof rv);
            if (rv == rv && (v != v || rv > v)) best = blk[i], v = rv;
        }
        ids[i] = best;
        vals[i] = v;
    }
    return TSR_OK;
}

/* Floats as integers in the same order, -0 below +0 (the order of ops.h top_rows). */
static int32_t order_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7FFFFFFFu));
}

/* A tensor group's candidates over the whole vocabulary, on the leader: each member reduced its columns
 * (tsr_forward_top: ids local, its normalizer against its own maximum); the leader merges the members' sorted lists
 * per row into s->top.ids / top_vals (global ids, the TSR_TOP_MAX best: larger value, then lower id) and brings
 * their normalizers to the row's maximum in s->top.z. */
static tsr_status gather_top(tsr_stage *s, size_t rows)
{
    const tsr_plan *p = s->plan;
    const tsr_model *m = s->engine->model;
    const int K = TSR_TOP_MAX, tp = p->tp;
    const size_t per_row = 2 * (size_t)K + 1, bytes = rows * per_row * sizeof(int32_t);
    int32_t *mine = s->top_all, *all = s->top_all + (size_t)s->cap_in * per_row;
    for (size_t r = 0; r < rows; r++) {
        int32_t *o = mine + r * per_row;
        for (int j = 0; j < K; j++) {
            const int32_t id = s->top.ids[r * K + j];
            o[j] = id >= 0 ? id + m->local.vocab0 : -1;
        }
        memcpy(o + K, s->top.vals + r * K, (size_t)K * sizeof(float));
        memcpy(o + 2 * K, &s->top.z[r], sizeof(float));
    }
    size_t counts[TSR_PLAN_MAX], displs[TSR_PLAN_MAX];
    for (int r = 0; r < tp; r++) {
        counts[r] = bytes;
        displs[r] = (size_t)r * bytes;
    }
    TSR_TRY(s->tp_host->gatherv(s->tp_host, mine, bytes, all, counts, displs, 0));
    if (p->w[s->worker].tp_rank != 0) return TSR_OK;
    for (size_t r = 0; r < rows; r++) {
        const int32_t *list[TSR_PLAN_MAX];
        int at[TSR_PLAN_MAX];
        float top = NAN;
        for (int g = 0; g < tp; g++) {
            list[g] = all + (size_t)g * rows * per_row + r * per_row;
            at[g] = 0;
            float v;
            memcpy(&v, list[g] + K, sizeof v);
            if (list[g][0] >= 0 && (top != top || order_key(v) > order_key(top))) top = v;
        }
        for (int j = 0; j < K; j++) { /* a merge of the members' sorted lists */
            int best = -1;
            float bv = 0;
            for (int g = 0; g < tp; g++) {
                if (at[g] >= K || list[g][at[g]] < 0) continue;
                float v;
                memcpy(&v, list[g] + K + at[g], sizeof v);
                if (best < 0 || order_key(v) > order_key(bv) ||
                    (order_key(v) == order_key(bv) && list[g][at[g]] < list[best][at[best]]))
                    best = g, bv = v;
            }
            s->top.ids[r * K + j] = best < 0 ? -1 : list[best][at[best]];
            s->top.vals[r * K + j] = best < 0 ? NAN : bv;
            if (best >= 0) at[best]++;
        }
        double z = 0;
        for (int g = 0; g < tp && isfinite(top); g++) {
            float mg, zg;
            memcpy(&mg, list[g] + K, sizeof mg);
            memcpy(&zg, list[g] + 2 * K, sizeof zg);
            if (list[g][0] >= 0 && zg > 0) z += (double)zg * exp(((double)mg - top) * s->top.inv[r]);
        }
        s->top.z[r] = (float)z;
    }
    return TSR_OK;
}

/* The rows the candidates could not decide, sampled whole on the leader. und = {count, first row, last row} of
 * the call, the same on every member of the group (broadcast); the leader's s->top.undecided lists them. */
static tsr_status sample_undecided(tsr_stage *s, const tsr_step *step, int n, const int32_t *und,
                                   tsr_step_result *results)
{
    tsr_engine *e = s->engine;
    const int vocab = e->model->cfg.vocab_size, span = und[2] - und[1] + 1;
    TSR_TRY(reserve(s, n, (size_t)span, vocab, e->model->local.vocab, s->plan->tp));
    TSR_TRY(tsr_forward_fetch_rows(e->fwd, und[1], span, s->shard_logits));
    float *full = NULL;
    TSR_TRY(gather_logits(s, (size_t)span, &full));
    if (!full || !results) return TSR_OK;
    for (int k = 0; k < und[0]; k++) {
        const int i = s->top.undecided[k], row = s->top.undecided[n + k];
        TSR_TRY(tsr_step_sample(full + (size_t)(row - und[1]) * vocab, vocab, step, &step->seqs[i], &results[i]));
    }
    return TSR_OK;
}

tsr_status tsr_stage_run(tsr_stage *s, const tsr_step *step, tsr_step_result *results, float *logits)
{
    const tsr_plan *p = s->plan;
    const tsr_plan_worker *me = &p->w[s->worker];
    tsr_engine *e = s->engine;
    const tsr_model *m = e->model;
    const int vocab = m->cfg.vocab_size, H = m->cfg.hidden;
    const int first = me->stage == 0, last = me->stage == p->n_stages - 1;
    const int leader = tsr_stage_is_leader(p, s->worker);
    TSR_TRY(tsr_step_validate(step, vocab, e->kv.n_pages, e->kv.page_size));
    const int n = step->n_seqs;
    if (n == 0) return TSR_OK;
    /* device comms: the step's work must drain within the timeout (their watchdog aborts otherwise) */
    tsr_comm *dev[2] = {s->tp, s->pipe};
    for (int k = 0; k < 2; k++)
        if (dev[k] && dev[k]->watch) dev[k]->watch(dev[k]);
    int *done = calloc((size_t)n * 2, sizeof *done);
    if (!done) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory");
    int *out_row = done + n;
    long total = 0;
    for (int i = 0, row = 0; i < n; i++) {
        out_row[i] = row;
        row += step->seqs[i].logits == 2 ? step->seqs[i].n_tokens : step->seqs[i].logits == 1;
        total += step->seqs[i].n_tokens;
        if (leader && results) results[i] = (tsr_step_result){.token = -1};
    }
    /* the calls: every worker computes the same cut */
    const int max_tokens = tsr_forward_max_tokens(e->fwd);
    long calls = (total + max_tokens - 1) / max_tokens;
    const int micro = s->micro_batches > 0 ? s->micro_batches : 2;
    const int decode_only = total == n;
    if (p->n_stages > 1 && calls < micro && !(decode_only && tsr_stage_depth(p, s->micro_batches) > 1))
        calls = total < micro ? total : micro;
    if (calls < 1) calls = 1;
    const int per_call = (int)((total + calls - 1) / calls);

    tsr_status st = TSR_OK;
    for (;;) {
        int nb = 0, budget = per_call, tokens = 0;
        size_t rows = 0;
        if ((st = reserve(s, n, 0, vocab, m->local.vocab, p->tp)) != TSR_OK) break;
        for (int i = 0; i < n && budget > 0; i++) {
            const tsr_step_seq *q = &step->seqs[i];
            int left = q->n_tokens - done[i];
            if (left <= 0) continue;
            int take = left < budget ? left : budget;
            int end = done[i] + take == q->n_tokens;
            tsr_logits_mode mode = q->logits == 2                    ? TSR_LOGITS_ALL
                                   : end && (q->sample || q->logits) ? TSR_LOGITS_LAST
                                                                     : TSR_LOGITS_NONE;
            s->in[nb] = (tsr_seq_input){
                step->tokens + q->token0 + done[i], take, q->pos0 + done[i], step->pages + q->page0, q->n_pages, mode};
            s->owner[nb++] = i;
            rows += mode == TSR_LOGITS_ALL ? (size_t)take : mode == TSR_LOGITS_LAST;
            budget -= take;
            tokens += take;
        }
        if (nb == 0) break;
        const int pick = last && tsr_step_call_picks(step, s->in, s->owner, nb, rows, tsr_forward_pick_rows(e->fwd));
        int top = last && !pick && tsr_step_call_top(step, s->in, s->owner, nb, rows, tsr_forward_top_rows(e->fwd));
        if (top && s->top.backoff > 0) {
            s->top.backoff--;
            top = 0;
        }
        if ((st = reserve(s, n, pick || top ? 0 : rows, vocab, m->local.vocab, p->tp)) != TSR_OK) break;
        const size_t hidden_bytes = (size_t)tokens * H * sizeof(float);
        if (!first) {
            int from = tsr_plan_worker_at(p, me->stage - 1, me->tp_rank);
            st = tsr_comm_recv_backend(s->pipe, e->ops, tsr_forward_hidden(e->fwd), hidden_bytes, from, &s->stage_buf,
                                       &s->stage_cap);
            if (st != TSR_OK) break;
        }
        if (pick) {
            st = tsr_forward_argmax(e->fwd, s->in, nb, s->picks, (float *)(s->picks + rows));
        } else if (top) {
            tsr_step_call_inv_temps(step, s->in, s->owner, nb, s->top.inv);
            st = tsr_forward_top(e->fwd, s->in, nb, s->top.inv, s->top.ids, s->top.vals, s->top.z);
        } else {
            st = tsr_forward(e->fwd, s->in, nb, last && rows ? s->shard_logits : NULL);
        }
        if (st != TSR_OK) break;
        if (!last) {
            int to = tsr_plan_worker_at(p, me->stage + 1, me->tp_rank);
            st = tsr_comm_send_backend(s->pipe, e->ops, tsr_forward_hidden(e->fwd), hidden_bytes, to, &s->stage_buf,
                                       &s->stage_cap);
            if (st != TSR_OK) break;
        }
        float *full = NULL;
        if (pick && (st = gather_picks(s, rows)) != TSR_OK) break;
        if (top && p->tp > 1 && (st = gather_top(s, rows)) != TSR_OK) break;
        if (!pick && !top && last && rows && (st = gather_logits(s, rows, &full)) != TSR_OK) break;
        size_t row = 0;
        int n_undecided = 0;
        for (int b = 0; b < nb && st == TSR_OK; b++) {
            const int i = s->owner[b];
            const tsr_step_seq *q = &step->seqs[i];
            const tsr_seq_input *in = &s->in[b];
            const int nrows = in->logits == TSR_LOGITS_ALL ? in->n_tokens : in->logits == TSR_LOGITS_LAST;
            if (pick) {
                done[i] += in->n_tokens;
                if (leader && results && nrows && q->sample && done[i] == q->n_tokens) {
                    float v;
                    memcpy(&v, s->picks + rows + row, sizeof v);
                    st = tsr_step_sample_pick(s->picks[row], v, vocab, step, q, &results[i]);
                }
                row += (size_t)nrows;
                continue;
            }
            if (top) {
                int decided = 1;
                done[i] += in->n_tokens;
                if (leader && results && nrows && q->sample && done[i] == q->n_tokens)
                    st = tsr_step_sample_top(s->top.ids + row * TSR_TOP_MAX, s->top.vals + row * TSR_TOP_MAX,
                                             s->top.z[row], vocab, step, q, &results[i], &decided);
                if (st == TSR_OK && !decided) {
                    s->top.undecided[n_undecided] = i;
                    s->top.undecided[n + n_undecided++] = (int)row;
                }
                row += (size_t)nrows;
                continue;
            }
            float *src = full ? full + row * (size_t)vocab : NULL;
            if (leader && src && logits && q->logits && nrows) {
                int dst = out_row[i] + (q->logits == 2 ? done[i] : 0);
                memcpy(logits + (size_t)dst * vocab, src, (size_t)nrows * vocab * sizeof(float));
            }
            done[i] += in->n_tokens;
            if (leader && src && results && q->sample && done[i] == q->n_tokens)
                st = tsr_step_sample(src + (size_t)(nrows - 1) * vocab, vocab, step, q, &results[i]);
            row += (size_t)nrows;
        }
        if (top) { /* the group learns the leader's undecided rows (none after a failure) and takes them whole */
            int32_t und[3] = {st == TSR_OK ? n_undecided : 0, 0, 0};
            for (int k = 0; k < und[0]; k++) {
                const int r = s->top.undecided[n + k];
                und[1] = k == 0 || r < und[1] ? r : und[1];
                und[2] = k == 0 || r > und[2] ? r : und[2];
            }
            if (p->tp > 1) {
                tsr_status bs = s->tp_host->bcast(s->tp_host, und, sizeof und, 0);
                if (st == TSR_OK) st = bs;
            }
            tsr_step_top_backoff(&s->top.backoff, und[0], (int)rows);
            if (st == TSR_OK && und[0]) st = sample_undecided(s, step, n, und, leader ? results : NULL);
        }
        if (st != TSR_OK) break;
    }
    for (int k = 0; k < 2 && st == TSR_OK; k++)
        if (dev[k] && dev[k]->watch && (k == 0 || dev[k] != dev[0])) st = dev[k]->sync(dev[k]);
    free(done);
    return st;
}
