/* Fuzz target: the safetensors header parser and validator, then the EXL2 matrix loader on whatever it accepted
 * (every tensor name ending in .q_weight is loaded as an EXL2 matrix with K taken from its q_invperm). */
#include "runtime/exl2.h"
#include "runtime/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_st_set *set = NULL;
    if (tsr_st_parse_buffer(data, size, "fuzz.safetensors", &set) != TSR_OK) return 0;
    for (size_t i = 0; i < tsr_st_count(set); i++) {
        const tsr_st_tensor *t = tsr_st_at(set, i);
        size_t len = strlen(t->name);
        if (len < 9 || strcmp(t->name + len - 9, ".q_weight") || t->ndim != 2) continue;
        char key[512], inv[600];
        if (len - 9 >= sizeof key) continue;
        memcpy(key, t->name, len - 9);
        key[len - 9] = '\0';
        snprintf(inv, sizeof inv, "%s.q_invperm", key);
        const tsr_st_tensor *ti = tsr_st_find(set, inv);
        if (!ti || ti->ndim != 1 || ti->shape[0] > 4096) continue;
        tsr_qmatrix q;
        if (tsr_qmatrix_load(set, key, (int)ti->shape[0], (int)t->shape[1], 0, 1.0f, &q) == TSR_OK) {
            float y[64];
            if ((size_t)q.K * q.N <= 4096) {
                float W[4096];
                tsr_qmatrix_dequant_ref(&q, 1, W);
                (void)y;
            }
            tsr_qmatrix_free(&q);
        }
    }
    tsr_st_set_free(set);
    return 0;
}
