/* tessera bench --concurrency: serving throughput through the scheduler and the service loop.
 *
 * For each concurrency level C, C closed-loop clients each keep one request in flight: when one finishes, the main
 * thread submits the next, until `requests` (default 4 x C, at least 8) have finished. Prompts are random ids
 * from a fixed seed; with --shared-prefix N the first N tokens are the same for every prompt (a system prompt),
 * so the prefix cache can serve them. Every request decodes exactly --gen tokens (greedy, EOS ignored). Reported:
 * generated tokens per second of wall time, requests per second, time to first token (mean and p50/p99), the
 * time between a request's consecutive tokens (p50/p99: what a long prompt's steps cost the running streams, which
 * --prefill-chunk bounds as in `tessera serve`), prefill tokens actually computed versus submitted (what the prefix
 * cache saved), prefix hits, and the scheduler's share of the loop time (planning + committing over planning +
 * committing + executing). The engine is opened once;
 * each level gets a fresh service (an empty prefix cache). */
#include "launcher/bench_service.h"

#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "runtime/engine.h"
#include "runtime/service.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct level_state {
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    int finished, failed, pending_done; /* pending_done: finished since the main thread last looked */
    double *ttft;
    int n_ttft;
    /* the gaps between a request's consecutive tokens: each request's last token time in an open-addressing table
     * keyed by id (2 x requests slots; the callback may run before tsr_service_submit hands the id back) */
    uint64_t *ids;
    double *last;
    int slots;
    double *itl;
    long n_itl, cap_itl;
    char error[256];
} level_state;

/* The gap since the request's previous token, or a negative value for its first. Under ls->mu. */
static double token_gap(level_state *ls, uint64_t id, double now)
{
    int i = (int)(id % (uint64_t)ls->slots);
    while (ls->ids[i] && ls->ids[i] != id)
        i = (i + 1) % ls->slots;
    double gap = ls->ids[i] ? now - ls->last[i] : -1.0;
    ls->ids[i] = id;
    ls->last[i] = now;
    return gap;
}

