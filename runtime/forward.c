/* Forward pass over the ops table (see forward.h). Per layer:
 *   h = RMSNorm(x); q,k,v = h·Wq, h·Wk, h·Wv (+bias); RoPE(q, k); store k, v; x += Attention(q)·Wo;
 *   h = RMSNorm(x); x += (silu(h·Wg) ⊙ h·Wu)·Wd
 * then RMSNorm and the head on the rows whose logits are wanted. A model part runs its layers only (from or into
 * the hidden buffer at the stage boundaries); a tensor shard sums o_proj's and down_proj's partial outputs over its
 * group before each residual add (forward.h).
 *
 * Each call builds the batch layout (row → sequence, positions, page tables, RoPE frequencies) on the host and
 * copies it into the backend's memory once; every op then reads it there. */
#include "runtime/forward.h"

#include "runtime/rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH_SEQS 4096

/* The batch layout's arrays, one host staging copy and one in backend memory. */
typedef struct {
    int32_t *tokens, *row_seq, *positions, *seq_row0, *page_tables, *out_index;
    float *inv_freq, *attn_factor;
} layout_arrays;

struct tsr_forward_ctx {
    const tsr_model *model;
    const tsr_ops *ops;
    tsr_kv_cache *kv;
    int max_tokens, max_seqs, pages_per_seq;
    int logit_rows;         /* rows of logits computed per head call (the logits buffer holds this many) */
    uint32_t id;            /* distinguishes this context's replayable work from other contexts' */
    tsr_forward_comm comm;  /* tensor-parallel sums (part.tp_size > 1) */
    int has_comm;
    /* activations, backend memory */
    float *x, *h, *q, *k, *v, *attn, *gate, *up, *out_rows, *logits;
    int32_t *picks;         /* [2][max_tokens]: each row's argmax id, then its value (bits), when ops->argmax_rows */
    /* when ops->top_rows: each row's TSR_TOP_MAX candidates (ids, then values), its normalizer and the inverse
     * temperature it is computed at, [max_tokens] each */
    int32_t *top_ids;
    float *top_vals, *top_z, *top_inv;
    int last_rows;          /* logits rows of the last reducing call (tsr_forward_fetch_rows' bound) */
    int held_row0, held_rows; /* the rows of that call `logits` holds now (all of them, or one slice) */
    layout_arrays host, dev;
};

static void free_arrays(const tsr_ops *ops, layout_arrays *a, int on_host)
{
    void *all[] = {a->tokens, a->row_seq, a->positions, a->seq_row0, a->page_tables, a->out_index, a->inv_freq,
                   a->attn_factor};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (on_host)
            free(all[i]);
        else if (all[i])
            ops->release(all[i]);
    }
}

void tsr_forward_ctx_free(tsr_forward_ctx *c)
{
    if (!c) return;
    float *bufs[] = {c->x, c->h, c->q, c->k, c->v, c->attn, c->gate, c->up, c->out_rows, c->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) c->ops->release(bufs[i]);
    if (c->picks) c->ops->release(c->picks);
    void *top[] = {c->top_ids, c->top_vals, c->top_z, c->top_inv};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (top[i]) c->ops->release(top[i]);
    free_arrays(c->ops, &c->host, 1);
    free_arrays(c->ops, &c->dev, 0);
    free(c);
}

int tsr_forward_max_tokens(const tsr_forward_ctx *ctx) { return ctx->max_tokens; }

void tsr_forward_set_comm(tsr_forward_ctx *ctx, const tsr_forward_comm *comm)
{
    ctx->has_comm = comm != NULL;
    if (comm) ctx->comm = *comm;
}

float *tsr_forward_hidden(tsr_forward_ctx *ctx) { return ctx->x; }

/* Allocates the layout arrays with `alloc` (host calloc or the backend's allocator); returns 0 on failure. */
static int alloc_arrays(layout_arrays *a, void *(*alloc)(size_t), size_t T, size_t S, size_t pages, size_t half)
{
    a->tokens = alloc(T * sizeof(int32_t));
    a->row_seq = alloc(T * sizeof(int32_t));
    a->positions = alloc(T * sizeof(int32_t));
    a->seq_row0 = alloc((S + 1) * sizeof(int32_t));
    a->page_tables = alloc(S * pages * sizeof(int32_t));
    a->out_index = alloc(T * sizeof(int32_t));
    a->inv_freq = alloc(S * half * sizeof(float));
    a->attn_factor = alloc(S * sizeof(float));
    return a->tokens && a->row_seq && a->positions && a->seq_row0 && a->page_tables && a->out_index && a->inv_freq &&
           a->attn_factor;
}

