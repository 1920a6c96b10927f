/* A loaded model: configuration plus weight views for the Llama family (Llama 2/3, Mistral, Qwen2).
 *
 * tsr_model_load() reads config.json / generation_config.json, maps every safetensors file of the directory and
 * binds each layer's tensors: EXL2 (`<key>.q_weight` ...) or dense F16/BF16/F32 (`<key>.weight`), per linear
 * layer, so mixed files work. The model owns the mapping and the small tables derived at load (permutations,
 * group tables); weights are never copied. The head is `lm_head` when present (quantized or not), else the
 * embedding when tie_word_embeddings is set. Every tensor's dtype and shape is checked; errors name file and
 * tensor.
 *
 * A process of a split model holds a part (tsr_model_part): a stage's contiguous layers, the embedding only on the
 * first stage (or with a tied head), the final norm and head only on the last; the layers it does not hold stay
 * zeroed in `layers`, which is always indexed by the global layer number. A tensor-parallel shard (parallel/shard.c)
 * then replaces the held matrices by slices the model owns (tsr_model_own) and sets `local` to the shard's
 * head, KV-head, intermediate and vocabulary counts; the forward pass and the KV cache size themselves from
 * `local`, never from cfg. */
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

/* Which part of the model a process holds. The whole model: {0, n_layers, 1, 1, 0, 1}. */
typedef struct tsr_model_part {
    int layer0, layer1;     /* layers [layer0, layer1) */
    int embed;              /* the embedding (first stage) */
    int head;               /* the final norm and the head (last stage) */
    int tp_rank, tp_size;   /* tensor shard: this process's index in its tensor-parallel group, and the group size */
} tsr_model_part;

/* The dimensions this process computes (global ones divided by the tensor split). */
typedef struct tsr_model_local {
    int n_heads, n_kv_heads; /* query and key/value heads */
    int intermediate;        /* MLP features */
    int vocab0, vocab;       /* the head's columns: logits [vocab0, vocab0 + vocab) of cfg.vocab_size */
} tsr_model_local;

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
    int head_tied;          /* the head is the embedding matrix (tie_word_embeddings, no lm_head tensor) */
    tsr_model_part part;    /* what this process holds (the whole model unless loaded with tsr_model_load_part) */
    tsr_model_local local;  /* what it computes */
    void **owned;           /* buffers of sliced tensors, freed with the model */
    int n_owned, cap_owned;
} tsr_model;

/* Loads the whole model. */
tsr_status tsr_model_load(const char *dir, tsr_model **out);
/* Loads only `part`'s layers (and embedding / final norm + head as it says); part->tp_size must be 1 here (the
 * tensor shard is cut afterwards, parallel/shard.c). A NULL part loads everything. Fails with TSR_ERR_ARG on a
 * layer range outside the model. */
tsr_status tsr_model_load_part(const char *dir, const tsr_model_part *part, tsr_model **out);
void tsr_model_free(tsr_model *m);

/* Hands a malloc'd buffer to the model, which frees it in tsr_model_free. On allocation failure p is freed at once
 * and TSR_ERR_NOMEM returned. */
tsr_status tsr_model_own(tsr_model *m, void *p);

/* Bytes of layer l's tensors as stored (its seven linear layers and two norms). */
uint64_t tsr_model_layer_bytes(const tsr_model *m, int l);
/* Bytes of the embedding, of the final norm + head (0 for a tied head beyond the norm). */
uint64_t tsr_model_embed_bytes(const tsr_model *m);
uint64_t tsr_model_head_bytes(const tsr_model *m);
/* 1 when the head is the embedding matrix (tie_word_embeddings without an lm_head tensor). */
int tsr_model_head_tied(const tsr_model *m);

/* "exl2", "fp16", "bf16", "fp32" or "mixed" */
const char *tsr_model_format(const tsr_model *m);

/* Bytes the forward pass reads per token from a linear layer (its stored tensors). */
uint64_t tsr_linear_bytes(const tsr_linear *L);

#endif
