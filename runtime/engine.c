/* Single-process engine (see engine.h). */
#include "runtime/engine.h"

#include "runtime/sampler.h"

#include <stdlib.h>
#include <string.h>

tsr_status tsr_engine_open(const char *model_dir, const tsr_engine_opts *opts, tsr_engine **out)
{
    tsr_engine_opts o = opts ? *opts : (tsr_engine_opts){0};
    if (o.max_tokens <= 0) o.max_tokens = TSR_STEP_TOKENS_DEFAULT;
    if (o.page_size <= 0) o.page_size = 16;
    if (!o.ops) o.ops = tsr_ops_cpu();
    if (o.kv_dtype == TSR_DTYPE_INVALID) o.kv_dtype = TSR_F16;
    tsr_engine *e = calloc(1, sizeof *e);
    if (!e) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    e->ops = o.ops;
    e->max_tokens = o.max_tokens;
    e->memory_cap = o.memory_cap;
    tsr_status st = tsr_model_load_part(model_dir, o.part, &e->model);
    if (st == TSR_OK && o.on_load) st = o.on_load(o.on_load_ctx, e->model);
    if (st == TSR_OK && o.max_context > e->model->cfg.rope.max_pos)
        st = tsr_fail(TSR_ERR_ARG, "a context of %ld positions is beyond the model's context (%d positions)",
                      o.max_context, e->model->cfg.rope.max_pos);
    size_t free_before = st == TSR_OK && o.memory_cap && !o.kv_tokens ? e->ops->memory_free() : 0;
    if (st == TSR_OK) st = e->ops->prepare_model(e->model);
    if (st == TSR_OK) {
        const tsr_model_config *c = &e->model->cfg;
        const tsr_model_local *lo = &e->model->local;
        const int n_layers = e->model->part.layer1 - e->model->part.layer0;
        e->max_context = o.max_context > 0 && o.max_context < c->rope.max_pos ? (int)o.max_context : c->rope.max_pos;
        long tokens = o.kv_tokens > 0 ? o.kv_tokens : e->max_context;
        long context = e->max_context; /* the longest sequence the rebuild for attention is sized for */
        size_t free_bytes = o.kv_tokens > 0 ? 0 : e->ops->memory_free();
        if (!free_bytes && o.kv_fraction > 0 && o.kv_tokens <= 0) /* a share of nothing known: not silently ignored */
            st = tsr_fail(TSR_ERR_ARG, "--kv-fraction sizes the KV pool from free device memory, which the %s backend "
                                       "does not report; give --kv-tokens N, or --gpu-memory SIZE for a cap",
                          e->ops->name);
        if (free_bytes > 0 && o.memory_cap) {
            /* the cap counts what this engine placed on the device so far (the weights) */
            size_t used = free_before > free_bytes ? free_before - free_bytes : 0;
            size_t left = o.memory_cap > used ? o.memory_cap - used : 0;
            if (left < free_bytes) free_bytes = left ? left : 1;
        }
        if (free_bytes > 0) {
            /* the pool takes a share of what the weights left, minus a reserve for the forward workspace (and the
             * fp16 rebuild of a quantized cache's context for attention) */
            double fraction = o.kv_fraction > 0 && o.kv_fraction <= 1 ? o.kv_fraction : 0.9;
            size_t per_token = tsr_kv_bytes_per_token(n_layers, lo->n_kv_heads, c->head_dim, o.kv_dtype);
            size_t per_row = (size_t)4 * (4 * (size_t)c->hidden + 3 * (size_t)lo->n_heads * c->head_dim +
                                          2 * (size_t)lo->intermediate);
            const size_t logits = (size_t)tsr_forward_head_rows(o.max_tokens) * lo->vocab * 4;
            const size_t base = per_row * (size_t)o.max_tokens + logits + ((size_t)512 << 20);
            for (int pass = 0; pass < 2; pass++) { /* a pool shorter than the model's context: reserve for the pool */
                const long positions = tsr_kv_expand_positions(o.max_tokens, context, o.page_size);
                const size_t reserve = base + tsr_kv_expand_bytes(lo->n_kv_heads, c->head_dim, o.kv_dtype, positions);
                const double usable = free_bytes > reserve ? (double)(free_bytes - reserve) * fraction : 0;
                tokens = (long)(usable / (double)per_token);
                if (pass == 1 || !tsr_kv_is_quant(o.kv_dtype) || tokens >= context || tokens <= 0) break;
                context = tokens;
            }
            if (tokens < (long)o.page_size * 4)
                st = tsr_fail(TSR_ERR_NOMEM, "not enough device memory for a KV pool (%.1f MiB free after the weights)",
                              (double)free_bytes / (1 << 20));
        }
        long pages = (tokens + o.page_size - 1) / o.page_size;
        if (pages < 4) pages = 4;
        if (pages > (1L << 30)) pages = 1L << 30;
        e->kv_pool_tokens = pages * o.page_size;
        if (st == TSR_OK)
            st =
                tsr_kv_init(&e->kv, e->ops, n_layers, lo->n_kv_heads, c->head_dim, o.page_size, (int)pages, o.kv_dtype);
        if (st == TSR_OK && tsr_kv_is_quant(o.kv_dtype)) {
            if (context > e->kv_pool_tokens) context = e->kv_pool_tokens; /* no sequence outgrows the pool */
            e->kv.expand_positions = tsr_kv_expand_positions(o.max_tokens, context, o.page_size);
        }
    }
    if (st == TSR_OK) st = tsr_forward_ctx_new(e->model, e->ops, &e->kv, o.max_tokens, &e->fwd);
    if (st != TSR_OK) {
        tsr_engine_close(e);
        return st;
    }
    *out = e;
    return TSR_OK;
}