static void *host_calloc(size_t n) { return calloc(1, n ? n : 1); }

int tsr_forward_head_rows(int max_tokens)
{
    const char *env = getenv("TSR_HEAD_ROWS");
    const long want = env && *env ? strtol(env, NULL, 10) : TSR_HEAD_ROWS;
    const int cap = want >= 1 && want <= 4096 ? (int)want : TSR_HEAD_ROWS;
    return max_tokens < cap ? max_tokens : cap;
}

tsr_status tsr_forward_ctx_new(const tsr_model *model, const tsr_ops *ops, tsr_kv_cache *kv, int max_tokens,
                               tsr_forward_ctx **out)
{
    const tsr_model_config *c = &model->cfg;
    const tsr_model_local *lo = &model->local;
    if (max_tokens <= 0) return tsr_fail(TSR_ERR_ARG, "forward: max_tokens must be positive");
    if (kv->n_layers != model->part.layer1 - model->part.layer0 || kv->n_kv_heads != lo->n_kv_heads ||
        kv->head_dim != c->head_dim)
        return tsr_fail(TSR_ERR_ARG, "forward: KV cache geometry does not match the model");
    if (c->head_dim > 512 || c->rope.dim / 2 > 512)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "forward: head_dim %d exceeds the kernels' limit of 512", c->head_dim);
    tsr_forward_ctx *x = calloc(1, sizeof *x);
    if (!x) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    x->model = model;
    x->ops = ops;
    x->kv = kv;
    x->max_tokens = max_tokens;
    x->max_seqs = max_tokens < MAX_BATCH_SEQS ? max_tokens : MAX_BATCH_SEQS;
    /* a sequence may span the model's context or the whole pool, whichever is smaller */
    long ctx_pages = (c->rope.max_pos + kv->page_size - 1) / kv->page_size + 1;
    x->pages_per_seq = (int)(ctx_pages < kv->n_pages ? ctx_pages : kv->n_pages);
    size_t T = (size_t)max_tokens, S = (size_t)x->max_seqs;
    size_t qd = (size_t)lo->n_heads * c->head_dim, kvd = (size_t)lo->n_kv_heads * c->head_dim;
    size_t half = (size_t)c->rope.dim / 2;
    x->x = ops->alloc(T * c->hidden * sizeof(float));
    x->h = ops->alloc(T * c->hidden * sizeof(float));
    x->q = ops->alloc(T * qd * sizeof(float));
    x->k = ops->alloc(T * kvd * sizeof(float));
    x->v = ops->alloc(T * kvd * sizeof(float));
    x->attn = ops->alloc(T * qd * sizeof(float));
    x->gate = ops->alloc(T * lo->intermediate * sizeof(float));
    x->up = ops->alloc(T * lo->intermediate * sizeof(float));
    x->out_rows = ops->alloc(T * c->hidden * sizeof(float));
    x->logit_rows = tsr_forward_head_rows(max_tokens);
    static uint32_t next_id;
    x->id = ++next_id;
    x->logits = ops->alloc((size_t)x->logit_rows * (size_t)(model->part.head ? lo->vocab : 1) * sizeof(float));
    int ok = x->x && x->h && x->q && x->k && x->v && x->attn && x->gate && x->up && x->out_rows && x->logits;
    /* the reductions keep every row's result (a decode batch past logit_rows runs the head in slices) */
    if (ok && ops->argmax_rows && model->part.head) ok = (x->picks = ops->alloc(T * 8)) != NULL;
    if (ok && ops->top_rows && model->part.head) {
        const size_t cand = T * TSR_TOP_MAX * sizeof(int32_t);
        x->top_ids = ops->alloc(cand);
        x->top_vals = ops->alloc(cand);
        x->top_z = ops->alloc(T * sizeof(float));
        x->top_inv = ops->alloc(T * sizeof(float));
        ok = x->top_ids && x->top_vals && x->top_z && x->top_inv;
    }
    ok = ok && alloc_arrays(&x->host, host_calloc, T, S, (size_t)x->pages_per_seq, half);
    ok = ok && alloc_arrays(&x->dev, ops->alloc, T, S, (size_t)x->pages_per_seq, half);
    if (!ok) {
        tsr_forward_ctx_free(x);
        return tsr_fail(TSR_ERR_NOMEM, "forward: cannot allocate the workspace for %d tokens", max_tokens);
    }
    *out = x;
    return TSR_OK;
}

