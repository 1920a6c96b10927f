/* bench_sched: the scheduler's own cost per step (tsr_sched_plan + tsr_sched_commit + draining events) with 64
 * sequences decoding, measured with a trivial executor so that only scheduling is timed. Not a test: it prints
 * figures and asserts nothing about them.
 *
 *   bench_sched [steps] [prompt_len] [page_size]      (defaults 20000, 512, 16)
 *
 * Runs three cases: plain sampling, with a repetition penalty (the penalty history is copied into every step),
 * and with 64 sequences sharing a 512-token prefix through the cache. */
#include "runtime/sched/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int bench(const char *name, int steps, int prompt_len, int page_size, int penalty, int shared)
{
    const int n_seqs = 64;
    tsr_sched_opts o;
    memset(&o, 0, sizeof o);
    o.page_size = page_size;
    o.n_pages = n_seqs * ((prompt_len + steps + page_size) / page_size + 1);
    o.max_step_tokens = 2048;
    o.max_running = n_seqs;
    o.max_context = prompt_len + steps + 16;
    tsr_sched *s;
    if (tsr_sched_new(&o, &s) != TSR_OK) {
        fprintf(stderr, "bench_sched: %s\n", tsr_last_error());
        return 1;
    }
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    tsr_step step;
    memset(&step, 0, sizeof step);
    tsr_step_result *res = calloc((size_t)n_seqs, sizeof *res);
    for (int i = 0; i < n_seqs; i++) {
        for (int k = 0; k < prompt_len; k++) prompt[k] = (int32_t)((shared ? k * 7 : k * 7 + i * 131) % 32000);
        tsr_seq_params p;
        memset(&p, 0, sizeof p);
        p.sampling = tsr_sampling_default();
        if (penalty) p.sampling.repetition_penalty = 1.1f;
        p.seed = (uint64_t)i;
        p.max_tokens = steps + 8;
        p.n_logprobs = -1;
        uint64_t id;
        if (tsr_sched_submit(s, prompt, prompt_len, &p, 0, &id) != TSR_OK) {
            fprintf(stderr, "bench_sched: %s\n", tsr_last_error());
            return 1;
        }
    }
    /* prefill everything (untimed), then time decode steps */
    double t_plan = 0, t_commit = 0;
    int timed = 0;
    uint64_t tokens = 0;
    for (int it = 0; timed < steps; it++) {
        double t0 = now_s();
        if (tsr_sched_plan(s, 0, &step) != TSR_OK) return 1;
        double t1 = now_s();
        for (int i = 0; i < step.n_seqs; i++) {
            res[i].token = step.seqs[i].sample ? (int32_t)((step.seqs[i].pos0 * 31 + i) % 32000) : -1;
            res[i].n_top = 0;
        }
        double t2 = now_s();
        if (tsr_sched_commit(s, &step, res, 0) != TSR_OK) return 1;
        const tsr_sched_event *ev;
        tsr_sched_drain_events(s, &ev);
        double t3 = now_s();
        int all_decode = step.n_seqs == n_seqs && step.n_tokens == n_seqs;
        if (all_decode && it > 0) {
            t_plan += t1 - t0;
            t_commit += t3 - t2;
            tokens += (uint64_t)step.n_tokens;
            timed++;
        }
        if (it > steps * 4) break;
    }
    tsr_sched_stats st;
    tsr_sched_get_stats(s, &st);
    printf("%-28s %6d steps x %d seqs: plan %6.2f us, commit %6.2f us, total %6.2f us per step (%.3f us per "
           "sequence); prefix hits %llu\n",
           name, timed, n_seqs, 1e6 * t_plan / timed, 1e6 * t_commit / timed, 1e6 * (t_plan + t_commit) / timed,
           1e6 * (t_plan + t_commit) / timed / n_seqs, (unsigned long long)st.prefix_hits);
    (void)tokens;
    free(prompt);
    free(res);
    tsr_step_free(&step);
    tsr_sched_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 20000;
    int prompt_len = argc > 2 ? atoi(argv[2]) : 512;
    int page_size = argc > 3 ? atoi(argv[3]) : 16;
    if (steps < 1 || prompt_len < 1 || page_size < 1) {
        fprintf(stderr, "usage: bench_sched [steps] [prompt_len] [page_size]\n");
        return 2;
    }
    int rc = bench("64 decoding", steps, prompt_len, page_size, 0, 0);
    rc |= bench("64 decoding, rep. penalty", steps, prompt_len, page_size, 1, 0);
    rc |= bench("64 decoding, shared prefix", steps, prompt_len, page_size, 0, 1);
    return rc;
}