static void on_event(const tsr_gen_event *ev, void *user)
{
    level_state *ls = user;
    const double now = tsr_service_now();
    pthread_mutex_lock(&ls->mu);
    if (ev->token >= 0) {
        const double gap = token_gap(ls, ev->id, now);
        if (gap >= 0 && ls->n_itl < ls->cap_itl) ls->itl[ls->n_itl++] = gap;
    }
    if (ev->finish == TSR_FINISH_NONE) {
        pthread_mutex_unlock(&ls->mu);
        return;
    }
    ls->finished++;
    ls->pending_done++;
    if (ev->finish == TSR_FINISH_ERROR) {
        ls->failed++;
        if (!ls->error[0]) snprintf(ls->error, sizeof ls->error, "%s", ev->error ? ev->error : "failed");
    }
    if (ev->t_first_token > 0) ls->ttft[ls->n_ttft++] = ev->t_first_token - ev->t_submit;
    pthread_cond_signal(&ls->done_cv);
    pthread_mutex_unlock(&ls->mu);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (0 <= p < 100) of n sorted values, 0 for none. */
static double percentile(const double *sorted, long n, int p)
{
    return n ? sorted[n * p / 100] : 0;
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct level_result {
    int concurrency, requests, failed;
    double wall_s, tok_s, req_s, ttft_mean, ttft_p50, ttft_p99, itl_p50, itl_p99, sched_fraction, step_ms;
    uint64_t prefill_submitted, prefill_computed, prefix_hits, steps;
} level_result;

static tsr_status run_level(tsr_executor *x, const tsr_tokenizer *tok, const bench_service_args *a, int conc,
                            level_result *out)
{
    int n_req = a->requests > 0 ? a->requests : 4 * conc;
    if (n_req < 8) n_req = 8;
    const int plen = a->prompt_len, shared = a->shared_prefix < plen ? a->shared_prefix : plen - 1;
    int32_t *prompt = malloc((size_t)plen * sizeof *prompt);
    level_state ls = {0};
    ls.ttft = calloc((size_t)n_req, sizeof *ls.ttft);
    ls.slots = 2 * n_req;
    ls.ids = calloc((size_t)ls.slots, sizeof *ls.ids);
    ls.last = calloc((size_t)ls.slots, sizeof *ls.last);
    ls.cap_itl = (long)n_req * (a->gen > 1 ? a->gen - 1 : 1);
    ls.itl = malloc((size_t)ls.cap_itl * sizeof *ls.itl);
    if (!prompt || !ls.ttft || !ls.ids || !ls.last || !ls.itl) {
        free(prompt);
        free(ls.ttft), free(ls.ids), free(ls.last), free(ls.itl);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&ls.mu, NULL);
    pthread_cond_init(&ls.done_cv, NULL);
    tsr_service_opts so = {.sched = {.max_running = conc,
                                     .max_waiting = n_req + 1,
                                     .max_step_tokens = a->step_tokens,
                                     .max_prefill_decoding = a->prefill_chunk,
                                     .prefix_cache = a->shared_prefix > 0 ? 1 : -1}};
    tsr_service *svc = NULL;
    tsr_status st = tsr_service_start(x, tok, &so, &svc);
    int submitted = 0;
    double t0 = tsr_service_now();
    uint64_t rng_shared = (uint64_t)a->seed, rng = (uint64_t)a->seed * 7919 + (uint64_t)conc;
    while (st == TSR_OK) {
        pthread_mutex_lock(&ls.mu);
        int in_flight = submitted - ls.finished, finished = ls.finished;
        pthread_mutex_unlock(&ls.mu);
        if (finished == n_req) break;
        if (in_flight < conc && submitted < n_req) {
            uint64_t r = rng_shared;
            for (int t = 0; t < plen; t++)
                prompt[t] = (int32_t)(mix(t < shared ? &r : &rng) % (uint64_t)x->vocab);
            tsr_gen_request q = {.prompt = prompt, .n_prompt = plen};
            q.params.sampling = tsr_sampling_default();
            q.params.sampling.temperature = 0;
            q.params.max_tokens = a->gen;
            q.params.ignore_eos = 1;
            q.params.n_logprobs = -1;
            uint64_t id;
            st = tsr_service_submit(svc, &q, on_event, &ls, &id);
            submitted++;
            continue;
        }
        pthread_mutex_lock(&ls.mu);
        while (ls.pending_done == 0) pthread_cond_wait(&ls.done_cv, &ls.mu);
        ls.pending_done = 0;
        pthread_mutex_unlock(&ls.mu);
    }
    double wall = tsr_service_now() - t0;
    if (svc) {
        tsr_service_wait_idle(svc);
        tsr_service_stats ss;
        tsr_service_get_stats(svc, &ss);
        tsr_service_stop(svc, 0);
        qsort(ls.ttft, (size_t)ls.n_ttft, sizeof *ls.ttft, cmp_double);
        qsort(ls.itl, (size_t)ls.n_itl, sizeof *ls.itl, cmp_double);
        double sum = 0;
        for (int i = 0; i < ls.n_ttft; i++) sum += ls.ttft[i];
        *out = (level_result){
            .concurrency = conc,
            .requests = n_req,
            .failed = ls.failed,
            .wall_s = wall,
            .tok_s = (double)ss.tokens_out / wall,
            .req_s = (double)n_req / wall,
            .ttft_mean = ls.n_ttft ? sum / ls.n_ttft : 0,
            .ttft_p50 = percentile(ls.ttft, ls.n_ttft, 50),
            .ttft_p99 = percentile(ls.ttft, ls.n_ttft, 99),
            .itl_p50 = percentile(ls.itl, ls.n_itl, 50),
            .itl_p99 = percentile(ls.itl, ls.n_itl, 99),
            .sched_fraction = ss.busy_s + ss.sched_s > 0 ? ss.sched_s / (ss.busy_s + ss.sched_s) : 0,
            .step_ms = ss.sched.steps ? 1e3 * (ss.busy_s + ss.sched_s) / (double)ss.sched.steps : 0,
            .prefill_submitted = (uint64_t)n_req * (uint64_t)plen,
            .prefill_computed = ss.sched.prefill_tokens,
            .prefix_hits = ss.sched.prefix_hits,
            .steps = ss.sched.steps,
        };
        if (ls.failed && st == TSR_OK) st = tsr_fail(TSR_ERR_INTERNAL, "%d requests failed: %s", ls.failed, ls.error);
    }
    pthread_mutex_destroy(&ls.mu);
    pthread_cond_destroy(&ls.done_cv);
    free(prompt);
    free(ls.ttft), free(ls.ids), free(ls.last), free(ls.itl);
    return st;
}

int tsr_bench_service(const bench_service_args *a)
{
    const tsr_ops *ops;
    tsr_status st = tsr_select_backend(a->device, &ops);
    if (st != TSR_OK) return tsr_cli_error("bench", st);
    int max_conc = 1;
    for (int i = 0; i < a->n_levels; i++)
        if (a->levels[i] > max_conc) max_conc = a->levels[i];
    const int page = a->page_size > 0 ? a->page_size : 16;
    /* every running sequence's pages, plus the shared prefix kept in the cache, plus slack */
    long per_seq = ((long)a->prompt_len + a->gen + page) / page + 1;
    tsr_engine_opts eo = {.max_tokens = a->step_tokens, .page_size = page, .ops = ops, .kv_dtype = a->kv_dtype,
                          .kv_tokens = a->kv_tokens > 0 ? a->kv_tokens : (per_seq * max_conc + 64) * page};
    tsr_engine *e = NULL;
    if ((st = tsr_engine_open(a->model, &eo, &e)) != TSR_OK) return tsr_cli_error("bench", st);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", a->model);
    tsr_tokenizer *tok = NULL;
    tsr_executor *x = NULL;
    /* synthetic models have no tokenizer: the service then runs on token ids alone */
    if (access(path, R_OK) == 0) st = tsr_tokenizer_load(path, &tok);
    if (st == TSR_OK) st = tsr_executor_local(e, &x);
    char desc[256];
    tsr_backend_describe(ops, desc, sizeof desc);
    if (st == TSR_OK) {
        const tsr_model_config *c = &e->model->cfg;
        printf("model    %s: %d layers, hidden %d, vocab %d\n", a->model, c->n_layers, c->hidden, c->vocab_size);
        printf("setup    %s, prompt %d (shared prefix %d), gen %d, step budget %d tokens (prompt tokens beside decode "
               "tokens: %d), page %d, KV pool %ld tokens\n",
               desc, a->prompt_len, a->shared_prefix, a->gen, tsr_forward_max_tokens(e->fwd), a->prefill_chunk, page,
               e->kv_pool_tokens);
        printf("%5s %6s %10s %8s %9s %9s %9s %9s %9s %9s %10s %8s %8s\n", "conc", "reqs", "gen tok/s", "req/s",
               "ttft ms", "p50 ms", "p99 ms", "itl p50", "itl p99", "ms/step", "prefill %", "hits", "sched %");
    }
    for (int i = 0; st == TSR_OK && i < a->n_levels; i++) {
        level_result r = {0};
        if ((st = run_level(x, tok, a, a->levels[i], &r)) != TSR_OK) break;
        printf("%5d %6d %10.1f %8.2f %9.1f %9.1f %9.1f %9.2f %9.2f %9.2f %9.1f%% %8llu %7.2f%%\n", r.concurrency,
               r.requests, r.tok_s, r.req_s, 1e3 * r.ttft_mean, 1e3 * r.ttft_p50, 1e3 * r.ttft_p99, 1e3 * r.itl_p50,
               1e3 * r.itl_p99, r.step_ms, 100.0 * (double)r.prefill_computed / (double)r.prefill_submitted,
               (unsigned long long)r.prefix_hits, 100.0 * r.sched_fraction);
        fflush(stdout);
    }
    int rc = st == TSR_OK ? 0 : tsr_cli_error("bench", st);
    if (x) x->close(x);
    tsr_tokenizer_free(tok);
    tsr_engine_close(e);
    return rc;
}
