/* tessera logits: runs prompts through the model and writes their logits to a safetensors file.
 *
 * Input: {"ids": [[...], ...]} (the fixtures' prompts.json shape). Output: F32 tensors `logits.<i>` of shape
 * [tokens, vocab], one per prompt. All prompts are processed together: their prefill chunks share forward calls. */
#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/engine.h"
#include "runtime/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera logits --model DIR --prompts FILE.json --out OUT.safetensors [--max-batch-tokens N]\n"
               "                      [--kv-dtype f16|f32] [--device cpu|cuda[:N]]\n"
               "FILE.json: {\"ids\": [[id, ...], ...]}; OUT gets F32 tensors logits.<i> of shape [tokens, vocab].\n");
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

int tsr_cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *prompts = NULL, *out = NULL, *device = "cpu";
    long max_batch = 512;
    tsr_dtype kv_dtype = TSR_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
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
    int32_t **ids = NULL;
    int *lens = NULL, n = 0;
    int rc = 1;
    tsr_engine *e = NULL;
    tsr_seq *seqs = NULL;
    tsr_feed *feeds = NULL;
    float **outs = NULL;
    tsr_st_writer *w = NULL;
    if (read_prompts(prompts, &ids, &lens, &n)) goto done;

    long total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    tsr_engine_opts o = {.max_tokens = (int)max_batch, .kv_tokens = total + 16L * n, .kv_dtype = kv_dtype};
    tsr_status st = tsr_select_backend(device, &o.ops);
    if (st == TSR_OK) st = tsr_engine_open(model, &o, &e);
    if (st != TSR_OK) {
        rc = tsr_cli_error("logits", st);
        goto done;
    }
    const int vocab = e->model->cfg.vocab_size;
    seqs = calloc((size_t)n, sizeof *seqs);
    feeds = calloc((size_t)n, sizeof *feeds);
    outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        outs[i] = malloc((size_t)lens[i] * vocab * sizeof(float));
        if (!outs[i]) {
            fprintf(stderr, "tessera logits: out of memory\n");
            goto done;
        }
        feeds[i] = (tsr_feed){&seqs[i], ids[i], lens[i], TSR_LOGITS_ALL, outs[i]};
    }
    if ((st = tsr_engine_feed(e, feeds, n)) != TSR_OK) {
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
        if (seqs && e) tsr_engine_seq_release(e, &seqs[i]);
    }
    free(ids);
    free(lens);
    free(outs);
    free(seqs);
    free(feeds);
    tsr_engine_close(e);
    return rc;
}