int tsr_forward_logit_rows(const tsr_seq_input *seqs, int n_seqs)
{
    int rows = 0;
    for (int s = 0; s < n_seqs; s++)
        rows += seqs[s].logits == TSR_LOGITS_ALL ? seqs[s].n_tokens : seqs[s].logits == TSR_LOGITS_LAST ? 1 : 0;
    return rows;
}

static tsr_status validate(const tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, int *total)
{
    const tsr_model_config *cfg = &c->model->cfg;
    if (n_seqs <= 0 || n_seqs > c->max_seqs)
        return tsr_fail(TSR_ERR_ARG, "forward: %d sequences in one batch (1..%d allowed)", n_seqs, c->max_seqs);
    long sum = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tsr_seq_input *q = &seqs[s];
        if (q->n_tokens <= 0 || q->pos0 < 0) return tsr_fail(TSR_ERR_ARG, "forward: sequence %d has no tokens", s);
        sum += q->n_tokens;
        long last = (long)q->pos0 + q->n_tokens - 1;
        if (last >= (long)c->pages_per_seq * c->kv->page_size)
            return tsr_fail(TSR_ERR_ARG, "forward: sequence %d reaches position %ld, beyond the context (%d tokens)", s,
                            last, c->pages_per_seq * c->kv->page_size);
        if (last / c->kv->page_size >= q->n_pages)
            return tsr_fail(TSR_ERR_ARG, "forward: sequence %d's page table (%d pages) does not cover position %ld", s,
                            q->n_pages, last);
        for (long p = 0; p <= last / c->kv->page_size; p++)
            if (q->page_table[p] < 0 || q->page_table[p] >= c->kv->n_pages)
                return tsr_fail(TSR_ERR_ARG, "forward: sequence %d names page %d outside the pool", s,
                                (int)q->page_table[p]);
        for (int t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= cfg->vocab_size)
                return tsr_fail(TSR_ERR_ARG, "forward: token id %d out of range (vocabulary %d)", (int)q->tokens[t],
                                cfg->vocab_size);
    }
    if (sum > c->max_tokens)
        return tsr_fail(TSR_ERR_ARG, "forward: %ld tokens in one batch (at most %d)", sum, c->max_tokens);
    *total = (int)sum;
    return TSR_OK;
}

/* Fills the host layout for the batch and copies it to the backend; returns the number of logit rows. With
 * `fixed_shape`, the page-table stride and the position bound are the context maximum instead of this batch's,
 * so that every decode step of the same batch size issues identical ops (replayable, see run_cached). */
