/* tessera bench: prefill and decode throughput, weight bandwidth and memory of one model on one backend (under mpirun
 * over the ranks' split model instead: launcher/bench_ranks.c).
 *
 * For each batch size: a fresh engine with a KV pool of batch × (prompt-len + gen) tokens; `batch` random prompts (ids
 * < vocab from a fixed seed) prefilled together in one tsr_engine_feed call (the engine chunks them into forward calls
 * of --max-tokens), then `gen` decode steps that feed one greedily chosen token per sequence, all sequences in one call
 * (each row's pick made on the device when the backend can, so that only the picks come back, as in serving; a
 * non-finite logit is then noticed only as a non-finite maximum). Before timing, one token is run through the model so
 * page faults of the mapped weights are not billed to prefill. Bytes per decode step = stored bytes of every linear
 * layer (the head included) + the embedding rows of the step's tokens; the K/V bytes its attention reads are shown
 * beside them (kv_read_bytes), and the copy-bandwidth fraction of both together. The CPU reference bandwidth is the
 * best of a few 256 MiB memcpy runs, counted as read + write bytes (STREAM "copy" convention), measured in a child
 * process so its buffers do not count toward this process's peak RSS (VmHWM). The prefill's arithmetic (linear layers,
 * causal attention, one head row per prompt: prefill_flops) per second is shown beside the device's dense fp16 rate,
 * measured in the same run on a GPU (cuBLAS with fp16 operands and fp32 accumulation, as the prefill's GEMMs run).
 * Exit codes: 0 ok, 1 failure, 2 usage error. */
#include "kernels/cpu/threadpool.h"
#ifdef TSR_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif
#include "launcher/backend_select.h"
#include "launcher/bench_ranks.h"
#include "launcher/bench_service.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "parallel/rank.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/proc_mem.h"
#include "runtime/sched/scheduler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera bench --model DIR [--device cpu|cuda[:N]] [--batch 1,8] [--prompt-len 128] [--gen 32]\n"
            "                     [--threads N] [--kv-dtype f16|f32|q4|q6|q8] [--max-tokens 2048] [--seed S]\n"
            "                     [--json FILE]\n"
            "       tessera bench --model DIR --concurrency 1,8,64 [--shared-prefix N] [--requests N]\n"
            "                     [--page-size 16] [--kv-tokens N] [--prefill-chunk 1024] (and --device, --gen, ...)\n"
            "Prefills `batch` random prompts, then decodes `gen` tokens per sequence (greedy), for each batch size.\n"
            "With --concurrency: closed-loop clients through the scheduler and service loop, per level.\n"
            "Under mpirun (rank 0 coordinates, the others hold the model's parts): the --batch form over the split\n"
            "model, with these options too:\n");
    tsr_par_opts_help(f);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best memcpy bandwidth over a 256 MiB buffer (bytes read + written per second), in a child process. */
