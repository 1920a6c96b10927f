/* Sampled decoding from device-side candidates, on the CPU: the CPU backend with the reference top_rows
 * (kernels/cpu) against the CPU backend copying whole rows, through the step path of the engine, on fixture models
 * of both architectures (tests/common/step_top.h). The GPU suite runs the same check on the CUDA backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "tests/common/fixtures.h"
#include "tests/common/step_top.h"

#include <stdio.h>

static void test_cpu_candidates(void **state)
{
    (void)state;
    static const char *models[] = {"tiny-llama-exl2-4.0bpw", "tiny-qwen2-fp16"};
    tsr_ops with_top = *tsr_ops_cpu();
    with_top.top_rows = tsr_cpu_top_rows;
    int checked = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char dir[1024], err[512];
        if (!tsr_fixture_model(dir, sizeof dir, models[i])) continue;
        tsr_step_top_stats st;
        if (tsr_check_step_top(dir, &with_top, tsr_ops_cpu(), 24, &st, err, sizeof err) != 0)
            fail_msg("%s: %s", models[i], err);
        printf("%s: %d tokens equal, %d forward calls read candidates\n", models[i], st.tokens, st.top_calls);
        assert_true(st.top_calls >= 25);
        checked++;
    }
    assert_true(checked > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpu_candidates)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
