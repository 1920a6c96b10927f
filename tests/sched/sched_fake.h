/* A fake executor for scheduler tests: a "model" whose KV cache stores token ids and whose next token is a
 * deterministic function of the whole history read back through the page table, the seed and the sample index.
 *
 * Because the history is read from the fake KV pages (not from the scheduler), a page shared or reused wrongly
 * changes the output, and fake_run also checks directly that every position it reads holds the sequence's token,
 * that every page it writes has reference count 1 (held only by the writing sequence) and that no two sequences
 * of a step write one page. The expected stream of a request can be computed independently with fake_expect. */
#ifndef TSR_TESTS_SCHED_FAKE_H
#define TSR_TESTS_SCHED_FAKE_H

#include "runtime/sched/scheduler.h"

#include <stdint.h>

typedef struct fake_exec {
    int page_size, n_pages, vocab;
    int32_t *kv;          /* [n_pages * page_size]: token id written at each slot, -1 never written */
    uint64_t *step_writer;/* [n_pages]: id of the sequence writing the page in the current step */
    uint64_t step_no;
    const tsr_sched *sched;
    char error[256];      /* first violation seen ("" none) */
} fake_exec;

int fake_init(fake_exec *f, const tsr_sched *s, int n_pages, int page_size, int vocab);
void fake_free(fake_exec *f);

/* The fake model's token after history h[0..n) for (seed, index); biased entries at or below -1e29 are never
 * chosen (the scheduler masks stop ids that way until min_tokens). */
int32_t fake_next(const int32_t *h, int n, uint64_t seed, uint32_t index, int vocab, const tsr_logit_bias *bias,
                  int n_bias);

/* Runs a step: writes each chunk's tokens into the pages, samples where asked. Returns 0, or -1 after recording
 * the first violation in f->error. */
int fake_run(fake_exec *f, const tsr_step *step, tsr_step_result *results);

/* The token a request with this history, seed and min_tokens/stop ids rule draws next (what the scheduler and
 * fake_run should produce together): history = prompt + generated so far. */
int32_t fake_expect(const int32_t *history, int n_history, int n_prompt, const tsr_seq_params *p, int vocab);

#endif
