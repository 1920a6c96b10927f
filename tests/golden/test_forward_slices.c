/* Device-side reductions of more logits rows than one head call takes (runtime/forward.c): a decode batch of 200
 * sequences on a fixture model, whose greedy picks (tsr_forward_argmax) and sampling candidates (tsr_forward_top)
 * run the head in slices of 128 rows, against the whole rows of tsr_forward reduced on the host, value for value;
 * then tsr_forward_fetch_rows for rows of the slice still held, of an earlier slice, and across both. On the CPU
 * backend with its reference top_rows (TSR_CPU_TOP=1); the same code serves the CUDA backend, where only the picks
 * and candidates cross to the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "runtime/engine.h"
#include "runtime/forward.h"
#include "tests/common/golden.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 200 /* more than the 128 rows of one head call */

static void host_argmax(const float *row, int n, int32_t *id, float *val)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    *id = best, *val = row[best];
}

static void expect_rows(tsr_forward_ctx *f, const float *full, int vocab, int row0, int n)
{
    float *got = malloc((size_t)n * vocab * sizeof(float));
    assert_non_null(got);
    assert_int_equal(tsr_forward_fetch_rows(f, row0, n, got), TSR_OK);
    assert_memory_equal(got, full + (size_t)row0 * vocab, (size_t)n * vocab * sizeof(float));
    free(got);
}

static void test_rows_past_one_head_call(void **state)
{
    (void)state;
    setenv("TSR_CPU_TOP", "1", 1);
    tsr_engine *e = open_engine("tiny-llama-exl2-4.0bpw", TSR_F16, 16 * ROWS);
    tsr_forward_ctx *f = e->fwd;
    const int vocab = e->model->local.vocab;
    assert_true(tsr_forward_pick_rows(f) >= ROWS);
    assert_true(tsr_forward_top_rows(f) >= ROWS);
    /* ROWS sequences of one token each, each in a page of its own, the logits of each */
    static int32_t tokens[ROWS], pages[ROWS];
    tsr_seq_input in[ROWS];
    for (int s = 0; s < ROWS; s++) {
        tokens[s] = (7 * s + 3) % vocab, pages[s] = s;
        in[s] = (tsr_seq_input){&tokens[s], 1, 0, &pages[s], 1, TSR_LOGITS_LAST};
    }
    float *full = malloc((size_t)ROWS * vocab * sizeof(float));
    assert_non_null(full);
    assert_int_equal(tsr_forward(f, in, ROWS, full), TSR_OK);

    int32_t ids[ROWS];
    float vals[ROWS];
    assert_int_equal(tsr_forward_argmax(f, in, ROWS, ids, vals), TSR_OK);
    for (int r = 0; r < ROWS; r++) {
        int32_t id;
        float val;
        host_argmax(full + (size_t)r * vocab, vocab, &id, &val);
        if (ids[r] != id || memcmp(&vals[r], &val, sizeof val) != 0)
            fail_msg("row %d: picked %d (%g), the whole row's argmax is %d (%g)", r, ids[r], vals[r], id, val);
    }
    expect_rows(f, full, vocab, 150, 3); /* the slice still held */
    expect_rows(f, full, vocab, 5, 3);   /* an earlier slice: the head again */

    float inv[ROWS], z[ROWS], want_z[ROWS];
    for (int r = 0; r < ROWS; r++) inv[r] = 0.5f + (float)(r % 5) * 0.25f;
    const size_t cand = (size_t)ROWS * TSR_TOP_MAX;
    int32_t *tids = malloc(sizeof(int32_t) * cand), *want_ids = malloc(sizeof(int32_t) * cand);
    float *tvals = malloc(sizeof(float) * cand), *want_vals = malloc(sizeof(float) * cand);
    assert_true(tids && want_ids && tvals && want_vals);
    assert_int_equal(tsr_forward_top(f, in, ROWS, inv, tids, tvals, z), TSR_OK);
    tsr_cpu_top_rows(full, ROWS, vocab, TSR_TOP_MAX, inv, want_ids, want_vals, want_z);
    assert_memory_equal(tids, want_ids, sizeof(int32_t) * cand);
    assert_memory_equal(tvals, want_vals, sizeof(float) * cand);
    assert_memory_equal(z, want_z, sizeof(float) * ROWS);
    expect_rows(f, full, vocab, 120, 20); /* across the two slices */
    expect_rows(f, full, vocab, 199, 1);
    float one[1];
    assert_int_equal(tsr_forward_fetch_rows(f, ROWS - 1, 2, one), TSR_ERR_ARG); /* past the call's rows */
    printf("%d rows: picks, candidates and fetched rows equal the whole rows' (logits in slices of 128)\n", ROWS);

    free(tids), free(want_ids), free(tvals), free(want_vals), free(full);
    tsr_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows_past_one_head_call)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
