/* config.json / generation_config.json reader (see config.h). */
#include "runtime/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *path;
    json_t *root; /* the object holding the model keys (root or root.text_config) */
} cfg_src;

static json_t *get(const cfg_src *s, const char *key) { return json_object_get(s->root, key); }

static tsr_status get_int(const cfg_src *s, const char *key, int required, int dflt, int *out)
{
    json_t *v = get(s, key);
    if (!v || json_is_null(v)) {
        if (required) return tsr_fail(TSR_ERR_MISSING, "%s: required key '%s' is missing", s->path, key);
        *out = dflt;
        return TSR_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
        return tsr_fail(TSR_ERR_FORMAT, "%s: '%s' must be a non-negative integer", s->path, key);
    *out = (int)json_integer_value(v);
    return TSR_OK;
}

static tsr_status get_num(const cfg_src *s, json_t *obj, const char *key, int required, double dflt, float *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return tsr_fail(TSR_ERR_MISSING, "%s: required key '%s' is missing", s->path, key);
        *out = (float)dflt;
        return TSR_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return tsr_fail(TSR_ERR_FORMAT, "%s: '%s' must be a number", s->path, key);
    *out = (float)json_number_value(v);
    return TSR_OK;
}

static tsr_status read_eos(const char *path, json_t *v, tsr_model_config *cfg)
{
    if (!v || json_is_null(v)) return TSR_OK;
    int n = 0;
    if (json_is_integer(v)) {
        cfg->eos_ids[n++] = (int)json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e)) return tsr_fail(TSR_ERR_FORMAT, "%s: eos_token_id entries must be integers", path);
            if (n < TSR_MAX_EOS) cfg->eos_ids[n++] = (int)json_integer_value(e);
        }
    } else {
        return tsr_fail(TSR_ERR_FORMAT, "%s: eos_token_id must be an integer or a list", path);
    }
    cfg->n_eos = n;
    return TSR_OK;
}

static tsr_status read_rope(const cfg_src *s, tsr_model_config *cfg)
{
    tsr_rope_config *r = &cfg->rope;
    json_t *rs = get(s, "rope_scaling");
    json_t *rp = get(s, "rope_parameters"); /* transformers >= 5 spelling, also carries rope_theta */
    TSR_TRY(get_num(s, s->root, "rope_theta", 0, 10000.0, &r->theta));
    if (!get(s, "rope_theta") && json_is_object(rp)) TSR_TRY(get_num(s, rp, "rope_theta", 0, 10000.0, &r->theta));
    float partial = 1.0f;
    TSR_TRY(get_num(s, s->root, "partial_rotary_factor", 0, 1.0, &partial));
    r->dim = (int)(cfg->head_dim * partial);
    if (r->dim <= 0 || r->dim > cfg->head_dim || r->dim % 2)
        return tsr_fail(TSR_ERR_FORMAT, "%s: partial_rotary_factor gives %d rotary dims", s->path, r->dim);
    r->max_pos = 2048;
    TSR_TRY(get_int(s, "max_position_embeddings", 0, 2048, &r->max_pos));
    r->type = TSR_ROPE_DEFAULT;
    r->factor = 1.0f;
    /* transformers 5 writes rope_parameters (canonical) and may keep the older rope_scaling beside it */
    if (json_is_object(rp)) rs = rp;
    if (!json_is_object(rs)) rs = NULL;
    if (!rs) return TSR_OK;

    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t)) t = json_object_get(rs, "type");
    if (!json_is_string(t)) return tsr_fail(TSR_ERR_FORMAT, "%s: rope_scaling has no 'rope_type'/'type'", s->path);
    const char *name = json_string_value(t);
    if (!strcmp(name, "default")) return TSR_OK;
    /* the original context length: top level first (Phi-3 style), then the rope dict, then max_position_embeddings */
    float omp = (float)r->max_pos;
    TSR_TRY(get_num(s, rs, "original_max_position_embeddings", 0, r->max_pos, &omp));
    if (json_is_number(get(s, "original_max_position_embeddings")))
        omp = (float)json_number_value(get(s, "original_max_position_embeddings"));
    if (!(omp >= 1 && omp <= (float)(1 << 30)))
        return tsr_fail(TSR_ERR_FORMAT, "%s: original_max_position_embeddings must be positive", s->path);
    r->original_max_pos = (int)omp;
    int yarn_without_factor = !strcmp(name, "yarn") && !json_is_number(json_object_get(rs, "factor"));
    if (yarn_without_factor)
        r->factor = (float)r->max_pos / (float)r->original_max_pos; /* HF: factor defaults to max / original */
    else
        TSR_TRY(get_num(s, rs, "factor", 1, 1.0, &r->factor));
    if (!(r->factor > 0) || !(r->factor < 1e6))
        return tsr_fail(TSR_ERR_FORMAT, "%s: rope_scaling.factor must be positive (is %g)", s->path, r->factor);
    if (!strcmp(name, "linear")) {
        r->type = TSR_ROPE_LINEAR;
    } else if (!strcmp(name, "dynamic")) {
        r->type = TSR_ROPE_DYNAMIC;
        r->original_max_pos = r->max_pos; /* HF's dynamic NTK compares against max_position_embeddings */
    } else if (!strcmp(name, "llama3")) {
        r->type = TSR_ROPE_LLAMA3;
        TSR_TRY(get_num(s, rs, "low_freq_factor", 1, 1.0, &r->low_freq_factor));
        TSR_TRY(get_num(s, rs, "high_freq_factor", 1, 4.0, &r->high_freq_factor));
        if (!(r->high_freq_factor > r->low_freq_factor))
            return tsr_fail(TSR_ERR_FORMAT, "%s: llama3 rope_scaling needs high_freq_factor > low_freq_factor",
                            s->path);
    } else if (!strcmp(name, "yarn")) {
        r->type = TSR_ROPE_YARN;
        TSR_TRY(get_num(s, rs, "beta_fast", 0, 32.0, &r->beta_fast));
        TSR_TRY(get_num(s, rs, "beta_slow", 0, 1.0, &r->beta_slow));
        TSR_TRY(get_num(s, rs, "attention_factor", 0, -1.0, &r->attention_factor));
        TSR_TRY(get_num(s, rs, "mscale", 0, 0.0, &r->mscale));
        TSR_TRY(get_num(s, rs, "mscale_all_dim", 0, 0.0, &r->mscale_all_dim));
        json_t *tr = json_object_get(rs, "truncate");
        r->truncate = tr ? json_is_true(tr) : 1;
    } else {
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "%s: rope_scaling type '%s' is not supported (linear, dynamic, llama3, yarn are)", s->path,
                        name);
    }
    return TSR_OK;
}

