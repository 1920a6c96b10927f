/* The fake executor of the scheduler tests (see sched_fake.h). */
#include "tests/sched/sched_fake.h"

#include "runtime/sched/sched_debug.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fake_init(fake_exec *f, const tsr_sched *s, int n_pages, int page_size, int vocab)
{
    memset(f, 0, sizeof *f);
    f->kv = malloc((size_t)n_pages * (size_t)page_size * sizeof *f->kv);
    f->step_writer = calloc((size_t)n_pages, sizeof *f->step_writer);
    if (!f->kv || !f->step_writer) return -1;
    for (size_t i = 0; i < (size_t)n_pages * (size_t)page_size; i++) f->kv[i] = -1;
    f->sched = s;
    f->n_pages = n_pages;
    f->page_size = page_size;
    f->vocab = vocab;
    return 0;
}

void fake_free(fake_exec *f)
{
    free(f->kv);
    free(f->step_writer);
    memset(f, 0, sizeof *f);
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int masked(int32_t t, const tsr_logit_bias *bias, int n_bias)
{
    for (int i = 0; i < n_bias; i++)
        if (bias[i].token == t && bias[i].bias <= -1e29f) return 1;
    return 0;
}

int32_t fake_next(const int32_t *h, int n, uint64_t seed, uint32_t index, int vocab, const tsr_logit_bias *bias,
                  int n_bias)
{
    uint64_t z = 0x1234567ull;
    for (int i = 0; i < n; i++) z = mix(z + (uint64_t)(uint32_t)h[i]);
    z = mix(z ^ seed) + index;
    int32_t t = (int32_t)(mix(z) % (uint64_t)vocab);
    for (int k = 0; k < vocab && masked(t, bias, n_bias); k++) t = (t + 1) % vocab;
    return t;
}

int32_t fake_expect(const int32_t *history, int n_history, int n_prompt, const tsr_seq_params *p, int vocab)
{
    int generated = n_history - n_prompt;
    tsr_logit_bias mask[64];
    int n_mask = 0;
    if (!p->ignore_eos && generated < p->min_tokens)
        for (int k = 0; k < p->n_stop_ids && n_mask < 64; k++) {
            mask[n_mask].token = p->stop_ids[k];
            mask[n_mask++].bias = -1e30f;
        }
    return fake_next(history, n_history, p->seed, (uint32_t)generated, vocab, mask, n_mask);
}

#define FAIL(...) (snprintf(f->error, sizeof f->error, __VA_ARGS__), -1)

int fake_run(fake_exec *f, const tsr_step *step, tsr_step_result *results)
{
    int ps = f->page_size;
    if (tsr_step_validate(step, f->vocab, f->n_pages, ps) != TSR_OK)
        return FAIL("step does not validate: %s", tsr_last_error());
    f->step_no++;
    int32_t *hist = NULL;
    int cap = 0;
    for (int i = 0; i < step->n_seqs; i++) {
        const tsr_step_seq *q = &step->seqs[i];
        const int32_t *table = step->pages + q->page0;
        int end = q->pos0 + q->n_tokens;
        if (q->n_pages * ps < end) return FAIL("seq %llu: %d pages for %d positions", (unsigned long long)q->id,
                                               q->n_pages, end);
        for (int t = 0; t < q->n_tokens; t++) {
            int pos = q->pos0 + t;
            int32_t page = table[pos / ps];
            if (tsr_sched_page_refcount(f->sched, page) != 1)
                return FAIL("seq %llu writes page %d (position %d) of count %d", (unsigned long long)q->id, page,
                            pos, tsr_sched_page_refcount(f->sched, page));
            if (f->step_writer[page] != 0 && f->step_writer[page] != q->id)
                return FAIL("seqs %llu and %llu both write page %d in one step",
                            (unsigned long long)f->step_writer[page], (unsigned long long)q->id, page);
            f->step_writer[page] = q->id;
            f->kv[(size_t)page * (size_t)ps + (size_t)(pos % ps)] = step->tokens[q->token0 + t];
        }
        /* read the whole history back through the page table and compare it with the scheduler's tokens */
        if (end > cap) {
            cap = end * 2;
            int32_t *h = realloc(hist, (size_t)cap * sizeof *h);
            if (!h) {
                free(hist);
                return FAIL("out of memory");
            }
            hist = h;
        }
        int n_known = 0;
        const int32_t *known = tsr_sched_tokens(f->sched, q->id, NULL, &n_known);
        for (int pos = 0; pos < end; pos++) {
            hist[pos] = f->kv[(size_t)table[pos / ps] * (size_t)ps + (size_t)(pos % ps)];
            if (!known || pos >= n_known || hist[pos] != known[pos]) {
                int bad = FAIL("seq %llu position %d reads %d from page %d, the sequence has %d",
                               (unsigned long long)q->id, pos, hist[pos], table[pos / ps],
                               known && pos < n_known ? known[pos] : -9);
                free(hist);
                return bad;
            }
        }
        memset(&results[i], 0, sizeof results[i]);
        results[i].token = -1;
        if (q->sample) {
            if (end != n_known) {
                free(hist);
                return FAIL("seq %llu samples at %d of %d known tokens", (unsigned long long)q->id, end, n_known);
            }
            results[i].token = fake_next(hist, end, q->seed, q->sample_index, f->vocab, step->bias + q->bias0,
                                         q->n_bias);
            results[i].logprob = -1.0f;
            results[i].n_top = q->n_logprobs > 0 ? 1 : 0;
            results[i].top_ids[0] = results[i].token;
        }
    }
    for (int i = 0; i < step->n_seqs; i++) { /* clear this step's writers */
        const tsr_step_seq *q = &step->seqs[i];
        for (int k = 0; k < q->n_pages; k++) f->step_writer[step->pages[q->page0 + k]] = 0;
    }
    free(hist);
    return 0;
}
