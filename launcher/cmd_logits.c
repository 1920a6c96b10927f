/* tessera logits: runs prompts through the model and writes their logits to a safetensors file.
 *
 * Input: {"ids": [[...], ...]} (the fixtures' prompts.json shape). Output: F32 tensors `logits.<i>` of shape
 * [tokens, vocab], one per prompt. All prompts are processed together: each step plan carries up to
 * --max-batch-tokens tokens, prompts' chunks side by side, and asks for every token's logits. The plans run on an
 * executor: this process's engine, or under mpirun the worker ranks (parallel/session.h); prompt i's pages are
 * numbered after prompt i-1's. Under mpirun only rank 0 writes. */
#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "parallel/rank.h"
#include "parallel/session.h"
#include "runtime/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera logits --model DIR --prompts FILE.json --out OUT.safetensors [--max-batch-tokens N]\n"
               "                      [--kv-dtype f16|f32|q4|q6|q8] [--device cpu|cuda[:N]] [--threads N]\n"
               "FILE.json: {\"ids\": [[id, ...], ...]}; OUT gets F32 tensors logits.<i> of shape [tokens, vocab].\n");
    tsr_par_opts_help(f);
}

static int read_prompts(const char *path, int32_t ***ids, int **lens, int *n)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        fprintf(stderr, "tessera logits: %s: invalid JSON at line %d: %s\n", path, err.line, err.text);
        return -1;
    }
    json_t *arr = json_object_get(root, "ids");
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        fprintf(stderr, "tessera logits: %s: expected {\"ids\": [[...], ...]} with at least one prompt\n", path);
        json_decref(root);
        return -1;
    }
    *n = (int)json_array_size(arr);
    *ids = calloc((size_t)*n, sizeof **ids);
    *lens = calloc((size_t)*n, sizeof **lens);
    for (int i = 0; i < *n; i++) {
        json_t *p = json_array_get(arr, (size_t)i);
        size_t len = json_is_array(p) ? json_array_size(p) : 0;
        if (len == 0) {
            fprintf(stderr, "tessera logits: %s: prompt %d is not a non-empty list of ids\n", path, i);
            json_decref(root);
            return -1;
        }
        (*ids)[i] = malloc(len * sizeof(int32_t));
        (*lens)[i] = (int)len;
        for (size_t k = 0; k < len; k++) {
            json_t *v = json_array_get(p, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                fprintf(stderr, "tessera logits: %s: prompt %d entry %zu is not a token id\n", path, i, k);
                json_decref(root);
                return -1;
            }
            (*ids)[i][k] = (int32_t)json_integer_value(v);
        }
    }
    json_decref(root);
    return 0;
}

/* Runs every prompt through the executor; outs[i] = logits [lens[i]][vocab]. */
static tsr_status run_prompts(tsr_executor *x, int32_t **ids, const int *lens, int n, float **outs)
{
    const int vocab = x->vocab, page = x->page_size;
    int *done = calloc((size_t)n, sizeof *done);
    int32_t **tables = calloc((size_t)n, sizeof *tables);
    float *rows = NULL;
    size_t cap_rows = 0;
    tsr_step step;
    memset(&step, 0, sizeof step);
    tsr_status st = done && tables ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of memory");
    /* prompt i's pages follow prompt i-1's */
    for (int i = 0, next = 0; st == TSR_OK && i < n; i++) {
        int np = (lens[i] + page - 1) / page;
        if (next + np > x->n_pages) {
            st = tsr_fail(TSR_ERR_NOMEM, "KV cache full: the prompts need more than %d pages of %d tokens", x->n_pages,
                          page);
            break;
        }
        if (!(tables[i] = malloc((size_t)np * sizeof(int32_t)))) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
        for (int k = 0; st == TSR_OK && k < np; k++) tables[i][k] = next++;
    }
    while (st == TSR_OK) {
        tsr_step_clear(&step);
        int budget = x->max_step_tokens, taken[64], owner[64], nb = 0;
        size_t need = 0;
        for (int i = 0; i < n && budget > 0 && nb < 64; i++) {
            int take = lens[i] - done[i] < budget ? lens[i] - done[i] : budget;
            if (take <= 0) continue;
            tsr_step_seq q;
            memset(&q, 0, sizeof q);
            q.id = (uint64_t)i + 1;
            q.pos0 = done[i];
            q.n_tokens = take;
            q.n_pages = (done[i] + take + page - 1) / page;
            q.n_logprobs = -1;
            q.logits = 2;
            q.sampling = tsr_sampling_default();
            if ((st = tsr_step_add(&step, &q, ids[i] + done[i], tables[i], NULL, NULL)) != TSR_OK) break;
            taken[nb] = take;
            owner[nb++] = i;
            budget -= take;
            need += (size_t)take;
        }
        if (st != TSR_OK || nb == 0) break;
        if (need > cap_rows) {
            float *g = realloc(rows, need * (size_t)vocab * sizeof *g);
            if (!g) {
                st = tsr_fail(TSR_ERR_NOMEM, "out of memory for %zu rows of logits", need);
                break;
            }
            rows = g;
            cap_rows = need;
        }
        tsr_step_result res[64];
        if ((st = x->run(x, &step, res, rows)) != TSR_OK) break;
        size_t row = 0;
        for (int b = 0; b < nb; b++) {
            int i = owner[b];
            memcpy(outs[i] + (size_t)done[i] * vocab, rows + row * vocab, (size_t)taken[b] * vocab * sizeof(float));
            row += (size_t)taken[b];
            done[i] += taken[b];
        }
    }
    for (int i = 0; tables && i < n; i++) free(tables[i]);
    free(tables);
    free(done);
    free(rows);
    tsr_step_free(&step);
    return st;
}

