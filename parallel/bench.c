/* Executor throughput (see bench.h). */
#include "parallel/bench.h"

#include "runtime/sampler.h"

#include <jansson.h>
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
    int groups; /* decode steps in flight: each worker streams its weights once per group and step */
    double prefill_s, decode_s;
} bench_row;

/* Decode step `at` of sequences [b0, b1) into *step (one token each, greedy). */
static tsr_status decode_step(tsr_step *step, tsr_step_seq *q, int b0, int b1, int at, const tsr_bench_opts *o, int P,
                              int page, const int32_t *pages, const int32_t *next)
{
    tsr_step_clear(step);
    for (int b = b0; b < b1; b++) {
        q->id = (uint64_t)b + 1;
        q->pos0 = o->prompt_len + at;
        q->n_tokens = 1;
        q->n_pages = (q->pos0 + 1 + page - 1) / page;
        q->sample = 1;
        q->sample_index = (uint32_t)at + 1;
        TSR_TRY(tsr_step_add(step, q, &next[b], pages + (size_t)b * P, NULL, NULL));
    }
    return TSR_OK;
}

/* The decode phase: o->gen steps after an untimed warm-up of step 0; *t0 is set when timing starts. With an
 * executor that keeps several steps in flight (layer stages over ranks), the batch is cut into that many groups
 * whose steps alternate, as the service's scheduler does (each group's next step is submitted as soon as its
 * previous one is collected); otherwise every step holds the whole batch. */
static tsr_status decode(tsr_executor *x, tsr_step_seq *q, int B, const tsr_bench_opts *o, int P,
                         const int32_t *pages, int32_t *next, tsr_step_result *res, double *t0, int *groups)
{
    const int page = x->page_size;
    const int G = x->depth > 1 && x->submit && x->collect ? (B < x->depth ? B : x->depth) : 1;
    *groups = G;
    int b0[TSR_EXECUTOR_MAX_DEPTH + 1];
    for (int k = 0; k <= G; k++) b0[k] = (int)((long)k * B / G);
    tsr_step steps[TSR_EXECUTOR_MAX_DEPTH];
    memset(steps, 0, sizeof steps);
    tsr_status st = TSR_OK;
    for (int k = 0; k < G && st == TSR_OK; k++) { /* warm-up */
        st = decode_step(&steps[k], q, b0[k], b0[k + 1], 0, o, P, page, pages, next);
        if (st == TSR_OK) st = x->run(x, &steps[k], res + b0[k], NULL);
    }
    *t0 = now_s();
    if (G == 1) {
        for (int g = 0; st == TSR_OK && g < o->gen; g++) {
            st = decode_step(&steps[0], q, 0, B, g, o, P, page, pages, next);
            if (st == TSR_OK) st = x->run(x, &steps[0], res, NULL);
            for (int b = 0; st == TSR_OK && b < B; b++)
                next[b] = res[b].token >= 0 ? res[b].token : 0;
        }
    } else {
        int in_flight = 0;
        for (int k = 0; k < G && st == TSR_OK; k++) {
            st = decode_step(&steps[k], q, b0[k], b0[k + 1], 0, o, P, page, pages, next);
            if (st == TSR_OK) st = x->submit(x, &steps[k], res + b0[k], NULL);
            in_flight += st == TSR_OK;
        }
        for (int g = 0; st == TSR_OK && g < o->gen; g++)
            for (int k = 0; k < G && st == TSR_OK; k++) {
                st = x->collect(x); /* group k's step g */
                in_flight--;
                for (int b = b0[k]; st == TSR_OK && b < b0[k + 1]; b++)
                    next[b] = res[b].token >= 0 ? res[b].token : 0;
                if (st != TSR_OK || g + 1 == o->gen) continue;
                st = decode_step(&steps[k], q, b0[k], b0[k + 1], g + 1, o, P, page, pages, next);
                if (st == TSR_OK) st = x->submit(x, &steps[k], res + b0[k], NULL);
                in_flight += st == TSR_OK;
            }
        for (; in_flight > 0; in_flight--)
            (void)x->collect(x); /* after a failure: the executor must not keep steps of this batch */
    }
    for (int k = 0; k < G; k++) tsr_step_free(&steps[k]);
    return st;
}

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
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(B + 1) + 0xBF58476D1CE4E5B9ull * o->prompt_seed;
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
    q.sampling = o->sampling;
    q.seed = 7;
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
     * that the decode shapes are set up (recorded) before timing */
    row->groups = 1;
    if (st == TSR_OK) st = decode(x, &q, B, o, P, pages, next, res, &t0, &row->groups);
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

/* Weight bytes per second the busiest worker of the plan streams while decoding row r (0 without a plan). */
static double busiest_worker_rate(const tsr_plan *p, const bench_row *r, int gen)
{
    uint64_t most = 0;
    for (int w = 0; p && w < p->n_workers; w++)
        if (p->w[w].stream_bytes > most) most = p->w[w].stream_bytes;
    return r->decode_s > 0 ? (double)most * r->groups * gen / r->decode_s : 0;
}

