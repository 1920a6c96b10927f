/* Model configuration: config.json and generation_config.json of Llama, Mistral and Qwen2 models.
 *
 * Values follow Hugging Face transformers' definitions (defaults included); RoPE scaling supports the `linear`,
 * `dynamic`, `llama3` and `yarn` variants as HF computes them (rope.h turns them into frequencies). Keys may sit
 * under "text_config" (multimodal wrappers). Errors name the file and the key. */
#ifndef TSR_CONFIG_H
#define TSR_CONFIG_H

#include "runtime/status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum tsr_arch { TSR_ARCH_LLAMA, TSR_ARCH_MISTRAL, TSR_ARCH_QWEN2 } tsr_arch;

typedef enum tsr_rope_type {
    TSR_ROPE_DEFAULT,
    TSR_ROPE_LINEAR,
    TSR_ROPE_DYNAMIC,
    TSR_ROPE_LLAMA3,
    TSR_ROPE_YARN,
} tsr_rope_type;

typedef struct tsr_rope_config {
    tsr_rope_type type;
    float theta;
    int dim;                   /* rotated dimensions (head_dim × partial_rotary_factor) */
    float factor;
    float low_freq_factor;     /* llama3 */
    float high_freq_factor;    /* llama3 */
    int original_max_pos;      /* llama3, yarn, dynamic */
    int max_pos;               /* max_position_embeddings */
    float beta_fast, beta_slow; /* yarn */
    float attention_factor;    /* yarn: <= 0 means derive from factor / mscale */
    float mscale, mscale_all_dim;
    int truncate;              /* yarn: floor/ceil the correction range (HF default true) */
} tsr_rope_config;

#define TSR_MAX_EOS 8

/* Quantization settings from config.json's `quantization_config` or, when that is absent, the model directory's
 * quantize_config.json (AutoGPTQ). Only GPTQ settings are interpreted (read_quantization_config in config.c);
 * for other methods (e.g. "exl2") only the name is kept. GPTQ with bits other than 4 is refused there with
 * TSR_ERR_UNSUPPORTED. */
typedef struct tsr_quant_config {
    char method[16];           /* "gptq", "exl2", ... ; "" when the model has no quantization config */
    int bits;                  /* GPTQ: 4 (the only width accepted); 0 otherwise */
    int group_size;            /* GPTQ: rows per group; -1 = one group per matrix; 0 = not given */
    int desc_act;              /* GPTQ act-order (g_idx not sequential) */
    int sym;                   /* GPTQ symmetric quantization (informational: zeros are read per group anyway) */
    int gptq_v2;               /* checkpoint_format "gptq_v2": qzeros hold the exact zero, not zero - 1 */
} tsr_quant_config;

typedef struct tsr_model_config {
    tsr_arch arch;
    char arch_name[64];
    int vocab_size;
    int hidden;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate;
    float norm_eps;
    tsr_rope_config rope;
    int tie_word_embeddings;
    int attention_bias;        /* q/k/v (and o for Llama's attention_bias) biases expected */
    int sliding_window;        /* 0 = full attention */
    int max_window_layers;     /* Qwen2: layers >= this use the window when sliding_window > 0 */
    int bos_id;                /* -1 when unknown */
    int eos_ids[TSR_MAX_EOS];  /* from generation_config.json, else config.json */
    int n_eos;
    /* generation_config.json sampling defaults (HF defaults when absent) */
    float gen_temperature, gen_top_p;
    int gen_top_k;
    int gen_do_sample;
    tsr_quant_config quant;    /* quantization_config / quantize_config.json */
} tsr_model_config;

/* Parses config.json text (and generation_config.json text, or NULL); `label` (the directory) prefixes errors. */
tsr_status tsr_config_parse(const char *config_json, size_t len, const char *generation_json, size_t gen_len,
                            const char *label, tsr_model_config *cfg);

/* Reads DIR/config.json, (optional) DIR/generation_config.json and, when config.json has no
 * quantization_config, (optional) DIR/quantize_config.json. */
tsr_status tsr_config_load(const char *dir, tsr_model_config *cfg);

/* Layer `layer`'s attention window (0 = full causal attention). */
int tsr_config_layer_window(const tsr_model_config *cfg, int layer);

#endif
