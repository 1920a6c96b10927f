/* Device-side reductions of more logits rows than one head call takes (runtime/forward.c), on the CPU backend with
 * its reference top_rows (TSR_CPU_TOP=1): tests/common/forward_slices.h's check, every value bit for bit. test_cuda
 * runs the same check on the GPU, where only the picks and candidates cross to the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "tests/common/fixtures.h"
#include "runtime/forward.h"
#include "tests/common/forward_slices.h"

#include <stdio.h>
#include <stdlib.h>

#define ROWS (TSR_HEAD_ROWS + 72) /* more than the rows of one head call */

static void test_rows_past_one_head_call(void **state)
{
    (void)state;
    setenv("TSR_CPU_TOP", "1", 1);
    char dir[4096], err[512];
    if (!tsr_fixture_model(dir, sizeof dir, "tiny-llama-exl2-4.0bpw")) fail_msg("fixture model not found");
    if (tsr_check_forward_slices(dir, tsr_ops_cpu(), ROWS, 0.0f, err, sizeof err) != 0) fail_msg("%s", err);
    printf("%d rows: picks, candidates and fetched rows equal the whole rows' (logits in slices of %d)\n", ROWS,
           TSR_HEAD_ROWS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows_past_one_head_call)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