/* ---- quantization_config (GPTQ) ----
 *
 * `qc` is config.json's "quantization_config" object or the whole of quantize_config.json (`implicit_gptq`: that
 * file is AutoGPTQ's and may omit quant_method). Only GPTQ is interpreted: bits (4 only; anything else is
 * TSR_ERR_UNSUPPORTED), group_size (-1 = one group per matrix), desc_act, sym and checkpoint_format ("gptq":
 * qzeros store zero - 1; "gptq_v2": the exact zero; other formats, e.g. Marlin repacks, are unsupported). For any
 * other method only its name is kept; the tensors decide how layers load. */
static tsr_status read_quantization_config(const char *path, json_t *qc, int implicit_gptq, tsr_model_config *cfg)
{
    tsr_quant_config *q = &cfg->quant;
    memset(q, 0, sizeof *q);
    if (!json_is_object(qc)) return tsr_fail(TSR_ERR_FORMAT, "%s: quantization config must be a JSON object", path);
    json_t *meth = json_object_get(qc, "quant_method");
    const char *name = json_is_string(meth) ? json_string_value(meth) : implicit_gptq ? "gptq" : "";
    if (meth && !json_is_null(meth) && !json_is_string(meth))
        return tsr_fail(TSR_ERR_FORMAT, "%s: quant_method must be a string", path);
    snprintf(q->method, sizeof q->method, "%s", name);
    if (strcmp(name, "gptq")) return TSR_OK;

    json_t *bits = json_object_get(qc, "bits");
    if (!json_is_number(bits) || json_number_value(bits) != floor(json_number_value(bits)) ||
        fabs(json_number_value(bits)) > 64)
        return tsr_fail(TSR_ERR_FORMAT, "%s: GPTQ quantization config needs an integer 'bits'", path);
    q->bits = (int)json_number_value(bits);
    if (q->bits != 4)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: GPTQ with %d-bit weights is not supported (only 4-bit GPTQ is)", path,
                        q->bits);

    json_t *gs = json_object_get(qc, "group_size");
    if (gs && !json_is_null(gs)) {
        double v = json_is_number(gs) ? json_number_value(gs) : 0;
        if (!json_is_number(gs) || v != floor(v) || !(v == -1 || (v >= 1 && v <= (1 << 30))))
            return tsr_fail(TSR_ERR_FORMAT, "%s: GPTQ group_size must be a positive integer or -1", path);
        q->group_size = (int)v;
    }
    q->desc_act = json_is_true(json_object_get(qc, "desc_act"));
    json_t *sym = json_object_get(qc, "sym");
    q->sym = sym ? json_is_true(sym) : 1;
    if (json_is_true(json_object_get(qc, "is_marlin_format")))
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: Marlin-format GPTQ checkpoints are not supported", path);
    json_t *fmt = json_object_get(qc, "checkpoint_format");
    if (fmt && !json_is_null(fmt)) {
        if (!json_is_string(fmt)) return tsr_fail(TSR_ERR_FORMAT, "%s: checkpoint_format must be a string", path);
        const char *f = json_string_value(fmt);
        if (!strcmp(f, "gptq_v2"))
            q->gptq_v2 = 1;
        else if (strcmp(f, "gptq"))
            return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: GPTQ checkpoint_format '%s' is not supported (gptq, gptq_v2 are)",
                            path, f);
    }
    return TSR_OK;
}