static int build_layout(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, int T, int fixed_shape,
                        tsr_batch_layout *b)
{
    const tsr_model_config *cfg = &c->model->cfg;
    const int half = cfg->rope.dim / 2, page = c->kv->page_size;
    layout_arrays *h = &c->host, *d = &c->dev;
    int row = 0, n_out = 0, max_pages = 1;
    for (int s = 0; s < n_seqs; s++) {
        int used = (seqs[s].pos0 + seqs[s].n_tokens + page - 1) / page;
        if (used > max_pages) max_pages = used;
    }
    if (fixed_shape) max_pages = c->pages_per_seq;
    for (int s = 0; s < n_seqs; s++) {
        const tsr_seq_input *q = &seqs[s];
        tsr_rope_freqs(&cfg->rope, q->pos0 + q->n_tokens, h->inv_freq + (size_t)s * half, &h->attn_factor[s]);
        h->seq_row0[s] = row;
        int used = (q->pos0 + q->n_tokens + page - 1) / page;
        memcpy(h->page_tables + (size_t)s * max_pages, q->page_table, (size_t)used * sizeof(int32_t));
        for (int p = used; p < max_pages; p++) h->page_tables[(size_t)s * max_pages + p] = 0;
        for (int t = 0; t < q->n_tokens; t++) {
            h->tokens[row + t] = q->tokens[t];
            h->row_seq[row + t] = s;
            h->positions[row + t] = q->pos0 + t;
            if (q->logits == TSR_LOGITS_ALL || (q->logits == TSR_LOGITS_LAST && t == q->n_tokens - 1))
                h->out_index[n_out++] = row + t;
        }
        row += q->n_tokens;
    }
    h->seq_row0[n_seqs] = row;
    const tsr_ops *ops = c->ops;
    ops->to_device(d->tokens, h->tokens, (size_t)T * sizeof(int32_t));
    ops->to_device(d->row_seq, h->row_seq, (size_t)T * sizeof(int32_t));
    ops->to_device(d->positions, h->positions, (size_t)T * sizeof(int32_t));
    ops->to_device(d->seq_row0, h->seq_row0, (size_t)(n_seqs + 1) * sizeof(int32_t));
    ops->to_device(d->page_tables, h->page_tables, (size_t)n_seqs * max_pages * sizeof(int32_t));
    ops->to_device(d->out_index, h->out_index, (size_t)n_out * sizeof(int32_t));
    ops->to_device(d->inv_freq, h->inv_freq, (size_t)n_seqs * half * sizeof(float));
    ops->to_device(d->attn_factor, h->attn_factor, (size_t)n_seqs * sizeof(float));
    int max_position = 0;
    double attended = 0; /* rows at positions pos0 .. pos0 + n - 1 attend to n · pos0 + n (n + 1) / 2 in all */
    for (int s = 0; s < n_seqs; s++) {
        const double n = seqs[s].n_tokens;
        attended += n * seqs[s].pos0 + n * (n + 1) / 2;
        if (seqs[s].pos0 + seqs[s].n_tokens - 1 > max_position) max_position = seqs[s].pos0 + seqs[s].n_tokens - 1;
    }
    if (fixed_shape) max_position = c->pages_per_seq * page - 1;
    *b = (tsr_batch_layout){n_seqs,       T,           max_pages,      max_position, d->row_seq,
                            d->positions, d->seq_row0, d->page_tables, d->inv_freq,  d->attn_factor,
                            attended,     h->seq_row0, h->positions};
    return n_out;
}

enum { REDUCE_NONE, REDUCE_PICK, REDUCE_TOP };

/* Everything one forward call issues after its layout is uploaded. */
typedef struct {
    tsr_forward_ctx *c;
    tsr_batch_layout b;
    int T, n_out;
    int reduce;             /* REDUCE_PICK: each logits row to its argmax on the device (tsr_forward_argmax);
                               REDUCE_TOP: to its candidates and normalizer (tsr_forward_top) */
    tsr_status comm_st;     /* first failure of the comm hook (later sums are skipped) */
} forward_job;

/* Sums a tensor shard's partial output over its group. */
static void group_sum(forward_job *j, float *buf, size_t n)
{
    tsr_forward_ctx *c = j->c;
    if (c->model->part.tp_size <= 1 || j->comm_st != TSR_OK) return;
    if (!c->has_comm) {
        j->comm_st = tsr_fail(TSR_ERR_INTERNAL, "forward: a tensor shard runs without a comm");
        return;
    }
    j->comm_st = c->comm.allreduce(c->comm.ctx, buf, n);
}

/* y[i] = x · W_i for layers sharing their input: one backend call when the backend can group them. */
static void linear_shared_input(const tsr_ops *ops, const tsr_linear *const *L, int n, const float *x, int M,
                                float *const *y)
{
    if (ops->linear_many) {
        ops->linear_many(L, n, x, M, y);
        return;
    }
    for (int i = 0; i < n; i++) ops->linear(L[i], x, M, y[i]);
}

/* x += h, then h = rmsnorm(x) · w: one pass when the backend fuses them. */
static void add_then_norm(const tsr_ops *ops, float *x, float *h, const tsr_dense *w, float eps, int T, int H)
{
    if (ops->add_rmsnorm) {
        ops->add_rmsnorm(x, h, w, eps, T, H, h);
        return;
    }
    ops->add(x, h, (size_t)T * H);
    ops->rmsnorm(x, w, eps, T, H, h);
}

/* h (a tensor shard's part of a product) summed over the group, then x += h and (with w) h = rmsnorm(x) · w. */
static void sum_then_add(forward_job *j, const tsr_dense *w)
{
    tsr_forward_ctx *c = j->c;
    const int T = j->T, H = c->model->cfg.hidden;
    group_sum(j, c->h, (size_t)T * H);
    if (w)
        add_then_norm(c->ops, c->x, c->h, w, c->model->cfg.norm_eps, T, H);
    else
        c->ops->add(c->x, c->h, (size_t)T * H);
}