void tsr_engine_close(tsr_engine *e)
{
    if (!e) return;
    tsr_forward_ctx_free(e->fwd);
    free(e->feed_logits);
    tsr_kv_free(&e->kv);
    if (e->model) e->ops->release_model(e->model);
    tsr_model_free(e->model);
    free(e);
}

void tsr_engine_seq_release(tsr_engine *e, tsr_seq *seq)
{
    for (int i = 0; i < seq->n_pages; i++) tsr_kv_release_page(&e->kv, seq->pages[i]);
    free(seq->pages);
    memset(seq, 0, sizeof *seq);
}

/* Makes seq's page table cover `len` tokens. */
static tsr_status reserve(tsr_engine *e, tsr_seq *seq, int len)
{
    int need = (len + e->kv.page_size - 1) / e->kv.page_size;
    if (need > seq->cap_pages) {
        int cap = seq->cap_pages ? seq->cap_pages * 2 : 8;
        while (cap < need) cap *= 2;
        int32_t *grown = realloc(seq->pages, (size_t)cap * sizeof *grown);
        if (!grown) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        seq->pages = grown;
        seq->cap_pages = cap;
    }
    while (seq->n_pages < need) {
        int32_t p = tsr_kv_alloc_page(&e->kv);
        if (p < 0)
            return tsr_fail(TSR_ERR_NOMEM, "KV cache full: %d pages of %d tokens are in use (raise the KV pool size)",
                            e->kv.n_pages, e->kv.page_size);
        seq->pages[seq->n_pages++] = p;
    }
    return TSR_OK;
}

/* Whether every row of the call is a pick (a feed with `pick` and no `out` wanting its last row), and one
 * tsr_forward_argmax call can take them. */
static int call_picks(const tsr_engine *e, const tsr_feed *feeds, const tsr_seq_input *batch, const int *owner,
                      int nb, size_t rows)
{
    if (rows == 0 || rows > (size_t)tsr_forward_pick_rows(e->fwd)) return 0;
    for (int b = 0; b < nb; b++)
        if (batch[b].logits != TSR_LOGITS_NONE && (batch[b].logits != TSR_LOGITS_LAST || feeds[owner[b]].out))
            return 0;
    return 1;
}