static tsr_status parse_generation_config(const char *path, json_t *root, tsr_model_config *cfg)
{
    tsr_status st = TSR_OK;
    if (!json_is_object(root)) {
        st = tsr_fail(TSR_ERR_FORMAT, "%s: not a JSON object", path);
    } else {
        cfg_src s = {path, root};
        json_t *eos = json_object_get(root, "eos_token_id");
        if (eos && !json_is_null(eos)) st = read_eos(path, eos, cfg);
        json_t *bos = json_object_get(root, "bos_token_id");
        if (st == TSR_OK && json_is_integer(bos)) cfg->bos_id = (int)json_integer_value(bos);
        if (st == TSR_OK) st = get_num(&s, root, "temperature", 0, 1.0, &cfg->gen_temperature);
        if (st == TSR_OK) st = get_num(&s, root, "top_p", 0, 1.0, &cfg->gen_top_p);
        if (st == TSR_OK) st = get_int(&s, "top_k", 0, 50, &cfg->gen_top_k);
        cfg->gen_do_sample = json_is_true(json_object_get(root, "do_sample"));
    }
    return st;
}

static tsr_status parse_config(const char *path, json_t *top, tsr_model_config *cfg)
{
    if (!json_is_object(top)) return tsr_fail(TSR_ERR_FORMAT, "%s: not a JSON object", path);
    cfg_src s = {path, top};
    json_t *text_cfg = json_object_get(top, "text_config");
    json_t *archs = json_object_get(top, "architectures");
    if (json_is_object(text_cfg)) s.root = text_cfg;
    if (!json_is_array(archs) || json_array_size(archs) < 1 || !json_is_string(json_array_get(archs, 0)))
        return tsr_fail(TSR_ERR_MISSING, "%s: 'architectures' must list the model class", path);
    const char *arch = json_string_value(json_array_get(archs, 0));
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch);
    if (!strcmp(arch, "LlamaForCausalLM"))
        cfg->arch = TSR_ARCH_LLAMA;
    else if (!strcmp(arch, "MistralForCausalLM"))
        cfg->arch = TSR_ARCH_MISTRAL;
    else if (!strcmp(arch, "Qwen2ForCausalLM"))
        cfg->arch = TSR_ARCH_QWEN2;
    else
        return tsr_fail(
            TSR_ERR_UNSUPPORTED,
            "%s: architecture '%s' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM are)", path,
            arch);

    TSR_TRY(get_int(&s, "hidden_size", 1, 0, &cfg->hidden));
    TSR_TRY(get_int(&s, "num_hidden_layers", 1, 0, &cfg->n_layers));
    TSR_TRY(get_int(&s, "num_attention_heads", 1, 0, &cfg->n_heads));
    TSR_TRY(get_int(&s, "num_key_value_heads", 0, cfg->n_heads, &cfg->n_kv_heads));
    TSR_TRY(get_int(&s, "intermediate_size", 1, 0, &cfg->intermediate));
    TSR_TRY(get_int(&s, "vocab_size", 1, 0, &cfg->vocab_size));
    if (cfg->hidden <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->intermediate <= 0 || cfg->vocab_size <= 0)
        return tsr_fail(TSR_ERR_FORMAT, "%s: model dimensions must be positive", path);
    TSR_TRY(get_int(&s, "head_dim", 0, cfg->hidden / cfg->n_heads, &cfg->head_dim));
    if (cfg->head_dim <= 0 || cfg->head_dim % 2)
        return tsr_fail(TSR_ERR_FORMAT, "%s: head_dim %d must be positive and even", path, cfg->head_dim);
    if (cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads)
        return tsr_fail(TSR_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                        cfg->n_heads, cfg->n_kv_heads);
    TSR_TRY(get_num(&s, s.root, "rms_norm_eps", 1, 1e-6, &cfg->norm_eps));
    TSR_TRY(read_rope(&s, cfg));
    cfg->tie_word_embeddings =
        json_is_true(get(&s, "tie_word_embeddings")) ||
        (!get(&s, "tie_word_embeddings") && json_is_true(json_object_get(top, "tie_word_embeddings")));
    cfg->attention_bias = cfg->arch == TSR_ARCH_QWEN2 || json_is_true(get(&s, "attention_bias"));
    if (json_is_true(get(&s, "mlp_bias")))
        return tsr_fail(TSR_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", path);

    int window = 0;
    json_t *sw = get(&s, "sliding_window");
    if (json_is_integer(sw) && json_integer_value(sw) > 0) window = (int)json_integer_value(sw);
    if (cfg->arch == TSR_ARCH_QWEN2) {
        if (!json_is_true(get(&s, "use_sliding_window"))) window = 0;
        TSR_TRY(get_int(&s, "max_window_layers", 0, cfg->n_layers, &cfg->max_window_layers));
    } else {
        cfg->max_window_layers = 0;
    }
    if (cfg->arch == TSR_ARCH_LLAMA) window = 0;
    cfg->sliding_window = window;

    cfg->bos_id = -1;
    json_t *bos = get(&s, "bos_token_id");
    if (json_is_integer(bos)) cfg->bos_id = (int)json_integer_value(bos);
    TSR_TRY(read_eos(path, get(&s, "eos_token_id"), cfg));
    json_t *qc = json_object_get(top, "quantization_config");
    if (!qc && s.root != top) qc = get(&s, "quantization_config");
    if (qc && !json_is_null(qc)) TSR_TRY(read_quantization_config(path, qc, 0, cfg));
    return TSR_OK;
}

