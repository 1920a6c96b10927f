/* Step plans: building, packing and unpacking round-trip exactly; truncated, misaligned, corrupted or
 * out-of-range plans are rejected by unpack or validate and never read outside the buffer (ASan in the sanitizer
 * build checks the latter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/step.h"

#include <stdlib.h>
#include <string.h>

static void build(tsr_step *s)
{
    memset(s, 0, sizeof *s);
    int32_t toks[5] = {1, 2, 3, 4, 5}, pages[2] = {7, 3}, hist[3] = {9, 9, 1};
    tsr_logit_bias bias[1] = {{42, -100.0f}};
    tsr_step_seq a = {.id = 11, .pos0 = 0, .n_tokens = 5, .n_pages = 2, .sample = 1, .n_logprobs = 2, .seed = 5,
                      .n_hist = 3, .n_hist_prompt = 2, .n_bias = 1};
    a.sampling = tsr_sampling_default();
    tsr_step_seq b = {.id = 12, .pos0 = 6, .n_tokens = 1, .n_pages = 2, .sample = 1, .n_logprobs = -1, .logits = 1};
    b.sampling = tsr_sampling_default();
    assert_int_equal(tsr_step_add(s, &a, toks, pages, hist, bias), TSR_OK);
    assert_int_equal(tsr_step_add(s, &b, toks + 4, pages, NULL, NULL), TSR_OK);
}

static void test_roundtrip(void **state)
{
    (void)state;
    tsr_step s;
    build(&s);
    assert_int_equal(s.n_seqs, 2);
    assert_int_equal(s.seqs[1].token0, 5);
    assert_int_equal(s.seqs[1].page0, 2);
    assert_int_equal(tsr_step_validate(&s, 100, 8, 4), TSR_OK);
    assert_int_equal(tsr_step_logit_rows(&s), 1);
    uint8_t *buf;
    size_t len;
    assert_int_equal(tsr_step_pack(&s, &buf, &len), TSR_OK);
    tsr_step u;
    assert_int_equal(tsr_step_unpack(buf, len, &u), TSR_OK);
    assert_int_equal(tsr_step_validate(&u, 100, 8, 4), TSR_OK);
    assert_int_equal(u.n_seqs, 2);
    assert_memory_equal(u.seqs, s.seqs, 2 * sizeof *s.seqs);
    assert_memory_equal(u.tokens, s.tokens, 6 * sizeof *s.tokens);
    assert_memory_equal(u.pages, s.pages, 4 * sizeof *s.pages);
    assert_memory_equal(u.hist, s.hist, 3 * sizeof *s.hist);
    assert_int_equal(u.bias[0].token, 42);
    tsr_step_free(&u); /* points into buf: frees nothing */
    free(buf);
    tsr_step_clear(&s);
    assert_int_equal(s.n_seqs, 0);
    tsr_step_free(&s);
}

static void test_rejects(void **state)
{
    (void)state;
    tsr_step s;
    build(&s);
    /* ranges: a token outside the vocabulary, a page outside the pool, positions past the page table */
    assert_int_equal(tsr_step_validate(&s, 5, 8, 4), TSR_ERR_FORMAT);
    assert_int_equal(tsr_step_validate(&s, 100, 7, 4), TSR_ERR_FORMAT);
    assert_int_equal(tsr_step_validate(&s, 100, 8, 3), TSR_ERR_FORMAT);
    uint8_t *buf;
    size_t len;
    assert_int_equal(tsr_step_pack(&s, &buf, &len), TSR_OK);
    /* every truncation fails cleanly; copies keep 8-byte alignment */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, buf, cut);
        tsr_step u;
        assert_int_not_equal(tsr_step_unpack(part, cut, &u), TSR_OK);
        free(part);
    }
    /* misaligned buffers are refused */
    uint8_t *shifted = malloc(len + 8);
    memcpy(shifted + 4, buf, len);
    tsr_step u;
    assert_int_equal(tsr_step_unpack(shifted + 4, len, &u), TSR_ERR_ARG);
    free(shifted);
    /* any single corrupted byte either fails or gives a plan that validates against the real bounds */
    uint64_t rng = 1;
    for (int trial = 0; trial < 4000; trial++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        copy[(rng >> 33) % len] ^= (uint8_t)(1u << ((rng >> 20) & 7));
        if (tsr_step_unpack(copy, len, &u) == TSR_OK && tsr_step_validate(&u, 100, 8, 4) == TSR_OK) {
            for (int i = 0; i < u.n_seqs; i++) {
                const tsr_step_seq *q = &u.seqs[i];
                for (int t = 0; t < q->n_tokens; t++) assert_true(u.tokens[q->token0 + t] < 100);
                for (int p = 0; p < q->n_pages; p++) assert_true(u.pages[q->page0 + p] < 8);
            }
        }
        free(copy);
    }
    free(buf);
    tsr_step_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