static double memcpy_bandwidth(void)
{
    int fd[2];
    if (pipe(fd) != 0) return 0;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    if (pid == 0) {
        close(fd[0]);
        const size_t n = (size_t)256 << 20;
        char *a = malloc(n), *b = malloc(n);
        double best = 0;
        if (a && b) {
            memset(a, 1, n);
            memset(b, 2, n);
            for (int i = 0; i < 5; i++) {
                double t0 = now_s();
                memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
                double dt = now_s() - t0;
                if (dt > 0 && 2.0 * (double)n / dt > best) best = 2.0 * (double)n / dt;
            }
        }
        if (write(fd[1], &best, sizeof best) != (ssize_t)sizeof best) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    double bw = 0;
    if (read(fd[0], &bw, sizeof bw) != (ssize_t)sizeof bw) bw = 0;
    close(fd[0]);
    waitpid(pid, NULL, 0);
    return bw;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct {
    int batch;
    double prefill_s, prefill_tps;
    double decode_s, decode_tps, ms_per_step;
    uint64_t bytes_per_step, kv_read_per_step;
    double bandwidth, bw_fraction, all_fraction;
    uint64_t kv_bytes, peak_rss, peak_dev;
    double prefill_flops, prefill_flop_rate, gemm_fraction;
    int nonfinite;
} bench_row;

/* K/V bytes the attention of one decode step reads, averaged over the gen steps: step i's rows (one per sequence)
 * attend to prompt_len + i + 1 positions each, or the layer's window, every layer's K and V rows at the cache's
 * bytes per position (codes and scales for quantized caches). */
static uint64_t kv_read_bytes(const tsr_model_config *c, tsr_dtype kv_dtype, int batch, int prompt_len, int gen)
{
    if (gen <= 0) return 0;
    const double per_layer = (double)tsr_kv_bytes_per_token(1, c->n_kv_heads, c->head_dim, kv_dtype);
    double positions = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const int w = tsr_config_layer_window(c, l);
        for (int i = 0; i < gen; i++) positions += w > 0 && prompt_len + i + 1 > w ? w : prompt_len + i + 1;
    }
    return (uint64_t)(positions / gen * per_layer * batch);
}

/* Arithmetic of the timed prefill: batch prompts of prompt_len tokens, each token through every linear layer
 * (2 · K · N FLOP each), each row's attention over the positions it sees (q·k and p·v: 4 · heads · head_dim FLOP per
 * position and layer, up to the layer's window), and one logits row per prompt through the head. */
static double prefill_flops(const tsr_model *m, int batch, int prompt_len)
{
    const tsr_model_config *c = &m->cfg;
    double linear = 0, attention = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer *y = &m->layers[l];
        const tsr_linear *all[] = {&y->q, &y->k, &y->v, &y->o, &y->gate, &y->up, &y->down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) linear += 2.0 * all[i]->K * all[i]->N;
        const int w = tsr_config_layer_window(c, l);
        for (int p = 0; p < prompt_len; p++)
            attention += 4.0 * c->n_heads * c->head_dim * (w > 0 && p + 1 > w ? w : p + 1);
    }
    const double head = 2.0 * m->head.K * m->head.N;
    return (double)batch * ((double)prompt_len * linear + attention + head);
}

/* Stored bytes of every linear layer of the model, the head included. */
static uint64_t linear_bytes(const tsr_model *m)
{
    uint64_t b = tsr_linear_bytes(&m->head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tsr_layer *y = &m->layers[l];
        b += tsr_linear_bytes(&y->q) + tsr_linear_bytes(&y->k) + tsr_linear_bytes(&y->v) + tsr_linear_bytes(&y->o) +
             tsr_linear_bytes(&y->gate) + tsr_linear_bytes(&y->up) + tsr_linear_bytes(&y->down);
    }
    return b;
}

