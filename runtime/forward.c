/* Forward pass over the ops table (see forward.h). Per layer:
 *   h = RMSNorm(x); q,k,v = h·Wq, h·Wk, h·Wv (+bias); RoPE(q, k); store k, v; x += Attention(q)·Wo;
 *   h = RMSNorm(x); x += (silu(h·Wg) ⊙ h·Wu)·Wd
 * then RMSNorm and the head on the rows whose logits are wanted. */
#include "runtime/forward.h"

#include "runtime/rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH_SEQS 4096

struct tsr_forward_ctx {
    const tsr_model *model;
    const tsr_ops *ops;
    tsr_kv_cache *kv;
    int max_tokens;
    float *x, *h, *q, *k, *v, *attn, *gate, *up, *out_rows;
    int32_t *tokens, *positions;
    float *inv_freq;       /* [n_seqs max][rot_dim/2] */
    float *attn_factor;
    tsr_attn_seq *attn_seqs;
    int *out_row_index;
};

void tsr_forward_ctx_free(tsr_forward_ctx *c)
{
    if (!c) return;
    free(c->x);
    free(c->h);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->attn);
    free(c->gate);
    free(c->up);
    free(c->out_rows);
    free(c->tokens);
    free(c->positions);
    free(c->inv_freq);
    free(c->attn_factor);
    free(c->attn_seqs);
    free(c->out_row_index);
    free(c);
}

int tsr_forward_max_tokens(const tsr_forward_ctx *ctx) { return ctx->max_tokens; }