tsr_status tsr_config_parse(const char *config_json, size_t len, const char *generation_json, size_t gen_len,
                            const char *label, tsr_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(config_json, len, 0, &jerr);
    if (!root)
        return tsr_fail(TSR_ERR_FORMAT, "%s/config.json: invalid JSON at line %d column %d: %s", label, jerr.line,
                        jerr.column, jerr.text);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", label);
    tsr_status st = parse_config(path, root, cfg);
    json_decref(root);
    if (st != TSR_OK) return st;
    cfg->gen_temperature = 1.0f;
    cfg->gen_top_p = 1.0f;
    cfg->gen_top_k = 50;
    if (!generation_json) return TSR_OK;
    snprintf(path, sizeof path, "%s/generation_config.json", label);
    root = json_loadb(generation_json, gen_len, 0, &jerr);
    if (!root) return tsr_fail(TSR_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    st = parse_generation_config(path, root, cfg);
    json_decref(root);
    return st;
}

/* Reads a whole file; returns NULL (with *missing set when it does not exist) on failure. */
static char *read_file(const char *path, size_t *len, int *missing)
{
    FILE *f = fopen(path, "rb");
    *missing = !f;
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            char *g = cap > (64u << 20) ? NULL : realloc(buf, cap = cap ? cap * 2 : 4096);
            if (!g) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = g;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

tsr_status tsr_config_load(const char *dir, tsr_model_config *cfg)
{
    char path[4096];
    size_t len = 0, gen_len = 0;
    int missing;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_file(path, &len, &missing);
    if (!text) {
        memset(cfg, 0, sizeof *cfg);
        if (missing) return tsr_fail(TSR_ERR_IO, "%s: cannot open (is '%s' a model directory?)", path, dir);
        return tsr_fail(TSR_ERR_IO, "%s: cannot read (or larger than 128 MiB)", path);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    char *gen = read_file(path, &gen_len, &missing);
    tsr_status st;
    if (!gen && !missing)
        st = tsr_fail(TSR_ERR_IO, "%s: cannot read", path);
    else
        st = tsr_config_parse(text, len, gen, gen_len, dir, cfg);
    free(text);
    free(gen);
    if (st == TSR_OK && !cfg->quant.method[0]) { /* AutoGPTQ's quantize_config.json, when config.json has none */
        snprintf(path, sizeof path, "%s/quantize_config.json", dir);
        char *qtext = read_file(path, &len, &missing);
        if (!qtext && !missing) return tsr_fail(TSR_ERR_IO, "%s: cannot read", path);
        if (qtext) {
            json_error_t jerr;
            json_t *root = json_loadb(qtext, len, 0, &jerr);
            free(qtext);
            if (!root) return tsr_fail(TSR_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
            st = read_quantization_config(path, root, 1, cfg);
            json_decref(root);
        }
    }
    return st;
}

int tsr_config_layer_window(const tsr_model_config *cfg, int layer)
{
    if (cfg->sliding_window <= 0) return 0;
    if (cfg->arch == TSR_ARCH_QWEN2 && layer < cfg->max_window_layers) return 0;
    return cfg->sliding_window;
}
