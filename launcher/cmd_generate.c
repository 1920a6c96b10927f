/* tessera generate: continues a prompt with the model, greedy or sampled, printing text or token ids.
 *
 * The prompt is given as token ids (--ids) or as text (--prompt, encoded with the model's tokenizer.json; --chat
 * wraps it in the model's chat template as a user message first). Generation stops at an end-of-sequence token
 * of generation_config.json / config.json (unless --ignore-eos) or after --max-tokens. Text is streamed through
 * the incremental detokenizer as it is produced. */
#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "kernels/cpu/threadpool.h"
#include "launcher/text_io.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera generate --model DIR (--prompt TEXT [--chat] | --ids 0,5,9) [options]\n"
            "  --max-tokens N      tokens to generate (default 128)\n"
            "  --temperature T     0 = greedy (default 0)\n"
            "  --top-k K           keep the K most likely tokens (default 0 = all)\n"
            "  --top-p P           nucleus truncation (default 1 = off)\n"
            "  --seed S            sampling seed (default 0)\n"
            "  --print-ids         print the generated token ids instead of text\n"
            "  --ignore-eos        do not stop at end-of-sequence tokens\n"
            "  --threads N         CPU threads (default: all cores)\n"
            "  --device D          cpu (default), cuda or cuda:N\n");
}

static int is_eos(const tsr_model_config *c, int32_t t)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == t) return 1;
    return 0;
}

int tsr_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *ids_arg = NULL, *device = "cpu";
    long max_tokens = 128, top_k = 0, seed = 0, threads = 0;
    double temperature = 0, top_p = 1;
    int print_ids = 0, ignore_eos = 0, chat = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--print-ids")) {
            print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--chat")) {
            chat = 1;
            continue;
        }
        if (!(v = tsr_cli_value("generate", argc, argv, &i))) return 2;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--ids"))
            ids_arg = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (tsr_cli_int("generate", a, v, 0, 1 << 24, &max_tokens)) return 2;
        } else if (!strcmp(a, "--temperature")) {
            if (tsr_cli_float("generate", a, v, 0, 100, &temperature)) return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (tsr_cli_int("generate", a, v, 0, 1 << 30, &top_k)) return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (tsr_cli_float("generate", a, v, 1e-9, 1, &top_p)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (tsr_cli_int("generate", a, v, 0, __LONG_MAX__, &seed)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (tsr_cli_int("generate", a, v, 1, 1024, &threads)) return 2;
        } else {
            fprintf(stderr, "tessera generate: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!prompt == !ids_arg) || (chat && !prompt)) {
        usage(stderr);
        return 2;
    }
    if (threads) tsr_threads_set((int)threads);

    int32_t *prompt_ids = NULL;
    int n_prompt = 0;
    tsr_text *text = NULL;
    int rc = 1;
    tsr_engine *e = NULL;
    tsr_seq seq = {0};
    float *logits = NULL;
    int32_t *out_ids = NULL;
    tsr_status st;

    if (ids_arg) {
        if (tsr_cli_ids("generate", ids_arg, &prompt_ids, &n_prompt)) return 2;
    }
    if (prompt || !print_ids) {
        if ((st = tsr_text_open(model, &text)) != TSR_OK) {
            if (prompt) return tsr_cli_error("generate", st);
            text = NULL; /* ids in, ids out when there is no tokenizer */
            print_ids = 1;
        }
    }
    if (prompt && (st = tsr_text_encode_prompt(text, prompt, chat, &prompt_ids, &n_prompt)) != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }

    tsr_engine_opts o = {.kv_tokens = n_prompt + max_tokens + 16};
    if ((st = tsr_select_backend(device, &o.ops)) != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    if ((st = tsr_engine_open(model, &o, &e)) != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    const tsr_model_config *c = &e->model->cfg;
    for (int i = 0; i < n_prompt; i++)
        if (prompt_ids[i] < 0 || prompt_ids[i] >= c->vocab_size) {
            fprintf(stderr, "tessera generate: token id %d is outside the vocabulary (%d)\n", (int)prompt_ids[i],
                    c->vocab_size);
            rc = 2;
            goto done;
        }
    logits = malloc((size_t)c->vocab_size * sizeof(float));
    out_ids = malloc(((size_t)max_tokens + 1) * sizeof(int32_t));
    if (!logits || !out_ids) {
        fprintf(stderr, "tessera generate: out of memory\n");
        goto done;
    }
    tsr_sampling sp = {(float)temperature, (int)top_k, (float)top_p};
    tsr_rng rng;
    tsr_rng_seed(&rng, (uint64_t)seed);
    tsr_feed feed = {&seq, prompt_ids, n_prompt, TSR_LOGITS_LAST, logits};
    int n_out = 0;
    if (text && !print_ids && (st = tsr_text_stream_begin(text)) != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    if (prompt && !chat && !print_ids) fputs(prompt, stdout); /* the continuation follows the prompt */
    while (n_out < max_tokens) {
        if ((st = tsr_engine_feed(e, &feed, 1)) != TSR_OK) break;
        int32_t tok;
        if ((st = tsr_sample(logits, c->vocab_size, &sp, &rng, &tok)) != TSR_OK) break;
        if (!ignore_eos && is_eos(c, tok)) break;
        out_ids[n_out++] = tok;
        if (print_ids) {
            printf(n_out > 1 ? ",%d" : "%d", (int)tok);
        } else if ((st = tsr_text_stream_push(text, tok, stdout)) != TSR_OK) {
            break;
        }
        fflush(stdout);
        feed = (tsr_feed){&seq, &out_ids[n_out - 1], 1, TSR_LOGITS_LAST, logits};
    }
    if (st == TSR_OK && text && !print_ids) st = tsr_text_stream_end(text, stdout);
    printf("\n");
    if (st != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    rc = 0;
done:
    if (e) tsr_engine_seq_release(e, &seq);
    tsr_engine_close(e);
    tsr_text_close(text);
    free(prompt_ids);
    free(logits);
    free(out_ids);
    return rc;
}
