/* Model loading: binds config and tensors into tsr_model (see model.h), for the whole model or one stage's part.
 * Only the held layers' tensors are looked up, so a stage never touches (or needs) the others' bytes beyond the
 * mapping of the files. */
#include "runtime/model.h"

#include "runtime/gptq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tsr_status load_dense(const tsr_st_set *st, const char *name, int rows, int cols, tsr_dense *out)
{
    const tsr_st_tensor *t = tsr_st_find(st, name);
    if (!t) return tsr_fail(TSR_ERR_MISSING, "tensor '%s' is missing", name);
    if (t->dtype != TSR_F16 && t->dtype != TSR_BF16 && t->dtype != TSR_F32)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F16, BF16 or F32", t->file, name,
                        tsr_dtype_name(t->dtype));
    int ok = rows > 1 ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols)
                      : (t->ndim == 1 && t->shape[0] == cols);
    if (!ok) {
        if (rows > 1)
            return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has the wrong shape (expected [%d, %d])", t->file, name,
                            rows, cols);
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s' has the wrong shape (expected [%d])", t->file, name, cols);
    }
    out->dtype = t->dtype;
    out->rows = rows;
    out->cols = cols;
    out->data = t->data;
    return TSR_OK;
}

static int has_tensor(const tsr_st_set *st, const char *key, const char *suffix)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", key, suffix);
    return tsr_st_find(st, name) != NULL;
}

/* Binds the linear layer `key` (K inputs, N outputs): EXL2 when key.q_weight exists, else dense key.weight. */
static tsr_status load_linear(tsr_model *m, const char *key, int K, int N, int has_bias, tsr_linear *L)
{
    char name[512];
    memset(L, 0, sizeof *L);
    L->K = K;
    L->N = N;
    if (has_tensor(m->st, key, "q_weight")) {
        L->kind = TSR_LINEAR_EXL2;
        m->n_exl2++;
        return tsr_qmatrix_load(m->st, key, K, N, has_bias, 1.0f, &L->q);
    }
    if (has_tensor(m->st, key, "qweight")) {
        /* GPTQ (4-bit): a tsr_qmatrix in GPTQ mode, run by the same kernel as EXL2 (gptq.h) */
        if (m->cfg.quant.method[0] && strcmp(m->cfg.quant.method, "gptq"))
            return tsr_fail(TSR_ERR_UNSUPPORTED,
                            "%s: '%s' has qweight tensors but quant_method is '%s' (only GPTQ is supported)", m->dir,
                            key, m->cfg.quant.method);
        L->kind = TSR_LINEAR_EXL2;
        m->n_exl2++;
        return tsr_gptq_load(m->st, key, K, N, has_bias, &m->cfg.quant, &L->q);
    }
    L->kind = TSR_LINEAR_DENSE;
    m->n_dense++;
    snprintf(name, sizeof name, "%s.weight", key);
    TSR_TRY(load_dense(m->st, name, N, K, &L->w));
    snprintf(name, sizeof name, "%s.bias", key);
    if (has_bias) {
        TSR_TRY(load_dense(m->st, name, 1, N, &L->bias));
    } else if (tsr_st_find(m->st, name)) {
        /* an unexpected bias is still applied, as transformers would when the config asks for it */
        TSR_TRY(load_dense(m->st, name, 1, N, &L->bias));
    }
    return TSR_OK;
}

static tsr_status load_layer(tsr_model *m, int l)
{
    const tsr_model_config *c = &m->cfg;
    tsr_layer *ly = &m->layers[l];
    char key[256];
    const int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    const int qkv_bias = c->attention_bias;
    const int o_bias = c->attention_bias && c->arch != TSR_ARCH_QWEN2;
#define KEY(fmt) (snprintf(key, sizeof key, "model.layers.%d." fmt, l), key)
    TSR_TRY(load_dense(m->st, KEY("input_layernorm.weight"), 1, H, &ly->attn_norm));
    TSR_TRY(load_dense(m->st, KEY("post_attention_layernorm.weight"), 1, H, &ly->mlp_norm));
    TSR_TRY(load_linear(m, KEY("self_attn.q_proj"), H, qd, qkv_bias, &ly->q));
    TSR_TRY(load_linear(m, KEY("self_attn.k_proj"), H, kvd, qkv_bias, &ly->k));
    TSR_TRY(load_linear(m, KEY("self_attn.v_proj"), H, kvd, qkv_bias, &ly->v));
    TSR_TRY(load_linear(m, KEY("self_attn.o_proj"), qd, H, o_bias, &ly->o));
    TSR_TRY(load_linear(m, KEY("mlp.gate_proj"), H, c->intermediate, 0, &ly->gate));
    TSR_TRY(load_linear(m, KEY("mlp.up_proj"), H, c->intermediate, 0, &ly->up));
    TSR_TRY(load_linear(m, KEY("mlp.down_proj"), c->intermediate, H, 0, &ly->down));
#undef KEY
    return TSR_OK;
}

static tsr_status load_head(tsr_model *m)
{
    const tsr_model_config *c = &m->cfg;
    if (has_tensor(m->st, "lm_head", "q_weight") || has_tensor(m->st, "lm_head", "weight") ||
        has_tensor(m->st, "lm_head", "qweight"))
        return load_linear(m, "lm_head", c->hidden, c->vocab_size, has_tensor(m->st, "lm_head", "bias"), &m->head);
    if (!c->tie_word_embeddings)
        return tsr_fail(TSR_ERR_MISSING, "%s: tensor 'lm_head.weight' is missing (and tie_word_embeddings is false)",
                        m->dir);
    memset(&m->head, 0, sizeof m->head);
    m->head_tied = 1;
    m->head.kind = TSR_LINEAR_DENSE;
    m->head.K = c->hidden;
    m->head.N = c->vocab_size;
    m->head.w = m->embed;
    m->n_dense++;
    return TSR_OK;
}

