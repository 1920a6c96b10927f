/* The CPU kernels' vector helpers (kernels/cpu/cpu_vec.h): vf_exp against the double-precision exp over its whole
 * range (the attention's softmax weights come from it), its clamp below -87, the exact word conversions, and the
 * lane reductions the attention's scores go through (vf_sum_each, vf_max_all, vi_lanes). */
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

/* Lane u of vf_sum_each is v[u]'s lane sum; integer-valued lanes make every order of addition exact, so a lane
 * taken from the wrong vector or a lane left out shows. */
static void test_sum_each(void **state)
{
    (void)state;
    vf v[VF];
    float want[VF];
    for (int u = 0; u < VF; u++) {
        want[u] = 0.0f;
        for (int l = 0; l < VF; l++) {
            v[u][l] = (float)((u * 37 + l * l * 11 + 5) % 101) * (l % 3 == 0 ? -1.0f : 1.0f);
            want[u] += v[u][l];
        }
    }
    const vf got = vf_sum_each(v);
    for (int u = 0; u < VF; u++)
        if (got[u] != want[u]) fail_msg("vf_sum_each lane %d: %g, want %g", u, (double)got[u], (double)want[u]);
}

static void test_max_and_lanes(void **state)
{
    (void)state;
    const vi id = vi_lanes();
    for (int at = 0; at < VF; at++) {
        vf v;
        for (int l = 0; l < VF; l++) {
            assert_int_equal(id[l], l);
            v[l] = l == at ? 5.5f : -(float)l - 1.0f;
        }
        assert_true(vf_max_all(v) == 5.5f);
        const vf m = vf_max(v, (vf){0} - 0.5f);
        for (int l = 0; l < VF; l++) assert_true(m[l] == (l == at ? 5.5f : -0.5f));
    }
    const vf all_low = (vf){0} - INFINITY;
    assert_true(vf_max_all(all_low) == -INFINITY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_sum_each),
        cmocka_unit_test(test_max_and_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
