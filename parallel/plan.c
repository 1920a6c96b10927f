/* The planner (see plan.h): spec parsing, layer ranges by bytes, memory accounting and the fit check. */
#include "parallel/plan.h"

#include "parallel/shard.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GPU_RESERVE ((uint64_t)512 << 20)

tsr_status tsr_split_parse(const char *s, tsr_split_spec *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !strcmp(s, "none")) return TSR_OK;
    if (!strcmp(s, "tensor")) {
        out->kind = TSR_SPLIT_TENSOR;
        return TSR_OK;
    }
    if (strncmp(s, "layers", 6) || (s[6] && s[6] != ':'))
        return tsr_fail(TSR_ERR_ARG, "--split must be none, layers, layers:R1,R2,... or tensor, got '%s'", s);
    out->kind = TSR_SPLIT_LAYERS;
    if (!s[6]) return TSR_OK;
    const char *p = s + 7;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (errno || end == p || !(v > 0) || !isfinite(v) || (*end && *end != ','))
            return tsr_fail(TSR_ERR_ARG, "--split %s: ratios must be positive numbers separated by commas", s);
        if (out->n_ratios == TSR_PLAN_MAX) return tsr_fail(TSR_ERR_ARG, "--split %s: too many ratios", s);
        out->ratios[out->n_ratios++] = v;
        p = *end ? end + 1 : end;
    }
    if (!out->n_ratios) return tsr_fail(TSR_ERR_ARG, "--split %s: no ratios after ':'", s);
    return TSR_OK;
}

tsr_status tsr_size_parse(const char *s, uint64_t *bytes)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || !isfinite(v))
        return tsr_fail(TSR_ERR_ARG, "'%s' is not a size (e.g. 24GiB)", s);
    char unit[8] = {0};
    size_t n = 0;
    while (end[n] && n < sizeof unit - 1) {
        unit[n] = (char)tolower((unsigned char)end[n]);
        n++;
    }
    if (end[n]) return tsr_fail(TSR_ERR_ARG, "'%s' is not a size (e.g. 24GiB)", s);
    double mul;
    if (!strcmp(unit, "") || !strcmp(unit, "b"))
        mul = 1;
    else if (!strcmp(unit, "k") || !strcmp(unit, "kib"))
        mul = 1024.0;
    else if (!strcmp(unit, "m") || !strcmp(unit, "mib"))
        mul = 1024.0 * 1024;
    else if (!strcmp(unit, "g") || !strcmp(unit, "gib"))
        mul = 1024.0 * 1024 * 1024;
    else if (!strcmp(unit, "t") || !strcmp(unit, "tib"))
        mul = 1024.0 * 1024 * 1024 * 1024;
    else if (!strcmp(unit, "kb"))
        mul = 1e3;
    else if (!strcmp(unit, "mb"))
        mul = 1e6;
    else if (!strcmp(unit, "gb"))
        mul = 1e9;
    else if (!strcmp(unit, "tb"))
        mul = 1e12;
    else
        return tsr_fail(TSR_ERR_ARG, "'%s': unknown size unit '%s' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s, end);
    double b = v * mul;
    if (b > 9e18) return tsr_fail(TSR_ERR_ARG, "'%s' is too large", s);
    *bytes = (uint64_t)b;
    return TSR_OK;
}

tsr_status tsr_sizes_parse(const char *s, uint64_t *v, int max, int *n)
{
    *n = 0;
    char buf[64];
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof buf) return tsr_fail(TSR_ERR_ARG, "'%s' is not a list of sizes", s);
        if (*n == max) return tsr_fail(TSR_ERR_ARG, "'%s': more than %d sizes", s, max);
        memcpy(buf, p, len);
        buf[len] = '\0';
        TSR_TRY(tsr_size_parse(buf, &v[(*n)++]));
        p = comma ? comma + 1 : p + len;
    }
    if (!*n) return tsr_fail(TSR_ERR_ARG, "empty list of sizes");
    return TSR_OK;
}

tsr_model_part tsr_plan_part(const tsr_plan *p, int w)
{
    const tsr_plan_worker *x = &p->w[w];
    return (tsr_model_part){x->layer0, x->layer1, x->embed, x->head, 0, 1};
}

static double gib(uint64_t b)
{
    return (double)b / (1024.0 * 1024 * 1024);
}

/* "12.34 GiB" or "56.7 MiB" */
static const char *human(uint64_t b, char *buf, size_t cap)
{
    if (b >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", gib(b));
    else
        snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024));
    return buf;
}