void tsr_model_free(tsr_model *m)
{
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            tsr_layer *ly = &m->layers[l];
            tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tsr_qmatrix_free(&all[i]->q);
        }
    }
    tsr_qmatrix_free(&m->head.q);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    tsr_st_set_free(m->st);
    free(m->dir);
    free(m);
}

tsr_status tsr_model_own(tsr_model *m, void *p)
{
    if (!p) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) {
            free(p);
            return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        }
        m->owned = grown;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return TSR_OK;
}

tsr_status tsr_model_load_part(const char *dir, const tsr_model_part *part, tsr_model **out)
{
    tsr_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_status st = tsr_config_load(dir, &m->cfg);
    if (st == TSR_OK) {
        m->part = part ? *part : (tsr_model_part){0, m->cfg.n_layers, 1, 1, 0, 1};
        const tsr_model_part *p = &m->part;
        if (p->layer0 < 0 || p->layer1 > m->cfg.n_layers || p->layer0 > p->layer1 ||
            (p->layer0 == p->layer1 && !p->embed && !p->head))
            st = tsr_fail(TSR_ERR_ARG, "%s: layers [%d, %d) are not a part of the model's %d layers", dir, p->layer0,
                          p->layer1, m->cfg.n_layers);
        else if (p->tp_size != 1 || p->tp_rank != 0)
            st = tsr_fail(TSR_ERR_ARG, "%s: a tensor shard is cut after loading (tp_size must be 1 here)", dir);
        m->local = (tsr_model_local){m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.intermediate, 0, m->cfg.vocab_size};
    }
    if (st == TSR_OK) st = tsr_st_open_dir(dir, &m->st);
    if (st == TSR_OK) {
        m->file_bytes = tsr_st_total_bytes(m->st);
        /* a tied head needs the embedding on the last stage too */
        int tied_head = m->part.head && m->cfg.tie_word_embeddings && !has_tensor(m->st, "lm_head", "q_weight") &&
                        !has_tensor(m->st, "lm_head", "weight") && !has_tensor(m->st, "lm_head", "qweight");
        if (m->part.embed || tied_head)
            st = load_dense(m->st, "model.embed_tokens.weight", m->cfg.vocab_size, m->cfg.hidden, &m->embed);
    }
    if (st == TSR_OK) {
        m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
        if (!m->layers) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    for (int l = m->part.layer0; st == TSR_OK && l < m->part.layer1; l++) st = load_layer(m, l);
    if (st == TSR_OK && m->part.head) st = load_dense(m->st, "model.norm.weight", 1, m->cfg.hidden, &m->final_norm);
    if (st == TSR_OK && m->part.head) st = load_head(m);
    if (st != TSR_OK) {
        tsr_model_free(m);
        return st;
    }
    *out = m;
    return TSR_OK;
}

tsr_status tsr_model_load(const char *dir, tsr_model **out) { return tsr_model_load_part(dir, NULL, out); }

static uint64_t dense_bytes(const tsr_dense *d)
{
    return d->data ? (uint64_t)d->rows * (uint64_t)d->cols * tsr_dtype_size(d->dtype) : 0;
}

uint64_t tsr_model_layer_bytes(const tsr_model *m, int l)
{
    if (!m->layers || l < 0 || l >= m->cfg.n_layers) return 0;
    const tsr_layer *ly = &m->layers[l];
    const tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
    uint64_t b = dense_bytes(&ly->attn_norm) + dense_bytes(&ly->mlp_norm);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->kind == TSR_LINEAR_EXL2 || all[i]->w.data) b += tsr_linear_bytes(all[i]);
    return b;
}

uint64_t tsr_model_embed_bytes(const tsr_model *m) { return dense_bytes(&m->embed); }

uint64_t tsr_model_head_bytes(const tsr_model *m)
{
    uint64_t b = dense_bytes(&m->final_norm);
    if (m->head_tied || (m->head.kind == TSR_LINEAR_DENSE && !m->head.w.data)) return b;
    return b + tsr_linear_bytes(&m->head);
}

int tsr_model_head_tied(const tsr_model *m) { return m->head_tied; }

/* Quantized linear layers in GPTQ mode (they are counted in n_exl2 too). */
static int count_gptq(const tsr_model *m)
{
    int n = m->head.kind == TSR_LINEAR_EXL2 && m->head.q.kind == TSR_QMATRIX_GPTQ;
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        const tsr_layer *ly = &m->layers[l];
        const tsr_linear *all[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            n += all[i]->kind == TSR_LINEAR_EXL2 && all[i]->q.kind == TSR_QMATRIX_GPTQ;
    }
    return n;
}

const char *tsr_model_format(const tsr_model *m)
{
    const int n_gptq = count_gptq(m);
    if (n_gptq && n_gptq == m->n_exl2 && m->n_dense <= 1) return "gptq"; /* an FP16 head does not make it mixed */
    if (m->n_exl2 && !n_gptq && m->n_dense <= 1) return "exl2"; /* a tied dense head does not make it mixed */
    if (m->n_exl2) return "mixed";
    switch (m->embed.dtype) {
    case TSR_BF16: return "bf16";
    case TSR_F32: return "fp32";
    default: return "fp16";
    }
}

uint64_t tsr_linear_bytes(const tsr_linear *L)
{
    if (L->kind == TSR_LINEAR_EXL2) return L->q.bytes;
    uint64_t b = (uint64_t)L->w.rows * L->w.cols * tsr_dtype_size(L->w.dtype);
    if (L->bias.data) b += (uint64_t)L->N * tsr_dtype_size(L->bias.dtype);
    return b;
}
