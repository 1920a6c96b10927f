/* The decode GEMV's shared memory against the limits of the cards tessera targets, with no GPU: for every row count
 * the kernels' opt-in must fit a block of the device (99 KB on sm_86/sm_89, 163 KB on sm_80, 227 KB on sm_90) and a
 * block must still stage some units of activations. Before stop 38 the one-row kernel asked for 112 KB at 1-8 rows
 * and 208 KB at 9-32 whatever the device, which the consumer cards and (at 9-32 rows) the A100 refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cuda/ops_cuda.h"

struct card {
    const char *name;
    int smem_block; /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
    int bulk;       /* sm_90 code: the bulk-copy kernel runs 3-64 rows */
};

static const struct card cards[] = {
    {"sm_80 (A100)", 163 * 1024, 0},
    {"sm_86 / sm_89 (RTX 3090 / 4090)", 99 * 1024, 0},
    {"sm_90 (H100 / H200)", 227 * 1024, 1},
};

static void test_gemv_fits(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof cards / sizeof cards[0]; c++) {
        const struct card *d = &cards[c];
        for (int M = 1; M <= 32; M++) { /* the one-row kernel's instances: up to 32 rows per launch off sm_90 */
            int units = 0;
            const size_t need = tsr_cuda_gemv_smem(M, 0, 0, d->smem_block, &units);
            if (need > (size_t)d->smem_block || units < 1)
                fail_msg("%s, %d rows: %zu bytes of %d, %d units per block", d->name, M, need, d->smem_block, units);
            if (M == 1 && units < 64) fail_msg("%s: one row stages only %d units per block", d->name, units);
        }
        for (int M = 3; d->bulk && M <= 64; M++)
            for (int gptq = 0; gptq <= 1; gptq++) {
                int units = 0;
                const size_t need = tsr_cuda_gemv_smem(M, 1, gptq, d->smem_block, &units);
                if (need > (size_t)d->smem_block || units < 1)
                    fail_msg("%s, bulk, %d rows: %zu bytes of %d, %d units", d->name, M, need, d->smem_block, units);
            }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gemv_fits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
