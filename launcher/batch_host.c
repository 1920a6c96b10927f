/* Opening a model behind a service for batch and the intake (see batch_host.h). */
#include "launcher/batch_host.h"

#include "launcher/backend_select.h"
#include "launcher/cli.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *base_name(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t i = n;
    while (i > 0 && dir[i - 1] != '/')
        i--;
    char *s = malloc(n - i + 1);
    if (s) {
        memcpy(s, dir + i, n - i);
        s[n - i] = '\0';
    }
    return s;
}

/* The shared options that take a value: where each goes in tsr_host_opts, and the range of a number. */
typedef enum { HOST_TEXT, HOST_INT, HOST_LONG, HOST_FRACTION, HOST_KV_DTYPE } host_opt_kind;
typedef struct {
    const char *name;
    host_opt_kind kind;
    size_t field; /* offsetof(tsr_host_opts, ...) */
    long lo, hi;
} host_opt;

static const host_opt valued_opts[] = {
    {"--model", HOST_TEXT, offsetof(tsr_host_opts, model_dir), 0, 0},
    {"--device", HOST_TEXT, offsetof(tsr_host_opts, device), 0, 0},
    {"--served-model-name", HOST_TEXT, offsetof(tsr_host_opts, served_name), 0, 0},
    {"--max-running", HOST_INT, offsetof(tsr_host_opts, max_running), 1, 4096},
    {"--kv-tokens", HOST_LONG, offsetof(tsr_host_opts, kv_tokens), 16, 1L << 30},
    {"--kv-fraction", HOST_FRACTION, offsetof(tsr_host_opts, kv_fraction), 0, 0},
    {"--max-context", HOST_LONG, offsetof(tsr_host_opts, max_context), 16, 1L << 30},
    {"--kv-dtype", HOST_KV_DTYPE, offsetof(tsr_host_opts, kv_dtype), 0, 0},
    {"--step-tokens", HOST_INT, offsetof(tsr_host_opts, step_tokens), 1, 1 << 20},
    {"--prefill-chunk", HOST_INT, offsetof(tsr_host_opts, prefill_chunk), 0, 1 << 20},
    {"--threads", HOST_INT, offsetof(tsr_host_opts, threads), 1, 1024},
};

void tsr_host_opts_kv_help(FILE *f)
{
    fprintf(f,
            "  --kv-tokens N          KV cache size in tokens (default: the engine's)\n"
            "  --kv-fraction F        with no --kv-tokens: the cache's share of the GPU memory the weights and\n"
            "                         workspace leave (default 0.9; 0.95 under a --gpu-memory plan; on the CPU only\n"
            "                         with --gpu-memory)\n"
            "  --kv-dtype D           f16 (default), q4, q6 or q8 (quantized: 2-3.5x the tokens), f32\n"
            "  --max-context N        the longest sequence served, prompt and output (default: the model's\n"
            "                         context); sizes the KV cache's default and longer requests are refused\n");
}

int tsr_host_opts_take(tsr_host_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--no-prefix-cache")) {
        o->no_prefix_cache = 1;
        return 1;
    }
    const int par = tsr_par_opts_take(o->cmd, &o->par, argc, argv, i);
    if (par) return par;
    const host_opt *opt = NULL;
    for (size_t k = 0; k < sizeof valued_opts / sizeof *valued_opts && !opt; k++)
        if (!strcmp(a, valued_opts[k].name)) opt = &valued_opts[k];
    if (!opt) return 0;
    const char *v = tsr_cli_value(o->cmd, argc, argv, i);
    if (!v) return -1;
    char *field = (char *)o + opt->field;
    long n = 0;
    if ((opt->kind == HOST_INT || opt->kind == HOST_LONG) && tsr_cli_int(o->cmd, a, v, opt->lo, opt->hi, &n)) return -1;
    switch (opt->kind) {
    case HOST_TEXT: *(const char **)(void *)field = v; break;
    case HOST_INT: *(int *)(void *)field = (int)n; break;
    case HOST_LONG: *(long *)(void *)field = n; break;
    case HOST_FRACTION: return tsr_cli_kv_fraction(o->cmd, v, (double *)(void *)field) ? -1 : 1;
    case HOST_KV_DTYPE: return tsr_cli_kv_dtype(o->cmd, v, (tsr_dtype *)(void *)field) ? -1 : 1;
    }
    return 1;
}