int tsr_cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *prompts = NULL, *out = NULL, *device = "cpu";
    long max_batch = 512, threads = 0;
    tsr_dtype kv_dtype = TSR_F16;
    tsr_par_opts po;
    tsr_par_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int par = tsr_par_opts_take("logits", &po, argc, argv, &i);
        if (par < 0) return 2;
        if (par > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            if (!(model = tsr_cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompts")) {
            if (!(prompts = tsr_cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--out")) {
            if (!(out = tsr_cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            if (!(v = tsr_cli_value("logits", argc, argv, &i)) ||
                tsr_cli_int("logits", "--max-batch-tokens", v, 1, 1 << 20, &max_batch))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = tsr_cli_value("logits", argc, argv, &i)) ||
                tsr_cli_int("logits", "--threads", v, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(a, "--device")) {
            if (!(device = tsr_cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = tsr_cli_value("logits", argc, argv, &i))) return 2;
            if (tsr_cli_kv_dtype("logits", v, &kv_dtype)) {
                return 2;
            }
        } else {
            fprintf(stderr, "tessera logits: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !prompts || !out) {
        usage(stderr);
        return 2;
    }
    tsr_session_req req = {.cmd = "logits", .model_dir = model, .device = device, .select_backend = tsr_select_backend,
                           .threads = (int)threads, .max_tokens = (int)max_batch, .kv_dtype = kv_dtype};
    tsr_session *s = NULL;
    tsr_status st;
    if (tsr_rank_is_worker()) {
        if ((st = tsr_session_open(&req, &po, &s)) != TSR_OK) return tsr_cli_error("logits", st);
        int rc = s->worker_rc;
        tsr_session_close(s);
        return rc;
    }
    int32_t **ids = NULL;
    int *lens = NULL, n = 0;
    int rc = 1;
    float **outs = NULL;
    tsr_st_writer *w = NULL;
    if (read_prompts(prompts, &ids, &lens, &n)) {
        tsr_session_cancel("unreadable prompts");
        goto done;
    }
    long total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    req.kv_tokens = total + 16L * n;
    if ((st = tsr_session_open(&req, &po, &s)) != TSR_OK) {
        rc = tsr_cli_error("logits", st);
        goto done;
    }
    const int vocab = s->cfg.vocab_size;
    outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; outs && i < n; i++) {
        outs[i] = malloc((size_t)lens[i] * vocab * sizeof(float));
        if (!outs[i]) break;
    }
    if (!outs || (n && !outs[n - 1])) {
        fprintf(stderr, "tessera logits: out of memory\n");
        goto done;
    }
    if ((st = run_prompts(s->x, ids, lens, n, outs)) != TSR_OK) {
        rc = tsr_cli_error("logits", st);
        goto done;
    }
    st = tsr_st_writer_open(out, &w);
    for (int i = 0; st == TSR_OK && i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "logits.%d", i);
        st = tsr_st_writer_declare(w, name, TSR_F32, 2, (int64_t[]){lens[i], vocab});
    }
    if (st == TSR_OK) st = tsr_st_writer_begin_data(w);
    for (int i = 0; st == TSR_OK && i < n; i++)
        st = tsr_st_writer_write(w, outs[i], (size_t)lens[i] * vocab * sizeof(float));
    if (st == TSR_OK) {
        st = tsr_st_writer_close(w);
        w = NULL;
    }
    if (st != TSR_OK) {
        rc = tsr_cli_error("logits", st);
        goto done;
    }
    rc = 0;
done:
    tsr_st_writer_abort(w);
    for (int i = 0; i < n; i++) {
        if (ids) free(ids[i]);
        if (outs) free(outs[i]);
    }
    free(ids);
    free(lens);
    free(outs);
    tsr_session_close(s);
    return rc;
}
