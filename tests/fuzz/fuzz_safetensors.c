/* Fuzz target: the safetensors header parser and validator, then the quantized-matrix loaders on whatever it
 * accepted: every tensor name ending in .q_weight is loaded as an EXL2 matrix (K taken from its q_invperm), every
 * name ending in .qweight as a 4-bit GPTQ matrix (K = 8 rows per word, N its columns) both as a v1 checkpoint with
 * derived groups and as gptq_v2 with act-order and a group size taken from the input's first byte; small loaded
 * matrices are dequantized in full, so offsets that validate but point outside the data show up under ASan. */
#include "runtime/exl2.h"
#include "runtime/gptq.h"
#include "runtime/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static float W[1 << 14];

static void dequant(tsr_qmatrix *q)
{
    if ((int64_t)q->K * q->N <= (int64_t)(sizeof W / sizeof W[0])) tsr_qmatrix_dequant_ref(q, 1, W);
    tsr_qmatrix_free(q);
}

/* key = name without its suffix (len chars); 0 when the name does not end in it or is too long */
static int key_of(const char *name, const char *suffix, char *key, size_t cap)
{
    size_t len = strlen(name), sl = strlen(suffix);
    if (len < sl || strcmp(name + len - sl, suffix) || len - sl >= cap) return 0;
    memcpy(key, name, len - sl);
    key[len - sl] = '\0';
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsr_st_set *set = NULL;
    if (tsr_st_parse_buffer(data, size, "fuzz.safetensors", &set) != TSR_OK) return 0;
    for (size_t i = 0; i < tsr_st_count(set); i++) {
        const tsr_st_tensor *t = tsr_st_at(set, i);
        char key[512], aux[600];
        tsr_qmatrix q;
        if (t->ndim == 2 && key_of(t->name, ".q_weight", key, sizeof key)) {
            snprintf(aux, sizeof aux, "%s.q_invperm", key);
            const tsr_st_tensor *ti = tsr_st_find(set, aux);
            if (!ti || ti->ndim != 1 || ti->shape[0] > 4096) continue;
            if (tsr_qmatrix_load(set, key, (int)ti->shape[0], (int)t->shape[1], 0, 1.0f, &q) == TSR_OK) dequant(&q);
        } else if (t->ndim == 2 && key_of(t->name, ".qweight", key, sizeof key)) {
            if (t->shape[0] > 512 || t->shape[1] > 4096) continue;
            int K = (int)t->shape[0] * 8, N = (int)t->shape[1];
            tsr_quant_config qc = {.method = "gptq", .bits = 4, .group_size = size ? (int)(data[0] % 5) * 32 - 32 : 0,
                                   .desc_act = 1, .gptq_v2 = 1};
            if (tsr_gptq_load(set, key, K, N, 0, NULL, &q) == TSR_OK) dequant(&q);
            if (tsr_gptq_load(set, key, K, N, 0, &qc, &q) == TSR_OK) dequant(&q);
        }
    }
    tsr_st_set_free(set);
    return 0;
}
