/* Shared golden-test helpers (see golden.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tests/common/golden.h"

#include "tests/common/fixtures.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

prompts load_prompts(void)
{
    prompts p = {0};
    char path[4096];
    assert_non_null(tsr_fixture_path(path, sizeof path, "reference/prompts.json"));
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    json_t *arr = json_object_get(root, "ids");
    p.n = (int)json_array_size(arr);
    assert_true(p.n > 0 && p.n <= 8);
    for (int i = 0; i < p.n; i++) {
        json_t *a = json_array_get(arr, (size_t)i);
        p.len[i] = (int)json_array_size(a);
        p.ids[i] = malloc((size_t)p.len[i] * sizeof(int32_t));
        for (int k = 0; k < p.len[i]; k++) p.ids[i][k] = (int32_t)json_integer_value(json_array_get(a, (size_t)k));
    }
    json_decref(root);
    return p;
}

void free_prompts(prompts *p)
{
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
}

tsr_st_set *open_ref(const char *name)
{
    char rel[1024], path[4096];
    snprintf(rel, sizeof rel, "reference/%s.safetensors", name);
    assert_non_null(tsr_fixture_path(path, sizeof path, rel));
    tsr_st_set *set = NULL;
    tsr_status st = tsr_st_open_file(path, &set);
    if (st != TSR_OK) fail_msg("%s: %s", path, tsr_last_error());
    return set;
}

tsr_engine *open_engine(const char *model_name, tsr_dtype kv, long kv_tokens)
{
    char dir[4096];
    if (!tsr_fixture_model(dir, sizeof dir, model_name)) fail_msg("model %s not found in the fixtures", model_name);
    tsr_engine_opts o = {.max_tokens = 512, .page_size = 16, .kv_tokens = kv_tokens, .kv_dtype = kv};
    tsr_engine *e = NULL;
    tsr_status st = tsr_engine_open(dir, &o, &e);
    if (st != TSR_OK) fail_msg("%s: %s", dir, tsr_last_error());
    return e;
}

/* Runs all prompts batched; out[i] = logits [len_i][vocab]. */
void run_prompts(tsr_engine *e, const prompts *p, float **out)
{
    const int vocab = e->model->cfg.vocab_size;
    tsr_seq seqs[8] = {0};
    tsr_feed feeds[8];
    for (int i = 0; i < p->n; i++) {
        out[i] = malloc((size_t)p->len[i] * vocab * sizeof(float));
        feeds[i] = (tsr_feed){&seqs[i], p->ids[i], p->len[i], TSR_LOGITS_ALL, out[i], NULL};
    }
    tsr_status st = tsr_engine_feed(e, feeds, p->n);
    if (st != TSR_OK) fail_msg("forward: %s", tsr_last_error());
    for (int i = 0; i < p->n; i++) tsr_engine_seq_release(e, &seqs[i]);
}

const tsr_linear *module_linear(const tsr_model *m, const char *module, int *layer_out)
{
    int l;
    char kind[64];
    *layer_out = -1;
    if (!strcmp(module, "lm_head")) return &m->head;
    if (sscanf(module, "model.layers.%d.%63s", &l, kind) != 2 || l < 0 || l >= m->cfg.n_layers) return NULL;
    *layer_out = l;
    const tsr_layer *ly = &m->layers[l];
    if (!strcmp(kind, "self_attn.q_proj")) return &ly->q;
    if (!strcmp(kind, "self_attn.k_proj")) return &ly->k;
    if (!strcmp(kind, "self_attn.v_proj")) return &ly->v;
    if (!strcmp(kind, "self_attn.o_proj")) return &ly->o;
    if (!strcmp(kind, "mlp.gate_proj")) return &ly->gate;
    if (!strcmp(kind, "mlp.up_proj")) return &ly->up;
    if (!strcmp(kind, "mlp.down_proj")) return &ly->down;
    return NULL;
}

int half_ulps(uint16_t a, uint16_t b)
{
    int ia = (a & 0x8000) ? -(int)(a & 0x7fff) : (int)a, ib = (b & 0x8000) ? -(int)(b & 0x7fff) : (int)b;
    return abs(ia - ib);
}

