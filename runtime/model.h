/* A loaded model: configuration plus weight views for the Llama family (Llama 2/3, Mistral, Qwen2).
 *
 * tsr_model_load() reads config.json / generation_config.json, maps every safetensors file of the directory and
 * binds each layer's tensors: EXL2 (`<key>.q_weight` ...) or dense F16/BF16/F32 (`<key>.weight`), per linear
 * layer, so mixed files work. The model owns the mapping and the small tables derived at load (permutations,
 * group tables); weights are never copied. The head is `lm_head` when present (quantized or not), else the
 * embedding when tie_word_embeddings is set. Every tensor's dtype and shape is checked; errors name file and
 * tensor. */
#ifndef TSR_MODEL_H
#define TSR_MODEL_H

#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"

typedef struct tsr_layer {
    tsr_dense attn_norm, mlp_norm;
    tsr_linear q, k, v, o;
    tsr_linear gate, up, down;
} tsr_layer;

typedef struct tsr_model {
    char *dir;
    tsr_model_config cfg;
    tsr_st_set *st;
    tsr_dense embed;        /* [vocab][hidden] */
    tsr_layer *layers;      /* [n_layers] */
    tsr_dense final_norm;
    tsr_linear head;        /* hidden → vocab */
    int n_exl2, n_dense;    /* linear layers of each kind */
    uint64_t file_bytes;    /* size of the safetensors files */
} tsr_model;

tsr_status tsr_model_load(const char *dir, tsr_model **out);
void tsr_model_free(tsr_model *m);

/* "exl2", "fp16", "bf16", "fp32" or "mixed" */
const char *tsr_model_format(const tsr_model *m);

/* Bytes the forward pass reads per token from a linear layer (its stored tensors). */
uint64_t tsr_linear_bytes(const tsr_linear *L);

#endif