static tsr_status run_batch(const tsr_ops *ops, const char *model, int batch, int prompt_len, int gen, int max_tokens,
                            tsr_dtype kv_dtype, uint64_t seed, double memcpy_bw, bench_row *row,
                            tsr_model_config *cfg_out, uint64_t *file_bytes)
{
    memset(row, 0, sizeof *row);
    row->batch = batch;
    /* KV pool: batch × (prompt + gen) tokens, rounded up to whole pages per sequence */
    const int page = 16;
    const long per_seq = ((long)prompt_len + gen + page - 1) / page * page;
    tsr_engine_opts o = {.max_tokens = max_tokens,
                         .page_size = page,
                         .kv_tokens = (long)batch * per_seq,
                         .kv_dtype = kv_dtype,
                         .ops = ops};
    tsr_engine *e = NULL;
    TSR_TRY(tsr_engine_open(model, &o, &e));
    const tsr_model_config *c = &e->model->cfg;
    *cfg_out = *c;
    *file_bytes = e->model->file_bytes;
    const int V = c->vocab_size;
    if ((long)prompt_len + gen > c->rope.max_pos) { /* said before any work, not at the first step past it */
        const int context = c->rope.max_pos;        /* c is the engine's */
        tsr_engine_close(e);
        return tsr_fail(TSR_ERR_ARG, "bench: --prompt-len %d + --gen %d is beyond the model's context (%d positions)",
                        prompt_len, gen, context);
    }
    row->kv_bytes = (uint64_t)e->kv.n_pages * (uint64_t)e->kv.page_size *
                    tsr_kv_bytes_per_token(c->n_layers, c->n_kv_heads, c->head_dim, kv_dtype);
    tsr_seq *seqs = calloc((size_t)batch, sizeof *seqs);
    tsr_feed *feeds = calloc((size_t)batch, sizeof *feeds);
    int32_t *prompts = malloc((size_t)batch * (size_t)prompt_len * sizeof *prompts);
    int32_t *next = malloc((size_t)batch * sizeof *next);
    float *logits = malloc((size_t)batch * (size_t)V * sizeof *logits);
    tsr_pick *picks = malloc((size_t)batch * sizeof *picks);
    tsr_status st = TSR_OK;
    if (!seqs || !feeds || !prompts || !next || !logits || !picks) st = tsr_fail(TSR_ERR_NOMEM, "bench: out of memory");

    /* warm-up, released before timing: one token through every layer (faults the mapped weights in, loads the
     * decode kernels), then, in a fresh sequence, a prompt as long as the timed one's first step (prompt_len tokens
     * up to max_tokens), so that the prefill takes the same paths with the same shapes (the kernels, libraries and
     * modules it loads lazily are ready). A 63-token chunk did not do that on the GPU: below 65 rows the big
     * matrices take the decode GEMV, and the first dequantize-and-cuBLAS call fell inside the timed prefill
     * (70B, batch 1: 648 instead of ~1040 tok/s; kernels/cuda/NOTES.md, stop 22). */
    if (st == TSR_OK) {
        const int n = prompt_len < max_tokens ? prompt_len : max_tokens; /* within one sequence's KV share */
        for (int i = 0; i < n; i++) prompts[i] = (int32_t)((1 + i) % V);
        tsr_seq warm = {0};
        tsr_feed f = {&warm, prompts, 1, TSR_LOGITS_LAST, logits, NULL};
        st = tsr_engine_feed(e, &f, 1);
        tsr_engine_seq_release(e, &warm);
        warm = (tsr_seq){0};
        f = (tsr_feed){&warm, prompts, n, TSR_LOGITS_LAST, logits, NULL};
        if (st == TSR_OK && n > 1) st = tsr_engine_feed(e, &f, 1);
        tsr_engine_seq_release(e, &warm);
    }

    uint64_t s = seed;
    for (long i = 0; st == TSR_OK && i < (long)batch * prompt_len; i++)
        prompts[i] = (int32_t)(rng_next(&s) % (uint64_t)V);
    if (st == TSR_OK) {
        for (int b = 0; b < batch; b++)
            feeds[b] = (tsr_feed){&seqs[b], prompts + (size_t)b * prompt_len, prompt_len, TSR_LOGITS_LAST,
                                  logits + (size_t)b * V, NULL};
        double t0 = now_s();
        st = tsr_engine_feed(e, feeds, batch);
        row->prefill_s = now_s() - t0;
        row->prefill_tps = (double)batch * prompt_len / row->prefill_s;
        row->prefill_flops = prefill_flops(e->model, batch, prompt_len);
        row->prefill_flop_rate = row->prefill_flops / row->prefill_s;
    }
    /* the prompts' logits rows are checked whole; decode steps pick on the device, as the serving path does for
     * greedy requests, so only their maxima are checked there */
    for (int b = 0; st == TSR_OK && b < batch; b++) {
        const float *lg = logits + (size_t)b * V;
        for (int i = 0; i < V; i++)
            if (!(lg[i] == lg[i]) || lg[i] - lg[i] != 0) {
                row->nonfinite = 1;
                break;
            }
        picks[b] = (tsr_pick){argmax(lg, V), 0.0f};
    }
    double t_dec = 0;
    for (int step = 0; st == TSR_OK && step < gen; step++) {
        for (int b = 0; b < batch; b++) {
            next[b] = picks[b].id;
            feeds[b] = (tsr_feed){&seqs[b], &next[b], 1, TSR_LOGITS_LAST, NULL, &picks[b]};
        }
        double t0 = now_s();
        st = tsr_engine_feed(e, feeds, batch);
        t_dec += now_s() - t0;
        for (int b = 0; st == TSR_OK && b < batch; b++)
            if (!isfinite(picks[b].value)) row->nonfinite = 1;
    }
    if (st == TSR_OK && gen > 0) {
        row->decode_s = t_dec;
        row->decode_tps = (double)batch * gen / t_dec;
        row->ms_per_step = 1e3 * t_dec / gen;
        row->bytes_per_step =
            linear_bytes(e->model) + (uint64_t)batch * c->hidden * tsr_dtype_size(e->model->embed.dtype);
        row->bandwidth = (double)row->bytes_per_step / (t_dec / gen);
        row->bw_fraction = memcpy_bw > 0 ? row->bandwidth / memcpy_bw : 0;
        row->kv_read_per_step = kv_read_bytes(c, kv_dtype, batch, prompt_len, gen);
        row->all_fraction = memcpy_bw > 0 ? (double)(row->bytes_per_step + row->kv_read_per_step) / (t_dec / gen) /
                                                memcpy_bw
                                          : 0;
    }
    row->peak_rss = tsr_peak_rss();
#ifdef TSR_HAVE_CUDA
    if (!strcmp(ops->name, "cuda")) row->peak_dev = tsr_cuda_peak_allocated();
#endif
    for (int b = 0; b < batch && seqs; b++) tsr_engine_seq_release(e, &seqs[b]);
    free(seqs);
    free(feeds);
    free(prompts);
    free(next);
    free(logits);
    free(picks);
    tsr_engine_close(e);
    return st;
}

