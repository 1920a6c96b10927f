/* The candidates-against-rows check (see step_top.h). */
#include "tests/common/step_top.h"

#include "runtime/engine.h"
#include "runtime/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQS 8
#define PROMPT 5

static int g_top_calls;
static const tsr_ops *g_inner;

/* the backend's top_rows, counted */
static void counting_top(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                         float *z)
{
    g_top_calls++;
    g_inner->top_rows(x, rows, n, k, inv_temp, ids, vals, z);
}

static tsr_sampling config(int s)
{
    tsr_sampling p = tsr_sampling_default();
    switch (s) {
    case 0: p.temperature = 0.8f; break;
    case 1: p.top_k = 40; break;
    case 2: p.temperature = 0.7f, p.top_p = 0.9f; break;
    case 3: p.top_p = 0.95f, p.min_p = 0.05f; break;
    case 4: p.min_p = 0.1f; break;
    case 5: p.typical_p = 0.9f; break;
    case 6: p.temperature = 0.5f, p.top_k = 20, p.top_p = 0.8f; break;
    default: p.temperature = 0; break;
    }
    return p;
}

int tsr_check_step_top(const char *model_dir, const tsr_ops *with_top, const tsr_ops *whole, int steps,
                       tsr_step_top_stats *stats, char *err, size_t cap)
{
    memset(stats, 0, sizeof *stats);
    tsr_ops counted = *with_top;
    g_inner = with_top;
    counted.top_rows = counting_top;
    g_top_calls = 0;
    tsr_engine *e[2] = {NULL, NULL};
    tsr_step_scratch scratch[2];
    memset(scratch, 0, sizeof scratch);
    tsr_step step;
    memset(&step, 0, sizeof step);
    const int per_seq = (PROMPT + steps + 1 + 15) / 16;
    int32_t toks[SEQS][PROMPT + 1], pages[SEQS * 64];
    tsr_step_result res[2][SEQS];
    int rc = -1;
    for (int k = 0; k < 2; k++) {
        tsr_engine_opts o = {.max_tokens = 64, .page_size = 16, .kv_tokens = (long)SEQS * per_seq * 16,
                             .ops = k ? whole : &counted};
        if (tsr_engine_open(model_dir, &o, &e[k]) != TSR_OK) {
            snprintf(err, cap, "open %s: %s", model_dir, tsr_last_error());
            goto out;
        }
    }
    if (per_seq * SEQS > 64 * SEQS) {
        snprintf(err, cap, "too many steps");
        goto out;
    }
    for (int i = 0; i < SEQS * per_seq; i++) pages[i] = i;
    const int vocab = e[0]->model->cfg.vocab_size;
    for (int s = 0; s < SEQS; s++) {
        static const int32_t base[PROMPT] = {0, 1392, 1329, 263, 680};
        memcpy(toks[s], base, sizeof base);
        toks[s][PROMPT - 1] = (int32_t)((base[PROMPT - 1] + 97 * s) % vocab);
    }
    for (int g = 0; g <= steps; g++) {
        tsr_step_clear(&step);
        for (int s = 0; s < SEQS; s++) {
            tsr_step_seq q = {.id = (uint64_t)s + 1, .sample = 1, .n_logprobs = -1, .seed = 1000 + (uint64_t)s,
                              .sampling = config(s), .sample_index = (uint32_t)g};
            q.pos0 = g == 0 ? 0 : PROMPT + g - 1;
            q.n_tokens = g == 0 ? PROMPT : 1;
            q.n_pages = (q.pos0 + q.n_tokens + 15) / 16;
            const int32_t *t = g == 0 ? toks[s] : &toks[s][PROMPT];
            if (tsr_step_add(&step, &q, t, pages + s * per_seq, NULL, NULL) != TSR_OK) {
                snprintf(err, cap, "step add: %s", tsr_last_error());
                goto out;
            }
        }
        for (int k = 0; k < 2; k++)
            if (tsr_engine_run_step(e[k], &scratch[k], &step, res[k], NULL) != TSR_OK) {
                snprintf(err, cap, "step %d on the %s engine: %s", g, k ? "whole-row" : "candidates",
                         tsr_last_error());
                goto out;
            }
        for (int s = 0; s < SEQS; s++) {
            if (res[0][s].token != res[1][s].token) {
                snprintf(err, cap, "step %d, sequence %d (config %d): candidates drew %d, the whole row %d", g, s, s,
                         res[0][s].token, res[1][s].token);
                goto out;
            }
            toks[s][PROMPT] = res[1][s].token;
            stats->tokens++;
        }
    }
    stats->top_calls = g_top_calls;
    rc = 0;
out:
    for (int k = 0; k < 2; k++) {
        tsr_step_scratch_free(&scratch[k]);
        tsr_engine_close(e[k]);
    }
    tsr_step_free(&step);
    return rc;
}
