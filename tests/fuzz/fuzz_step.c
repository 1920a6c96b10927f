/* Fuzz target: step-plan buffers as a worker receives them over MPI. The input is copied into an 8-byte aligned
 * buffer (as a receive buffer is), unpacked, validated against a small model's bounds, and when it passes, every
 * slice it names is read, so a plan that validates but points outside its arrays shows up under ASan; then it is
 * packed again and the copy must unpack and validate with the same sizes. */
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
    if (tsr_step_unpack((const uint8_t *)aligned, size, &s) == TSR_OK &&
        tsr_step_validate(&s, 1000, 64, 16) == TSR_OK) {
        volatile int64_t sum = 0;
        (void)sum;
        for (int i = 0; i < s.n_seqs; i++) {
            const tsr_step_seq *q = &s.seqs[i];
            for (int t = 0; t < q->n_tokens; t++) sum += s.tokens[q->token0 + t];
            for (int p = 0; p < q->n_pages; p++) sum += s.pages[q->page0 + p];
            for (int h = 0; h < q->n_hist; h++) sum += s.hist[q->hist0 + h];
            for (int b = 0; b < q->n_bias; b++) sum += s.bias[q->bias0 + b].token;
        }
        (void)tsr_step_logit_rows(&s);
        /* a valid plan packs back into a buffer that unpacks and validates to the same shape */
        uint8_t *buf = NULL;
        size_t len = 0;
        if (tsr_step_pack(&s, &buf, &len) == TSR_OK) {
            tsr_step s2;
            if (tsr_step_unpack(buf, len, &s2) != TSR_OK || tsr_step_validate(&s2, 1000, 64, 16) != TSR_OK ||
                s2.n_seqs != s.n_seqs || s2.n_tokens != s.n_tokens || s2.n_pages != s.n_pages)
                abort();
            free(buf);
        }
    }
    free(aligned);
    return 0;
}