/* x += a · W, then (with w) h = rmsnorm(x) · w, h holding the product before: one backend call when the backend
 * fuses them and no tensor-parallel sum has to come between the product and the add. */
static void linear_then_add(forward_job *j, const tsr_linear *L, const float *a, const tsr_dense *w)
{
    tsr_forward_ctx *c = j->c;
    const tsr_ops *ops = c->ops;
    const int T = j->T;
    const float eps = c->model->cfg.norm_eps;
    if (ops->linear_add_norm && c->model->part.tp_size <= 1) {
        ops->linear_add_norm(L, a, T, c->x, w, eps, c->h);
        return;
    }
    ops->linear(L, a, T, c->h);
    sum_then_add(j, w);
}

static void forward_body(void *arg)
{
    forward_job *j = arg;
    tsr_forward_ctx *c = j->c;
    const tsr_model *m = c->model;
    const tsr_model_config *cfg = &m->cfg;
    const tsr_ops *ops = c->ops;
    const int T = j->T, H = cfg->hidden, nh = m->local.n_heads, nkv = m->local.n_kv_heads, d = cfg->head_dim;
    const tsr_batch_layout *b = &j->b;

    if (m->part.embed) ops->embed(&m->embed, c->dev.tokens, T, c->x);
    const float scale = 1.0f / sqrtf((float)d);
    int normed = 0; /* c->h already holds this layer's attention-norm input (fused into the previous add) */
    for (int l = m->part.layer0; l < m->part.layer1; l++) {
        const tsr_layer *ly = &m->layers[l];
        const int kl = l - m->part.layer0; /* the cache holds the part's layers only */
        if (!normed) ops->rmsnorm(c->x, &ly->attn_norm, cfg->norm_eps, T, H, c->h);
        const tsr_linear *qkv[3] = {&ly->q, &ly->k, &ly->v};
        float *const qkv_out[3] = {c->q, c->k, c->v};
        linear_shared_input(ops, qkv, 3, c->h, T, qkv_out);
        if (ops->rope_store) {
            ops->rope_store(b, c->q, nh, c->k, c->v, c->kv, kl, cfg->rope.dim);
        } else {
            ops->rope(b, c->q, nh, d, cfg->rope.dim);
            ops->rope(b, c->k, nkv, d, cfg->rope.dim);
            ops->kv_store(b, c->kv, kl, c->k, c->v);
        }
        tsr_attn_args args = {nh, nkv, d, scale, tsr_config_layer_window(cfg, l), kl, &ly->o};
        ops->attention(b, &args, c->kv, c->q, c->attn);
        linear_then_add(j, &ly->o, c->attn, &ly->mlp_norm);

        /* within the part, the next layer's attention norm rides on this add when the backend fuses them */
        normed = l + 1 < m->part.layer1 && (ops->add_rmsnorm || ops->linear_add_norm);
        const tsr_dense *next_norm = normed ? &m->layers[l + 1].attn_norm : NULL;
        if (ops->mlp_add_norm && m->part.tp_size <= 1 &&
            ops->mlp_add_norm(&ly->gate, &ly->up, &ly->down, c->h, T, c->x, next_norm, cfg->norm_eps, c->h, c->gate,
                              c->up))
            continue; /* the whole MLP in one backend call */
        const tsr_linear *gate_up[2] = {&ly->gate, &ly->up};
        float *const gate_up_out[2] = {c->gate, c->up};
        linear_shared_input(ops, gate_up, 2, c->h, T, gate_up_out);
        if (ops->silu_linear_add_norm && m->part.tp_size <= 1) {
            ops->silu_linear_add_norm(&ly->down, c->gate, c->up, T, c->x, next_norm, cfg->norm_eps, c->h);
        } else if (ops->silu_linear_add_norm) { /* a tensor shard: the product alone, then the group's sum */
            ops->silu_linear_add_norm(&ly->down, c->gate, c->up, T, NULL, NULL, cfg->norm_eps, c->h);
            sum_then_add(j, next_norm);
        } else {
            ops->silu_mul(c->gate, c->up, (size_t)T * m->local.intermediate, c->gate);
            linear_then_add(j, &ly->down, c->gate, next_norm);
        }
    }
    if (j->n_out == 0 || !m->part.head) return;
    ops->gather_rows(c->x, c->dev.out_index, j->n_out, H, c->out_rows);
    ops->rmsnorm(c->out_rows, &m->final_norm, cfg->norm_eps, j->n_out, H, c->out_rows);
    /* all logits wanted of more rows than `logits` holds: tsr_forward runs the head slice by slice, copying each */
    if (j->n_out > c->logit_rows && j->reduce == REDUCE_NONE) return;
    /* the head, then the reduction, one slice of logit_rows rows after the other: the picks and candidates of every
     * row stay on the device (in the recording too), and `logits` keeps the last slice's rows (held_slice) */
    const int vocab = m->local.vocab;
    for (int r0 = 0; r0 < j->n_out; r0 += c->logit_rows) {
        const int n = j->n_out - r0 < c->logit_rows ? j->n_out - r0 : c->logit_rows;
        ops->linear(&m->head, c->out_rows + (size_t)r0 * H, n, c->logits);
        if (j->reduce == REDUCE_PICK)
            ops->argmax_rows(c->logits, n, vocab, c->picks + r0, (float *)(c->picks + c->max_tokens) + r0);
        if (j->reduce == REDUCE_TOP)
            ops->top_rows(c->logits, n, vocab, TSR_TOP_MAX, c->top_inv + r0, c->top_ids + (size_t)r0 * TSR_TOP_MAX,
                          c->top_vals + (size_t)r0 * TSR_TOP_MAX, c->top_z + r0);
    }
}