/* Contiguous layer ranges for S stages following target shares of the model's bytes. */
static tsr_status assign_layers(const tsr_model *m, int S, const double *share, int *first)
{
    const int L = m->cfg.n_layers;
    if (L < S)
        return tsr_fail(TSR_ERR_ARG, "layer split: %d stages for a model of %d layers (at most one stage per layer)", S,
                        L);
    double *cum = malloc(((size_t)L + 1) * sizeof *cum);
    if (!cum) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    cum[0] = 0;
    for (int l = 0; l < L; l++)
        cum[l + 1] = cum[l] + (double)tsr_model_layer_bytes(m, l);
    const double embed = (double)tsr_model_embed_bytes(m), head = (double)tsr_model_head_bytes(m);
    const double tied = tsr_model_head_tied(m) && S > 1 ? embed : 0;
    const double total = cum[L] + embed + head + tied;
    first[0] = 0;
    double target = 0;
    for (int s = 0; s < S - 1; s++) {
        /* stage s's layers get its share of everything minus its fixed tensors */
        double fixed = (s == 0 ? embed : 0);
        target += share[s] * total - fixed;
        int lo = first[s] + 1, hi = L - (S - 1 - s), best = lo;
        for (int i = lo; i <= hi; i++)
            if (fabs(cum[i] - target) < fabs(cum[best] - target)) best = i;
        first[s + 1] = best;
    }
    first[S] = L;
    free(cum);
    return TSR_OK;
}

