/* The CPU kernels' vector helpers (kernels/cpu/cpu_vec.h): vf_exp against the double-precision exp over its whole
 * range (the attention's softmax weights come from it), its clamp below -87, and the exact word conversions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cpu/cpu_vec.h"

#include <math.h>

static void test_exp(void **state)
{
    (void)state;
    double worst = 0.0;
    float at = 0.0f;
    for (float x0 = -87.0f; x0 <= 88.0f; x0 += 0.0173f * VF) {
        vf x;
        for (int l = 0; l < VF; l++) x[l] = x0 + 0.0173f * (float)l;
        const vf e = vf_exp(x);
        for (int l = 0; l < VF; l++) {
            if (x[l] > 88.0f) continue;
            const double want = exp((double)x[l]), rel = fabs((double)e[l] - want) / want;
            if (rel > worst) worst = rel, at = x[l];
        }
    }
    if (worst > 2.5e-7) fail_msg("vf_exp: relative error %g at %g", worst, (double)at);
    const vf zero = vf_exp((vf){0});
    const vf far = vf_exp((vf){0} - 1000.0f);
    for (int l = 0; l < VF; l++) {
        assert_true(zero[l] == 1.0f);
        assert_true(far[l] > 0.0f && far[l] < 2e-38f); /* clamped to e^-87, not 0 */
    }
}

static void test_words(void **state)
{
    (void)state;
    vu w;
    for (int l = 0; l < VF; l++) w[l] = (uint32_t)l << 27; /* codes in the top bits below bit 31 */
    const vf f = vu_to_vf(w);
    for (int l = 0; l < VF; l++) assert_true(f[l] == (float)((uint32_t)l << 27));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