/* After a reducing call of `rows` rows: the last slice forward_body ran the head for is what `logits` holds. */
static void held_slice(tsr_forward_ctx *c, int rows)
{
    c->last_rows = rows;
    c->held_row0 = (rows - 1) / c->logit_rows * c->logit_rows;
    c->held_rows = rows - c->held_row0;
}

/* The work both entry points share: validation, the layout upload and the recorded (or issued) body. */
static tsr_status run_job(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, int reduce, forward_job *job)
{
    int T = 0;
    const tsr_model *m = c->model;
    TSR_TRY(validate(c, seqs, n_seqs, &T));
    /* decode steps (one token per sequence, logits of each) have a fixed shape per batch size: replayable, unless a
     * tensor shard's sums block on the host */
    const int host_comm = m->part.tp_size > 1 && (!c->has_comm || !c->comm.capturable);
    const int decode = T == n_seqs && tsr_forward_logit_rows(seqs, n_seqs) == n_seqs;
    *job = (forward_job){c, {0}, T, 0, reduce, TSR_OK};
    job->n_out = build_layout(c, seqs, n_seqs, T, decode, &job->b);
    const uint64_t key = decode && !host_comm ? ((uint64_t)1 << 62) | ((uint64_t)(reduce == REDUCE_PICK) << 61) |
                                                    ((uint64_t)(reduce == REDUCE_TOP) << 60) |
                                                    ((uint64_t)c->id << 24) | (uint64_t)n_seqs
                                              : 0;
    c->last_rows = 0;
    c->ops->run_cached(key, forward_body, job);
    return job->comm_st;
}

/* Logits rows [r0, r0 + n) of the last call (n <= logit_rows) into `logits`, from the final-normed rows the forward
 * left in out_rows: tsr_forward's slices past the first logit_rows rows, and rows fetched again (fetch_rows). */
static void head_slice(tsr_forward_ctx *c, int r0, int n)
{
    c->ops->linear(&c->model->head, c->out_rows + (size_t)r0 * c->model->cfg.hidden, n, c->logits);
    c->held_row0 = r0, c->held_rows = n;
}

tsr_status tsr_forward(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, float *logits)
{
    const tsr_model *m = c->model;
    if (m->part.head && tsr_forward_logit_rows(seqs, n_seqs) && !logits)
        return tsr_fail(TSR_ERR_ARG, "forward: logits requested but no output buffer given");
    forward_job job;
    TSR_TRY(run_job(c, seqs, n_seqs, REDUCE_NONE, &job));
    if (!m->part.head) return TSR_OK;
    const size_t vocab = (size_t)m->local.vocab;
    if (job.n_out <= c->logit_rows) {
        if (job.n_out) c->ops->to_host(logits, c->logits, (size_t)job.n_out * vocab * sizeof(float));
        return TSR_OK;
    }
    /* many logit rows (e.g. all positions of a prompt): the head runs in slices of logit_rows rows */
    for (int r0 = 0; r0 < job.n_out; r0 += c->logit_rows) {
        int rows = job.n_out - r0 < c->logit_rows ? job.n_out - r0 : c->logit_rows;
        head_slice(c, r0, rows);
        c->ops->to_host(logits + (size_t)r0 * vocab, c->logits, (size_t)rows * vocab * sizeof(float));
    }
    return TSR_OK;
}