tsr_status tsr_plan_make(const tsr_model *m, const tsr_plan_input *in, tsr_plan *out)
{
    const tsr_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    const int W = in->n_workers;
    if (W < 1 || W > TSR_PLAN_MAX) return tsr_fail(TSR_ERR_ARG, "plan: %d workers (1..%d)", W, TSR_PLAN_MAX);
    tsr_split_kind kind = in->split.kind;
    if (kind == TSR_SPLIT_NONE && W > 1) kind = TSR_SPLIT_LAYERS;
    int tp = kind == TSR_SPLIT_TENSOR ? W : in->tp > 0 ? in->tp : 1;
    if (W % tp)
        return tsr_fail(TSR_ERR_ARG, "plan: %d workers do not form tensor groups of %d (--tp must divide the workers)",
                        W, tp);
    const int S = W / tp;
    TSR_TRY(tsr_shard_check(c, tp));
    out->version = TSR_PLAN_VERSION;
    out->n_workers = W;
    out->n_stages = S;
    out->tp = tp;
    out->n_layers = c->n_layers;
    out->page_size = in->page_size > 0 ? in->page_size : 16;
    out->max_tokens = in->max_tokens > 0 ? in->max_tokens : TSR_STEP_TOKENS_DEFAULT;
    if (in->max_context > c->rope.max_pos)
        return tsr_fail(TSR_ERR_ARG, "plan: a context of %ld positions is beyond the model's context (%d positions)",
                        in->max_context, c->rope.max_pos);
    out->max_context = in->max_context > 0 ? (int)in->max_context : c->rope.max_pos;
    out->kv_dtype = in->kv_dtype == TSR_DTYPE_INVALID ? TSR_F16 : in->kv_dtype;
    out->split = kind;

    /* stage shares: explicit ratios, else memory, else equal */
    double share[TSR_PLAN_MAX];
    if (in->split.n_ratios) {
        if (in->split.n_ratios != S)
            return tsr_fail(TSR_ERR_ARG, "--split layers: %d ratios given for %d stages", in->split.n_ratios, S);
        double sum = 0;
        for (int s = 0; s < S; s++)
            sum += in->split.ratios[s];
        for (int s = 0; s < S; s++)
            share[s] = in->split.ratios[s] / sum;
    } else {
        int known = 1;
        double sum = 0;
        for (int s = 0; s < S; s++) {
            uint64_t cap = UINT64_MAX;
            for (int r = 0; r < tp; r++) {
                uint64_t x = in->capacity[s * tp + r];
                if (!x) known = 0;
                if (x < cap) cap = x;
            }
            share[s] = known ? (double)cap : 1.0;
            sum += share[s];
        }
        for (int s = 0; s < S; s++)
            share[s] = known ? share[s] / sum : 1.0 / S;
    }
    int first[TSR_PLAN_MAX + 1];
    TSR_TRY(assign_layers(m, S, share, first));

    /* bytes per worker */
    const int tied = tsr_model_head_tied(m);
    const uint64_t embed = tsr_model_embed_bytes(m), head = tsr_model_head_bytes(m);
    const int nh = c->n_heads / tp, nkv = tsr_shard_kv_heads(c, tp), inter = c->intermediate / tp;
    const int vocab = (c->vocab_size + tp - 1) / tp;
    const uint64_t per_row = 4ull * (4ull * c->hidden + 3ull * nh * c->head_dim + 2ull * inter);
    /* a quantized cache's context rebuilt as fp16 for attention (runtime/kv_cache.h), for the longest sequence */
    const long expand_positions = tsr_kv_expand_positions(out->max_tokens, out->max_context, out->page_size);
    const uint64_t expand = tsr_kv_expand_bytes(nkv, c->head_dim, (tsr_dtype)out->kv_dtype, expand_positions);
    const uint64_t work = per_row * (uint64_t)out->max_tokens +
                          (uint64_t)(out->max_tokens < 128 ? out->max_tokens : 128) * (uint64_t)vocab * 4 +
                          (in->gpu ? GPU_RESERVE + expand : 0);
    uint64_t per_token[TSR_PLAN_MAX];
    long fit_tokens = -1; /* tokens the tightest limited worker allows */
    int tight = -1;
    for (int w = 0; w < W; w++) {
        tsr_plan_worker *x = &out->w[w];
        x->stage = w / tp;
        x->tp_rank = w % tp;
        x->layer0 = first[x->stage];
        x->layer1 = first[x->stage + 1];
        x->embed = x->stage == 0;
        x->head = x->stage == S - 1;
        uint64_t layers = 0;
        for (int l = x->layer0; l < x->layer1; l++)
            layers += tsr_model_layer_bytes(m, l);
        x->weight_bytes =
            layers / (uint64_t)tp + (x->embed || (x->head && tied) ? embed : 0) + (x->head ? head / (uint64_t)tp : 0);
        x->stream_bytes = layers / (uint64_t)tp + (x->head ? (tied ? embed : head) / (uint64_t)tp : 0);
        x->work_bytes = work;
        x->capacity = in->capacity[w];
        per_token[w] = tsr_kv_bytes_per_token(x->layer1 - x->layer0, nkv, c->head_dim, (tsr_dtype)out->kv_dtype);
        if (x->capacity) {
            if (x->weight_bytes + x->work_bytes >= x->capacity)
                return tsr_fail(TSR_ERR_NOMEM,
                                "plan: worker %d (stage %d, layers %d-%d) needs %.2f GiB of weights and %.2f GiB of "
                                "workspace but has %.2f GiB (--gpu-memory or free memory); use more workers or a "
                                "smaller model",
                                w, x->stage, x->layer0, x->layer1 - 1, gib(x->weight_bytes), gib(x->work_bytes),
                                gib(x->capacity));
            const double kv_share = in->kv_fraction > 0 && in->kv_fraction <= 1 ? in->kv_fraction : 0.95;
            long t = (long)((double)(x->capacity - x->weight_bytes - x->work_bytes) * kv_share / (double)per_token[w]);
            if (fit_tokens < 0 || t < fit_tokens) fit_tokens = t, tight = w;
        }
    }
    if (in->kv_fraction > 0 && in->kv_tokens <= 0 && fit_tokens < 0)
        return tsr_fail(TSR_ERR_ARG, "plan: --kv-fraction sizes the KV pool from the workers' memory, which none of "
                                     "them limits or reports (CPU workers); give --kv-tokens N, or --gpu-memory SIZE "
                                     "for a cap");
    long tokens = in->kv_tokens > 0 ? in->kv_tokens : fit_tokens >= 0 ? fit_tokens : out->max_context;
    long pages = in->kv_tokens <= 0 && fit_tokens >= 0 ? tokens / out->page_size /* as much as fits: round down */
                                                       : (tokens + out->page_size - 1) / out->page_size;
    if (pages < 4) pages = 4;
    if (pages > (1L << 30)) pages = 1L << 30;
    if (fit_tokens >= 0 && pages * out->page_size > fit_tokens) {
        const tsr_plan_worker *x = &out->w[tight];
        return tsr_fail(TSR_ERR_NOMEM,
                        "plan: worker %d (stage %d, layers %d-%d) cannot hold a KV pool of %ld tokens: %.2f GiB of "
                        "weights + %.2f GiB of workspace leave room for %ld tokens in %.2f GiB",
                        tight, x->stage, x->layer0, x->layer1 - 1, pages * out->page_size, gib(x->weight_bytes),
                        gib(x->work_bytes), fit_tokens, gib(x->capacity));
    }
    out->n_pages = (int)pages;
    for (int w = 0; w < W; w++)
        out->w[w].kv_bytes = per_token[w] * (uint64_t)pages * (uint64_t)out->page_size;
    return TSR_OK;
}

