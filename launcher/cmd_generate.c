/* tessera generate: continues a prompt with the model, greedy or sampled, printing text or token ids.
 *
 * The prompt is given as token ids (--ids) or as text (--prompt, encoded with the model's tokenizer.json; --chat
 * wraps it in the model's chat template as a user message first). Generation stops at an end-of-sequence token
 * of generation_config.json / config.json (unless --ignore-eos) or after --max-tokens. Text is streamed through
 * the incremental detokenizer as it is produced.
 *
 * The work goes through an executor (runtime/executor.h): this process's engine, or under mpirun the worker ranks
 * (parallel/session.h), with one step plan per token built here (the sequence's pages numbered from 0). The last
 * stage samples: token i is drawn with the counter-based uniform (seed, i), which is what the one-process sampler
 * draws too, so a seed gives the same text everywhere. Under mpirun only rank 0 prints.
 *
 * --bench times random prompts instead (parallel/bench.h): prefill and decode throughput per batch size through
 * the same executor, so `mpirun ... tessera generate --bench --split tensor` measures a split model. */
#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/text_io.h"
#include "parallel/bench.h"
#include "parallel/rank.h"
#include "parallel/session.h"
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
            "  --logprobs N        also print each token's log-probability and the N best alternatives (stderr)\n"
            "  --ignore-eos        do not stop at end-of-sequence tokens\n"
            "  --threads N         CPU threads (default: all cores, or a worker's bound cores)\n"
            "  --device D          cpu (default), cuda or cuda:N (under mpirun: each worker its own GPU)\n"
            "  --step-tokens N     tokens per step and forward call (default 2048)\n"
            "  --kv-dtype D        KV cache storage: f16 (default), q4, q6, q8 (quantized K and V) or f32\n"
            "benchmark: tessera generate --model DIR --bench [--batch 1,8,32] [--prompt-len 128] [--gen 32]\n"
            "           [--json FILE]: random prompts, prefill and decode tokens/s per batch size; tokens are\n"
            "           greedy unless --temperature, --top-k or --top-p say how to sample them\n");
    tsr_par_opts_help(f);
}

static int is_eos(const tsr_model_config *c, int32_t t)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == t) return 1;
    return 0;
}

static void print_logprobs(const tsr_step_result *r)
{
    fprintf(stderr, "token %d logprob %.5f", (int)r->token, r->logprob);
    for (int i = 0; i < r->n_top; i++)
        fprintf(stderr, "%s%d:%.5f", i ? " " : " top ", (int)r->top_ids[i], r->top_logprobs[i]);
    fprintf(stderr, "\n");
}