int tsr_forward_pick_rows(const tsr_forward_ctx *c) { return c->picks ? c->max_tokens : 0; }

tsr_status tsr_forward_argmax(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, int32_t *ids, float *vals)
{
    if (!c->picks)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "forward: this backend or model part cannot pick on the device");
    const int rows = tsr_forward_logit_rows(seqs, n_seqs);
    if (rows > c->max_tokens)
        return tsr_fail(TSR_ERR_ARG, "forward: %d rows to pick from, at most %d per call", rows, c->max_tokens);
    if (rows && (!ids || !vals)) return tsr_fail(TSR_ERR_ARG, "forward: picks requested but no output buffer given");
    forward_job job;
    TSR_TRY(run_job(c, seqs, n_seqs, REDUCE_PICK, &job));
    if (!rows) return TSR_OK;
    held_slice(c, rows);
    c->ops->to_host(ids, c->picks, (size_t)rows * sizeof(int32_t));
    c->ops->to_host(vals, c->picks + c->max_tokens, (size_t)rows * sizeof(float));
    return TSR_OK;
}

int tsr_forward_top_rows(const tsr_forward_ctx *c) { return c->top_ids ? c->max_tokens : 0; }

tsr_status tsr_forward_top(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, const float *inv_temp,
                           int32_t *ids, float *vals, float *z)
{
    if (!c->top_ids)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "forward: this backend or model part cannot reduce rows on the device");
    const int rows = tsr_forward_logit_rows(seqs, n_seqs);
    if (rows > c->max_tokens)
        return tsr_fail(TSR_ERR_ARG, "forward: %d rows to reduce, at most %d per call", rows, c->max_tokens);
    if (rows && (!inv_temp || !ids || !vals || !z))
        return tsr_fail(TSR_ERR_ARG, "forward: candidates requested but no buffers given");
    if (rows) c->ops->to_device(c->top_inv, inv_temp, (size_t)rows * sizeof(float));
    forward_job job;
    TSR_TRY(run_job(c, seqs, n_seqs, REDUCE_TOP, &job));
    if (!rows) return TSR_OK;
    held_slice(c, rows);
    c->ops->to_host(ids, c->top_ids, (size_t)rows * TSR_TOP_MAX * sizeof(int32_t));
    c->ops->to_host(vals, c->top_vals, (size_t)rows * TSR_TOP_MAX * sizeof(float));
    c->ops->to_host(z, c->top_z, (size_t)rows * sizeof(float));
    return TSR_OK;
}

tsr_status tsr_forward_fetch_rows(tsr_forward_ctx *c, int row0, int n, float *out)
{
    if (row0 < 0 || n < 1 || row0 + n > c->last_rows)
        return tsr_fail(TSR_ERR_ARG, "forward: rows %d..%d of the last call's %d reduced rows", row0, row0 + n - 1,
                        c->last_rows);
    const size_t vocab = (size_t)c->model->local.vocab;
    /* slice by slice of the call's head (one, unless it had more rows than `logits` holds); a slice not held is run
     * again whole, on the same rows as the call's own head, so that the values are bit for bit those its picks or
     * candidates came from (a backend's product may round differently at another row count: the GPU's GEMV below 65
     * rows, its dequantize-and-GEMM path above) */
    for (int r = row0; r < row0 + n;) {
        const int s0 = r / c->logit_rows * c->logit_rows;
        const int s_rows = c->last_rows - s0 < c->logit_rows ? c->last_rows - s0 : c->logit_rows;
        if (s0 != c->held_row0 || s_rows != c->held_rows) head_slice(c, s0, s_rows);
        const int k = (row0 + n < s0 + s_rows ? row0 + n : s0 + s_rows) - r;
        c->ops->to_host(out + (size_t)(r - row0) * vocab, c->logits + (size_t)(r - s0) * vocab,
                        (size_t)k * vocab * sizeof(float));
        r += k;
    }
    return TSR_OK;
}