tsr_status tsr_forward_ctx_new(const tsr_model *model, const tsr_ops *ops, tsr_kv_cache *kv, int max_tokens,
                               tsr_forward_ctx **out)
{
    const tsr_model_config *c = &model->cfg;
    if (max_tokens <= 0) return tsr_fail(TSR_ERR_ARG, "forward: max_tokens must be positive");
    if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim)
        return tsr_fail(TSR_ERR_ARG, "forward: KV cache geometry does not match the model");
    if (c->head_dim > 512 || c->rope.dim / 2 > 512)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "forward: head_dim %d exceeds the CPU kernels' limit of 512", c->head_dim);
    tsr_forward_ctx *x = calloc(1, sizeof *x);
    if (!x) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    x->model = model;
    x->ops = ops;
    x->kv = kv;
    x->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    int n_seq_max = max_tokens < MAX_BATCH_SEQS ? max_tokens : MAX_BATCH_SEQS;
    x->x = malloc(T * c->hidden * sizeof(float));
    x->h = malloc(T * c->hidden * sizeof(float));
    x->q = malloc(T * qd * sizeof(float));
    x->k = malloc(T * kvd * sizeof(float));
    x->v = malloc(T * kvd * sizeof(float));
    x->attn = malloc(T * qd * sizeof(float));
    x->gate = malloc(T * c->intermediate * sizeof(float));
    x->up = malloc(T * c->intermediate * sizeof(float));
    x->out_rows = malloc(T * c->hidden * sizeof(float));
    x->tokens = malloc(T * sizeof(int32_t));
    x->positions = malloc(T * sizeof(int32_t));
    x->inv_freq = malloc((size_t)n_seq_max * (size_t)(c->rope.dim / 2) * sizeof(float));
    x->attn_factor = malloc((size_t)n_seq_max * sizeof(float));
    x->attn_seqs = malloc((size_t)n_seq_max * sizeof *x->attn_seqs);
    x->out_row_index = malloc(T * sizeof(int));
    if (!x->x || !x->h || !x->q || !x->k || !x->v || !x->attn || !x->gate || !x->up || !x->out_rows || !x->tokens ||
        !x->positions || !x->inv_freq || !x->attn_factor || !x->attn_seqs || !x->out_row_index) {
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
    if (n_seqs <= 0 || n_seqs > MAX_BATCH_SEQS || n_seqs > c->max_tokens)
        return tsr_fail(TSR_ERR_ARG, "forward: %d sequences in one batch (1..%d allowed)", n_seqs,
                        c->max_tokens < MAX_BATCH_SEQS ? c->max_tokens : MAX_BATCH_SEQS);
    long sum = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tsr_seq_input *q = &seqs[s];
        if (q->n_tokens <= 0 || q->pos0 < 0) return tsr_fail(TSR_ERR_ARG, "forward: sequence %d has no tokens", s);
        sum += q->n_tokens;
        long last = (long)q->pos0 + q->n_tokens - 1;
        if (last / c->kv->page_size >= q->n_pages)
            return tsr_fail(TSR_ERR_ARG, "forward: sequence %d's page table (%d pages) does not cover position %ld", s,
                            q->n_pages, last);
        for (long p = 0; p <= last / c->kv->page_size; p++)
            if (q->page_table[p] < 0 || q->page_table[p] >= c->kv->n_pages)
                return tsr_fail(TSR_ERR_ARG, "forward: sequence %d names page %d outside the pool", s, (int)q->page_table[p]);
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

tsr_status tsr_forward(tsr_forward_ctx *c, const tsr_seq_input *seqs, int n_seqs, float *logits)
{
    const tsr_model *m = c->model;
    const tsr_model_config *cfg = &m->cfg;
    const tsr_ops *ops = c->ops;
    int T = 0;
    TSR_TRY(validate(c, seqs, n_seqs, &T));
    const int H = cfg->hidden, nh = cfg->n_heads, nkv = cfg->n_kv_heads, d = cfg->head_dim;
    const int qd = nh * d, kvd = nkv * d, half = cfg->rope.dim / 2;

    /* flatten the batch; rope frequencies per sequence (dynamic NTK depends on its length) */
    int row = 0, n_out = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tsr_seq_input *q = &seqs[s];
        tsr_rope_freqs(&cfg->rope, q->pos0 + q->n_tokens, c->inv_freq + (size_t)s * half, &c->attn_factor[s]);
        c->attn_seqs[s] = (tsr_attn_seq){row, q->n_tokens, q->pos0, q->page_table};
        for (int t = 0; t < q->n_tokens; t++) {
            c->tokens[row + t] = q->tokens[t];
            c->positions[row + t] = q->pos0 + t;
            if (q->logits == TSR_LOGITS_ALL || (q->logits == TSR_LOGITS_LAST && t == q->n_tokens - 1))
                c->out_row_index[n_out++] = row + t;
        }
        row += q->n_tokens;
    }
    if (n_out && !logits) return tsr_fail(TSR_ERR_ARG, "forward: logits requested but no output buffer given");

    ops->embed(&m->embed, c->tokens, T, c->x);
    const float scale = 1.0f / sqrtf((float)d);
    for (int l = 0; l < cfg->n_layers; l++) {
        const tsr_layer *ly = &m->layers[l];
        ops->rmsnorm(c->x, &ly->attn_norm, cfg->norm_eps, T, H, c->h);
        ops->linear(&ly->q, c->h, T, c->q);
        ops->linear(&ly->k, c->h, T, c->k);
        ops->linear(&ly->v, c->h, T, c->v);
        for (int s = 0; s < n_seqs; s++) {
            const tsr_attn_seq *a = &c->attn_seqs[s];
            const float *inv = c->inv_freq + (size_t)s * half;
            ops->rope(c->q + (size_t)a->row0 * qd, a->n_tokens, nh, d, cfg->rope.dim, c->positions + a->row0, inv,
                      c->attn_factor[s]);
            ops->rope(c->k + (size_t)a->row0 * kvd, a->n_tokens, nkv, d, cfg->rope.dim, c->positions + a->row0, inv,
                      c->attn_factor[s]);
            ops->kv_store(c->kv, l, a->page_table, a->pos0, a->n_tokens, c->k + (size_t)a->row0 * kvd,
                          c->v + (size_t)a->row0 * kvd);
        }
        tsr_attn_args args = {n_seqs, c->attn_seqs, nh, nkv, d, scale, tsr_config_layer_window(cfg, l), l};
        ops->attention(&args, c->kv, c->q, c->attn);
        ops->linear(&ly->o, c->attn, T, c->h);
        ops->add(c->x, c->h, (size_t)T * H);

        ops->rmsnorm(c->x, &ly->mlp_norm, cfg->norm_eps, T, H, c->h);
        ops->linear(&ly->gate, c->h, T, c->gate);
        ops->linear(&ly->up, c->h, T, c->up);
        ops->silu_mul(c->gate, c->up, (size_t)T * cfg->intermediate, c->gate);
        ops->linear(&ly->down, c->gate, T, c->h);
        ops->add(c->x, c->h, (size_t)T * H);
    }
    if (n_out == 0) return TSR_OK;
    for (int i = 0; i < n_out; i++)
        memcpy(c->out_rows + (size_t)i * H, c->x + (size_t)c->out_row_index[i] * H, (size_t)H * sizeof(float));
    ops->rmsnorm(c->out_rows, &m->final_norm, cfg->norm_eps, n_out, H, c->out_rows);
    ops->linear(&m->head, c->out_rows, n_out, logits);
    return TSR_OK;
}
