/* Fuzz target: step-plan buffers as a worker receives them over MPI. The input is copied into an 8-byte aligned
 * buffer (as a receive buffer is), unpacked, validated against a small model's bounds, and when it passes, every
 * slice it names is read, so a plan that validates but points outside its arrays shows up under ASan. */
#include "runtime/step.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t *aligned = malloc(size / 8 * 8 + 8);
    if (!aligned) return 0;
    memcpy(aligned, data, size);
    tsr_step s;
    if (tsr_step_unpack((const uint8_t *)aligned, size, &s) == TSR_OK && tsr_step_validate(&s, 1000, 64, 16) == TSR_OK) {
        volatile int64_t sum = 0;
        for (int i = 0; i < s.n_seqs; i++) {
            const tsr_step_seq *q = &s.seqs[i];
            for (int t = 0; t < q->n_tokens; t++) sum += s.tokens[q->token0 + t];
            for (int p = 0; p < q->n_pages; p++) sum += s.pages[q->page0 + p];
            for (int h = 0; h < q->n_hist; h++) sum += s.hist[q->hist0 + h];
            for (int b = 0; b < q->n_bias; b++) sum += s.bias[q->bias0 + b].token;
        }
        (void)tsr_step_logit_rows(&s);
    }
    free(aligned);
    return 0;
}
