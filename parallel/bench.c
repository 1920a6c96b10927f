/* Executor throughput (see bench.h). */
#include "parallel/bench.h"

#include "runtime/sampler.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

long tsr_bench_kv_tokens(const tsr_bench_opts *o, int page_size)
{
    int most = 1;
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] > most) most = o->batches[i];
    long per = ((long)o->prompt_len + o->gen + page_size - 1) / page_size;
    return (long)most * per * page_size;
}

typedef struct {
    int batch;
    double prefill_s, decode_s;
} bench_row;

static tsr_status one_batch(tsr_executor *x, const tsr_bench_opts *o, int B, bench_row *row)
{
    const int page = x->page_size, P = (o->prompt_len + o->gen + page - 1) / page;
    if ((long)B * P > x->n_pages)
        return tsr_fail(TSR_ERR_ARG, "bench: batch %d needs %ld KV pages, the pool has %d", B, (long)B * P, x->n_pages);
    int32_t *prompts = malloc((size_t)B * o->prompt_len * sizeof *prompts);
    int32_t *pages = malloc((size_t)B * P * sizeof *pages);
    int32_t *next = malloc((size_t)B * sizeof *next);
    tsr_step_result *res = malloc((size_t)(B > 0 ? B : 1) * sizeof *res);
    int *done = calloc((size_t)B * 2, sizeof *done);
    int *owner = done ? done + B : NULL; /* sequence of each plan entry */
    tsr_step step;
    memset(&step, 0, sizeof step);
    tsr_status st = prompts && pages && next && res && done ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of memory");
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(B + 1);
    for (long i = 0; st == TSR_OK && i < (long)B * o->prompt_len; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        prompts[i] = (int32_t)(r % (uint64_t)x->vocab);
    }
    for (long i = 0; st == TSR_OK && i < (long)B * P; i++)
        pages[i] = (int32_t)i;
    tsr_step_seq q;
    memset(&q, 0, sizeof q);
    q.sample = 1;
    q.n_logprobs = -1;
    q.sampling = tsr_sampling_default();
    q.sampling.temperature = 0;
    /* warm-up: one token of sequence 0 (rewritten by the prefill) and one decode shape */
    if (st == TSR_OK) {
        q.id = 1;
        q.n_tokens = 1;
        q.n_pages = 1;
        st = tsr_step_add(&step, &q, prompts, pages, NULL, NULL);
        if (st == TSR_OK) st = x->run(x, &step, res, NULL);
    }
    /* prefill */
    double t0 = now_s();
    while (st == TSR_OK) {
        tsr_step_clear(&step);
        int budget = x->max_step_tokens, n = 0;
        for (int b = 0; b < B && budget > 0 && st == TSR_OK; b++) {
            int take = o->prompt_len - done[b] < budget ? o->prompt_len - done[b] : budget;
            if (take <= 0) continue;
            q.id = (uint64_t)b + 1;
            q.pos0 = done[b];
            q.n_tokens = take;
            q.n_pages = (done[b] + take + page - 1) / page;
            q.sample = done[b] + take == o->prompt_len;
            st = tsr_step_add(&step, &q, prompts + (size_t)b * o->prompt_len + done[b], pages + (size_t)b * P, NULL,
                              NULL);
            owner[n++] = b;
            done[b] += take;
            budget -= take;
        }
        if (st != TSR_OK || n == 0) break;
        st = x->run(x, &step, res, NULL);
        for (int i = 0; st == TSR_OK && i < n; i++)
            if (step.seqs[i].sample) next[owner[i]] = res[i].token >= 0 ? res[i].token : 0;
    }
    row->prefill_s = now_s() - t0;
    /* decode: step 0 runs twice, untimed first (the same token at the same position: the cache ends the same), so
     * that the batch's decode shape is set up (recorded) before timing */
    for (int g = -1; st == TSR_OK && g < o->gen; g++) {
        if (g == 0) t0 = now_s();
        const int at = g < 0 ? 0 : g;
        tsr_step_clear(&step);
        for (int b = 0; b < B && st == TSR_OK; b++) {
            q.id = (uint64_t)b + 1;
            q.pos0 = o->prompt_len + at;
            q.n_tokens = 1;
            q.n_pages = (q.pos0 + 1 + page - 1) / page;
            q.sample = 1;
            q.sample_index = (uint32_t)at + 1;
            st = tsr_step_add(&step, &q, &next[b], pages + (size_t)b * P, NULL, NULL);
        }
        if (st == TSR_OK) st = x->run(x, &step, res, NULL);
        for (int b = 0; st == TSR_OK && g >= 0 && b < B; b++)
            next[b] = res[b].token >= 0 ? res[b].token : 0;
    }
    row->decode_s = now_s() - t0;
    row->batch = B;
    tsr_step_free(&step);
    free(prompts);
    free(pages);
    free(next);
    free(res);
    free(done);
    return st;
}

tsr_status tsr_bench_run(tsr_executor *x, const tsr_bench_opts *o, FILE *out)
{
    bench_row rows[TSR_BENCH_MAX_BATCHES];
    if (o->prompt_len < 1 || o->gen < 1 || o->n_batches < 1)
        return tsr_fail(TSR_ERR_ARG, "bench: prompt length, generated tokens and batches must be positive");
    fprintf(out, "bench %s: prompt %d tokens, %d generated per sequence\n", o->label ? o->label : "", o->prompt_len,
            o->gen);
    for (int i = 0; i < o->n_batches; i++) {
        TSR_TRY(one_batch(x, o, o->batches[i], &rows[i]));
        const bench_row *r = &rows[i];
        fprintf(out, "  batch %3d  prefill %10.1f tok/s (%8.1f ms)  decode %9.1f tok/s (%7.2f ms/step)\n", r->batch,
                (double)r->batch * o->prompt_len / r->prefill_s, r->prefill_s * 1e3,
                (double)r->batch * o->gen / r->decode_s, r->decode_s * 1e3 / o->gen);
        fflush(out);
    }
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) return tsr_fail(TSR_ERR_IO, "bench: cannot write %s", o->json);
        fprintf(f, "{\"label\": \"%s\", \"prompt_len\": %d, \"gen\": %d, \"batches\": [", o->label ? o->label : "",
                o->prompt_len, o->gen);
        for (int i = 0; i < o->n_batches; i++) {
            const bench_row *r = &rows[i];
            fprintf(f,
                    "%s{\"batch\": %d, \"prefill_tok_s\": %.3f, \"prefill_ms\": %.3f, \"decode_tok_s\": %.3f, "
                    "\"decode_ms_per_step\": %.4f}",
                    i ? ", " : "", r->batch, (double)r->batch * o->prompt_len / r->prefill_s, r->prefill_s * 1e3,
                    (double)r->batch * o->gen / r->decode_s, r->decode_s * 1e3 / o->gen);
        }
        fprintf(f, "]}\n");
        if (fclose(f) != 0) return tsr_fail(TSR_ERR_IO, "bench: cannot write %s", o->json);
    }
    return TSR_OK;
}
