/* tessera bench under mpirun (see bench_ranks.h).
 *
 * One process measures its engine directly (cmd_bench.c: weight bandwidth against the device's copy rate, peak
 * memory). Under mpirun the model is split over worker ranks, so the measurement goes through the session's executor
 * as `tessera generate --bench` does (parallel/bench.h): random prompts of --prompt-len tokens prefilled in steps of
 * --max-tokens, then --gen greedy decode steps, per batch size; the plan's per-worker shares are printed first and
 * each batch reports the weight bytes per second its busiest worker streams. Arguments are checked the same way on
 * every rank before any rank starts, so a bad one ends the whole job at once (only rank 0 says why). */
#include "launcher/bench_ranks.h"

#include "launcher/backend_select.h"
#include "launcher/cli.h"
#include "parallel/bench.h"
#include "parallel/rank.h"
#include "parallel/session.h"

#include <stdio.h>

int tsr_bench_ranks(const bench_ranks_args *a, const tsr_par_opts *po)
{
    const int quiet = tsr_rank_is_worker();
    tsr_bench_opts bo = {.prompt_len = a->prompt_len, .gen = a->gen, .json = a->json, .label = a->model,
                         .prompt_seed = a->seed};
    bo.sampling = tsr_sampling_default(); /* greedy */
    if (a->gen < 1) {
        if (!quiet) fprintf(stderr, "tessera bench: under mpirun --gen must be at least 1\n");
        return 2;
    }
    for (int i = 0; i < a->n_batches; i++) {
        if (i == TSR_BENCH_MAX_BATCHES || a->batches[i] > a->max_tokens) {
            if (!quiet)
                fprintf(stderr,
                        "tessera bench: under mpirun --batch takes up to %d sizes of at most --max-tokens (%d)\n",
                        TSR_BENCH_MAX_BATCHES, a->max_tokens);
            return 2;
        }
        bo.batches[bo.n_batches++] = a->batches[i];
    }
    tsr_session_req req = {.cmd = "bench",
                           .model_dir = a->model,
                           .device = a->device,
                           .select_backend = tsr_select_backend,
                           .threads = a->threads,
                           .max_tokens = a->max_tokens,
                           .kv_dtype = a->kv_dtype,
                           .kv_tokens = tsr_bench_kv_tokens(&bo, 16),
                           /* the plan refuses a run past the model's context before any worker loads a weight */
                           .max_context = (long)a->prompt_len + a->gen};
    tsr_session *s = NULL;
    tsr_status st = tsr_session_open(&req, po, &s);
    if (st != TSR_OK) return tsr_cli_error("bench", st);
    if (s->worker) { /* a worker rank: it served the coordinator's steps until the end */
        const int rc = s->worker_rc;
        tsr_session_close(s);
        return rc;
    }
    bo.plan = &s->plan;
    st = tsr_bench_run(s->x, &bo, stdout);
    tsr_session_close(s);
    return st == TSR_OK ? 0 : tsr_cli_error("bench", st);
}