/* Generates on the executor; returns the command's exit code. */
static int run(tsr_session *s, tsr_text *text, const int32_t *prompt_ids, int n_prompt, long max_tokens,
               const tsr_sampling *sp, long seed, long logprobs, int print_ids, int ignore_eos, const char *prompt,
               int chat)
{
    tsr_executor *x = s->x;
    const tsr_model_config *c = &s->cfg;
    for (int i = 0; i < n_prompt; i++)
        if (prompt_ids[i] < 0 || prompt_ids[i] >= c->vocab_size) {
            fprintf(stderr, "tessera generate: token id %d is outside the vocabulary (%d)\n", (int)prompt_ids[i],
                    c->vocab_size);
            return 2;
        }
    const long need = (long)n_prompt + max_tokens;
    const int n_pages = (int)((need + x->page_size - 1) / x->page_size);
    if (n_pages > x->n_pages) {
        fprintf(stderr, "tessera generate: %ld tokens need %d KV pages, the pool has %d\n", need, n_pages, x->n_pages);
        return 1;
    }
    int32_t *pages = malloc((size_t)n_pages * sizeof *pages);
    int32_t *out_ids = malloc(((size_t)max_tokens + 1) * sizeof *out_ids);
    if (!pages || !out_ids) {
        free(pages);
        free(out_ids);
        fprintf(stderr, "tessera generate: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n_pages; i++) pages[i] = i;
    tsr_step step;
    memset(&step, 0, sizeof step);
    tsr_step_seq q;
    memset(&q, 0, sizeof q);
    q.id = 1;
    q.sample = 1;
    q.n_logprobs = logprobs > 0 ? (int32_t)logprobs : -1;
    q.seed = (uint64_t)seed;
    q.sampling = *sp;
    tsr_status st = TSR_OK;
    int n_out = 0;
    if (text && !print_ids && (st = tsr_text_stream_begin(text)) != TSR_OK) goto out;
    if (prompt && !chat && !print_ids) fputs(prompt, stdout); /* the continuation follows the prompt */
    while (n_out < max_tokens) {
        /* the prompt first, then one token per step */
        const int32_t *tokens = n_out ? &out_ids[n_out - 1] : prompt_ids;
        q.pos0 = n_out ? n_prompt + n_out - 1 : 0;
        q.n_tokens = n_out ? 1 : n_prompt;
        q.n_pages = (q.pos0 + q.n_tokens + x->page_size - 1) / x->page_size;
        q.sample_index = (uint32_t)n_out;
        tsr_step_clear(&step);
        tsr_step_result r;
        if ((st = tsr_step_add(&step, &q, tokens, pages, NULL, NULL)) != TSR_OK) break;
        if ((st = x->run(x, &step, &r, NULL)) != TSR_OK) break;
        if (logprobs > 0) print_logprobs(&r);
        if (!ignore_eos && is_eos(c, r.token)) break;
        out_ids[n_out++] = r.token;
        if (print_ids) {
            printf(n_out > 1 ? ",%d" : "%d", (int)r.token);
        } else if ((st = tsr_text_stream_push(text, r.token, stdout)) != TSR_OK) {
            break;
        }
        fflush(stdout);
    }
    if (st == TSR_OK && text && !print_ids) st = tsr_text_stream_end(text, stdout);
    printf("\n");
out:
    tsr_step_free(&step);
    free(pages);
    free(out_ids);
    return st == TSR_OK ? 0 : tsr_cli_error("generate", st);
}

int tsr_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *ids_arg = NULL, *device = "cpu";
    long max_tokens = 128, top_k = 0, seed = 0, threads = 0, logprobs = 0;
    double temperature = 0, top_p = 1;
    int print_ids = 0, ignore_eos = 0, chat = 0, bench = 0;
    long step_tokens = TSR_STEP_TOKENS_DEFAULT, prompt_len = 128, gen = 32;
    const char *batches = "1,8,32", *json = NULL;
    tsr_dtype kv_dtype = TSR_F16;
    tsr_par_opts po;
    tsr_par_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
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
        if (!strcmp(a, "--bench")) {
            bench = 1;
            continue;
        }
        int par = tsr_par_opts_take("generate", &po, argc, argv, &i);
        if (par < 0) return 2;
        if (par > 0) continue;
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
        } else if (!strcmp(a, "--logprobs")) {
            if (tsr_cli_int("generate", a, v, 0, TSR_MAX_LOGPROBS, &logprobs)) return 2;
        } else if (!strcmp(a, "--step-tokens")) {
            if (tsr_cli_int("generate", a, v, 1, 1 << 20, &step_tokens)) return 2;
        } else if (!strcmp(a, "--prompt-len")) {
            if (tsr_cli_int("generate", a, v, 1, 1 << 20, &prompt_len)) return 2;
        } else if (!strcmp(a, "--gen")) {
            if (tsr_cli_int("generate", a, v, 1, 1 << 20, &gen)) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (tsr_cli_kv_dtype("generate", v, &kv_dtype)) return 2;
        } else if (!strcmp(a, "--batch")) {
            batches = v;
        } else if (!strcmp(a, "--json")) {
            json = v;
        } else {
            fprintf(stderr, "tessera generate: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!bench && ((!prompt == !ids_arg) || (chat && !prompt)))) {
        usage(stderr);
        return 2;
    }
    int32_t *prompt_ids = NULL;
    int n_prompt = 0;
    if (ids_arg && tsr_cli_ids("generate", ids_arg, &prompt_ids, &n_prompt)) return 2;
    tsr_bench_opts bo = {.prompt_len = (int)prompt_len, .gen = (int)gen, .json = json, .label = model};
    bo.sampling = tsr_sampling_default();
    bo.sampling.temperature = (float)temperature;
    bo.sampling.top_k = (int)top_k;
    bo.sampling.top_p = (float)top_p;
    if (bench) {
        int32_t *b = NULL;
        int nb = 0;
        if (tsr_cli_ids("generate", batches, &b, &nb)) return 2;
        for (int i = 0; i < nb; i++) {
            if (i == TSR_BENCH_MAX_BATCHES || b[i] < 1 || b[i] > step_tokens) {
                fprintf(stderr, "tessera generate: --batch takes up to %d sizes in [1, %ld]\n", TSR_BENCH_MAX_BATCHES,
                        step_tokens);
                free(b);
                free(prompt_ids);
                return 2;
            }
            bo.batches[bo.n_batches++] = b[i];
        }
        free(b);
    }

    tsr_session_req req = {.cmd = "generate", .model_dir = model, .device = device,
                           .select_backend = tsr_select_backend, .threads = (int)threads,
                           .max_tokens = (int)step_tokens, .kv_dtype = kv_dtype};
    tsr_session *s = NULL;
    tsr_status st;
    if (bench && !tsr_rank_is_worker()) {
        req.kv_tokens = tsr_bench_kv_tokens(&bo, 16);
        if ((st = tsr_session_open(&req, &po, &s)) != TSR_OK) {
            free(prompt_ids);
            return tsr_cli_error("generate", st);
        }
        st = tsr_bench_run(s->x, &bo, stdout);
        tsr_session_close(s);
        free(prompt_ids);
        return st == TSR_OK ? 0 : tsr_cli_error("generate", st);
    }
    if (tsr_rank_is_worker()) {
        /* a worker rank: serve the coordinator's steps until it is done */
        free(prompt_ids);
        if ((st = tsr_session_open(&req, &po, &s)) != TSR_OK) return tsr_cli_error("generate", st);
        int rc = s->worker_rc;
        tsr_session_close(s);
        return rc;
    }

    tsr_text *text = NULL;
    int rc = 1;
    if (prompt || !print_ids) {
        if ((st = tsr_text_open(model, &text)) != TSR_OK) {
            if (prompt) {
                tsr_session_cancel("no tokenizer");
                free(prompt_ids);
                return tsr_cli_error("generate", st);
            }
            text = NULL; /* ids in, ids out when there is no tokenizer */
            print_ids = 1;
        }
    }
    if (prompt && (st = tsr_text_encode_prompt(text, prompt, chat, &prompt_ids, &n_prompt)) != TSR_OK) {
        tsr_session_cancel("the prompt cannot be encoded");
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    req.kv_tokens = n_prompt + max_tokens + 16;
    if ((st = tsr_session_open(&req, &po, &s)) != TSR_OK) {
        rc = tsr_cli_error("generate", st);
        goto done;
    }
    tsr_sampling sp = tsr_sampling_default();
    sp.temperature = (float)temperature;
    sp.top_k = (int)top_k;
    sp.top_p = (float)top_p;
    rc = run(s, text, prompt_ids, n_prompt, max_tokens, &sp, seed, logprobs, print_ids, ignore_eos, prompt, chat);
done:
    tsr_session_close(s);
    tsr_text_close(text);
    free(prompt_ids);
    return rc;
}
