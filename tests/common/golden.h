/* Helpers shared by the golden tests: the fixture prompts, reference files, engines on fixture models, batched
 * logits of all prompts, the linear layer behind a module name, and fp16 ulp distance. Uses cmocka assertions. */
#ifndef TSR_TEST_GOLDEN_H
#define TSR_TEST_GOLDEN_H

#include "runtime/engine.h"
#include "runtime/safetensors.h"

typedef struct {
    int n;
    int32_t *ids[8];
    int len[8];
} prompts;

/* reference/prompts.json */
prompts load_prompts(void);
void free_prompts(prompts *p);
/* reference/<name>.safetensors */
tsr_st_set *open_ref(const char *name);
/* An engine on a fixture model (tests/fixtures/models/<name> or models/<name>) on the CPU. */
tsr_engine *open_engine(const char *model_name, tsr_dtype kv, long kv_tokens);
/* Runs all prompts batched; out[i] = malloc'd logits [len_i][vocab]. */
void run_prompts(tsr_engine *e, const prompts *p, float **out);
/* The linear layer of a module name ("model.layers.3.mlp.up_proj", "lm_head"); *layer_out = its layer or -1. */
const tsr_linear *module_linear(const tsr_model *m, const char *module, int *layer_out);
/* Distance in fp16 ulps between two fp16 values (same sign assumed for non-zero values). */
int half_ulps(uint16_t a, uint16_t b);

#endif