tsr_status tsr_plan_check(const tsr_plan *p, int n_layers)
{
    if (p->version != TSR_PLAN_VERSION)
        return tsr_fail(TSR_ERR_FORMAT, "plan: version %u (expected %u)", p->version, TSR_PLAN_VERSION);
    if (p->n_workers < 1 || p->n_workers > TSR_PLAN_MAX || p->tp < 1 || p->n_workers % p->tp ||
        p->n_stages != p->n_workers / p->tp || p->n_layers != n_layers || p->page_size < 1 || p->n_pages < 1 ||
        p->max_tokens < 1 || p->max_context < 1)
        return tsr_fail(TSR_ERR_FORMAT, "plan: inconsistent counts");
    for (int w = 0; w < p->n_workers; w++) {
        const tsr_plan_worker *x = &p->w[w];
        if (x->layer0 < 0 || x->layer1 > n_layers || x->layer0 >= x->layer1 || x->stage != w / p->tp ||
            x->tp_rank != w % p->tp)
            return tsr_fail(TSR_ERR_FORMAT, "plan: worker %d has an invalid layer range", w);
    }
    return TSR_OK;
}

static const char *split_name(int k)
{
    return k == TSR_SPLIT_TENSOR ? "tensor split" : k == TSR_SPLIT_LAYERS ? "layer split" : "one worker";
}

void tsr_plan_print(FILE *f, const tsr_plan *p, const tsr_model *m)
{
    const char *kv = tsr_kv_dtype_name((tsr_dtype)p->kv_dtype);
    fprintf(f,
            "plan           %s: %d worker%s, %d stage%s x %d-way tensor groups (ranks 1..%d under mpirun; rank 0 "
            "coordinates)\n",
            split_name(p->split), p->n_workers, p->n_workers == 1 ? "" : "s", p->n_stages, p->n_stages == 1 ? "" : "s",
            p->tp, p->n_workers);
    fprintf(f, "KV pool        %d pages x %d tokens = %ld tokens (%s), the same page numbering on every worker\n",
            p->n_pages, p->page_size, (long)p->n_pages * p->page_size, kv);
    fprintf(f, "workspace      %d tokens per forward call; sequences of up to %d positions\n", p->max_tokens,
            p->max_context);
    fprintf(f,
            "\n  worker stage tp layers        embed head  weights     KV pool     workspace   total       capacity\n");
    for (int w = 0; w < p->n_workers; w++) {
        const tsr_plan_worker *x = &p->w[w];
        char layers[32], cap[32], b[5][32];
        snprintf(layers, sizeof layers, "%d-%d (%d)", x->layer0, x->layer1 - 1, x->layer1 - x->layer0);
        if (x->capacity)
            human(x->capacity, cap, sizeof cap);
        else
            snprintf(cap, sizeof cap, "unlimited");
        uint64_t total = x->weight_bytes + x->kv_bytes + x->work_bytes;
        fprintf(f, "  %-6d %-5d %-2d %-13s %-5s %-5s %-11s %-11s %-11s %-11s %s\n", w, x->stage, x->tp_rank, layers,
                x->embed ? "yes" : "no", x->head ? "yes" : "no", human(x->weight_bytes, b[0], 32),
                human(x->kv_bytes, b[1], 32), human(x->work_bytes, b[2], 32), human(total, b[3], 32), cap);
    }
    if (m && p->n_stages > 1) {
        fprintf(f, "\n  stage bytes (layers as stored):");
        for (int s = 0; s < p->n_stages; s++) {
            const tsr_plan_worker *x = &p->w[tsr_plan_worker_at(p, s, 0)];
            uint64_t b = 0;
            for (int l = x->layer0; l < x->layer1; l++)
                b += tsr_model_layer_bytes(m, l);
            char h[32];
            fprintf(f, " %s", human(b, h, sizeof h));
        }
        fprintf(f, "\n");
    }
}