static tsr_session_req session_req(const tsr_host_opts *o)
{
    return (tsr_session_req){.cmd = o->cmd ? o->cmd : "serve",
                             .model_dir = o->model_dir,
                             .device = o->device ? o->device : "cpu",
                             .select_backend = tsr_select_backend,
                             .threads = o->threads,
                             .max_tokens = o->step_tokens,
                             .kv_dtype = o->kv_dtype, /* TSR_DTYPE_INVALID: the session's fp16 */
                             .kv_tokens = o->kv_tokens,
                             .kv_fraction = o->kv_fraction,
                             .max_context = o->max_context};
}

int tsr_host_run_worker(const tsr_host_opts *o)
{
    tsr_session_req req = session_req(o);
    tsr_session *s = NULL;
    tsr_status st = tsr_session_open(&req, &o->par, &s);
    if (st != TSR_OK) return tsr_cli_error(req.cmd, st);
    int rc = s->worker_rc;
    tsr_session_close(s);
    return rc;
}

tsr_status tsr_host_open(const tsr_host_opts *o, tsr_host **out)
{
    *out = NULL;
    tsr_host *h = calloc(1, sizeof *h);
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    tsr_status st;
    h->name = o->served_name ? strdup(o->served_name) : base_name(o->model_dir);
    if (!h->name) {
        st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = tsr_tokenizer_load(o->model_dir, &h->tok)) != TSR_OK) goto fail;
    st = tsr_chat_template_load_dir(o->model_dir, 0, &h->tpl, &h->bos, &h->eos);
    if (st != TSR_OK) { /* no template: chat requests get a 400, completions work */
        if (st == TSR_ERR_NOMEM) goto fail;
        fprintf(stderr, "tessera %s: no chat template (%s): /v1/chat/completions is unavailable\n",
                o->cmd ? o->cmd : "serve", tsr_last_error());
        h->tpl = NULL;
    }
    tsr_session_req req = session_req(o);
    if ((st = tsr_session_open(&req, &o->par, &h->session)) != TSR_OK) goto fail_open;
    const tsr_model_config *c = &h->session->cfg;
    const tsr_executor *x = h->session->x;
    h->eos_ids = calloc((size_t)c->n_eos + 1, sizeof *h->eos_ids);
    if (!h->eos_ids) {
        st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c->n_eos; i++)
        h->eos_ids[i] = c->eos_ids[i];
    tsr_service_opts so = {.sched = {.max_running = o->max_running,
                                     .max_prefill_decoding = o->prefill_chunk,
                                     .prefix_cache = o->no_prefix_cache ? -1 : 0}};
    if ((st = tsr_service_start(h->session->x, h->tok, &so, &h->svc)) != TSR_OK) goto fail;
    h->model = (tsr_oai_model){
        .name = h->name,
        .tok = h->tok,
        .tpl = h->tpl,
        .bos_token = h->bos,
        .eos_token = h->eos,
        .eos_ids = h->eos_ids,
        .n_eos = c->n_eos,
        .vocab = x->vocab,
        .max_context = x->max_context,
        .created = (int64_t)time(NULL),
    };
    *out = h;
    return TSR_OK;
fail:
    if (!h->session) tsr_session_cancel(tsr_last_error()); /* workers waiting for the start leave */
fail_open:
    tsr_host_close(h, 0);
    return st;
}

void tsr_host_close(tsr_host *h, double grace_s)
{
    if (!h) return;
    if (h->svc) tsr_service_stop(h->svc, grace_s);
    tsr_session_close(h->session);
    tsr_chat_template_free(h->tpl);
    tsr_tokenizer_free(h->tok);
    free(h->bos);
    free(h->eos);
    free(h->name);
    free(h->eos_ids);
    free(h);
}

void tsr_host_stats_line(tsr_host *h, char *buf, size_t cap)
{
    tsr_service_stats s;
    tsr_service_get_stats(h->svc, &s);
    snprintf(buf, cap,
             "prefix_lookups=%" PRIu64 " prefix_hits=%" PRIu64 " prefix_hit_tokens=%" PRIu64
             " prefix_evictions=%" PRIu64 " prefill_tokens=%" PRIu64 " decode_tokens=%" PRIu64 " steps=%" PRIu64
             " preempted=%d requests=%" PRIu64 " tokens_in=%" PRIu64 " tokens_out=%" PRIu64 " busy_s=%.3f"
             " sched_s=%.3f",
             s.sched.prefix_lookups, s.sched.prefix_hits, s.sched.prefix_hit_tokens, s.sched.prefix_evictions,
             s.sched.prefill_tokens, s.sched.decode_tokens, s.sched.steps, s.sched.preempted_total, s.requests_total,
             s.tokens_in, s.tokens_out, s.busy_s, s.sched_s);
}