int tsr_cmd_bench(int argc, char **argv)
{
    const char *model = NULL, *json_path = NULL, *device = "cpu";
    int32_t *batches = NULL, *levels = NULL;
    int n_batches = 0, n_levels = 0;
    long shared_prefix = 0, requests = 0, page_size = 16, kv_tokens = 0, prefill_chunk = TSR_PREFILL_CHUNK_DEFAULT;
    long prompt_len = 128, gen = 32, threads = 0, max_tokens = TSR_STEP_TOKENS_DEFAULT, seed = 1234;
    tsr_dtype kv_dtype = TSR_F16;
    tsr_par_opts po;
    tsr_par_opts_init(&po);
    int par_given = 0; /* an option of the ranks (--split, ...) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!tsr_rank_is_worker()) usage(stdout);
            free(batches);
            free(levels);
            return 0;
        } else if (!strcmp(a, "--model")) {
            if (!(model = tsr_cli_value("bench", argc, argv, &i))) goto usage_error;
        } else if (!strcmp(a, "--device")) {
            if (!(device = tsr_cli_value("bench", argc, argv, &i))) goto usage_error;
        } else if (!strcmp(a, "--json")) {
            if (!(json_path = tsr_cli_value("bench", argc, argv, &i))) goto usage_error;
        } else if (!strcmp(a, "--batch")) {
            free(batches);
            batches = NULL;
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_ids("bench", v, &batches, &n_batches))
                goto usage_error;
            for (int b = 0; b < n_batches; b++)
                if (batches[b] < 1 || batches[b] > 4096) {
                    fprintf(stderr, "tessera bench: --batch sizes must be in 1..4096\n");
                    goto usage_error;
                }
        } else if (!strcmp(a, "--concurrency")) {
            free(levels);
            levels = NULL;
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_ids("bench", v, &levels, &n_levels))
                goto usage_error;
            for (int b = 0; b < n_levels; b++)
                if (levels[b] < 1 || levels[b] > 4096) {
                    fprintf(stderr, "tessera bench: --concurrency levels must be in 1..4096\n");
                    goto usage_error;
                }
        } else if (!strcmp(a, "--shared-prefix")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 0, 1 << 20, &shared_prefix))
                goto usage_error;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 0, 1 << 20, &prefill_chunk))
                goto usage_error;
        } else if (!strcmp(a, "--requests")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 1, 1 << 24, &requests))
                goto usage_error;
        } else if (!strcmp(a, "--page-size")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 1, 4096, &page_size))
                goto usage_error;
        } else if (!strcmp(a, "--kv-tokens")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 16, 1L << 30, &kv_tokens))
                goto usage_error;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 1, 1 << 20, &prompt_len))
                goto usage_error;
        } else if (!strcmp(a, "--gen")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 0, 1 << 20, &gen))
                goto usage_error;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 1, 4096, &threads))
                goto usage_error;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 1, 1 << 20, &max_tokens))
                goto usage_error;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i)) || tsr_cli_int("bench", a, v, 0, 0x7fffffffL, &seed))
                goto usage_error;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = tsr_cli_value("bench", argc, argv, &i))) goto usage_error;
            if (tsr_cli_kv_dtype("bench", v, &kv_dtype)) {
                goto usage_error;
            }
        } else {
            const int par = tsr_par_opts_take("bench", &po, argc, argv, &i);
            if (par < 0) goto usage_error;
            if (par > 0) {
                par_given = 1;
                continue;
            }
            fprintf(stderr, "tessera bench: unknown option '%s'\n", a);
            usage(stderr);
            goto usage_error;
        }
    }
    if (!model) {
        if (!tsr_rank_is_worker()) usage(stderr);
        goto usage_error;
    }
    if (tsr_rank_multi()) {
        if (levels) {
            if (!tsr_rank_is_worker())
                fprintf(stderr, "tessera bench: --concurrency runs in one process; under mpirun use --batch\n");
            goto usage_error;
        }
        const int32_t one_eight[2] = {1, 8};
        bench_ranks_args ra = {.model = model,
                               .device = device,
                               .json = json_path,
                               .batches = batches ? batches : one_eight,
                               .n_batches = batches ? n_batches : 2,
                               .prompt_len = (int)prompt_len,
                               .gen = (int)gen,
                               .threads = (int)threads,
                               .max_tokens = (int)max_tokens,
                               .seed = (uint64_t)seed,
                               .kv_dtype = kv_dtype};
        const int rc = tsr_bench_ranks(&ra, &po);
        free(batches);
        return rc;
    }
    if (par_given) {
        fprintf(stderr, "tessera bench: --split and the other options of the ranks take effect under mpirun\n");
        goto usage_error;
    }
    if (levels) {
        if (threads > 0) tsr_threads_set((int)threads);
        bench_service_args sa = {.model = model,
                                 .device = device,
                                 .levels = levels,
                                 .n_levels = n_levels,
                                 .prompt_len = (int)prompt_len,
                                 .gen = (int)gen,
                                 .shared_prefix = (int)shared_prefix,
                                 .requests = (int)requests,
                                 .step_tokens = (int)max_tokens,
                                 .prefill_chunk = (int)prefill_chunk,
                                 .page_size = (int)page_size,
                                 .kv_tokens = kv_tokens,
                                 .seed = seed,
                                 .kv_dtype = kv_dtype};
        int rc = tsr_bench_service(&sa);
        free(levels);
        free(batches);
        return rc;
    }
    const tsr_ops *ops;
    tsr_status sel = tsr_select_backend(device, &ops);
    if (sel != TSR_OK) {
        free(batches);
        return tsr_cli_error("bench", sel);
    }
    const int on_gpu = strcmp(ops->name, "cpu") != 0;
    if (!batches) {
        batches = malloc(2 * sizeof *batches);
        batches[0] = 1;
        batches[1] = 8;
        n_batches = 2;
    }
    if (threads > 0) tsr_threads_set((int)threads);
    const int n_threads = tsr_threads_count();
    double bw = 0, gemm = 0; /* the device's copy bandwidth and dense fp16 rate, measured here */
#ifdef TSR_HAVE_CUDA
    if (on_gpu) bw = tsr_cuda_copy_bandwidth((size_t)1 << 30), gemm = tsr_cuda_gemm_rate(8192);
#endif
    if (!on_gpu) bw = memcpy_bandwidth();
    char desc[256];
    tsr_backend_describe(ops, desc, sizeof desc);

    bench_row *rows = calloc((size_t)n_batches, sizeof *rows);
    tsr_model_config cfg;
    uint64_t file_bytes = 0;
    int rc = 0;
    for (int b = 0; b < n_batches; b++) {
        tsr_status st = run_batch(ops, model, batches[b], (int)prompt_len, (int)gen, (int)max_tokens, kv_dtype,
                                  (uint64_t)seed, bw, &rows[b], &cfg, &file_bytes);
        rows[b].gemm_fraction = gemm > 0 ? rows[b].prefill_flop_rate / gemm : 0;
        if (st != TSR_OK) {
            rc = tsr_cli_error("bench", st);
            break;
        }
        if (b == 0) {
            printf("model    %s: %s, %d layers, hidden %d, heads %d/%d, intermediate %d, vocab %d; files %.3f GB\n",
                   model, cfg.arch_name, cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.intermediate,
                   cfg.vocab_size, (double)file_bytes / 1e9);
            printf("setup    %s, kv %s, prompt %ld, gen %ld, max-tokens %ld; %s copy %.2f GB/s (read+write)", desc,
                   tsr_kv_dtype_name(kv_dtype), prompt_len, gen, max_tokens, on_gpu ? "device" : "memcpy",
                   bw / 1e9);
            if (gemm > 0) printf("; fp16 GEMM %.1f TFLOP/s (cuBLAS, 8192^3)", gemm / 1e12);
            printf("\n");
            printf("%5s %13s %12s %9s %9s %8s %8s %9s %8s %9s %9s %9s %10s %7s\n", "batch", "prefill tok/s",
                   "decode tok/s", "ms/step", "MB/step", "GB/s", "%copy", "KV rd MB", "+KV %", "KV MB", "peak MB",
                   "dev MB", "pf TFLOP/s", "%gemm");
        }
        bench_row *r = &rows[b];
        printf("%5d %13.1f %12.2f %9.2f %9.1f %8.2f %7.1f%% %9.1f %7.1f%% %9.1f %9.1f %9.1f %10.3f", r->batch,
               r->prefill_tps, r->decode_tps, r->ms_per_step, (double)r->bytes_per_step / 1e6, r->bandwidth / 1e9,
               100.0 * r->bw_fraction, (double)r->kv_read_per_step / 1e6, 100.0 * r->all_fraction,
               (double)r->kv_bytes / 1e6, (double)r->peak_rss / 1e6, (double)r->peak_dev / 1e6,
               r->prefill_flop_rate / 1e12);
        if (gemm > 0)
            printf(" %6.1f%%\n", 100.0 * r->gemm_fraction);
        else
            printf(" %7s\n", "-");
        fflush(stdout);
        if (r->nonfinite) fprintf(stderr, "tessera bench: warning: non-finite logits at batch %d\n", r->batch);
    }
    if (rc == 0 && json_path) {
        json_t *root = json_object();
        json_object_set_new(root, "model", json_string(model));
        json_object_set_new(root, "arch", json_string(cfg.arch_name));
        json_object_set_new(root, "file_bytes", json_integer((json_int_t)file_bytes));
        json_object_set_new(root, "device", json_string(desc));
        json_object_set_new(root, "threads", json_integer(n_threads));
        json_object_set_new(root, "kv_dtype", json_string(tsr_kv_dtype_name(kv_dtype)));
        json_object_set_new(root, "prompt_len", json_integer(prompt_len));
        json_object_set_new(root, "gen", json_integer(gen));
        json_object_set_new(root, "max_tokens", json_integer(max_tokens));
        json_object_set_new(root, "copy_bytes_per_s", json_real(bw));
        json_object_set_new(root, "fp16_gemm_flop_per_s", json_real(gemm));
        json_t *arr = json_array();
        for (int b = 0; b < n_batches; b++) {
            const bench_row *r = &rows[b];
            json_t *o = json_object();
            json_object_set_new(o, "batch", json_integer(r->batch));
            json_object_set_new(o, "prefill_s", json_real(r->prefill_s));
            json_object_set_new(o, "prefill_tokens_per_s", json_real(r->prefill_tps));
            json_object_set_new(o, "prefill_flop", json_real(r->prefill_flops));
            json_object_set_new(o, "prefill_flop_per_s", json_real(r->prefill_flop_rate));
            json_object_set_new(o, "prefill_fraction_of_fp16_gemm", json_real(r->gemm_fraction));
            json_object_set_new(o, "decode_s", json_real(r->decode_s));
            json_object_set_new(o, "decode_tokens_per_s", json_real(r->decode_tps));
            json_object_set_new(o, "ms_per_decode_step", json_real(r->ms_per_step));
            json_object_set_new(o, "bytes_per_decode_step", json_integer((json_int_t)r->bytes_per_step));
            json_object_set_new(o, "bandwidth_bytes_per_s", json_real(r->bandwidth));
            json_object_set_new(o, "bandwidth_fraction_of_memcpy", json_real(r->bw_fraction));
            json_object_set_new(o, "kv_bytes_read_per_decode_step", json_integer((json_int_t)r->kv_read_per_step));
            json_object_set_new(o, "weights_and_kv_fraction_of_memcpy", json_real(r->all_fraction));
            json_object_set_new(o, "kv_pool_bytes", json_integer((json_int_t)r->kv_bytes));
            json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)r->peak_rss));
            json_object_set_new(o, "peak_device_bytes", json_integer((json_int_t)r->peak_dev));
            json_object_set_new(o, "logits_finite", json_boolean(!r->nonfinite));
            json_array_append_new(arr, o);
        }
        json_object_set_new(root, "runs", arr);
        if (json_dump_file(root, json_path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "tessera bench: cannot write %s\n", json_path);
            rc = 1;
        }
        json_decref(root);
    }
    free(rows);
    free(batches);
    return rc;

usage_error: /* a bad or missing option: nothing ran */
    free(batches);
    free(levels);
    return 2;
}