tsr_status tsr_engine_feed(tsr_engine *e, tsr_feed *feeds, int n)
{
    const int vocab = e->model->local.vocab;
    int *done = calloc((size_t)n, sizeof *done);
    tsr_seq_input *batch = malloc((size_t)n * sizeof *batch);
    int *owner = malloc((size_t)n * sizeof *owner);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *vals = malloc((size_t)n * sizeof *vals);
    tsr_status st = TSR_OK;
    if (!done || !batch || !owner || !ids || !vals) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
    for (int i = 0; st == TSR_OK && i < n; i++) {
        const tsr_feed *f = &feeds[i];
        const int has_dst = f->out || (f->logits == TSR_LOGITS_LAST && f->pick);
        if (f->n_tokens < 0 || (f->logits != TSR_LOGITS_NONE && !has_dst))
            st = tsr_fail(TSR_ERR_ARG, "engine: feed %d is invalid", i);
    }
    for (;;) {
        if (st != TSR_OK) break;
        int nb = 0, budget = e->max_tokens;
        for (int i = 0; i < n && budget > 0; i++) {
            tsr_feed *f = &feeds[i];
            int left = f->n_tokens - done[i];
            if (left <= 0) continue;
            int take = left < budget ? left : budget;
            if ((st = reserve(e, f->seq, f->seq->len + take)) != TSR_OK) break;
            int last_chunk = done[i] + take == f->n_tokens;
            tsr_logits_mode mode = f->logits == TSR_LOGITS_ALL ? TSR_LOGITS_ALL
                                   : f->logits == TSR_LOGITS_LAST && last_chunk ? TSR_LOGITS_LAST
                                                                                : TSR_LOGITS_NONE;
            batch[nb] = (tsr_seq_input){f->tokens + done[i], take, f->seq->len, f->seq->pages, f->seq->n_pages, mode};
            owner[nb++] = i;
            budget -= take;
        }
        if (st != TSR_OK || nb == 0) break;
        size_t need_rows = (size_t)tsr_forward_logit_rows(batch, nb);
        const int pick = call_picks(e, feeds, batch, owner, nb, need_rows);
        if (!pick && need_rows > e->feed_rows) {
            float *grown = realloc(e->feed_logits, need_rows * (size_t)vocab * sizeof(float));
            if (!grown) {
                st = tsr_fail(TSR_ERR_NOMEM, "out of memory for %zu rows of logits", need_rows);
                break;
            }
            e->feed_logits = grown;
            e->feed_rows = need_rows;
        }
        float *logits = e->feed_logits;
        st = pick ? tsr_forward_argmax(e->fwd, batch, nb, ids, vals) : tsr_forward(e->fwd, batch, nb, logits);
        if (st != TSR_OK) break;
        int row = 0;
        for (int b = 0; b < nb; b++) {
            tsr_feed *f = &feeds[owner[b]];
            int rows = batch[b].logits == TSR_LOGITS_ALL ? batch[b].n_tokens : batch[b].logits == TSR_LOGITS_LAST;
            if (rows && pick) {
                *f->pick = (tsr_pick){ids[row], vals[row]};
            } else if (rows && f->out) {
                float *dst = f->logits == TSR_LOGITS_ALL ? f->out + (size_t)done[owner[b]] * vocab : f->out;
                memcpy(dst, logits + (size_t)row * vocab, (size_t)rows * vocab * sizeof(float));
            } else if (rows) { /* a pick in a call that brought the rows over: picked here */
                const float *r = logits + (size_t)row * vocab;
                const int32_t id = tsr_argmax(r, vocab);
                *f->pick = (tsr_pick){id, r[id]}; /* NaN when the row is all NaN */
            }
            row += rows;
            done[owner[b]] += batch[b].n_tokens;
            f->seq->len += batch[b].n_tokens;
        }
    }
    free(done);
    free(batch);
    free(owner);
    free(ids);
    free(vals);
    return st;
}