/* The usage of each rank holding the model after the batches (n = 0 where the executor cannot say). */
static tsr_status rank_usage(tsr_executor *x, tsr_rank_usage *u, int *n, FILE *out)
{
    *n = 0;
    if (!x->usage) return TSR_OK;
    TSR_TRY(x->usage(x, u, TSR_PLAN_MAX, n));
    for (int w = 0; w < *n; w++) {
        const double gib = 1u << 30;
        fprintf(out, "  rank %d: %lld steps", (int)u[w].rank, (long long)u[w].steps);
        if (u[w].peak_device) fprintf(out, ", peak device memory %.3f GiB", (double)u[w].peak_device / gib);
        if (u[w].capacity) fprintf(out, " (usable: %.3f GiB)", (double)u[w].capacity / gib);
        fprintf(out, ", peak host memory %.3f GiB\n", (double)u[w].peak_host / gib);
    }
    return TSR_OK;
}

static tsr_status write_json(const tsr_bench_opts *o, const bench_row *rows, const tsr_rank_usage *u, int n_usage)
{
    json_t *root = json_pack("{s:s, s:i, s:i}", "label", o->label ? o->label : "", "prompt_len", o->prompt_len, "gen",
                             o->gen);
    json_t *arr = json_array();
    if (!root || !arr) {
        json_decref(root);
        json_decref(arr);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    if (o->plan) json_object_set_new(root, "workers", json_integer(o->plan->n_workers));
    for (int i = 0; i < o->n_batches; i++) {
        const bench_row *r = &rows[i];
        json_t *b = json_pack("{s:i, s:f, s:f, s:f, s:f, s:i}", "batch", r->batch, "prefill_tok_s",
                              (double)r->batch * o->prompt_len / r->prefill_s, "prefill_ms", r->prefill_s * 1e3,
                              "decode_tok_s", (double)r->batch * o->gen / r->decode_s, "decode_ms_per_step",
                              r->decode_s * 1e3 / o->gen, "decode_groups", r->groups);
        if (b && o->plan)
            json_object_set_new(b, "busiest_worker_weight_bytes_per_s",
                                json_real(busiest_worker_rate(o->plan, r, o->gen)));
        if (b) json_array_append_new(arr, b);
    }
    json_object_set_new(root, "batches", arr);
    if (n_usage > 0) {
        json_t *ws = json_array();
        for (int w = 0; ws && w < n_usage; w++)
            json_array_append_new(ws, json_pack("{s:i, s:I, s:I, s:I, s:I}", "rank", (int)u[w].rank, "steps",
                                                (json_int_t)u[w].steps, "peak_device_bytes",
                                                (json_int_t)u[w].peak_device, "capacity_bytes",
                                                (json_int_t)u[w].capacity, "peak_host_bytes",
                                                (json_int_t)u[w].peak_host));
        json_object_set_new(root, "rank_usage", ws);
    }
    const int bad = json_dump_file(root, o->json, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return bad ? tsr_fail(TSR_ERR_IO, "bench: cannot write %s", o->json) : TSR_OK;
}

tsr_status tsr_bench_run(tsr_executor *x, const tsr_bench_opts *o, FILE *out)
{
    bench_row rows[TSR_BENCH_MAX_BATCHES];
    if (o->prompt_len < 1 || o->gen < 1 || o->n_batches < 1)
        return tsr_fail(TSR_ERR_ARG, "bench: prompt length, generated tokens and batches must be positive");
    fprintf(out, "bench %s: prompt %d tokens, %d generated per sequence\n", o->label ? o->label : "", o->prompt_len,
            o->gen);
    if (o->plan) {
        tsr_plan_print(out, o->plan, NULL);
        fprintf(out, "\n");
    }
    for (int i = 0; i < o->n_batches; i++) {
        TSR_TRY(one_batch(x, o, o->batches[i], &rows[i]));
        const bench_row *r = &rows[i];
        fprintf(out, "  batch %3d  prefill %10.1f tok/s (%8.1f ms)  decode %9.1f tok/s (%7.2f ms/step)", r->batch,
                (double)r->batch * o->prompt_len / r->prefill_s, r->prefill_s * 1e3,
                (double)r->batch * o->gen / r->decode_s, r->decode_s * 1e3 / o->gen);
        if (o->plan)
            fprintf(out, "  busiest worker %.2f GB/s of weights (%d group%s)",
                    busiest_worker_rate(o->plan, r, o->gen) / 1e9, r->groups, r->groups == 1 ? "" : "s");
        fprintf(out, "\n");
        fflush(out);
    }
    tsr_rank_usage usage[TSR_PLAN_MAX];
    int n_usage = 0;
    TSR_TRY(rank_usage(x, usage, &n_usage, out));
    return o->json ? write_json(o, rows, usage, n_usage) : TSR_OK;
}
